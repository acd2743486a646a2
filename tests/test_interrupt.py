"""Ctrl-C during a run and during a sweep: one line (what finished, what did not, that the same
command resumes), exit status 130, and the same command then completes exactly the missing runs.

``run.py`` runs in a subprocess of its own session; SIGINT goes to its whole process group, as a
terminal's Ctrl-C does, while a run is generating (``tests/fault_injection.py:SlowGeneration``
makes each generation wait, so the moment is reliable on the tiny pair).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from mtad.harness.interrupt import EXIT_INTERRUPTED
from mtad.harness.lease import LEASE_FILE
from mtad.harness.wandb_logger import offline_runs, wandb_run_id
from mtad.runs.folder import RESULT_FILES, is_complete

REPO = Path(__file__).resolve().parents[1]
SLOW = ["+hydra.callbacks.slow._target_=fault_injection.SlowGeneration"]


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "WANDB_MODE": "offline",
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]),
    }


def _rerun_env() -> dict[str, str]:
    """The rerun of the same command: no window to interrupt it in is needed (no waits)."""
    return {**_env(), "SLOW_GENERATION": "off"}


def _command(tmp: Path, *args: str) -> list[str]:
    return [
        sys.executable,
        str(REPO / "run.py"),
        *args,
        "+experiment=smoke",
        "runtime.progress=false",
        f"results.root={tmp / 'results'}",
        f"logger.dir={tmp}",
    ]


def _folders(tmp: Path) -> list[Path]:
    base = tmp / "results" / "smoke"
    return sorted(p for p in base.iterdir() if p.is_dir()) if base.is_dir() else []


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupt_when(cmd: list[str], tmp: Path, ready) -> subprocess.CompletedProcess[str]:  # noqa: ANN001
    """Start ``cmd``; once ``ready()`` holds, SIGINT its process group; its result."""
    proc = subprocess.Popen(
        cmd,
        cwd=tmp,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        # a shell's background job (nohup pytest ... &) ignores SIGINT, and so would run.py,
        # which inherits it: the child gets Ctrl-C's default, as at a terminal
        preexec_fn=_default_sigint,
    )
    deadline = time.monotonic() + 240
    sent = False
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if ready():
                os.killpg(proc.pid, signal.SIGINT)
                sent = True
                break
            time.sleep(0.05)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert sent, "never caught the run mid-generation"
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _generating(tmp: Path, complete: int) -> bool:
    """``complete`` folders are complete and another holds its lease with its W&B run started
    (models loaded: the warm-up or the generation loop is running)."""
    folders = _folders(tmp)
    running = [f for f in folders if (f / LEASE_FILE).exists() and not is_complete(f)]
    return (
        sum(is_complete(f) for f in folders) == complete
        and len(running) == 1
        and wandb_run_id("smoke", running[0].name) in offline_runs(tmp / "wandb")
    )


def _assert_one_line(out: subprocess.CompletedProcess[str], line: str) -> None:
    assert out.returncode == EXIT_INTERRUPTED, out.stderr[-3000:]
    assert "Traceback" not in out.stderr and "KeyboardInterrupt" not in out.stderr, out.stderr
    assert out.stderr.splitlines()[-1] == line, out.stderr[-3000:]


def _assert_exactly_once(tmp: Path, n: int) -> None:
    folders = _folders(tmp)
    assert len(folders) == n
    for folder in folders:
        assert is_complete(folder)
        assert sorted(p.name for p in folder.iterdir()) == sorted(RESULT_FILES), folder
    ids = offline_runs(tmp / "wandb")
    assert set(ids) == {wandb_run_id("smoke", f.name) for f in folders}
    assert all(len(paths) == 1 for paths in ids.values())


def test_ctrl_c_during_a_run(tmp_path: Path) -> None:
    cmd = _command(tmp_path, *SLOW, "+hydra.callbacks.slow.seconds=0.5", "hydra.run.dir=h")
    first = _interrupt_when(cmd, tmp_path, lambda: _generating(tmp_path, complete=0))
    _assert_one_line(
        first,
        "interrupted: the run did not finish (its result folder is not complete); "
        "the same command runs it again",
    )
    (folder,) = _folders(tmp_path)
    assert not is_complete(folder) and not (folder / LEASE_FILE).exists()

    again = subprocess.run(cmd, cwd=tmp_path, env=_rerun_env(), capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-3000:]
    _assert_exactly_once(tmp_path, 1)


def test_ctrl_c_during_a_sweep(tmp_path: Path) -> None:
    """Three runs; Ctrl-C while the second generates; the same command runs the two missing."""
    cmd = _command(
        tmp_path,
        "-m",
        "method=ar,sps,mtad",
        *SLOW,
        "+hydra.callbacks.slow.seconds=0.5",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
    )
    first = _interrupt_when(cmd, tmp_path, lambda: _generating(tmp_path, complete=1))
    _assert_one_line(
        first,
        "interrupted: 1 of 3 runs finished (1 done), job 1 (method=sps) did not finish, "
        "1 not started; the same command skips the complete runs and runs the 2 missing",
    )
    assert sum(is_complete(f) for f in _folders(tmp_path)) == 1

    again = subprocess.run(cmd, cwd=tmp_path, env=_rerun_env(), capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "sweep: 2 run, 1 skipped (already complete), 0 claimed by another process, 0 failed" in (
        again.stdout
    )
    _assert_exactly_once(tmp_path, 3)


def test_the_line_in_each_state() -> None:
    from mtad.harness.interrupt import Progress

    jobs = [["+experiment=smoke", f"method.gamma={g}"] for g in (2, 3, 4)]
    assert Progress(sweep=True, jobs=jobs).line() == (
        "interrupted before any run of the sweep started; the same command starts it"
    )
    mid = Progress(sweep=True, jobs=jobs, ended=["done", "skipped"], current="job 2 (x)")
    assert mid.line() == (
        "interrupted: 2 of 3 runs finished (1 done, 1 skipped), job 2 (x) did not finish, "
        "0 not started; the same command skips the complete runs and runs the 1 missing"
    )
    between = Progress(sweep=True, jobs=jobs, ended=["done"])
    assert "1 of 3 runs finished (1 done), 2 not started" in between.line()
    unknown = Progress(sweep=True, ended=["failed"], current="job 1 (y)")  # e.g. Optuna
    assert unknown.line() == (
        "interrupted: 1 run finished (1 failed), job 1 (y) did not finish; the same command "
        "skips the complete runs and runs the missing ones"
    )
    assert Progress(ended=["done"]).line().startswith("interrupted after the run finished")
