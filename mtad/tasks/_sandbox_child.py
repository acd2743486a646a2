"""Child side of :mod:`mtad.tasks.sandbox`: build the isolation, then run ``program.py``.

The parent starts this file as ``python -I -B _sandbox_child.py '<json spec>'`` in a fresh,
single-threaded interpreter (so the multi-threaded parent needs no unsafe ``preexec_fn``), with
the throwaway working directory as cwd. Standard library only; never imported by the harness.
One file on purpose (~380 lines): ``-I`` keeps the script's own folder off ``sys.path`` and the
program's workdir is cwd, so the child can import nothing beside it; splitting it would mean
putting the package on the sandboxed interpreter's path. (Serve mode loads one more file, the
data-only codec ``plain_data.py``, by its path, at start-up, before any privilege is dropped.)

Serve mode (``spec["serve"]``, used by the HumanEval checker, :mod:`mtad.tasks.checker`): the
program defines functions and does not run any test; the program process then answers calls of
the entry point that the trusted checker sends on a request pipe (:func:`_serve`).

Process layout (when namespaces are available)::

    outer   (parent's pid namespace, privileges kept only to wait) -- exits with the program's code
     '- reaper (pid 1 of a new pid namespace, unprivileged): reaps orphans, exits with the program
         '- program (unprivileged, resource-limited): runs program.py

When the reaper dies the kernel kills every process left in its pid namespace, so nothing the
program forks (or ``setsid``-detaches) outlives the run. The outer process reports which
protections it achieved on the status file descriptor as JSON lines; ``{"ready": true}`` is the
last line, written just before the program starts, so the parent can tell a sandbox that failed
to come up from a program that failed.

The design follows the usual container recipe (unshare + mount/pid/net namespaces + rlimits +
dropping to an unprivileged uid), e.g. as described in ``unshare(1)``/``namespaces(7)``; nothing
is copied from another project.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import signal
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_NOATIME = 0x400
MS_NODIRATIME = 0x800
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
MS_RELATIME = 0x200000
MS_STRICTATIME = 0x1000000

PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38

# Per-mount options that must be kept when remounting (the kernel refuses to clear locked ones).
_KEEP_FLAGS = {
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME,
    "relatime": MS_RELATIME,
    "strictatime": MS_STRICTATIME,
}

SETUP_FAILED = 125  # exit code of the outer process when the sandbox itself cannot come up

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_ulong,
    ctypes.c_char_p,
]
_libc.unshare.argtypes = [ctypes.c_int]
_libc.prctl.argtypes = [
    ctypes.c_int,
    ctypes.c_ulong,
    ctypes.c_ulong,
    ctypes.c_ulong,
    ctypes.c_ulong,
]


def _enc(s: str | None) -> bytes | None:
    return None if s is None else s.encode()


def _mount(
    source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None
) -> None:
    if _libc.mount(_enc(source), _enc(target), _enc(fstype), flags, _enc(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {target}: {os.strerror(err)}")


def _prctl(option: int, arg: int) -> None:
    if _libc.prctl(option, arg, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl({option}): {os.strerror(err)}")


def _mount_points() -> list[tuple[str, set[str]]]:
    """(mount point, per-mount options) of every mount visible to this process."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            point = fields[4].encode().decode("unicode_escape")  # \040 etc.
            out.append((point, set(fields[5].split(","))))
    return out


class _Status:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def write(self, **items: object) -> None:
        os.write(self.fd, (json.dumps(items) + "\n").encode())


def _enter_namespaces(spec: dict, status: _Status) -> dict[str, bool]:
    """unshare mount + pid (+ net) namespaces; as non-root inside a new user namespace."""
    got = {"mount": False, "pid": False, "net": False, "user": False}
    if not spec["namespaces"]:
        return got
    root = os.geteuid() == 0
    flags = CLONE_NEWNS | CLONE_NEWPID | (0 if spec["network"] else CLONE_NEWNET)
    if not root:
        flags |= CLONE_NEWUSER
    uid, gid = os.getuid(), os.getgid()
    if _libc.unshare(flags) != 0:
        err = ctypes.get_errno()
        status.write(note=f"unshare failed ({os.strerror(err)}): no namespaces")
        return got
    if not root:
        # Map our own uid/gid into the new user namespace (allowed without privileges).
        with open("/proc/self/setgroups", "w") as f:
            f.write("deny")
        with open("/proc/self/uid_map", "w") as f:
            f.write(f"{uid} {uid} 1")
        with open("/proc/self/gid_map", "w") as f:
            f.write(f"{gid} {gid} 1")
        got["user"] = True
    got["mount"] = got["pid"] = True
    got["net"] = not spec["network"]
    return got


