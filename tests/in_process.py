"""Run a test's script in the test's own process: what it leaves on disk is the same as from a
subprocess, without a new interpreter's imports (torch and transformers, ~4 s each). The tests
keep subprocesses where the process is the point (a kill, a signal, a fault in a save)."""

from __future__ import annotations

import contextlib
import io
import runpy
import signal
import sys


def run_script_here(argv: list[str]) -> str:
    """The script ``argv[0]`` run as ``__main__`` with ``argv`` as its ``sys.argv``: its stdout.
    Signal handlers it installs (a training session ends after its step on SIGTERM / SIGINT)
    are put back, so the test process keeps its own."""
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    saved_argv, out = sys.argv, io.StringIO()
    try:
        sys.argv = list(argv)
        with contextlib.redirect_stdout(out):
            runpy.run_path(argv[0], run_name="__main__")
    finally:
        sys.argv = saved_argv
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    return out.getvalue()
