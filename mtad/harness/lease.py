"""One owner per run at a time: a lease, an exclusive lock on ``<result folder>/.lease``.

Two sweeps over one study (two SLURM arrays, a joblib launcher, a user re-running a command
while the first is still going) must never run the same signature at once: they would write
one folder twice and leave two W&B runs. Before a run starts, :func:`lease` takes a
non-blocking exclusive ``flock`` on ``.lease`` in its result folder and writes the owner into
it (host, pid, SLURM job id, start time). A run that finds the lock held is reported as
*claimed by* that owner: skipped by this sweep, not failed; a rerun completes it if the owner
died without finishing.

Why a kernel lock rather than ``O_EXCL`` + liveness checks: the lock is released by the kernel
when its owner dies, ``kill -9``, OOM killer and SLURM's SIGKILL included, so a dead owner's
lease is stale by construction and the next run takes it over; no pid-reuse or clock-skew
heuristics. On NFS (v4, or v3 with lockd) ``flock`` is forwarded to the server as a POSIX lock
and a dead client's lock expires with its lease (about 90 s). A filesystem without locks (Lustre
mounted ``noflock``) makes :func:`lease` warn once and run without a lease.

The owner unlinks ``.lease`` when it is done (the folder then holds only result files). Since a
waiting process may have opened the old file just before the unlink, a lock only counts when
the locked file is still the one at the path (same inode); otherwise the lease is retried.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

LEASE_FILE = ".lease"
SLURM_KEYS = ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_RESTART_COUNT")
_NO_LOCKS = (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL)


class LeaseHeld(RuntimeError):
    """Another live process holds the run's lease."""

    def __init__(self, folder: Path, owner: dict[str, Any]) -> None:
        self.folder = folder
        self.owner = owner
        super().__init__(f"{folder.name}: claimed by {describe(owner)}")


def owner_info() -> dict[str, Any]:
    """Who runs this process: host, pid, SLURM job (when under SLURM), start time."""
    info: dict[str, Any] = {"host": socket.gethostname(), "pid": os.getpid()}
    info.update({k.lower(): os.environ[k] for k in SLURM_KEYS if k in os.environ})
    if "SLURM_ARRAY_TASK_ID" in os.environ:
        # what scancel / squeue take for this array task (SLURM_JOB_ID of the array's first
        # task is the array's own id: signalling it would reach every task)
        info["slurm_job"] = (
            f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
        )
    elif "SLURM_JOB_ID" in os.environ:
        info["slurm_job"] = os.environ["SLURM_JOB_ID"]
    info["since"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    return info


def describe(owner: dict[str, Any]) -> str:
    if not owner:
        return "another process"
    text = f"{owner.get('host', '?')} pid {owner.get('pid', '?')}"
    if owner.get("slurm_job"):
        text += f" (SLURM job {owner['slurm_job']})"
    if owner.get("since"):
        text += f" since {owner['since']}"
    return text


def read_owner(folder: Path) -> dict[str, Any]:
    try:
        value = json.loads((folder / LEASE_FILE).read_text() or "{}")
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _acquire(folder: Path) -> int | None:
    """The locked lease file's descriptor; None on a filesystem without locks."""
    path = folder / LEASE_FILE
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise LeaseHeld(folder, read_owner(folder)) from None
        except OSError as err:
            os.close(fd)
            if err.errno not in _NO_LOCKS:
                raise
            warnings.warn(
                f"{folder.parent}: the filesystem has no file locks ({err.strerror}); runs are "
                "no lease taken, so two sweeps over this study may run one signature twice",
                stacklevel=3,
            )
            return None
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)  # the previous owner unlinked it after we opened it: try again


@contextlib.contextmanager
def lease(folder: Path) -> Iterator[dict[str, Any]]:
    """Hold the lease of ``folder`` for the ``with`` block; raise :class:`LeaseHeld` when a live
    process holds it. Yields the owner record written into the lease file."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = _acquire(folder)
    owner = owner_info()
    if fd is None:
        yield owner
        return
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(owner).encode(), 0)
        yield owner
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(folder / LEASE_FILE)
        os.close(fd)  # releases the lock


__all__ = ["LEASE_FILE", "LeaseHeld", "lease", "describe", "owner_info", "read_owner"]
