"""A control group per sandboxed run (private to :mod:`mtad.tasks.sandbox`): one memory limit
over everything the run allocates, and one CPU share that its children cannot escape.

``RLIMIT_AS`` is per process and counts only mappings: memory-backed files (``memfd_create``,
tmpfs, SysV shared memory) held open but unmapped are outside it, and ``max_procs`` processes
each get their own limit. A memory cgroup charges every page the run's processes allocate,
shmem included, so one limit bounds the run as a whole. Likewise the scheduler shares CPU
between cgroups first: a run with many busy children gets one share, not one per child.

Where the harness can, it creates the run's cgroup as a child of its own (it must be able to
write there: root, or a delegated subtree):

* cgroup v2 (``memory.max``, ``memory.swap.max``, ``cpu.weight.nice``) as children of the
  harness's v2 cgroup when it hands them the ``memory`` controller (``cgroup.subtree_control``),
  else as its siblings (v2 keeps processes in leaves, so a cgroup holding the harness rarely
  can);
* else cgroup v1 (``memory.limit_in_bytes``, ``memory.memsw.limit_in_bytes``, ``cpu.shares``)
  in the hierarchies that carry ``memory`` and ``cpu``.

The run's CPU weight is the harness's own nice level's, so a sample never gets more CPU than one
process of the harness would (a harness under ``nice -n 15`` keeps its samples there). Where no
cgroup can be made (:func:`hierarchy` says why), the sandbox says so in its isolation list and
falls back to what bounds memory without one (:mod:`mtad.tasks._sandbox_seccomp`).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import itertools
import logging
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from mtad.tasks._sandbox_procs import kill_until_gone

log = logging.getLogger("mtad.tasks.sandbox")

# the kernel's nice -> CFS weight table (kernel/sched/core.c, sched_prio_to_weight), for v1's
# cpu.shares; v2 takes the nice level itself (cpu.weight.nice)
_NICE_WEIGHT = (
    88761, 71755, 56483, 46273, 36291, 29154, 23254, 18705, 14949, 11916,
    9548, 7620, 6100, 4904, 3906, 3121, 2501, 1991, 1586, 1277,
    1024, 820, 655, 526, 423, 335, 272, 215, 172, 137,
    110, 87, 70, 56, 45, 36, 29, 23, 18, 15,
)  # fmt: skip
_counter = itertools.count()


@dataclass(frozen=True)
class Hierarchy:
    """Where runs' cgroups go: ``memory`` / ``cpu`` are the harness's own cgroup folders that
    carry those controllers (one folder for both on v2; ``cpu`` is None when it cannot be
    shared out)."""

    version: int
    memory: Path
    cpu: Path | None

    def features(self) -> tuple[str, ...]:
        return ("memory_cgroup",) + (("cpu_cgroup",) if self.cpu is not None else ())


def _mounts(mountinfo: str) -> list[tuple[str, str, str, set[str]]]:
    """(mount point, root inside the hierarchy, fs type, options) of each cgroup mount."""
    found = []
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        mount_point = fields[4].replace("\\040", " ")
        found.append((mount_point, fields[3], tail[0], set(tail[2].split(","))))
    return found


def _folder(mount_point: str, mount_root: str, path: str) -> Path | None:
    """The folder of cgroup ``path`` under a mount of the hierarchy's ``mount_root``."""
    rel = os.path.relpath(path, mount_root)
    if rel.startswith(".."):  # our cgroup lies outside what is mounted
        return None
    return Path(os.path.normpath(os.path.join(mount_point, rel)))


def _writable(folder: Path) -> bool:
    """A child cgroup can be made (and removed) in ``folder``."""
    probe = folder / f"mtad-probe-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        probe.mkdir()
    except OSError:
        return False
    with contextlib.suppress(OSError):
        probe.rmdir()
    return True


def _v2(folder: Path) -> Hierarchy | None:
    """v2: runs' cgroups are children of ours where it hands ``memory`` to its children; that
    is refused (EBUSY) when ours holds processes and is not the root (v2 keeps processes in
    leaves), the usual case. Then they are our siblings, children of our parent, which hands
    out ``memory`` if ours has it, where we may write there (root; else a delegated parent)."""
    found = _v2_children(folder)
    if found is None and folder.parent != folder:
        found = _v2_children(folder.parent, enable=False)
    return found


def _v2_children(folder: Path, *, enable: bool = True) -> Hierarchy | None:
    try:
        enabled = set((folder / "cgroup.subtree_control").read_text().split())
        available = set((folder / "cgroup.controllers").read_text().split())
    except OSError:
        return None
    wanted = [c for c in ("memory", "cpu") if enable and c in available and c not in enabled]
    for controller in wanted:
        with contextlib.suppress(OSError):
            (folder / "cgroup.subtree_control").write_text(f"+{controller}")
            enabled.add(controller)
    if "memory" not in enabled or not _writable(folder):
        return None
    return Hierarchy(2, folder, folder if "cpu" in enabled else None)


