"""A new method is one module in ``mtad/methods/`` plus one ``conf/method/<name>.yaml``.

The test copies the package, its configs and ``run.py`` into a temporary folder, writes a
throwaway method module and its yaml into that copy (and changes nothing else), and runs
``run.py +experiment=smoke method=<name>`` there in a fresh interpreter: the package's own scan
imports the module, its decorator registers the method, Hydra finds the yaml in the ``method``
group. The working tree is never written to.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from mtad.methods import METHODS, build_params
from mtad.methods.registry import register_method

REPO = Path(__file__).resolve().parents[1]
NAME = "greedy_throwaway"

MODULE = '''"""Greedy decoding, one target forward per token: a throwaway method (tests)."""

from __future__ import annotations

from dataclasses import dataclass

from mtad.engine import DecodeContext, DecodingMethod, StepResult
from mtad.methods.registry import register_method


@dataclass
class GreedyParams:
    note: str = "default"

    def __post_init__(self) -> None:
        if not self.note:
            raise ValueError("note must not be empty")


@register_method(GreedyParams)
class Greedy(DecodingMethod):
    name = "greedy_throwaway"

    def __init__(self, params: GreedyParams) -> None:
        self.params = params

    def step(self, ctx: DecodeContext) -> StepResult:
        with ctx.timed("verify"):
            token = ctx.target.feed(ctx.ids)[0, -1].argmax(dim=-1)
        return StepResult(token.view(1), drafted=0, accepted=0)
'''

YAML = f"""# Greedy decoding: a throwaway method written by tests/test_method_registry.py.
name: {NAME}
note: from the yaml
"""


def smoke_overrides(root: Path) -> list[str]:
    return ["+experiment=smoke", f"results.root={root / 'results'}", "logger=none", "energy=none"]


def result_folder(results: Path, method: str) -> Path:
    (folder,) = (results / "smoke").glob(f"{method}-*")
    return folder


def test_a_method_module_and_its_yaml_are_all_a_new_method_needs(tmp_path: Path) -> None:
    assert NAME not in METHODS  # only the copy below knows it
    tree = tmp_path / "tree"
    skip = shutil.ignore_patterns("__pycache__")
    for folder in ("mtad", "conf", "hydra_plugins"):
        shutil.copytree(REPO / folder, tree / folder, ignore=skip)
    shutil.copy2(REPO / "run.py", tree / "run.py")
    (tree / "mtad" / "methods" / f"{NAME}.py").write_text(MODULE)
    (tree / "conf" / "method" / f"{NAME}.yaml").write_text(YAML)

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the copy's mtad only
    env["PYTHONPATH"] = str(tree)
    hydra_dir = f"hydra.run.dir={tmp_path / 'hydra'}"
    cmd = [sys.executable, "run.py", *smoke_overrides(tmp_path), hydra_dir, f"method={NAME}"]
    out = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]

    folder = result_folder(tmp_path / "results", NAME)
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics["method"] == NAME and metrics["params"] == {"note": "from the yaml"}
    assert metrics["n_samples"] == 2 and metrics["draft_forwards"] == 0

    # it decoded: the same tokens as the built-in `ar` at temperature 0, run here in-process
    from mtad.harness.job import run

    overrides = [*smoke_overrides(tmp_path), "method=ar", "method.temperature=0"]
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        run(compose("config", overrides=overrides))
    ar = result_folder(tmp_path / "results", "ar")

    def outputs(folder: Path) -> list[str]:
        rows = (folder / "samples.jsonl").read_text().splitlines()
        return [json.loads(row)["output"] for row in rows]

    assert outputs(folder) == outputs(ar)


def test_registering_takes_the_class_name_and_refuses_a_second_owner() -> None:
    from mtad.methods.ar import ARParams, AutoregressiveSampling

    assert METHODS["ar"] == (ARParams, AutoregressiveSampling)
    assert list(METHODS) == sorted(METHODS)
    with pytest.raises(ValueError, match="registered twice"):

        @register_method(ARParams)
        class Impostor(AutoregressiveSampling):
            name = "ar"

    with pytest.raises(TypeError, match="sets its own `name`"):

        @register_method(ARParams)
        class Nameless(AutoregressiveSampling):
            pass

    assert METHODS["ar"] == (ARParams, AutoregressiveSampling)
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        build_params("nope")
