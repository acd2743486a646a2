"""A new method is its params dataclass in ``mtad/methods/params.py``, one module in
``mtad/methods/`` and one ``conf/method/<name>.yaml``.

The test copies the package, its configs, ``run.py`` and ``analysis/`` into a temporary folder,
adds a throwaway method's params to that copy's ``params.py`` and writes its module and its yaml
there (and changes nothing else), and runs it there in fresh interpreters: Hydra's ConfigStore
holds the params' defaults, the package's own scan imports the module, its decorator registers
the method, Hydra finds the yaml in the ``method`` group, the preflight asks the built method
how deep it drafts, the harness runs it beside ``ar`` in one sweep and
``analysis/make_tables.py`` compares the two. The working tree is never written to.
"""

from __future__ import annotations

import csv
import json
import math
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
NAME = "greedy_chain"

PARAMS = """

@dataclass
class GreedyChainParams:
    depth: int = 2

    def __post_init__(self) -> None:
        if self.depth < 1:
            raise ValueError(f"depth must be >= 1, got {self.depth}")


PARAMS["greedy_chain"] = GreedyChainParams
"""

MODULE = '''"""Greedy draft and verify, a throwaway method (tests): the draft proposes ``depth``
tokens greedily, the target keeps the longest prefix it agrees with and adds its own token."""

from __future__ import annotations

import torch

from mtad.engine import DecodeContext, DecodingMethod, DraftDepth, StepResult
from mtad.methods.common import leading_true_count
from mtad.methods.params import GreedyChainParams
from mtad.methods.registry import register_method


@register_method(GreedyChainParams)
class GreedyChain(DecodingMethod):
    name = "greedy_chain"
    uses_draft = True

    def __init__(self, params: GreedyChainParams) -> None:
        self.params = params

    def draft_depth(self) -> DraftDepth:
        return DraftDepth("depth", self.params.depth)

    def step(self, ctx: DecodeContext) -> StepResult:
        g = self.params.depth
        assert ctx.draft is not None
        with ctx.timed("draft"):
            logits = ctx.draft.feed(ctx.ids)[0, -1]
            drafted = []
            for i in range(g):
                drafted.append(logits.argmax(dim=-1))
                if i + 1 < g:
                    logits = ctx.draft.forward(drafted[-1].view(1, 1))[0, -1]
            x = torch.stack(drafted)
        with ctx.timed("verify"):
            best = ctx.target.feed(ctx.ids, extra=x)[0, -(g + 1) :].argmax(dim=-1)
            k = int(leading_true_count(best[:g] == x))
            ctx.target.crop(ctx.n + k)
            ctx.draft.crop(ctx.n + k)
        return StepResult(torch.cat([x[:k], best[k : k + 1]]), drafted=g, accepted=k)
'''

YAML = f"""# Greedy draft and verify: a throwaway method written by tests/test_method_registry.py.
defaults:
  - params/{NAME}@_here_
  - _self_
"""


def smoke_overrides(root: Path) -> list[str]:
    return ["+experiment=smoke", f"results.root={root / 'results'}", "logger=none", "energy=none"]


def result_folder(results: Path, method: str) -> Path:
    (folder,) = (results / "smoke").glob(f"{method}-*")
    return folder


def test_its_params_a_module_and_a_yaml_are_all_a_new_method_needs(tmp_path: Path) -> None:
    assert NAME not in METHODS  # only the copy below knows it
    tree = tmp_path / "tree"
    skip = shutil.ignore_patterns("__pycache__")
    for folder in ("mtad", "conf", "hydra_plugins", "analysis"):
        shutil.copytree(REPO / folder, tree / folder, ignore=skip)
    shutil.copy2(REPO / "run.py", tree / "run.py")
    params = tree / "mtad" / "methods" / "params.py"
    params.write_text(params.read_text() + PARAMS)
    (tree / "mtad" / "methods" / f"{NAME}.py").write_text(MODULE)
    (tree / "conf" / "method" / f"{NAME}.yaml").write_text(YAML)

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the copy's mtad only
    env["PYTHONPATH"] = str(tree)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, *args], cwd=tree, env=env, capture_output=True, text=True, timeout=600
        )

    # the preflight asks the built method how deep it drafts: past the budget, one line
    refused = run("run.py", *smoke_overrides(tmp_path), f"method={NAME}", "method.depth=1000")
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert refused.stderr.splitlines() == [
        "error: method.depth: block of 1000 tokens exceeds the token budget task.max_new_tokens=16"
    ]

    sweep = f"hydra.sweep.dir={tmp_path / 'sweep'}"
    out = run("run.py", "-m", *smoke_overrides(tmp_path), sweep, f"method=ar,{NAME}")
    assert out.returncode == 0, out.stderr[-3000:]
    folder = result_folder(tmp_path / "results", NAME)
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics["method"] == NAME and metrics["params"] == {"depth": 2}
    assert metrics["n_samples"] == 2 and metrics["draft_forwards"] > 0

    # the tables compare it with ar, as any method
    tables = run("analysis/make_tables.py", "smoke", "--root", str(tmp_path / "results"))
    assert tables.returncode == 0, tables.stderr[-3000:]
    speed = tmp_path / "results" / "smoke" / "tables" / "speed.csv"
    rows = {row["label"]: row for row in csv.DictReader(speed.open())}
    speedup = float(rows[NAME]["speed-up vs AR"])
    assert math.isfinite(speedup) and speedup > 0

    # it decoded: the same tokens as the built-in `ar` at temperature 0, run here in-process
    from mtad.harness.job import run as run_in_process

    overrides = [*smoke_overrides(tmp_path / "greedy"), "method=ar", "method.temperature=0"]
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        run_in_process(compose("config", overrides=overrides))
    ar = result_folder(tmp_path / "greedy" / "results", "ar")

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

    from mtad.engine import DecodingMethod

    with pytest.raises(TypeError, match="says how deep it drafts"):

        @register_method(ARParams)
        class Silent(DecodingMethod):  # how deep does it draft? the budget check must know
            name = "silent"

            def step(self, ctx):  # noqa: ANN001, ANN202
                raise NotImplementedError

    assert METHODS["ar"] == (ARParams, AutoregressiveSampling) and "silent" not in METHODS
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        build_params("nope")
