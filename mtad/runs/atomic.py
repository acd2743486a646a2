"""Files replaced whole or not at all: the one way this project writes a file another run reads.

A file is written under a temporary name in its own folder, flushed and ``fsync``-ed, renamed
over the old one (``os.replace``, atomic on POSIX), and the folder is ``fsync``-ed so the rename
itself survives a power cut. Until the rename the previous version is untouched, so a writer
killed mid-save or stopped by a full disk (``ENOSPC`` from ``write`` or ``fsync``) leaves the
last good file in place and no temporary behind (the except path removes it; a ``kill -9``
can leave a ``.*.tmp`` file, which readers never open). Run folders, sweeps and training
checkpoints all go through here.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

TMP_SUFFIX = ".tmp"


def temporary_name(path: Path) -> Path:
    """A hidden sibling of ``path`` unique to this process and call (two writers never share
    one, and a reader globbing the folder does not take it for a result)."""
    return path.parent / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}{TMP_SUFFIX}"


def _fsync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def writing(path: Path) -> Iterator[BinaryIO]:
    """A binary file to write ``path``'s new content into (``torch.save``, ``np.savez`` and
    safetensors take it); ``path`` is replaced when the block ends without an exception. An
    ``OSError`` names ``path`` (a failed ``write`` or ``fsync`` names no file by itself)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_name(path)
    try:
        with open(tmp, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_folder(path.parent)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        if isinstance(err, OSError) and not err.filename:
            err.filename = str(path)
        raise


def write_atomic(path: Path, data: str | bytes) -> None:
    """Replace ``path`` with ``data`` (text is written as UTF-8)."""
    with writing(path) as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)


def append_line_atomic(path: Path, line: str) -> None:
    """``path`` with one more line: the file is rewritten whole (an append cut short by a kill
    or a full disk would leave a torn last line that every later reader trips on). For small
    logs such as a training curve."""
    path = Path(path)
    old = path.read_bytes() if path.is_file() else b""
    if old and not old.endswith(b"\n"):
        old += b"\n"
    write_atomic(path, old + line.rstrip("\n").encode("utf-8") + b"\n")