def _isolate_filesystem(
    workdir: str, spec: dict, run_uid: int, run_gid: int, status: _Status
) -> bool:
    """Make every mount read-only in our mount namespace, then put a size-limited tmpfs on the
    working directory. Returns True when the root filesystem became read-only."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    root_ro = False
    failed = []
    for point, opts in _mount_points():
        if point == workdir or point.startswith(workdir.rstrip("/") + "/"):
            continue
        flags = MS_BIND | MS_REMOUNT | MS_RDONLY
        for name, bit in _KEEP_FLAGS.items():
            if name in opts:
                flags |= bit
        try:
            _mount(None, point, None, flags)
            root_ro = root_ro or point == "/"
        except OSError:
            failed.append(point)
    if failed:
        status.write(note=f"could not make read-only: {failed}")
    _mount(
        "tmpfs",
        workdir,
        "tmpfs",
        MS_NOSUID | MS_NODEV,
        f"size={spec['disk_mb']}m,mode=0700,uid={run_uid},gid={run_gid}",
    )
    os.chdir(workdir)  # step onto the new tmpfs (the old cwd is the directory underneath it)
    return root_ro


def _set_limits(spec: dict, run_uid: int) -> None:
    cpu = int(spec["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    mem = int(spec["memory_mb"]) << 20
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    fsize = int(spec["file_mb"]) << 20
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    # RLIMIT_NPROC counts every process of the real uid. With a uid of its own the sandbox
    # counts from zero; sharing the caller's uid, allow what that uid already runs.
    nproc = int(spec["max_procs"]) + 1  # + the reaper
    if not spec["switch_uid"]:
        nproc += _count_processes(run_uid)
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))


def _count_processes(uid: int) -> int:
    n = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                n += entry.stat().st_uid == uid
    return n


def _drop_privileges(spec: dict, in_user_ns: bool) -> None:
    if spec["switch_uid"]:
        uid, gid = int(spec["uid"]), int(spec["gid"])
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)  # from root: clears every capability
        if os.geteuid() != uid or os.getuid() != uid:
            raise OSError("setresuid did not take effect")
    elif in_user_ns:
        # Our uid never was 0 in the user namespace, so clear the capabilities it granted.
        header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this pid
        data = (ctypes.c_uint32 * 6)()
        if _libc.capset(header, data) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"capset: {os.strerror(err)}")
    _prctl(PR_SET_NO_NEW_PRIVS, 1)  # no setuid binary can give privileges back


def _install_audit_guards(workdir: str, block_net: bool, block_fs: bool) -> None:
    """Soft guards (Python audit hooks) used only where the kernel-level isolation is missing.

    They stop plain Python calls, not ctypes or child processes: the report says which
    protections were real.
    """
    prefix = workdir.rstrip("/") + "/"
    write_events = {
        "os.remove",
        "os.rename",
        "os.rmdir",
        "os.mkdir",
        "os.chmod",
        "os.chown",
        "os.truncate",
        "os.symlink",
        "os.link",
        "shutil.rmtree",
        "shutil.move",
    }

    def outside(path: object) -> bool:
        if isinstance(path, int):
            return False
        p = os.path.abspath(os.fsdecode(path))  # type: ignore[arg-type]
        return not (p + "/").startswith(prefix)

    def hook(event: str, args: tuple) -> None:
        if block_net and event.startswith("socket."):
            raise PermissionError("sandbox: network access is disabled")
        if not block_fs:
            return
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None))[:3]
            writing = bool(mode and any(c in str(mode) for c in "wax+")) or bool(
                isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)
            )
            if writing and outside(path):
                raise PermissionError(f"sandbox: writing outside the working directory: {path}")
        elif event in write_events and args and outside(args[0]):
            raise PermissionError(f"sandbox: {event} outside the working directory")

    sys.addaudithook(hook)


def _exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def _reap_until(pid: int) -> int:
    """Wait for ``pid`` while reaping every other child (we may be pid 1 of the namespace)."""
    while True:
        try:
            done, status = os.wait()
        except ChildProcessError:
            return SETUP_FAILED
        except InterruptedError:
            continue
        if done == pid:
            return _exit_code(status)


def _run_program(
    workdir: str, guards: tuple[bool, bool], nonce_fd: int, done_fd: int, serve: dict | None
) -> None:
    """Run program.py; only when it returns (no exception, no SystemExit, no early exit of the
    process) hand the harness's nonce back: the proof that the program ran to its end. In
    serve mode, instead, answer calls of the program's entry point (:func:`_serve`)."""
    import runpy

    private = [nonce_fd, done_fd] + ([serve["request_fd"], serve["reply_fd"]] if serve else [])
    for fd in private:
        os.set_inheritable(fd, False)  # not for the program's own child processes
    if any(guards):
        _install_audit_guards(workdir, *guards)
    sys.argv = ["program.py"]
    sys.path[:] = [p for p in sys.path if p and os.path.abspath(p) != os.path.dirname(__file__)]
    sys.path.insert(0, workdir)
    namespace = runpy.run_path("program.py", run_name="__main__")
    if serve is not None:
        _serve(namespace, serve)
        return
    os.write(done_fd, os.read(nonce_fd, 256))


