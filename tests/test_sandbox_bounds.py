"""What the sandbox bounds beyond namespaces (issue 38): memory across a run's processes and
memory-backed files, a CPU share its children cannot escape, kernel keys, and processes
reaped before the result returns. Each test runs where the host gives the bound (a per-run
cgroup, a fresh session keyring) and, where a fallback exists, with the cgroup taken away."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import platform
import secrets
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from mtad.tasks import _sandbox_cgroup, _sandbox_seccomp, sandbox
from mtad.tasks._sandbox_cgroup import RunCgroup, find_hierarchy
from mtad.tasks.sandbox import SandboxLimits, in_parallel, run_python

MIB = 1 << 20
CHUNK_MB = 8

# -- memory-backed files ---------------------------------------------------------------------

# Each route allocates CHUNK_MB at a time, keeps it (open descriptors, unmapped, or files) and
# prints the total held after each chunk; "HELD ALL" means it got its target past the limit.
_ROUTES = {
    "memfd": """
        import os
        def chunk(i):
            fd = os.memfd_create(f"m{i}")
            os.ftruncate(fd, CHUNK)
            os.pwrite(fd, b"x" * CHUNK, 0)
            return fd
    """,
    "dev_shm": """
        import os
        def chunk(i):
            fd = os.open(f"/dev/shm/m{i}", os.O_CREAT | os.O_RDWR, 0o600)
            os.pwrite(fd, b"x" * CHUNK, 0)
            return fd
    """,
    "workdir": """
        import os
        def chunk(i):
            with open(f"m{i}", "wb") as f:
                f.write(b"x" * CHUNK)
    """,
    # the scratch folder until it is full, then memfd: the sum is what the limit bounds
    "workdir_then_memfd": """
        import errno, os
        full = []
        def chunk(i):
            if not full:
                try:
                    with open(f"m{i}", "wb") as f:
                        f.write(b"x" * CHUNK)
                    return None
                except OSError as err:
                    if err.errno != errno.ENOSPC:
                        raise
                    os.remove(f"m{i}")
                    full.append(i)
            fd = os.memfd_create(f"m{i}")
            os.pwrite(fd, b"x" * CHUNK, 0)
            return fd
    """,
    "sysv_shm": """
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.shmat.restype = ctypes.c_void_p
        libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
        libc.shmdt.argtypes = [ctypes.c_void_p]
        def chunk(i):
            sid = libc.shmget(0, CHUNK, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
            if sid < 0:
                raise OSError(ctypes.get_errno(), "shmget")
            addr = libc.shmat(sid, None, 0)
            if addr in (None, ctypes.c_void_p(-1).value):
                raise OSError(ctypes.get_errno(), "shmat")
            ctypes.memset(addr, 1, CHUNK)
            libc.shmdt(addr)  # the segment stays, no longer mapped: outside RLIMIT_AS
    """,
}
_HOLD = """
import sys
CHUNK = {chunk_mb} << 20
{route}
held = []
for i in range({chunks}):
    try:
        held.append(chunk(i))
    except OSError as err:
        print("refused", err, flush=True)
        sys.exit(3)
    print("held", (i + 1) * {chunk_mb}, flush=True)
print("HELD ALL", flush=True)
"""


def _hold(route: str, target_mb: int) -> str:
    body = textwrap.dedent(_ROUTES[route])
    return _HOLD.format(chunk_mb=CHUNK_MB, route=body, chunks=target_mb // CHUNK_MB)


def _held_mb(stdout: str) -> int:
    held = [int(line.split()[1]) for line in stdout.splitlines() if line.startswith("held ")]
    return max(held, default=0)


@pytest.fixture
def no_cgroup(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sandbox as on a host where no cgroup can be made."""
    monkeypatch.setattr(sandbox, "hierarchy", lambda: (None, "taken away by the test"))


def _cgroup_here() -> bool:
    return _sandbox_cgroup.hierarchy()[0] is not None


@pytest.mark.parametrize("route", sorted(_ROUTES))
def test_memory_backed_files_past_the_limit_are_stopped(route: str) -> None:
    """A run's limit holds over everything it allocates: 3x the limit held through
    memory-backed files (which RLIMIT_AS does not count) never gets past it."""
    if not _cgroup_here():
        pytest.skip("no per-run cgroup here: test_..._without_a_cgroup covers this host")
    limits = SandboxLimits(wall_s=60.0, memory_mb=96, disk_mb=512, file_mb=CHUNK_MB)
    limit_mb = limits.memory_mb + limits.disk_mb  # the run's cgroup: one process and its folder
    r = run_python(_hold(route, 3 * limit_mb), limits)
    assert "memory_cgroup" in r.isolation
    assert "HELD ALL" not in r.stdout and r.status == "failed", (r.status, r.stdout[-300:])
    assert _held_mb(r.stdout) <= limit_mb


@pytest.mark.parametrize("route", sorted(_ROUTES))
def test_memory_backed_files_are_bounded_without_a_cgroup(route: str, no_cgroup: None) -> None:
    """Without a cgroup: memfd_create and SysV shm are refused, /dev is read-only, and the
    scratch folder is a tmpfs of disk_mb; the list says the cgroup is missing."""
    if not _sandbox_seccomp.supported():
        pytest.skip(f"no seccomp filter for {platform.machine()}")
    limits = SandboxLimits(wall_s=60.0, memory_mb=96, disk_mb=64, file_mb=CHUNK_MB)
    r = run_python(_hold(route, 6 * limits.disk_mb), limits)
    assert "no_memory_cgroup" in r.isolation and "memfd_denied" in r.isolation
    assert "memory_cgroup" not in r.isolation
    assert "HELD ALL" not in r.stdout and r.status == "failed", (r.status, r.stdout[-300:])
    assert _held_mb(r.stdout) <= limits.disk_mb


# -- CPU share --------------------------------------------------------------------------------

_SPIN = """
import os, sys, time
start, end = {start}, {end}
while time.time() < start:
    time.sleep(0.01)
"""
# one process busy from start to end: its CPU seconds per second of the window it saw
_HONEST = (
    _SPIN
    + """
began = time.time()
while time.time() < end:
    pass
print("rate", time.process_time() / max(time.time() - began, 1e-3))
"""
)
# the same window in CHILDREN processes, each in a session of its own where it may
_HOG = (
    _SPIN
    + """
began = time.time()
for _ in range({children}):
    if os.fork() == 0:
        try:
            os.setsid()
        except OSError:
            pass
        while time.time() < end:
            pass
        os._exit(0)
for _ in range({children}):
    os.wait()
ru = __import__("resource").getrusage(__import__("resource").RUSAGE_CHILDREN)
print("rate", (ru.ru_utime + ru.ru_stime) / max(time.time() - began, 1e-3))
"""
)
HOG_CHILDREN = 8


def _rates() -> tuple[float, float, tuple[str, ...]]:
    """(honest run's CPU rate, hog run's CPU rate, isolation) over one common window."""
    start = time.time() + 4.0  # both runs are up by then (~0.3 s each), even on a loaded machine
    window = dict(start=start, end=start + 3.0)
    sources = [
        _HONEST.format(**window),
        _HOG.format(**window, children=HOG_CHILDREN),
    ]
    limits = SandboxLimits(wall_s=30.0, cpu_s=30, max_procs=HOG_CHILDREN + 4)
    results = in_parallel(lambda s: run_python(s, limits), sources, workers=2)
    for r in results:
        assert r.passed, (r.status, r.stderr[-300:])
    honest, hog = (float(r.stdout.split()[-1]) for r in results)
    return honest, hog, results[0].isolation


def test_a_cpu_hog_with_detached_children_does_not_starve_a_concurrent_run() -> None:
    """Two runs at once, one busy process against 8 busy children that each start their own
    session: with a CPU cgroup per run the honest one gets about as much CPU as the whole hog
    (without it, about an eighth: the control below); so it does not time out either."""
    if not _cgroup_here() or _sandbox_cgroup.hierarchy()[0].cpu is None:  # type: ignore[union-attr]
        pytest.skip("no CPU cgroup per run here")
    honest, hog, isolation = _rates()
    assert "cpu_cgroup" in isolation
    assert honest >= 0.4 * hog, f"honest {honest:.3f} CPU s/s against the hog's {hog:.3f}"


def test_without_a_cpu_share_the_list_says_so_and_the_hog_wins(no_cgroup: None) -> None:
    """The control: where the host gives no share (no cgroup, no autogroups), the isolation
    list says ``no_cpu_share``, and the same hog takes several times the honest run's CPU,
    which is what the test above would see without its cgroup."""
    honest, hog, isolation = _rates()
    if "cpu_autogroup" in isolation:
        assert honest >= 0.4 * hog  # the session stays one autogroup: setsid is refused
        return
    assert "no_cpu_share" in isolation and "cpu_cgroup" not in isolation
    assert honest < 0.4 * hog, f"honest {honest:.3f} CPU s/s against the hog's {hog:.3f}"


# -- keyrings ---------------------------------------------------------------------------------

_KEYCTL_NR = {"x86_64": (248, 249, 250), "aarch64": (217, 218, 219)}  # add_key, request, keyctl
KEY_SPEC = {"thread": -1, "process": -2, "session": -3, "user": -4, "user_session": -5}
KEYCTL_READ, KEYCTL_INVALIDATE, KEYCTL_JOIN, KEYCTL_SEARCH = 11, 21, 1, 10

# inside the sandbox: what of the named keys (serials, descriptions) it can reach, and a key of
# its own left in every keyring it can write
_PROBE_KEYS = """
import ctypes, json, sys
ADD, REQUEST, KEYCTL = {numbers}
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
serials, descriptions = {serials}, {descriptions}
seen = []
for serial in serials:
    buf = ctypes.create_string_buffer(256)
    n = libc.syscall(KEYCTL, {read}, ctypes.c_long(serial), buf, ctypes.c_long(256))
    if n >= 0:
        seen.append(("read", serial, buf.raw[:n].decode("latin-1")))
for desc in descriptions:
    for where in (-3, -4, -5, -2, -1):
        n = libc.syscall(KEYCTL, {search}, ctypes.c_long(where), b"user", desc.encode(), 0)
        if n >= 0:
            seen.append(("search", where, desc))
    n = libc.syscall(REQUEST, b"user", desc.encode(), None, 0)
    if n >= 0:
        seen.append(("request", n, desc))
try:
    listed = open("/proc/keys").read()
except OSError:
    listed = ""
seen += [("listed", d) for d in descriptions if d in listed]
left = []
for where in (-3, -4, -5):
    n = libc.syscall(ADD, b"user", b"{leave}", b"left behind", 11, ctypes.c_long(where))
    if n >= 0:
        left.append(n)
print(json.dumps({{"seen": seen, "left": left}}))
"""


class _Keys:
    """keyctl(2) through ctypes, as the harness side of the test."""

    def __init__(self) -> None:
        self.add, self.request, self.keyctl = _KEYCTL_NR[platform.machine()]
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.syscall.restype = ctypes.c_long

    def call(self, number: int, *args: object) -> int:
        n = self.libc.syscall(number, *args)
        if n < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        return n

    def add_key(self, desc: str, payload: bytes, where: int) -> int:
        return self.call(self.add, b"user", desc.encode(), payload, len(payload), where)

    def search(self, where: int, desc: str) -> int:
        return self.call(self.keyctl, KEYCTL_SEARCH, where, b"user", desc.encode(), 0)


def _probe(numbers: tuple[int, int, int], serials: list[int], descs: list[str], leave: str):
    source = _PROBE_KEYS.format(
        numbers=numbers,
        serials=serials,
        descriptions=descs,
        read=KEYCTL_READ,
        search=KEYCTL_SEARCH,
        leave=leave,
    )
    r = run_python(source, SandboxLimits(wall_s=30.0))
    assert r.passed, (r.status, r.stderr[-300:])
    return json.loads(r.stdout.splitlines()[-1]), r.isolation


@pytest.mark.skipif(platform.machine() not in _KEYCTL_NR, reason="keyctl numbers unknown here")
def test_sandboxed_code_sees_no_key_of_the_harness_and_leaves_none_for_the_next_run() -> None:
    """The harness thread holds keys in its session, process, thread and user keyrings (as a
    login session would); a run reads, searches, requests and lists none of them, and a key
    it leaves in every keyring it can write is not there for the next run or the harness."""
    keys = _Keys()
    tag = secrets.token_hex(6)
    outcome: dict[str, object] = {}
    added: list[int] = []

    def harness_thread() -> None:
        try:
            keys.call(keys.keyctl, KEYCTL_JOIN, f"mtad-test-{tag}".encode())
            descs = []
            for name in ("session", "process", "thread", "user"):
                desc = f"mtad-test-{tag}-{name}"
                added.append(keys.add_key(desc, b"harness secret", KEY_SPEC[name]))
                descs.append(desc)
            leave = f"mtad-test-{tag}-left"
            first, isolation = _probe(_KEYCTL_NR[platform.machine()], added, descs, leave)
            second, _ = _probe(_KEYCTL_NR[platform.machine()], first["left"], [leave], "x")
            found = []
            for where in (-3, -4, -5):
                with contextlib.suppress(OSError):
                    found.append(keys.search(where, leave))
            outcome.update(first=first, second=second, isolation=isolation, found=found)
        except BaseException as err:  # noqa: BLE001 - reported in the test's thread
            outcome["error"] = err
        finally:
            for serial in added:  # the user keyring outlives the test: take ours out again
                with contextlib.suppress(OSError):
                    keys.call(keys.keyctl, KEYCTL_INVALIDATE, serial)

    thread = threading.Thread(target=harness_thread)
    thread.start()
    thread.join()
    if isinstance(outcome.get("error"), OSError) and not added:
        pytest.skip(f"keyrings are refused here: {outcome['error']}")
    assert "error" not in outcome, outcome.get("error")
    assert "own_keyring" in outcome["isolation"]  # type: ignore[operator]
    assert outcome["first"]["seen"] == []  # type: ignore[index]
    assert outcome["first"]["left"], "the run could not even add a key to its own session"  # type: ignore[index]
    assert outcome["second"]["seen"] == []  # type: ignore[index]
    assert outcome["found"] == []


# -- reaping ----------------------------------------------------------------------------------


def _processes_of(uid: int) -> list[tuple[int, str]]:
    """Every process of ``uid``, zombies included."""
    found = []
    for p in psutil.process_iter(["uids", "status"]):
        try:
            if p.info["uids"] and p.info["uids"].real == uid:
                found.append((p.pid, p.info["status"]))
        except psutil.Error:
            continue
    return found


def _run_cgroups() -> list[Path]:
    where = _sandbox_cgroup.hierarchy()[0]
    if where is None:
        return []
    folders = {where.memory} | ({where.cpu} if where.cpu is not None else set())
    return [p for f in folders for p in f.glob(f"mtad-sandbox-{os.getpid()}-*")]


def _children() -> set[int]:
    """This process's descendants, zombies included."""
    return {c.pid for c in psutil.Process().children(recursive=True)}


@pytest.mark.parametrize(
    "source",
    [
        "while True:\n    pass\n",  # killed at the deadline
        # a detached daemon, still busy when its run ends
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    while True:\n        pass\n"
        "time.sleep(0.2)\n",
    ],
    ids=["deadline", "daemon"],
)
def test_every_process_is_reaped_before_the_result_returns(source: str) -> None:
    """Not one process of the run (zombies included: bwrap's init was left for the host's pid 1
    to reap) remains once run_python returns, and its cgroup is gone."""
    before = _children()  # a shared pytest worker may hold other tests' children
    r = run_python(source, SandboxLimits(wall_s=1.5))
    assert r.uid is not None or os.geteuid() != 0
    if r.uid is not None:
        assert _processes_of(r.uid) == []
    assert _children() - before == set()
    assert _run_cgroups() == []


def test_every_process_of_a_served_run_is_reaped_when_the_checker_is_done(
    tmp_path: Path,
) -> None:
    """Serve mode (HumanEval's checker): the run is ended by the caller, not by itself; its
    processes are gone and reaped once run_python returns."""
    request_r, request_w = os.pipe()
    reply_r, reply_w = os.pipe()
    serving = sandbox.Serving("f", request_r, reply_w, until=lambda s: time.sleep(0.5) or True)
    before = _children()
    try:
        r = run_python("def f():\n    return 1\n", SandboxLimits(wall_s=10.0), serve=serving)
    finally:
        os.close(request_w)
        os.close(reply_r)
    assert r.status == "served"
    if r.uid is not None:
        assert _processes_of(r.uid) == []
    assert _children() - before == set()


# -- finding a cgroup -------------------------------------------------------------------------


def _fake_v2(tmp_path: Path, subtree: str, controllers: str = "cpu memory pids") -> str:
    ours = tmp_path / "user.slice" / "harness.scope"
    ours.mkdir(parents=True)
    (ours / "cgroup.controllers").write_text(controllers + "\n")
    (ours / "cgroup.subtree_control").write_text(subtree + "\n")
    return f"30 23 0:26 / {tmp_path} rw - cgroup2 cgroup2 rw\n"


def test_a_v2_cgroup_that_hands_out_memory_is_used(tmp_path: Path) -> None:
    mountinfo = _fake_v2(tmp_path, "cpu memory")
    found, why = find_hierarchy("0::/user.slice/harness.scope\n", mountinfo)
    assert found is not None and found.version == 2, why
    assert found.memory == tmp_path / "user.slice" / "harness.scope" == found.cpu
    run = RunCgroup(found, 300 * MIB)
    (folder,) = run.folders
    assert (folder / "memory.max").read_text() == str(300 * MIB)
    assert folder.parent == found.memory and folder.name.startswith("mtad-sandbox-")


def test_v2_runs_go_beside_the_harness_when_its_cgroup_cannot_hand_out_memory(
    tmp_path: Path,
) -> None:
    """v2 keeps processes in leaves: when the harness's cgroup cannot enable memory for
    children (the kernel's EBUSY; here a control file that cannot be written) and its parent
    hands memory out, runs' cgroups are the harness's siblings."""
    mountinfo = _fake_v2(tmp_path, "", controllers="cpu memory")
    parent = tmp_path / "user.slice"
    (parent / "cgroup.controllers").write_text("cpu memory\n")
    (parent / "cgroup.subtree_control").write_text("cpu memory\n")
    control = parent / "harness.scope" / "cgroup.subtree_control"
    control.unlink()
    control.mkdir()  # reads and writes as a file fail, for root too
    found, why = find_hierarchy("0::/user.slice/harness.scope\n", mountinfo)
    assert found is not None and found.version == 2, why
    assert found.memory == parent == found.cpu


def test_without_any_usable_cgroup_the_reason_is_given(tmp_path: Path) -> None:
    mountinfo = _fake_v2(tmp_path, "pids", controllers="pids")  # memory not delegated
    found, why = find_hierarchy("0::/user.slice/harness.scope\n", mountinfo)
    assert found is None and "memory" in why
    found, why = find_hierarchy("0::/\n", "")
    assert found is None and "no cgroup file system" in why


def test_v1_hierarchies_are_used_where_v2_has_no_memory(tmp_path: Path) -> None:
    """This host's layout: cgroup2 with no controller, v1 memory and cpu mounted apart."""
    (tmp_path / "unified").mkdir()
    for name in ("memory/process_api/abc", "cpu"):
        (tmp_path / name).mkdir(parents=True)
    (tmp_path / "unified" / "cgroup.controllers").write_text("\n")
    (tmp_path / "unified" / "cgroup.subtree_control").write_text("\n")
    mountinfo = (
        f"32 31 0:29 / {tmp_path}/cpu rw - cgroup cgroup rw,cpu\n"
        f"35 31 0:32 / {tmp_path}/memory rw - cgroup cgroup rw,memory\n"
        f"41 31 0:38 / {tmp_path}/unified rw - cgroup2 cgroup2 rw\n"
    )
    proc = "4:memory:/process_api/abc\n1:cpu:/\n0::/\n"
    found, why = find_hierarchy(proc, mountinfo)
    assert found is not None and found.version == 1, why
    assert found.memory == tmp_path / "memory/process_api/abc" and found.cpu == tmp_path / "cpu"
    run = RunCgroup(found, 200 * MIB)
    memory, cpu = run.folders
    assert (memory / "memory.limit_in_bytes").read_text() == str(200 * MIB)
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    assert (cpu / "cpu.shares").read_text() == str(_sandbox_cgroup._NICE_WEIGHT[nice + 20])
