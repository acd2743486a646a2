"""``run.py --help`` and ``--cfg job`` compose configs without importing torch (seconds saved on
every look at a config, and a check that the config layer stays free of the engine)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PROBE = """
import runpy, sys
sys.argv = ["run.py", *sys.argv[1:]]
try:
    runpy.run_path("run.py", run_name="__main__")
except SystemExit as stop:
    assert not stop.code, stop.code
heavy = sorted(m for m in ("torch", "transformers") if m in sys.modules)
print("imported:", ",".join(heavy) or "none", file=sys.stderr)
"""


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["--cfg", "job"],
        ["+experiment=llama70b", "--cfg", "job"],
        ["+sweep=mtad_grid", "method=sps", "--cfg", "job"],
    ],
)
def test_looking_at_a_config_imports_no_torch(args: list[str]) -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stderr.strip().splitlines()[-1] == "imported: none"


def test_the_config_layer_uses_the_engines_model_spec_without_torch() -> None:
    probe = (
        "import sys; from mtad.harness.config import PairConfig; import mtad.engine.spec as s;"
        "import dataclasses as d; t = {f.name: f.type for f in d.fields(PairConfig)}['target'];"
        "print(t, 'torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["ModelSpec", "False"]
