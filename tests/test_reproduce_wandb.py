"""scripts/reproduce.py with W&B offline: every run the report references (the harness runs
behind the tables and the analysis run) has an offline run folder, and PUBLISH.md's sync
command uploads each of those folders. The runs are the smoke profile's (tiny pair) with
``logger=wandb`` on the command line (the profile itself logs nothing: tests/test_paper.py
checks that the output says so)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RECIPE = "ablation_beam"  # the smoke profile's smallest recipe: 10 runs


def referenced_ids(report: dict) -> set[str]:
    """The run ids the report's run sets filter on (``ID in [...]`` and ``ID == '...'``)."""
    ids: set[str] = set()
    for runset in report["runsets"]:
        for listed in re.findall(r"Metric\(\"ID\"\) in \[([^\]]*)\]", runset["filters"]):
            ids |= set(re.findall(r"'([^']+)'", listed))
        ids |= set(re.findall(r"Metric\(\"ID\"\) == '([^']+)'", runset["filters"]))
    return ids


def sync_command(publish_md: str) -> tuple[Path, list[str]]:
    """The folder PUBLISH.md changes to and the paths its first ``wandb sync`` uploads."""
    lines = publish_md.splitlines()
    cd = next(shlex.split(ln)[1] for ln in lines if ln.startswith("cd ") and ln != "cd -")
    words = next(shlex.split(ln) for ln in lines if ln.startswith("wandb sync --project"))[2:]
    paths = []
    while words:
        word = words.pop(0)
        if word in ("--project", "--entity"):
            words.pop(0)  # its value
        else:
            paths.append(word)
    return Path(cd), paths


def test_every_run_the_report_references_is_uploaded_by_its_sync_command(tmp_path: Path) -> None:
    root, wandb_dir = tmp_path / "results", tmp_path / "w"
    cmd = [
        sys.executable,
        "scripts/reproduce.py",
        RECIPE,
        "--profile",
        "smoke",
        "logger=wandb",
        "task.limit=1",
        "task.max_new_tokens=4",
        "--root",
        str(root),
        "--wandb-dir",
        str(wandb_dir),
        f"hydra.sweep.dir={tmp_path / 'multirun'}",
    ]
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]

    study = root / "paper_smoke"
    logged = {json.loads(m.read_text())["wandb"]["run_id"] for m in study.glob("*/metrics.json")}
    assert len(logged) == 10
    report = json.loads((study / "report" / "report.json").read_text())
    ids = referenced_ids(report)
    assert ids == logged | {next(i for i in ids if i.startswith("analysis-"))}

    cd, paths = sync_command((study / "report" / "PUBLISH.md").read_text())
    uploaded = {(cd / p).resolve() for p in paths}
    for run_id in ids:
        folders = list((wandb_dir / "wandb").glob(f"offline-run-*-{run_id}"))
        assert len(folders) == 1, run_id
        assert (folders[0] / f"run-{run_id}.wandb").is_file(), run_id
        assert folders[0].resolve() in uploaded, run_id
    assert len(uploaded) == len(ids)
    assert f"W&B: 10 harness runs logged, 10 folders in {wandb_dir / 'wandb'}" in out.stdout


def test_logger_dir_belongs_to_wandb_dir() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("reproduce", REPO / "scripts" / "reproduce.py")
    assert spec and spec.loader
    reproduce = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reproduce)
    with pytest.raises(SystemExit) as stop:
        reproduce.parse(["main", "--profile", "smoke", "logger.dir=/elsewhere"])
    assert stop.value.code == 2
    args = reproduce.parse(["main", "--profile", "smoke", "--wandb-dir", "rel/w"])
    assert f"logger.dir={Path('rel/w').resolve()}" in reproduce.launch_command(args)