def _serve(namespace: dict, serve: dict) -> None:
    """Answer calls of ``serve["entry_point"]`` from the trusted checker until it closes the
    request pipe: arguments in, return value (or the exception's type name and message) out,
    all through the data-only codec. Nothing here is trusted: the program runs in this very
    interpreter and may replace any of it; the checker believes only plain data."""
    codec = _CODEC
    request_fd, reply_fd = serve["request_fd"], serve["reply_fd"]
    function = namespace.get(serve["entry_point"])
    if not callable(function):
        found = "not defined" if function is None else f"a {type(function).__name__}"
        codec.write_all(reply_fd, codec.frame(("missing", f"{serve['entry_point']} is {found}")))
        return
    codec.write_all(reply_fd, codec.frame(("ready",)))
    while True:
        request = codec.read_frame(request_fd)
        if request is None:  # the checker is done
            return
        _kind, number, args, kwargs = request
        try:
            value = function(*args, **kwargs)
        except Exception as err:  # the candidate's own exception: its name and message travel
            reply: tuple = ("raised", number, type(err).__name__, _message(err))
        else:
            reply = ("value", number, value)
        try:
            data = codec.frame(reply)
        except codec.NotPlainData as err:
            data = codec.frame(("unplain", number, str(err)))
        codec.write_all(reply_fd, data)


def _message(err: BaseException) -> str:
    try:
        return str(err)[:500]
    except Exception:  # noqa: BLE001 - a __str__ that raises
        return "<unprintable>"


_CODEC = None  # mtad/tasks/plain_data.py, loaded by path in serve mode (see main)


def main() -> None:
    global _CODEC
    spec = json.loads(sys.argv[1])
    serve = spec.get("serve")
    if serve is not None:  # loaded now, while this process can still read the package
        import importlib.util

        loader = importlib.util.spec_from_file_location("mtad_plain_data", serve["codec"])
        _CODEC = importlib.util.module_from_spec(loader)
        loader.loader.exec_module(_CODEC)
    private = [int(spec["nonce_fd"]), int(spec["done_fd"])]
    if serve is not None:
        private += [int(serve["request_fd"]), int(serve["reply_fd"])]
    status = _Status(int(spec["status_fd"]))
    workdir = os.getcwd()
    with open("program.py", encoding="utf-8") as f:
        source = f.read()
    run_uid = int(spec["uid"]) if spec["switch_uid"] else os.getuid()
    run_gid = int(spec["gid"]) if spec["switch_uid"] else os.getgid()

    nonce_fd, done_fd = int(spec["nonce_fd"]), int(spec["done_fd"])
    ns = _enter_namespaces(spec, status)
    fs_ro = False
    if ns["mount"]:
        try:
            fs_ro = _isolate_filesystem(workdir, spec, run_uid, run_gid, status)
        except OSError as e:
            status.write(note=f"filesystem isolation failed: {e}")
            os.chdir(workdir)
        with open("program.py", "w", encoding="utf-8") as f:
            f.write(source)
        os.chown("program.py", run_uid, run_gid)
    isolation = ["rlimits", "session"]
    if ns["pid"]:
        isolation.append("pid_namespace")
    if ns["net"]:
        isolation.append("net_namespace")
    if fs_ro:
        isolation += ["fs_readonly", "tmpfs_workdir"]
    if spec["switch_uid"]:
        isolation.append("own_uid")
    status.write(isolation=isolation)

    reaper = os.fork()
    if reaper == 0:
        code = SETUP_FAILED
        try:
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            if ns["pid"]:
                # On failure the namespace still holds; /proc just shows more than it needs to.
                with contextlib.suppress(OSError):
                    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
            _set_limits(spec, run_uid)
            _drop_privileges(spec, ns["user"])
            guards = (not ns["net"] and not spec["network"], not fs_ro)
            status.write(
                ready=True,
                guards=[n for n, g in zip(("net_audit", "fs_audit"), guards, strict=True) if g],
            )
            os.close(status.fd)
            program = os.fork()
            if program == 0:
                try:
                    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # dies with the reaper
                    _run_program(workdir, guards, nonce_fd, done_fd, serve)
                    code = 0
                except SystemExit as e:
                    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                except BaseException:  # the program's own failure: print it like python does
                    import traceback

                    traceback.print_exc()
                    code = 1
                finally:
                    sys.stdout.flush()
                    sys.stderr.flush()
                os._exit(code)
            for fd in private:
                os.close(fd)  # only the program holds them now
            code = _reap_until(program)
            if spec["switch_uid"] and not ns["pid"]:
                os.kill(-1, signal.SIGKILL)  # every process of the sandbox's own uid but us
        except BaseException as e:  # setup failure: report it, never run the program
            sys.stderr.write(f"mtad-sandbox: setup failed: {e!r}\n")
        finally:
            os._exit(code)
    for fd in (status.fd, *private):
        os.close(fd)
    sys.exit(_reap_until(reaper))


if __name__ == "__main__":
    main()
