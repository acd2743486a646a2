"""A real SLURM: smoke sweeps through ``hydra/launcher=slurm_cpu`` on a single-node cluster on
localhost (``scripts/slurm_local.sh``). One sweep has a job killed mid-run with ``scancel``
(SIGKILL), then the same command again: every run complete exactly once, in the result folders
and in W&B. Another has its job pre-empted mid-run (SIGTERM, then USR2, as SLURM does): submitit
requeues it and the sweep ends with one complete result and one W&B run.

Marked ``slurm`` (not in the default suite): ``pytest -m slurm``. Needs root and Debian's
package registry the first time (the script installs ``slurm-wlm`` and ``munge``); CI runs it
as a separate step after the default suite (``.ci/run``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from mtad.harness.callbacks import read_pointers
from mtad.harness.lease import LEASE_FILE
from mtad.harness.wandb_logger import offline_runs, wandb_run_id
from mtad.runs.folder import ENVIRONMENT_FILE, RESULT_FILES, is_complete

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "slurm_local.sh"
STUDY = "slurm"


def cluster_up() -> bool:
    if shutil.which("sinfo") is None:
        return False
    out = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True)
    return out.returncode == 0 and any(s.startswith(("idle", "mix")) for s in out.stdout.split())


@pytest.fixture(scope="module")
def cluster():  # noqa: ANN201 - a generator fixture
    """The local cluster, brought up for the test (and down after, if the test started it)."""
    if os.geteuid() != 0:
        pytest.skip("the local SLURM cluster needs root (scripts/slurm_local.sh)")
    started = not cluster_up()
    if started:
        subprocess.run(["bash", str(SCRIPT), "up"], check=True, timeout=600)
    yield
    if started:
        subprocess.run(["bash", str(SCRIPT), "down"], check=False, timeout=120)


def sweep_cmd(tmp: Path, name: str) -> list[str]:
    return [
        sys.executable,
        str(REPO / "run.py"),
        "-m",
        "hydra/launcher=slurm_cpu",
        "hydra.launcher.cpus_per_task=1",
        "hydra.launcher.mem_gb=2",
        "hydra.launcher.timeout_min=10",
        "+experiment=smoke",
        "task.max_new_tokens=512",  # seconds of generation: a window to cancel a job in
        "method=ar,sps,mtad",
        f"results.study={STUDY}",
        f"results.root={tmp / 'results'}",
        f"logger.dir={tmp}",
        f"hydra.sweep.dir={tmp / name}",
    ]


def env() -> dict[str, str]:
    return {**os.environ, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}


def _started_slurm_runs(base: Path, wandb_dir: Path) -> list[tuple[Path, dict]]:
    """Result folders whose lease names a SLURM job and whose W&B run has started: runs caught
    mid-way (the moment both tests act on)."""
    found = []
    for lease_file in base.glob(f"*/{LEASE_FILE}") if base.is_dir() else []:
        try:
            owner = json.loads(lease_file.read_text() or "{}")
        except (OSError, ValueError):
            continue
        if owner.get("slurm_job") and wandb_run_id(STUDY, lease_file.parent.name) in offline_runs(
            wandb_dir
        ):
            found.append((lease_file.parent, owner))
    return found


def test_slurm_sweep_with_a_cancelled_job_completes_every_run_once(
    cluster: None, tmp_path: Path
) -> None:
    base = tmp_path / "results" / STUDY
    first = subprocess.Popen(
        sweep_cmd(tmp_path, "first"),
        cwd=tmp_path,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    # A run mid-way (claimed, W&B started, nothing written yet): its lease names the SLURM job
    # that holds it.
    cancelled: tuple[Path, str] | None = None
    deadline = time.monotonic() + 300
    while cancelled is None and time.monotonic() < deadline and first.poll() is None:
        for folder, owner in _started_slurm_runs(base, tmp_path / "wandb"):
            if not (folder / "config.yaml").exists():
                # SIGKILL to every process of the job (``<array>_<task>``: only this task), as
                # a node failure or a hard pre-emption would: no chance to finish or clean up.
                sent = subprocess.run(["scancel", "--full", "--signal=KILL", owner["slurm_job"]])
                if sent.returncode == 0:  # else the job ended just before: try another
                    cancelled = (folder, owner["slurm_job"])
                    break
        time.sleep(0.05)
    out, _ = first.communicate(timeout=300)
    assert cancelled is not None, f"no job was caught mid-run:\n{out[-3000:]}"
    folder, job_id = cancelled
    assert not is_complete(folder)
    assert first.returncode != 0  # submitit reports the killed job to the sweep

    second = subprocess.run(
        sweep_cmd(tmp_path, "second"),
        cwd=tmp_path,
        env=env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert second.returncode == 0, (second.stdout + second.stderr)[-3000:]
    assert "sweep: 1 run, 2 skipped (already complete)" in second.stdout

    results = sorted(p for p in base.iterdir() if p.is_dir())
    assert len(results) == 3
    for res in results:
        assert is_complete(res) and sorted(p.name for p in res.iterdir()) == sorted(RESULT_FILES)
        slurm = json.loads((res / ENVIRONMENT_FILE).read_text())["slurm"]
        assert slurm["job_id"] and slurm["node"]
    done = Counter()
    for name in ("first", "second"):
        done.update(p["signature"] for p in read_pointers(tmp_path / name) if p["status"] == "done")
    assert sorted(done) == [r.name for r in results] and set(done.values()) == {1}
    assert folder.name in {p["signature"] for p in read_pointers(tmp_path / "second")}
    ids = offline_runs(tmp_path / "wandb")
    assert set(ids) == {wandb_run_id(STUDY, r.name) for r in results}
    assert all(len(paths) == 1 for paths in ids.values())


def test_slurm_preempted_job_is_requeued_and_completes_in_the_same_sweep(
    cluster: None, tmp_path: Path
) -> None:
    """SLURM's pre-emption signals (SIGTERM, then USR2) reach a job mid-run: submitit
    checkpoints and requeues it, the requeued job runs the run again from the start, and the
    sweep ends with one complete result and one W&B run, nothing failed."""
    cmd = [
        c if not c.startswith("method=") else "method=ar"
        for c in sweep_cmd(tmp_path, "first")
        if not c.startswith("task.max_new_tokens=")
    ]
    cmd.insert(cmd.index("method=ar"), "task.max_new_tokens=1500")
    sweep = subprocess.Popen(
        cmd, cwd=tmp_path, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    base = tmp_path / "results" / STUDY
    job = None
    deadline = time.monotonic() + 300
    while job is None and time.monotonic() < deadline and sweep.poll() is None:
        for _, owner in _started_slurm_runs(base, tmp_path / "wandb"):
            job = str(owner["slurm_job"])
        time.sleep(0.05)
    assert job is not None, "the job was never caught mid-run"
    for sig in ("TERM", "USR2"):  # what SLURM sends a pre-empted job
        subprocess.run(["scancel", f"--signal={sig}", job], check=True)
    # SLURM holds a requeued batch job for two minutes before it is eligible again; as an
    # administrator would, make it eligible sooner, but not at once: slurmd revokes the first
    # run's credential with a one-second clock, and a run launched in that same second is
    # killed as "Job credential revoked" (the job then ends FAILED with no result; CI saw it).
    for _ in range(200):
        state = subprocess.run(
            ["squeue", "-h", "-j", job, "-o", "%t"], capture_output=True, text=True
        ).stdout.strip()
        if state == "PD":
            subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now+5"], check=True)
            break
        time.sleep(0.1)
    out, _ = sweep.communicate(timeout=300)
    assert sweep.returncode == 0, out[-3000:]
    assert "sweep: 1 run, 0 skipped (already complete), 0 claimed by another process, 0 failed" in (
        out
    )
    (result,) = [p for p in base.iterdir() if p.is_dir()]
    assert is_complete(result) and sorted(p.name for p in result.iterdir()) == sorted(RESULT_FILES)
    slurm = json.loads((result / ENVIRONMENT_FILE).read_text())["slurm"]
    assert int(slurm["restart_count"]) >= 1  # it really was requeued
    ids = offline_runs(tmp_path / "wandb")
    assert list(ids) == [wandb_run_id(STUDY, result.name)] and len(ids[list(ids)[0]]) == 1
