"""Run a script with one save of a named file cut short (tests only, never imported by the
harness): the training writers' crash tests run the real training in a subprocess under it.

    python tests/save_fault.py NAME:N:KIND SCRIPT [ARGS...]

The ``N``-th save of a file called ``NAME`` through :mod:`mtad.runs.atomic`, for ``KIND``:

- ``kill``: writes its content, cuts the temporary file to half its bytes and SIGKILLs the
  process (a kill in the middle of the save: the new bytes are on disk under the temporary
  name, not renamed);
- ``enospc``: the same cut, then the write fails with ``ENOSPC`` (a full disk), which the
  script sees as an ``OSError`` from its save;
- ``stop``: completes the save, then the process SIGSTOPs itself, for the test to kill it from
  outside at a known step (polling for a step raced a fast run to its end).
"""

from __future__ import annotations

import errno
import os
import runpy
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO


def install(name: str, nth: int, kind: str) -> None:
    from mtad.runs import atomic

    real = atomic.writing
    seen = [0]

    @contextmanager
    def writing(path: Path) -> Iterator[BinaryIO]:
        hit = False
        with real(path) as f:
            yield f
            if Path(path).name == name:
                seen[0] += 1
                hit = seen[0] == nth
                if hit and kind != "stop":
                    f.flush()
                    f.truncate(f.tell() // 2)
                    if kind == "kill":
                        os.kill(os.getpid(), signal.SIGKILL)
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if hit:  # "stop": the save is whole and in place
            os.kill(os.getpid(), signal.SIGSTOP)

    atomic.writing = writing  # before the script imports anything that binds the name


if __name__ == "__main__":
    spec, script, *args = sys.argv[1:]
    name, nth, kind = spec.split(":")
    assert kind in ("kill", "enospc", "stop"), kind
    install(name, int(nth), kind)
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")
