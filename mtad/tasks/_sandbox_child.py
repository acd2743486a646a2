"""Child side of :mod:`mtad.tasks.sandbox`: inside bubblewrap, set the resource limits, then run
``program.py`` (or, in serve mode, answer calls of its entry point).

When this starts, bubblewrap has built the isolation (:mod:`mtad.tasks._sandbox_bwrap`): new
user, pid, network, IPC and UTS namespaces, a root holding only the interpreter's standard
library, this file, the codec and the scratch folder, no capabilities, ``no_new_privs``. This
process is pid 2 of the new pid namespace, under bwrap's own init (pid 1), which reaps orphans
and exits with this process's status; when it exits the kernel kills whatever the program left
in the namespace, ``setsid``-detached daemons included.

Started as ``python -I -B /sandbox/_sandbox_child.py '<json spec>'`` with the scratch folder as
cwd. Standard library only; never imported by the harness. First it waits at the harness's
gate (:func:`_pass_gate`) until the harness has moved the sandbox into the run's cgroup and
taken hold of bwrap's init. The status descriptor gets one JSON
line, ``{"ready": true}``, just before the program starts, so the parent can tell a sandbox that
failed to come up from a program that failed.

Serve mode (``spec["serve"]``, used by the HumanEval checker, :mod:`mtad.tasks.checker`): the
program defines functions and runs no test; this process then answers calls of the entry point
that the trusted checker sends on a request pipe (:func:`_serve`).
"""

from __future__ import annotations

import json
import os
import resource
import sys

SETUP_FAILED = 125  # exit status when the limits cannot be set (the program never runs)


def _count_processes() -> int:
    """Processes of this pid namespace (all the sandbox's): bwrap's init and this one."""
    return sum(name.isdigit() for name in os.listdir("/proc"))


def _set_limits(spec: dict) -> None:
    cpu = int(spec["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    mem = int(spec["memory_mb"]) << 20
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    fsize = int(spec["file_mb"]) << 20
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    # RLIMIT_NPROC counts the processes of the uid: in a user namespace (Linux >= 5.14) those
    # inside it; on older kernels every process of the uid, so the parent passes how many the
    # uid runs outside (0 with a uid of its own).
    nproc = int(spec["max_procs"]) + _count_processes() + int(spec["host_processes"])
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))


def _pass_gate(gate: dict) -> None:
    """Say hello to the harness and wait until it has moved this sandbox into the run's cgroup
    (``spec["gate"]``, :func:`mtad.tasks.sandbox._move_in`); the gate closed unopened means the
    harness could not, and the program must not run."""
    hello, go = int(gate["hello_fd"]), int(gate["go_fd"])
    os.write(hello, b"1")
    os.close(hello)
    opened = os.read(go, 1) == b"1"
    os.close(go)
    if not opened:
        sys.stderr.write(
            "mtad-sandbox: the harness did not open the gate (the time limit ran out first, "
            "or the run could not enter its cgroup)\n"
        )
        os._exit(SETUP_FAILED)


def _run_program(nonce_fd: int, done_fd: int, serve: dict | None) -> None:
    """Run program.py; only when it returns (no exception, no SystemExit, no early exit of the
    process) hand the harness's nonce back: the proof that the program ran to its end. In
    serve mode, instead, answer calls of the program's entry point (:func:`_serve`)."""
    import runpy

    private = [nonce_fd, done_fd] + ([serve["request_fd"], serve["reply_fd"]] if serve else [])
    for fd in private:
        os.set_inheritable(fd, False)  # not for the program's own child processes
    sys.argv = ["program.py"]
    sys.path.insert(0, os.getcwd())  # -I left out the wrapper's own folder
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
    if "gate" in spec:
        _pass_gate(spec["gate"])
    serve = spec.get("serve")
    if serve is not None:
        import importlib.util

        loader = importlib.util.spec_from_file_location("mtad_plain_data", serve["codec"])
        _CODEC = importlib.util.module_from_spec(loader)
        loader.loader.exec_module(_CODEC)
    status_fd = int(spec["status_fd"])
    try:
        _set_limits(spec)
    except (OSError, ValueError) as err:
        sys.stderr.write(f"mtad-sandbox: setup failed: {err!r}\n")
        os._exit(SETUP_FAILED)
    os.write(status_fd, b'{"ready": true}\n')
    os.close(status_fd)
    code = 0
    try:
        _run_program(int(spec["nonce_fd"]), int(spec["done_fd"]), serve)
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


if __name__ == "__main__":
    main()
