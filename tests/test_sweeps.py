"""Sweeps that survive: kill -9 mid-run, a failing job, two sweeps at once, leases, determinism.

Each sweep is ``run.py -m`` in a subprocess, as a user types it. What is counted: result
folders (complete, none torn), W&B offline runs by id (one folder per id), and the jobs each
sweep reports in its ``result.json`` pointers.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from mtad.harness.callbacks import read_pointers
from mtad.harness.lease import LEASE_FILE, LeaseHeld, lease
from mtad.harness.wandb_logger import offline_runs, wandb_run_id
from mtad.runs.folder import FAILED_FILE, METRICS_FILE, RESULT_FILES, is_complete

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"


def env(**extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "WANDB_MODE": "offline",
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]),
        **extra,
    }


def sweep_cmd(tmp: Path, name: str, *args: str) -> list[str]:
    return [
        sys.executable,
        str(REPO / "run.py"),
        "-m",
        *args,
        f"results.root={tmp / 'results'}",
        f"logger.dir={tmp}",
        f"hydra.sweep.dir={tmp / name}",
    ]


def run_sweep(tmp: Path, name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        sweep_cmd(tmp, name, *args),
        cwd=tmp,
        env=env(),
        capture_output=True,
        text=True,
        timeout=600,
    )


def folders(tmp: Path, study: str) -> list[Path]:
    base = tmp / "results" / study
    return sorted(p for p in base.iterdir() if p.is_dir()) if base.is_dir() else []


def assert_clean(folder: Path) -> None:
    """Complete, and nothing else in it: no lease, no failure, no temporary file."""
    assert is_complete(folder), folder
    assert sorted(p.name for p in folder.iterdir()) == sorted(RESULT_FILES), folder


def wandb_ids(tmp: Path) -> dict[str, list[Path]]:
    return offline_runs(tmp / "wandb")


# ------------------------------------------------------------------------------------------
# Must hold 1: kill -9 in the middle of a run, rerun, count


def test_sigkill_mid_run_then_rerun_completes_exactly_the_missing_runs(tmp_path: Path) -> None:
    """Three runs of the real pair; the sweep is killed (SIGKILL, whole process group) while
    its second run is generating; the same command again does exactly the two missing runs."""
    study = "kill"
    args = [
        "pair=smollm2",
        "task.limit=2",
        "task.max_new_tokens=8",
        "method=ar,sps,mtad",
        "energy=none",
        f"results.study={study}",
    ]
    proc = subprocess.Popen(
        sweep_cmd(tmp_path, "first", *args),
        cwd=tmp_path,
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    # Mid-run of the second job: the first folder is complete, the second has its lease and
    # its W&B run (models loaded, W&B started: warm-up or the generation loop is running).
    deadline = time.monotonic() + 240
    killed_in = None
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            done = [f for f in folders(tmp_path, study) if is_complete(f)]
            running = [
                f
                for f in folders(tmp_path, study)
                if (f / LEASE_FILE).exists() and not is_complete(f)
            ]
            if len(done) == 1 and running:
                run_id = wandb_run_id(study, running[0].name)
                if run_id in wandb_ids(tmp_path):
                    killed_in = running[0]
                    os.killpg(proc.pid, signal.SIGKILL)
                    break
            time.sleep(0.05)
    finally:
        if proc.poll() is None and killed_in is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert killed_in is not None, "never caught the sweep mid-run"
    assert not is_complete(killed_in)
    assert len(wandb_ids(tmp_path)) == 2  # the finished run and the killed one

    second = run_sweep(tmp_path, "second", *args)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "sweep: 2 run, 1 skipped (already complete), 0 claimed by another process, 0 failed" in (
        second.stdout
    )
    results = folders(tmp_path, study)
    assert len(results) == 3
    for folder in results:
        assert_clean(folder)
    ids = wandb_ids(tmp_path)
    assert len(ids) == 3 and all(len(paths) == 1 for paths in ids.values())
    assert set(ids) == {wandb_run_id(study, f.name) for f in results}
    for folder in results:  # each result names the W&B run that holds it
        metrics = json.loads((folder / METRICS_FILE).read_text())
        assert metrics["wandb"]["run_id"] == wandb_run_id(study, folder.name)
        assert Path(metrics["wandb"]["run_dir"]).is_dir()


# ------------------------------------------------------------------------------------------
# Must hold 2: one failing job


def test_failing_job_is_recorded_the_sweep_goes_on_and_a_rerun_retries_only_it(
    tmp_path: Path,
) -> None:
    args = ["+experiment=smoke", "method=ar,sps,mtad", "energy=none"]
    inject = [
        "+hydra.callbacks.inject._target_=fault_injection.FailAtGeneration",
        "+hydra.callbacks.inject.method=sps",
    ]
    first = run_sweep(tmp_path, "first", *args, *inject)
    assert first.returncode == 1, first.stderr[-3000:]
    assert "sweep: 2 run, 0 skipped (already complete), 0 claimed" in first.stdout
    assert "1 failed" in first.stdout and "FAILED job 1" in first.stdout
    assert "1 job(s) failed" in first.stderr

    results = {f.name.split("-")[0]: f for f in folders(tmp_path, "smoke")}
    assert sorted(results) == ["ar", "mtad", "sps"]
    assert is_complete(results["ar"]) and is_complete(results["mtad"])
    failed = results["sps"]
    assert not is_complete(failed) and not (failed / LEASE_FILE).exists()
    record = json.loads((failed / FAILED_FILE).read_text())
    assert record["error"].startswith("RuntimeError: CUDA out of memory")
    assert "fault_injection.py" in record["traceback"]
    assert record["config"]["method"]["name"] == "sps" and record["signature"] == failed.name
    assert record["environment"]["packages"]["torch"] and record["time"]
    pointers = {p["signature"]: p["status"] for p in read_pointers(tmp_path / "first")}
    assert pointers[failed.name] == "failed"
    mtimes = {k: (f / METRICS_FILE).stat().st_mtime_ns for k, f in results.items() if k != "sps"}

    second = run_sweep(tmp_path, "second", *args)  # no injection: the job now succeeds
    assert second.returncode == 0, second.stderr[-3000:]
    assert "sweep: 1 run, 2 skipped (already complete), 0 claimed by another process, 0 failed" in (
        second.stdout
    )
    done = [p for p in read_pointers(tmp_path / "second") if p["status"] == "done"]
    assert [p["signature"] for p in done] == [failed.name]
    for folder in folders(tmp_path, "smoke"):
        assert_clean(folder)  # failed.json is gone from the retried folder
    assert {k: (f / METRICS_FILE).stat().st_mtime_ns for k, f in results.items() if k != "sps"} == (
        mtimes
    )
    ids = wandb_ids(tmp_path)  # the failed attempt's W&B run was replaced, not kept
    assert len(ids) == 3 and all(len(v) == 1 for v in ids.values())


# ------------------------------------------------------------------------------------------
# Must hold 3: two sweeps over one study at once


def test_two_concurrent_sweeps_run_every_signature_exactly_once(tmp_path: Path) -> None:
    """Two sweeps over the same runs start together in the same order, so they reach each
    run at about the same time; each run must be done by exactly one of them (without leases
    both run most of them)."""
    methods = ["ar", "sps", "mtad", "bild"]
    procs = []
    for name in ("a", "b"):
        cmd = sweep_cmd(tmp_path, name, "+experiment=smoke", f"method={','.join(methods)}")
        procs.append(
            subprocess.Popen(
                cmd, cwd=tmp_path, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
        )
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err.decode()[-3000:]

    results = folders(tmp_path, "smoke")
    assert len(results) == len(methods)
    for folder in results:
        assert_clean(folder)
    done = Counter()
    for name in ("a", "b"):
        pointers = read_pointers(tmp_path / name)
        assert len(pointers) == len(methods)  # every job of each sweep reported
        assert {p["status"] for p in pointers} <= {"done", "skipped", "claimed"}
        done.update(p["signature"] for p in pointers if p["status"] == "done")
    assert sorted(done) == sorted(f.name for f in results)
    assert set(done.values()) == {1}, done
    ids = wandb_ids(tmp_path)
    assert len(ids) == len(methods) and all(len(v) == 1 for v in ids.values())


# ------------------------------------------------------------------------------------------
# leases


HOLDER = """
import sys, time
from pathlib import Path
from mtad.harness.lease import lease
with lease(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(600)
"""


def test_a_live_claim_is_respected_and_a_dead_owners_claim_is_taken_over(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(folder)], env=env(), stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(LeaseHeld) as info, lease(folder):
            pass
        assert info.value.owner["pid"] == holder.pid
        assert f"pid {holder.pid}" in str(info.value)
    finally:
        holder.kill()  # SIGKILL: no cleanup runs, the lease file stays behind
        holder.wait()
    assert (folder / LEASE_FILE).exists()
    with lease(folder) as owner:  # stale: taken over
        assert owner["pid"] == os.getpid()
        assert json.loads((folder / LEASE_FILE).read_text())["pid"] == os.getpid()
    assert not (folder / LEASE_FILE).exists()


def test_a_claimed_run_is_skipped_not_failed(tmp_path: Path, monkeypatch) -> None:
    import mtad.engine.loading
    from mtad.harness.job import prepare, run

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                "+experiment=smoke",
                f"results.root={tmp_path}",
                "logger=none",
                "energy=none",
            ],
        )
    folder = prepare(cfg).result_dir
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(folder)], env=env(), stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        monkeypatch.setattr(mtad.engine.loading, "load_pair", _no_model)
        outcome = run(cfg)
        assert outcome.status == "claimed" and f"pid {holder.pid}" in outcome.note
        assert not (folder / FAILED_FILE).exists()
    finally:
        holder.kill()
        holder.wait()


def _no_model(*args: object, **kwargs: object) -> None:
    raise AssertionError("a model was loaded")


# ------------------------------------------------------------------------------------------
# Build 9: determinism


@pytest.mark.parametrize("method", ["mtad", "sps"])
def test_same_config_and_seed_give_byte_identical_samples_on_cpu(
    tmp_path: Path, method: str
) -> None:
    """Sampling methods at temperature 1: two runs into two result roots write the same bytes."""
    from mtad.harness.job import run

    outputs = []
    for attempt in ("one", "two"):
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = compose(
                "config",
                overrides=[
                    "+experiment=smoke",
                    f"method={method}",
                    f"results.root={tmp_path / attempt}",
                    "logger=none",
                    "energy=none",
                ],
            )
        outcome = run(cfg)
        assert outcome.status == "done"
        outputs.append((outcome.result_dir / "samples.jsonl").read_bytes())
    assert outputs[0] == outputs[1]
    assert b'"output"' in outputs[0]
