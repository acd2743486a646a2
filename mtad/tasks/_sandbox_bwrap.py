"""The sandbox's view of the host, as a bubblewrap command line (private to
:mod:`mtad.tasks.sandbox`).

bubblewrap (``bwrap``, the tool Flatpak builds its sandboxes with; Debian package
``bubblewrap``) creates the namespaces and the mounts; this module only decides what goes in:

* the interpreter, found by running it once outside the sandbox (:func:`interpreter`): its
  executable, the folders of its standard library (``sys.path`` of ``python -I -S``), and every
  shared object it and its standard-library extension modules load, each at the path the
  dynamic loader opens it by, with the symlinks on the way (``/lib64 -> usr/lib64`` ...);
  ``site-packages`` / ``dist-packages`` inside those folders are covered by an empty read-only
  tmpfs, so not one installed package (and no data set shipped in one) is visible;
* the sandbox's own wrapper and the data-only codec, read-only under :data:`CHILD_DIR`;
* a fresh, size-limited tmpfs as the scratch folder (:data:`SCRATCH`: cwd, ``HOME``,
  ``TMPDIR``) holding ``program.py``; a new ``/proc`` (this pid namespace only) and a minimal
  read-only ``/dev``; the root itself is an empty read-only tmpfs.

Nothing else of the host exists inside: no virtual environment, project tree, home folder,
data set or other run's files. What is and is not isolated, and why: ``docs/sandbox.md``.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

CHILD_DIR = "/sandbox"  # the wrapper (_sandbox_child.py) and the codec, read-only
SCRATCH = "/tmp"  # the only writable folder: a fresh tmpfs per run
BWRAP_MIN_VERSION = (0, 8)  # --disable-userns; Debian 12 ships 0.8.0
INSTALL_HINT = "install bubblewrap: scripts/setup.sh does it (apt-get install bubblewrap)"


class SandboxError(RuntimeError):
    """The sandbox itself could not be set up (not a failure of the program): bubblewrap
    missing or refused, an interpreter it cannot run; the message says why."""


# Run as ``python -I -S -W ignore -c`` outside the sandbox: what the interpreter maps into
# memory once every extension module of its standard library is loaded (libgcc_s too: glibc
# loads it lazily when a thread exits through pthread_exit), as the loader opened each file.
_PROBE = r"""
import ctypes, importlib.machinery, json, os, sys
paths = [p for p in sys.path if os.path.isdir(p)]
suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
for folder in paths:
    for name in sorted(os.listdir(folder)):
        if name.endswith(suffixes) and not name.startswith(("_test", "xx", "_xx", "_ctypes_t")):
            try:
                __import__(name.split(".")[0])
            except Exception:
                pass
try:
    ctypes.CDLL("libgcc_s.so.1")
except OSError:
    pass
opened = []
class Info(ctypes.Structure):
    _fields_ = [("addr", ctypes.c_void_p), ("name", ctypes.c_char_p)]
@ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
def each(info, size, data):
    name = ctypes.cast(info, ctypes.POINTER(Info)).contents.name
    if name and name.startswith(b"/"):
        opened.append(os.fsdecode(name))
    return 0
ctypes.CDLL(None).dl_iterate_phdr(each, None)
print(json.dumps({"executable": sys.executable, "paths": paths, "opened": opened,
                  "version": sys.version.split()[0]}))
