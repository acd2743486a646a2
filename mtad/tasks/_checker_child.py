"""The trusted HumanEval checker process (private to :mod:`mtad.tasks.checker`).

Started as ``python -I -S -B _checker_child.py '<json spec>'`` with the problem (``prompt``,
``test``, ``entry_point``) as JSON on stdin. It runs the data set's code only: the prompt (for
the helper functions the tests call, e.g. ``poly`` of HumanEval/32, ``encode_cyclic`` of
HumanEval/38) and the test's ``check``, with the entry point bound to a proxy whose every call
crosses a pipe to the sandboxed program (:func:`mtad.tasks._sandbox_child._serve`): arguments
and results travel through the data-only codec ``plain_data.py`` (loaded by path), so the
completion's objects never exist here and its code never runs here. The verdict (one JSON
object) goes to the harness on a descriptor the sandbox has no access to.

Its own budget: a reply's size is checked from its header before it is read
(``MAX_FRAME_BYTES``), its decoding is bounded in nesting, time (``DECODE_BUDGET_S`` from its
arrival) and hash flooding (``plain_data._Decoder``), and the whole process in CPU seconds, so
an adversarial reply fails within a second instead of holding the checker to the outer deadline.

Statuses: ``ok``; ``failed`` (an assertion of the tests, or an error they raised on the
results); ``raised`` (the completion raised; its type name and message are the reason);
``not_plain`` (it returned something other than plain data); ``incomplete`` (the sandboxed
process ended before the tests finished, or the entry point is missing); ``timeout``;
``protocol`` (a malformed reply); ``unsupported`` (the tests pass the candidate something the
codec cannot carry: a limit of this checker, not of the completion; none of the 164 problems
does).

What the pipe changes, checked on the 164 problems: (1) the prompt's own definition of the
entry point (a docstring-only stub) is replaced by the proxy under the entry point's name too:
HumanEval/33's tests call ``sort_third`` by name, which in the data set's own program is the
completed function, so this keeps their meaning; (2) arguments are copies, so a candidate that
mutates its arguments no longer changes the tests' objects: no test of the 164 depends on it
(of those passing a variable, /32 and /50 pass deep copies, /38, /44 and /53 immutable values,
and /151 computes its expectation before the call); (3) every test passes plain
data only (ints, floats, strings, lists, tuples, dicts), so ``unsupported`` never occurs there.
"""

from __future__ import annotations

import json
import os
import resource
import select
import sys
import time
import traceback

_CODEC = None  # plain_data.py, loaded in main()


class SampleFailed(BaseException):  # noqa: N818 - not an Exception: tests cannot swallow it
    """Ends the check: the sample failed for a reason that is not an assertion."""

    def __init__(self, status: str, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


class CandidateRaised(Exception):  # noqa: N818 - the candidate's exception, as type name + text
    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}" if message else name)
        self.name = name


class Channel:
    """The pipes to the sandbox: one call at a time, each within the problem's deadline."""

    def __init__(self, request_fd: int, reply_fd: int, deadline: float) -> None:
        self.request_fd, self.reply_fd, self.deadline = request_fd, reply_fd, deadline
        self.calls = 0
        self.failure: SampleFailed | None = None

    def fail(self, status: str, reason: str) -> SampleFailed:
        self.failure = self.failure or SampleFailed(status, reason)
        return self.failure

    def _read(self, n: int, what: str) -> bytes:
        data = b""
        while len(data) < n:
            left = self.deadline - time.monotonic()
            if left <= 0 or not select.select([self.reply_fd], [], [], left)[0]:
                raise self.fail("timeout", f"{what}: no answer within the time limit")
            chunk = os.read(self.reply_fd, min(n - len(data), 1 << 20))
            if not chunk:
                raise self.fail("incomplete", f"{what}: the sandboxed program ended")
            data += chunk
        return data

    def receive(self, what: str) -> tuple:
        codec = _CODEC
        n = int.from_bytes(self._read(codec.FRAME_HEADER, what), "big")
        if n > codec.MAX_FRAME_BYTES:
            raise self.fail(
                "protocol", f"{what}: reply of {n} bytes (limit {codec.MAX_FRAME_BYTES})"
            )
        data = self._read(n, what)
        budget = min(codec.DECODE_BUDGET_S, max(0.0, self.deadline - time.monotonic()))
        try:
            message = codec.decode(data, budget_s=budget)
        except codec.NotPlainData as err:
            raise self.fail("protocol", f"{what}: reply is not plain data ({err})") from None
        if type(message) is not tuple or not message or type(message[0]) is not str:
            raise self.fail("protocol", f"{what}: malformed reply")
        return message

    def wait_ready(self) -> None:
        message = self.receive("loading the completion")
        if message == ("ready",):
            return
        if len(message) == 2 and message[0] == "missing" and type(message[1]) is str:
            raise self.fail("incomplete", message[1][:200])
        raise self.fail("protocol", "loading the completion: malformed reply")

    def call(self, args: tuple, kwargs: dict) -> object:
        if self.failure is not None:
            raise self.failure
        self.calls += 1
        number = self.calls
        what = f"call {number}"
        try:
            request = _CODEC.frame(("call", number, args, kwargs))
        except _CODEC.NotPlainData as err:
            raise self.fail("unsupported", f"{what}: the tests pass {err}") from None
        try:
            _CODEC.write_all(self.request_fd, request)
        except BrokenPipeError:
            raise self.fail("incomplete", f"{what}: the sandboxed program ended") from None
        reply = self.receive(what)
        kind = reply[0]
        if kind == "value" and len(reply) == 3 and reply[1] == number:
            return reply[2]
        if kind == "raised" and len(reply) == 4 and reply[1] == number and _texts(reply[2:]):
            raise CandidateRaised(reply[2][:100], reply[3][:300])
        if kind == "unplain" and len(reply) == 3 and reply[1] == number and _texts(reply[2:]):
            raise self.fail("not_plain", f"{what}: the completion returned {reply[2][:200]}")
        raise self.fail("protocol", f"{what}: malformed reply")