def find_hierarchy(proc_cgroup: str, mountinfo: str) -> tuple[Hierarchy | None, str]:
    """The hierarchy to make runs' cgroups in, from ``/proc/self/cgroup`` and
    ``/proc/self/mountinfo``; else (None, why not)."""
    paths: dict[str, str] = {}  # controller ("" for v2) -> our cgroup's path
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(",") if parts[1] else [""]:
                paths[controller] = parts[2]
    mounts = _mounts(mountinfo)
    for mount_point, root, kind, _ in mounts:
        if kind == "cgroup2" and "" in paths:
            folder = _folder(mount_point, root, paths[""])
            found = _v2(folder) if folder is not None else None
            if found is not None:
                return found, ""
    v1: dict[str, Path] = {}
    for mount_point, root, kind, options in mounts:
        for controller in ("memory", "cpu"):
            if kind == "cgroup" and controller in options and controller in paths:
                folder = _folder(mount_point, root, paths[controller])
                if folder is not None and controller not in v1 and _writable(folder):
                    v1[controller] = folder
    if "memory" in v1:
        return Hierarchy(1, v1["memory"], v1.get("cpu")), ""
    if not mounts:
        return None, "no cgroup file system is mounted"
    return None, (
        "no memory cgroup can be created under the harness's own (cgroup v2 without the memory "
        "controller delegated to it, and no writable cgroup v1 memory hierarchy)"
    )


@functools.cache
def hierarchy() -> tuple[Hierarchy | None, str]:
    """:func:`find_hierarchy` for this process, found once."""
    try:
        proc_cgroup = Path("/proc/self/cgroup").read_text()
        mountinfo = Path("/proc/self/mountinfo").read_text()
    except OSError as err:
        return None, f"cannot read the process's cgroups: {err}"
    found, why = find_hierarchy(proc_cgroup, mountinfo)
    if found is None:
        log.warning("sandbox: no per-run cgroup: %s", why)
    return found, why


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


class RunCgroup:
    """The cgroup(s) of one run: made with its limits, the run's processes moved in
    (:meth:`add`), and at the end everything in it killed and the folders removed
    (:meth:`close`)."""

    def __init__(self, where: Hierarchy, memory_bytes: int) -> None:
        name = f"mtad-sandbox-{os.getpid()}-{next(_counter)}-{secrets.token_hex(3)}"
        self.folders: list[Path] = []
        try:
            if where.version == 2:
                self._make(where.memory / name)
                self._limit_v2(self.folders[0], memory_bytes)
            else:
                self._make(where.memory / name)
                self._limit_v1_memory(self.folders[0], memory_bytes)
                if where.cpu is not None and where.cpu != where.memory:
                    self._make(where.cpu / name)
                if where.cpu is not None:
                    nice = min(19, max(-20, os.getpriority(os.PRIO_PROCESS, 0)))
                    _write(self.folders[-1] / "cpu.shares", str(_NICE_WEIGHT[nice + 20]))
        except BaseException:
            self.close()
            raise

    def _make(self, folder: Path) -> None:
        folder.mkdir()
        self.folders.append(folder)

    @staticmethod
    def _limit_v2(folder: Path, memory_bytes: int) -> None:
        _write(folder / "memory.max", str(memory_bytes))
        for name, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
            if (folder / name).exists():  # swap accounting / group kill are optional
                _write(folder / name, value)
        if (folder / "cpu.weight.nice").exists():
            _write(folder / "cpu.weight.nice", str(os.getpriority(os.PRIO_PROCESS, 0)))

    @staticmethod
    def _limit_v1_memory(folder: Path, memory_bytes: int) -> None:
        _write(folder / "memory.limit_in_bytes", str(memory_bytes))
        # memory + swap, set after the memory limit (the kernel wants memsw >= memory); absent
        # when swap accounting is off, and then there is no swap to escape to either
        if (folder / "memory.memsw.limit_in_bytes").exists():
            _write(folder / "memory.memsw.limit_in_bytes", str(memory_bytes))

    def add(self, pid: int) -> None:
        """Move process ``pid`` in (every controller's folder)."""
        for folder in self.folders:
            _write(folder / "cgroup.procs", str(pid))

    def pids(self) -> list[int]:
        found: set[int] = set()
        for folder in self.folders:
            with contextlib.suppress(OSError):
                found.update(int(p) for p in (folder / "cgroup.procs").read_text().split())
        return sorted(found)

    def kill(self) -> None:
        """SIGKILL everything in it until it is empty (``cgroup.kill`` on v2 does it in one
        step; on v1 a forking process may add a child between the read and the kill, so loop)."""
        kill_file = self.folders[0] / "cgroup.kill" if self.folders else None
        if kill_file is not None and kill_file.exists():
            with contextlib.suppress(OSError):
                _write(kill_file, "1")
        survivors = kill_until_gone(self.pids, attempts=500, pause_s=0.002)
        if survivors:
            log.error("sandbox: processes survived SIGKILL in its cgroup: %s", survivors)

    def close(self) -> None:
        """Kill what is left, then remove the folders (an exiting process may keep one busy for
        a moment)."""
        self.kill()
        for folder in reversed(self.folders):
            for _ in range(200):
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as err:
                    if err.errno != errno.EBUSY:
                        log.error("sandbox: cannot remove cgroup %s: %s", folder, err)
                        break
                    time.sleep(0.005)
            else:
                log.error("sandbox: cgroup %s stays busy", folder)
        self.folders = []
