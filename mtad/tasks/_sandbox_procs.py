"""Process bookkeeping for the parent side of :mod:`mtad.tasks.sandbox` (private): a fresh uid
for a run and the processes of a uid, killing a run's processes, waiting on a pidfd, reading the
verdict pipe without blocking, and the tail of captured output."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import select
import signal
import subprocess
import time

log = logging.getLogger("mtad.tasks.sandbox")  # the sandbox's logger, as before the split

UID_RANGE = (1_900_000, 2_900_000)  # far above any real account


def processes_of_uid(uid: int) -> list[int]:
    """Live (non-zombie) processes whose uid is ``uid``."""
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            with open(f"/proc/{entry.name}/stat") as f:
                state = f.read().rpartition(")")[2].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X"):
            pids.append(int(entry.name))
    return pids


def allocate_uid() -> int:
    rng = random.SystemRandom()
    while True:
        uid = rng.randrange(*UID_RANGE)
        if not processes_of_uid(uid):
            return uid


def kill_everything(proc: subprocess.Popen, uid: int | None) -> None:
    """Kill the run's process group and, with an own uid, every process of that uid."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    if uid is None:
        return
    for _ in range(200):
        pids = processes_of_uid(uid)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)
    log.error("sandbox: processes of uid %d survived SIGKILL: %s", uid, processes_of_uid(uid))


def wait_exit(proc: subprocess.Popen, timeout: float) -> bool:
    """Wait for ``proc`` to exit within ``timeout`` seconds (True if it did).

    Uses a pidfd where the kernel has one: ``Popen.wait(timeout=...)`` polls with sleeps of up to
    50 ms, which would dominate the cost of a short program.
    """
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        try:
            proc.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            return False
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        exited = bool(poller.poll(timeout * 1000))
    finally:
        os.close(fd)
    if exited:
        proc.wait()
    return exited


def read_available(fd: int, limit: int = 4096) -> bytes:
    """What is in the pipe ``fd`` now (every writer is gone or dead), without blocking."""
    os.set_blocking(fd, False)
    data = b""
    with contextlib.suppress(BlockingIOError):
        while len(data) < limit:
            chunk = os.read(fd, limit)
            if not chunk:
                break
            data += chunk
    return data


def output_tail(f, limit: int) -> str:  # type: ignore[no-untyped-def]
    f.seek(0, os.SEEK_END)
    size = f.tell()
    f.seek(max(0, size - limit))
    return f.read().decode("utf-8", errors="replace")
