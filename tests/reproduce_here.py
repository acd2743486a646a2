"""``scripts/reproduce.py`` in the test's own process, for the paper's test modules
(``tests/test_paper.py``, ``tests/test_paper_dry_run.py``): what needs no W&B and is not about
the process (planning, re-rendering records) runs without a new interpreter's imports."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]


@functools.cache
def script() -> ModuleType:
    """``scripts/reproduce.py`` as a module, loaded once per test process."""
    spec = importlib.util.spec_from_file_location("reproduce", REPO / "scripts" / "reproduce.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reproduce_here(capsys: pytest.CaptureFixture, root: Path, *args: str) -> tuple[int, str]:
    """``reproduce.py ARGS --root ROOT --wandb-dir ROOT`` in this process: exit code, stdout."""
    capsys.readouterr()
    code = script().main([*args, "--root", str(root), "--wandb-dir", str(root)])
    return code, capsys.readouterr().out
