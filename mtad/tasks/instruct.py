"""Instruction following verified by rules: IFEval's instructions and verifiers (Zhou et al.,
2023) on this project's generated prompt set, or on the real IFEval data.

Data (``task.data``):

* ``generated`` (default): ``mtad/tasks/data/instruct_prompts.jsonl``, 400 prompts built by
  :mod:`mtad.tasks.instruct_data` from IFEval's instruction types and kwargs over topics written
  for it (committed; ``tests/test_tasks_instruct.py`` rebuilds it and checks it shares no 8-gram
  with any shipped draft's training text);
* ``ifeval``: IFEval's 541 prompts, from ``task.data_dir`` (a folder holding IFEval's
  ``input_data.jsonl``, or any ``*.jsonl`` in its format) or, without it, the hub
  (``google/IFEval`` through ``datasets``; not reachable on an offline machine).

Rows are IFEval's format: ``key``, ``prompt``, ``instruction_id_list`` and ``kwargs`` (one dict per
instruction). Each prompt is one user turn (the chat template when the model has one). The reply
is checked by lm-eval's verifiers (:mod:`mtad.tasks.ifeval_rules`), strict and loose as IFEval
reports them: prompt level (every instruction followed) and instruction level (the share of all
instructions followed). The per-prompt record keeps both verdicts; the run's score is
prompt-level strict accuracy, the mean of ``prompt_strict``, so comparisons of it are paired per
prompt (:mod:`mtad.runs.comparison`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mtad.runs.identity import content_tag
from mtad.tasks import ifeval_rules, rows
from mtad.tasks.base import Task
from mtad.tasks.instruct_data import DATA_FILE
from mtad.tasks.params import InstructParams
from mtad.tasks.samples import Sample, SampleOutput, TaskResult

DATA_CHOICES = ("generated", "ifeval")
HUB_DATASET = "google/IFEval"
IFEVAL_FILE = "input_data.jsonl"  # the file of google-research/instruction_following_eval
FIELDS = ("prompt", "instruction_id_list", "kwargs")
METRICS = (
    "prompt_level_strict_acc",
    "prompt_level_loose_acc",
    "inst_level_strict_acc",
    "inst_level_loose_acc",
)


class InstructTask(Task):
    name = "instruct"
    primary_metric = "prompt_level_strict_acc"
    score_record = "prompt_strict"

    def __init__(
        self,
        *,
        data: str = InstructParams.data,
        data_dir: str | None = InstructParams.data_dir,
        max_new_tokens: int = InstructParams.max_new_tokens,
        **common: Any,
    ) -> None:
        super().__init__(max_new_tokens=max_new_tokens, **common)
        if data not in DATA_CHOICES:
            raise ValueError(f"task.data must be one of {DATA_CHOICES}, got {data!r}")
        if data_dir is not None and data != "ifeval":
            raise ValueError("task.data_dir: only read with task.data=ifeval (the real IFEval set)")
        self.data = data
        self.data_dir = Path(data_dir).expanduser() if data_dir else None

    # ------------------------------------------------------------------------------- data

    def files(self) -> list[Path]:
        """The jsonl files read (none: the hub)."""
        if self.data == "generated":
            return [DATA_FILE]
        if self.data_dir is None:
            return []
        if not self.data_dir.is_dir():
            raise FileNotFoundError(f"task.data_dir={self.data_dir}: not a folder")
        named = self.data_dir / IFEVAL_FILE
        found = [named] if named.is_file() else sorted(self.data_dir.glob("*.jsonl"))
        if not found:
            raise FileNotFoundError(
                f"task.data_dir={self.data_dir}: no {IFEVAL_FILE} (or other *.jsonl in IFEval's "
                "format: key, prompt, instruction_id_list, kwargs)"
            )
        return found

    def _raw_rows(self) -> list[tuple[str, Path | None, int, dict[str, Any]]]:
        files = self.files()
        if files:
            return [
                ("task.data_dir", path, n, row)
                for path in files
                for n, row in rows.rows(path, "task.data_dir")
            ]
        try:
            import datasets

            hub = datasets.load_dataset(HUB_DATASET, split="train")
        except Exception as err:  # offline, no cache: say which key gives a local copy
            raise FileNotFoundError(
                f"task.data_dir: not set, and {HUB_DATASET} could not be loaded from the hub or "
                f"its cache ({type(err).__name__}); point task.data_dir at a folder holding "
                f"IFEval's {IFEVAL_FILE}"
            ) from None
        return [("task.data", None, n + 1, dict(row)) for n, row in enumerate(hub)]

    def load_samples(self) -> list[Sample]:
        """Every row, checked as it is read (a bad one names its file and line); the prompt
        set's instructions must all be checkable here (:func:`ifeval_rules.check_runnable`)."""
        samples: list[Sample] = []
        seen: set[str] = set()
        for key, path, n, row in self._raw_rows():
            where = (key, path or Path(HUB_DATASET), n)
            missing = [f for f in FIELDS if f not in row]
            if missing:
                raise rows.RowError(*where, f"is not an IFEval row (no {', '.join(missing)})")
            prompt = rows.text(row, "prompt", where)
            ids, kwargs = row["instruction_id_list"], row["kwargs"]
            if type(ids) is not list or not ids or not all(type(i) is str for i in ids):
                raise rows.RowError(*where, "instruction_id_list must be a non-empty list of ids")
            if type(kwargs) is not list or len(kwargs) != len(ids):
                raise rows.RowError(*where, "kwargs must be a list of one dict per instruction")
            if not all(isinstance(k, dict) for k in kwargs):
                raise rows.RowError(*where, "kwargs must be a list of one dict per instruction")
            sid = rows.identifier(row, "key", where) or f"{where[1].stem}/{n}"
            if sid in seen:
                raise rows.RowError(*where, f"duplicate key {sid!r}")
            seen.add(sid)
            samples.append(
                Sample(
                    id=sid,
                    turns=[prompt],
                    max_new_tokens=self.max_new_tokens,
                    # IFEval's hub rows hold every kwarg name, unused ones null (lm-eval drops them)
                    reference={
                        "instruction_id_list": list(ids),
                        "kwargs": [{k: v for k, v in kw.items() if v is not None} for kw in kwargs],
                    },
                )
            )
        ifeval_rules.check_runnable(
            (i for s in samples for i in s.reference["instruction_id_list"]),
            f"task.data={self.data}",
        )
        return samples

    def signature(self) -> dict[str, Any]:
        """The data by name and content hash (no absolute paths: they differ per checkout)."""
        files = [content_tag(f) for f in self.files()]
        return {**super().signature(), "data": self.data, "files": files or [HUB_DATASET]}

    # ----------------------------------------------------------------------------- scoring

    def score(self, outputs: Sequence[SampleOutput]) -> TaskResult:
        records = []
        for output in outputs:
            ref = output.sample.reference
            verdict = ifeval_rules.score(
                output.sample.turns[0], ref["instruction_id_list"], ref["kwargs"], output.text
            )
            records.append(
                {
                    **self.base_record(output),
                    "instruction_id_list": ref["instruction_id_list"],
                    "prompt_strict": verdict.prompt_strict,
                    "prompt_loose": verdict.prompt_loose,
                    "inst_strict": list(verdict.strict),
                    "inst_loose": list(verdict.loose),
                }
            )
        return TaskResult(records, instruct_metrics(records))


def instruct_metrics(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """IFEval's four accuracies over ``records`` (NaN without any)."""
    n = len(records)
    strict = [v for r in records for v in r["inst_strict"]]
    loose = [v for r in records for v in r["inst_loose"]]
    nan = float("nan")
    return {
        "prompt_level_strict_acc": sum(r["prompt_strict"] for r in records) / n if n else nan,
        "prompt_level_loose_acc": sum(r["prompt_loose"] for r in records) / n if n else nan,
        "inst_level_strict_acc": sum(strict) / len(strict) if strict else nan,
        "inst_level_loose_acc": sum(loose) / len(loose) if loose else nan,
        "instruct_n": n,
        "instruct_instructions": len(strict),
    }


__all__ = ["DATA_CHOICES", "METRICS", "InstructTask", "instruct_metrics"]