def _texts(items: tuple) -> bool:
    return all(type(x) is str for x in items)


def _failed_line(err: BaseException, test: str) -> str:
    """``line N of the tests: <source line>`` where ``err`` left the test code."""
    frames = [f for f in traceback.extract_tb(err.__traceback__) if f.filename == "<test>"]
    if not frames or frames[-1].lineno is None:
        return ""
    lines = test.splitlines()
    n = frames[-1].lineno
    text = lines[n - 1].strip() if 0 < n <= len(lines) else ""
    return f" at line {n} of the tests: {text[:200]}"


def check(problem: dict, channel: Channel) -> tuple[str, str]:
    """(status, reason) of one sample; runs the data set's tests against the proxy."""
    entry_point, test = problem["entry_point"], problem["test"]

    def candidate(*args: object, **kwargs: object) -> object:
        return channel.call(args, kwargs)

    try:
        channel.wait_ready()
        namespace: dict = {"__name__": "__checker__"}
        exec(compile(problem["prompt"], "<prompt>", "exec"), namespace)  # noqa: S102 - data set
        namespace[entry_point] = candidate
        exec(compile(test, "<test>", "exec"), namespace)  # noqa: S102 - the data set's tests
        namespace["check"](candidate)
    except SampleFailed as failure:
        return failure.status, failure.reason
    except CandidateRaised as err:
        if channel.failure is None:
            return "raised", f"the completion raised {err}{_failed_line(err, test)}"
    except Exception as err:  # noqa: BLE001 - an assertion, or the tests choking on a result
        if channel.failure is None:
            text = str(err)[:200]
            detail = f"{type(err).__name__}{': ' + text if text else ''}"
            return "failed", f"{detail}{_failed_line(err, test)}"
    if channel.failure is not None:  # swallowed by the tests: still a failure
        return channel.failure.status, channel.failure.reason
    return "ok", f"{channel.calls} calls"


def main() -> None:
    global _CODEC
    spec = json.loads(sys.argv[1])
    import importlib.util

    loader = importlib.util.spec_from_file_location("mtad_plain_data", spec["codec"])
    _CODEC = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(_CODEC)
    deadline = time.monotonic() + float(spec["wall_s"])
    problem = json.loads(sys.stdin.read())
    memory = int(spec["memory_mb"]) << 20
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # the tests' own work on the replies (e.g. set() over a huge list) within the problem's
    # time too: past it the kernel ends this process, and the harness records no verdict
    cpu = int(float(spec["wall_s"])) + 2
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    channel = Channel(int(spec["request_fd"]), int(spec["reply_fd"]), deadline)
    try:
        status, reason = check(problem, channel)
    except MemoryError:
        status, reason = "failed", "the checker ran out of memory on the completion's results"
    os.close(channel.request_fd)  # the sandboxed program's serve loop ends
    verdict = {"status": status, "reason": reason, "calls": channel.calls}
    os.write(int(spec["verdict_fd"]), json.dumps(verdict).encode())


if __name__ == "__main__":
    main()
