"""Plain prompt sets (jsonl) for perplexity-only studies, e.g. ChatAlpaca- or CNN/DM-style
prompts exported to local files.

One JSON object a line with an ``id``, a ``prompt`` and optionally a ``kind`` (``chat``,
``code``, ``prose``, ...), ``system`` and ``max_new_tokens``. There is no downstream score: the
run's quality metric is perplexity (:func:`mtad.tasks.base.score_outputs`). The default set,
``mtad/tasks/data/default_prompts.jsonl``, is written for this project and kept stable (a
distilled draft's training text is kept disjoint from it).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from mtad.tasks.base import Task, resolve_data_path
from mtad.tasks.samples import Sample, SampleOutput, TaskResult

DEFAULT_FILE = "default_prompts.jsonl"


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
        self.files = [resolve_data_path(f) for f in files]
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
