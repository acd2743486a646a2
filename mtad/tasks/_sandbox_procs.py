"""Process bookkeeping for the parent side of :mod:`mtad.tasks.sandbox` (private): a fresh uid
for a run and the processes of a uid, a fresh session keyring, killing and reaping a run's
processes, waiting on a pidfd, reading the verdict pipe without blocking, and the tail of
captured output."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import platform
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


# keyctl(2)'s number where the C library has no wrapper (glibc has none: it is libkeyutils')
_KEYCTL = {"x86_64": 250, "aarch64": 219, "riscv64": 219, "ppc64le": 271, "s390x": 280}
_KEYCTL_JOIN_SESSION_KEYRING = 1


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def join_fresh_session_keyring() -> bool:
    """Give the calling *thread* a new, empty, anonymous session keyring (keyrings are per
    thread since Linux 3.8, and a process starts with its creating thread's): processes it
    starts then hold no key of the harness's session, and what they leave there dies with
    them. False where keyctl is unknown here or refused (a container's seccomp profile: then
    the sandbox cannot reach any keyring either)."""
    number = _KEYCTL.get(platform.machine())
    if number is None:
        return False
    return _libc().syscall(number, _KEYCTL_JOIN_SESSION_KEYRING, None) >= 0


_PR_SET_CHILD_SUBREAPER = 36


@functools.cache
def become_subreaper() -> bool:
    """Make this process a child subreaper (once): a process whose parent dies while it runs
    comes to this process instead of the host's pid 1. bwrap's outer process exits as soon as
    its init reports the program's exit status, without waiting for that init; so the init
    comes back here, and :func:`reap_adopted` reaps it before the run's result returns.
    Orphans of this process's other descendants would come here too (Python's subprocess
    waits only for its own children; none of ours daemonizes)."""
    return _libc().prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def pidfd(pid: int) -> int | None:
    """A pidfd for ``pid`` (None where the kernel has none, or it is gone)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def reap_adopted(
    inits: list[tuple[int, int | None]], uid: int | None, timeout: float = 5.0
) -> None:
    """Wait for each run's bwrap init (pid, pidfd) to exit, and reap it if it came to this
    process (:func:`become_subreaper`); one the outer bwrap reaped is not a child here. With
    none taken hold of (the wrapper failed to start) and a uid of the run's own, every child
    of that uid left here instead."""
    deadline = time.monotonic() + timeout
    for pid, fd in inits:
        if fd is not None:
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            poller.poll(max(0.0, deadline - time.monotonic()) * 1000)
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitid(os.P_PIDFD, fd, os.WEXITED | os.WNOHANG)
        else:  # no pidfd: the pid stays ours (a zombie of this process) until reaped here
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
    if inits or uid is None:
        return
    me = os.getpid()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError, ChildProcessError):
                if entry.stat().st_uid != uid:
                    continue
                with open(f"/proc/{entry.name}/stat") as f:
                    fields = f.read().rpartition(")")[2].split()
                if int(fields[1]) == me and fields[0] in ("Z", "X"):
                    os.waitpid(int(entry.name), 0)


def children(pid: int) -> list[int]:
    """The child processes of ``pid``."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    found: list[int] = []
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found += [int(c) for c in f.read().split()]
        except OSError:
            return _children_by_scan(pid)  # a kernel without CONFIG_PROC_CHILDREN
    return found


def _children_by_scan(pid: int) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with (
                contextlib.suppress(OSError, IndexError, ValueError),
                open(f"/proc/{entry.name}/stat") as f,
            ):
                if int(f.read().rpartition(")")[2].split()[1]) == pid:
                    found.append(int(entry.name))
    return found


def end_sandbox(proc: subprocess.Popen, timeout: float = 5.0) -> None:
    """End bwrap's sandbox from the inside out and reap it: SIGKILL its init (the child of
    ``proc``, pid 1 of the run's pid namespace), so the kernel ends everything else in the
    namespace and waits for it; ``proc`` (the outer bwrap) then reaps its init and exits, and
    this process reaps ``proc``. Killing the outer bwrap first would orphan the init to the
    host's pid 1, which reaps it late or, on a host whose pid 1 does not reap, never."""
    if proc.poll() is not None:
        return
    for pid in children(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    wait_exit(proc, timeout, reap=False)


def kill_everything(proc: subprocess.Popen, uid: int | None) -> None:
    """End the sandbox (:func:`end_sandbox`), then kill what is left in the run's process
    group and, with an own uid, every process of that uid; ``proc`` is reaped on return."""
    end_sandbox(proc)
    if proc.returncode is None:  # not reaped yet: its pid (and process group) is still ours
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    if uid is None:
        return
    survivors = kill_until_gone(lambda: processes_of_uid(uid), attempts=200, pause_s=0.01)
    if survivors:
        log.error("sandbox: processes of uid %d survived SIGKILL: %s", uid, survivors)


def kill_until_gone(list_pids, attempts: int, pause_s: float) -> list[int]:
    """SIGKILL every pid ``list_pids()`` names until it names none (a forking process may add
    a child between the read and the kill, so loop); the survivors after ``attempts``."""
    for _ in range(attempts):
        pids = list_pids()
        if not pids:
            return []
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(pause_s)
    return list(list_pids())


def wait_exit(proc: subprocess.Popen, timeout: float, *, reap: bool = True) -> bool:
    """Wait for ``proc`` to exit within ``timeout`` seconds (True if it did); with ``reap``
    false an exited ``proc`` stays a zombie, so its pid (and process group) cannot be reused
    before the caller is done with them (without pidfds it is reaped all the same).

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
    if exited and reap:
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