"""


@dataclass(frozen=True)
class Interpreter:
    """A Python as the sandbox sees it. ``executable``: the real file (a venv's ``python`` is a
    symlink to its base interpreter, which is what runs); ``paths``: its standard-library
    folders; ``hidden``: package folders inside them; ``opened``: the shared objects it loads."""

    executable: str
    paths: tuple[str, ...]
    hidden: tuple[str, ...]
    opened: tuple[str, ...]
    version: str


def _probe_user(uid: int | None) -> dict:
    if uid is None:
        return {}
    return {"user": uid, "group": uid, "extra_groups": []}


@functools.cache
def interpreter(python: str, uid: int | None) -> Interpreter:
    """``python`` as run by ``uid`` (None: this process's own). Raises
    :class:`SandboxError` naming the problem (missing, not executable, unreadable by
    ``uid``, not a Python)."""
    path = Path(python)
    if not path.exists():
        raise SandboxError(f"{python} does not exist")
    real = os.path.realpath(path)
    if not os.path.isfile(real) or not os.access(real, os.X_OK):
        raise SandboxError(f"{python} is not an executable file")
    # the sandbox runs as this uid (root hands it a fresh one): it must be able to read it all
    who = "" if uid is None else " as an unprivileged user (is its folder readable by all?)"
    try:
        proc = subprocess.run(
            [real, "-I", "-S", "-B", "-W", "ignore", "-c", _PROBE],
            capture_output=True,
            text=True,
            timeout=60,
            cwd="/",
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            **_probe_user(uid),
        )
    except (OSError, subprocess.SubprocessError) as err:
        raise SandboxError(f"{python} does not run{who}: {err}") from err
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        raise SandboxError(f"{python} does not run{who}: {last[:200]}")
    try:
        found = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError) as err:
        raise SandboxError(f"{python} is not a Python interpreter") from err
    paths = tuple(os.path.realpath(p) for p in found["paths"])
    hidden = tuple(
        os.path.join(p, name)
        for p in paths
        for name in ("site-packages", "dist-packages")
        if os.path.isdir(os.path.join(p, name)) and not os.path.islink(os.path.join(p, name))
    )
    return Interpreter(
        executable=os.path.realpath(found["executable"]),
        paths=paths,
        hidden=hidden,
        opened=tuple(dict.fromkeys(found["opened"])),
        version=found["version"],
    )


@functools.cache
def bwrap_path() -> str:
    """The ``bwrap`` binary, new enough (:data:`BWRAP_MIN_VERSION`)."""
    found = shutil.which("bwrap")
    if found is None:
        raise SandboxError(f"bubblewrap (bwrap) is not installed; {INSTALL_HINT}")
    out = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=30)
    m = re.search(r"(\d+)\.(\d+)", out.stdout)
    if not m or (int(m.group(1)), int(m.group(2))) < BWRAP_MIN_VERSION:
        need = ".".join(map(str, BWRAP_MIN_VERSION))
        raise SandboxError(
            f"{found} is {out.stdout.strip() or 'of unknown version'}; need {need} or newer"
        )
    return found


def _resolve(path: str, links: dict[str, str], depth: int = 0) -> str:
    """The real path of ``path``; every symlink met on the way goes into ``links``
    (link -> its target as written), so the sandbox can recreate the same chain."""
    if depth > 40:
        raise SandboxError(f"too many symlinks resolving {path}")
    parts = Path(os.path.normpath(path)).parts
    current = "/"
    for i, part in enumerate(parts[1:], 1):
        step = os.path.join(current, part)
        if os.path.islink(step):
            target = os.readlink(step)
            links[step] = target
            # ``current`` holds no symlink, so ``..`` in the target normalises correctly
            rest = os.path.join(os.path.normpath(os.path.join(current, target)), *parts[i + 1 :])
            return _resolve(rest, links, depth + 1)
        current = step
    return current


def _inside(path: str, folders: tuple[str, ...] | list[str]) -> bool:
    return any(path == f or path.startswith(f.rstrip("/") + "/") for f in folders)


def host_view(interp: Interpreter) -> list[str]:
    """bwrap options that put the interpreter in the sandbox, read-only, and nothing else."""
    links: dict[str, str] = {}
    folders = [_resolve(p, links) for p in interp.paths]
    files = [_resolve(p, links) for p in (interp.executable, *interp.opened)]
    clash = [p for p in (*folders, *files, *links) if _inside(p, [SCRATCH, CHILD_DIR])]
    if clash:  # the scratch tmpfs would cover it
        raise SandboxError(
            f"{interp.executable}: {clash[0]} lies under {SCRATCH} or {CHILD_DIR}, which the "
            "sandbox replaces; use an interpreter installed elsewhere"
        )
    args: list[str] = []
    for link, target in links.items():
        if not _inside(link, folders):
            args += ["--symlink", target, link]
    for folder in dict.fromkeys(folders):
        args += ["--ro-bind", folder, folder]
    for file in dict.fromkeys(files):
        if not _inside(file, folders):
            args += ["--ro-bind", file, file]
    for hidden in interp.hidden:  # empty, read-only: no installed package is visible
        args += ["--tmpfs", hidden, "--remount-ro", hidden]
    # the loader's cache only lists library paths; without it the loader searches its defaults
    args += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    return args


def command(
    interp: Interpreter,
    *,
    wrapper: str,
    child_fds: dict[str, int],
    wrapper_args: list[str],
    program_fd: int,
    disk_mb: int,
    network: bool,
    seccomp_fd: int | None = None,
) -> list[str]:
    """The full ``bwrap ... -- python -I -B <wrapper> <args>`` command line. ``child_fds``
    (file name -> descriptor, ``wrapper`` among them) are copied into read-only files under
    :data:`CHILD_DIR`: from descriptors, not bound from the project's tree, which the sandbox's
    unprivileged uid may not be able to reach (a checkout under a 0700 home or temp folder).
    ``program_fd`` is read into ``SCRATCH/program.py``; ``seccomp_fd``, when given, holds a
    seccomp filter that bwrap loads just before it starts the interpreter."""
    args = [
        bwrap_path(),
        "--unshare-all",  # user, pid, net, ipc, uts, cgroup (if possible) namespaces
        "--unshare-user",  # explicit: --disable-userns needs it
        "--disable-userns",  # no nested user namespace: no way to gain capabilities again
        "--die-with-parent",
        "--new-session",  # no TIOCSTI into a terminal
        "--hostname",
        "sandbox",
    ]
    if network:
        args.append("--share-net")
    if seccomp_fd is not None:
        args += ["--seccomp", str(seccomp_fd)]
    args += host_view(interp)
    for name, fd in child_fds.items():
        args += ["--perms", "0444", "--ro-bind-data", str(fd), f"{CHILD_DIR}/{name}"]
    args += ["--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev"]
    args += ["--size", str(disk_mb << 20), "--perms", "0700", "--tmpfs", SCRATCH]
    args += ["--perms", "0600", "--file", str(program_fd), f"{SCRATCH}/program.py"]
    args += ["--chdir", SCRATCH, "--remount-ro", "/"]
    return [
        *args,
        "--",
        interp.executable,
        "-I",
        "-B",
        f"{CHILD_DIR}/{wrapper}",
        *wrapper_args,
    ]
