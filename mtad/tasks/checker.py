"""HumanEval verdicts that the generated code cannot forge: tests in a trusted process, the
completion in the sandbox, plain data between them.

Per sample, two processes:

* the **sandboxed program** (:func:`mtad.tasks.sandbox.run_python` in serve mode): the
  problem's prompt plus the completion, in the bubblewrap sandbox (only the interpreter's
  standard library and a scratch folder visible; namespaces, own uid, rlimits:
  ``docs/sandbox.md``); it runs no test, it only answers calls of the entry point;
* the **trusted checker** (``_checker_child.py``, the harness's own interpreter, never touched
  by the completion): the data set's tests, whose ``candidate(*args)`` crosses a pipe through
  the data-only codec :mod:`mtad.tasks.plain_data`.

The verdict exists only in the checker, and reaches the harness on a pipe the sandbox never
holds. Whatever the completion does inside its own process (ending it with status 0, writing
forged proofs to every descriptor it finds, replacing the serve loop, printing "passed") gives
at most a wrong or missing answer to a call; objects with rigged comparisons cannot cross (only
exact plain types decode), so every ``==`` of the tests compares plain values. Idea after the
split of untrusted code and trusted judge in e.g. CodeContests/AlphaCode-style judges and
EvalPlus' differential testing; the implementation is ours.

Cost: one more process per sample; `bench/humaneval_checker.py` measures it against the
exit-status path side by side.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtad.tasks._sandbox_procs import output_tail, read_available, wait_exit
from mtad.tasks.sandbox import (
    SandboxLimits,
    SandboxResult,
    Serving,
    default_python,
    in_parallel,
    run_python,
)

_CHECKER = Path(__file__).with_name("_checker_child.py")
_CODEC = Path(__file__).with_name("plain_data.py")
GRACE_S = 2.0  # the checker's own deadline is the problem's; the harness waits this much more


@dataclass
class Verdict:
    """``status`` ``"ok"`` is a pass; the others are listed in ``_checker_child.py``."""

    status: str
    reason: str
    calls: int
    sandbox: SandboxResult

    @property
    def passed(self) -> bool:
        return self.status == "ok"


def program_source(problem: dict[str, Any], completion: str) -> str:
    """What the sandbox runs: prompt + completion, no tests."""
    return problem["prompt"] + completion + "\n"


def check_completion(
    problem: dict[str, Any],
    completion: str,
    limits: SandboxLimits | None = None,
    *,
    python: str | None = None,
) -> Verdict:
    """The verdict on one completion of ``problem`` (``prompt``, ``test``, ``entry_point``)."""
    limits = limits or SandboxLimits()
    request_r, request_w = os.pipe()  # checker -> sandbox: calls
    reply_r, reply_w = os.pipe()  # sandbox -> checker: results
    verdict_r, verdict_w = os.pipe()  # checker -> harness
    spec = {
        "codec": str(_CODEC),
        "wall_s": limits.wall_s,
        "memory_mb": limits.memory_mb,
        "request_fd": request_w,
        "reply_fd": reply_r,
        "verdict_fd": verdict_w,
    }
    problem_json = json.dumps({k: problem[k] for k in ("prompt", "test", "entry_point")})
    with tempfile.TemporaryFile() as err:
        try:
            checker = subprocess.Popen(
                [sys.executable, "-I", "-S", "-B", str(_CHECKER), json.dumps(spec)],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=err,
                pass_fds=(request_w, reply_r, verdict_w),
                cwd=tempfile.gettempdir(),
                start_new_session=True,
            )
        finally:
            for fd in (request_w, reply_r, verdict_w):
                os.close(fd)
        try:
            assert checker.stdin is not None
            with contextlib.suppress(BrokenPipeError):
                checker.stdin.write(problem_json.encode())
                checker.stdin.close()
            serving = Serving(
                entry_point=problem["entry_point"],
                request_fd=request_r,
                reply_fd=reply_w,
                until=lambda seconds: wait_exit(checker, seconds + GRACE_S),
            )
            sandboxed = run_python(
                program_source(problem, completion), limits, python=python, serve=serving
            )
        finally:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(checker.pid, signal.SIGKILL)
            checker.wait()
            data = read_available(verdict_r)
            os.close(verdict_r)
        checker_err = output_tail(err, 2000).strip()
    return _verdict(data, checker.returncode, checker_err, sandboxed)


def _verdict(data: bytes, returncode: int, stderr: str, sandboxed: SandboxResult) -> Verdict:
    if sandboxed.status == "timeout":
        return Verdict(
            "timeout", f"no verdict within {GRACE_S:g} s past the time limit", 0, sandboxed
        )
    try:
        got = json.loads(data)
        status, reason, calls = str(got["status"]), str(got["reason"]), int(got["calls"])
    except (ValueError, KeyError, TypeError):
        last = stderr.splitlines()[-1] if stderr else ""
        return Verdict(
            "checker_error",
            f"the checker ended without a verdict (exit {returncode}) {last}",
            0,
            sandboxed,
        )
    if status == "incomplete" and sandboxed.stderr.strip():
        reason += f" ({sandboxed.stderr.strip().splitlines()[-1][:200]})"
    return Verdict(status, reason, calls, sandboxed)


def check_many(
    items: Sequence[tuple[dict[str, Any], str]],
    limits: SandboxLimits | None = None,
    *,
    workers: int = 2,
    python: str | None = None,
) -> list[Verdict]:
    """:func:`check_completion` over (problem, completion) pairs, ``workers`` at a time."""
    python = python or default_python()

    def one(item: tuple[dict[str, Any], str]) -> Verdict:
        return check_completion(item[0], item[1], limits, python=python)

    return in_parallel(one, items, workers)
