"""``run.py --help`` and ``--cfg job`` compose configs without importing torch (seconds saved on
every look at a config, and a check that the config layer stays free of the engine);
``analysis/make_tables.py`` reads results through ``mtad.runs`` alone (no torch, no Hydra); and
the packages import downwards only: ``mtad.runs`` imports none of the project's other packages,
the harness never imports the paper."""

from __future__ import annotations

import ast
import json
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


def test_make_tables_imports_neither_torch_nor_hydra(tmp_path: Path) -> None:
    """``analysis/make_tables.py <study>`` reads result folders through mtad.runs alone."""
    folder = tmp_path / "s" / "ar-tiny-prompts-0"
    metrics = {"study": "s", "pair": "tiny", "task": "prompts", "method": "ar", "seed": 0}
    metrics |= {"device": "cpu", "new_tokens": 4, "ms_per_token": 2.0, "params": {}}
    for name in ("config.yaml", "samples.jsonl", "timings.jsonl", "environment.json"):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("{}\n")
    (folder / "metrics.json").write_text(json.dumps(metrics))
    probe = (
        "import runpy, sys\n"
        f"sys.argv = ['make_tables.py', 's', '--root', {str(tmp_path)!r}]\n"
        "try:\n"
        f"    runpy.run_path({str(REPO / 'analysis' / 'make_tables.py')!r}, run_name='__main__')\n"
        "except SystemExit as stop:\n"
        "    assert not stop.code, stop.code\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'hydra', 'omegaconf')"
        " if m in sys.modules)\n"
        "print('imported:', ','.join(heavy) or 'none', file=sys.stderr)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "== speed (s, 1 runs)" in out.stdout
    assert out.stderr.strip().splitlines()[-1] == "imported: none"


def _imports(package: Path) -> dict[str, set[str]]:
    """Module file -> the ``mtad.*`` modules it imports (at any depth of the file)."""
    found: dict[str, set[str]] = {}
    for path in sorted(package.rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
            elif isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
        found[str(path.relative_to(REPO))] = {n for n in names if n.split(".")[0] == "mtad"}
    return found


def test_the_packages_import_downwards_only() -> None:
    """runs/ is below harness/ and paper/; harness/ is below paper/ (no arrow back up)."""
    for module, names in _imports(REPO / "mtad" / "runs").items():
        assert all(n.startswith("mtad.runs") for n in names), (module, names)
    for module, names in _imports(REPO / "mtad" / "harness").items():
        assert not any(n.startswith("mtad.paper") for n in names), (module, names)
    for module, names in _imports(REPO / "analysis").items():
        assert all(n.startswith("mtad.runs") for n in names), (module, names)
