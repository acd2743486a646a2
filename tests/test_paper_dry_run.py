"""The paper profile's dry run: every run of every recipe composed and validated, as
``scripts/reproduce.py all --profile paper --dry-run`` plans them, and the paper preset that
launches them through run.py with a cluster launcher.

Its own module, apart from ``tests/test_paper.py``: pytest-xdist's ``--dist loadscope`` keeps a
module on one worker, and this planning (the suite's longest) and that module's smoke
reproduction need not wait for each other.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from reproduce_here import REPO, reproduce_here

from mtad.paper.recipes import load_profile, recipe_names


def test_paper_dry_run_lists_every_run_and_composes_with_a_cluster_launcher(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Every run of the paper profile composed and validated (~1,300, the suite's longest
    planning): in this process, as the script's main() does it, since the check is the plan
    and what it prints, not a process boundary; the preset below goes through run.py."""
    code, stdout = reproduce_here(
        capsys,
        tmp_path,
        "all",
        "--profile",
        "paper",
        "--dry-run",
        "hydra/launcher=submitit_slurm",
        f"hydra.sweep.dir={tmp_path}/multirun",
    )
    assert code == 0, stdout[-2000:]
    for recipe in recipe_names():
        assert f"  {recipe} " in stdout
    assert "hydra/launcher=submitit_slurm" in stdout
    # pairs x 3 seeds x (methods x tasks) main runs, each listed with its state
    grid = yaml.safe_load((REPO / "experiments" / "main.yaml").read_text())["runs"][0]
    n_main = len(load_profile("paper").pairs) * 3 * len(grid["method"]) * len(grid["task"])
    assert re.search(rf"^  main\s+{n_main} runs", stdout, re.M), stdout[:2000]
    listed = stdout.count("      missing  ") + stdout.count("      not_run  ")
    assert listed >= n_main
    # The preset itself launches through the recipe sweeper and takes the launcher override
    # (one recipe of two compositions: the plan above composed and validated every run of
    # every recipe).
    preset = subprocess.run(
        [
            sys.executable,
            "run.py",
            "+experiment=opt13b",
            "hydra.sweeper.dry_run=true",
            "hydra.sweeper.recipes=[ablation_beam]",
            "hydra/launcher=submitit_slurm",
            f"hydra.sweep.dir={tmp_path}/ms",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "WANDB_MODE": "offline"},
    )
    assert preset.returncode == 0, preset.stderr[-2000:]
    assert "(pairs: opt_13b)" in preset.stdout and "  ablation_beam " in preset.stdout
    assert "  main " not in preset.stdout  # the recipe asked for, only
