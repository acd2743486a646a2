"""Compact run records: everything the tables, figures and claims read of a run, without its
result folder, so a committed reference re-renders on any machine.

A :class:`StoredRun` is one complete run: its ``metrics.json`` (counters, time split, energy of
the whole run, scores, PPL), the two facts its folder's ``config.yaml`` gives the tables (the
comparison key and the hardware text, :func:`mtad.runs.frame.run_record`), the commit it ran at,
and per prompt the fields the intervals resample (:data:`PROMPT_FIELDS`: tokens, wall time and
its split, target forwards, the PPL term ``mean_logprob``, and the task's per-prompt score,
``metrics.json``'s ``score_record``). Output texts and per-token lists stay in the run folder.

A records folder (``records/`` of an exported study) holds two JSON-lines files:

* ``runs.jsonl``: one :class:`StoredRun` per line (per prompt as ``columns`` + ``rows``);
* ``plan.jsonl``: a first line with the plan that was rendered (profile, recipes, pairs, the
  user's overrides), then one line per planned configuration (its override set,
  :attr:`mtad.paper.expansion.PlannedRun.key`) with its state, reason and signature.

Both are written in a fixed order with sorted keys, so the same runs give the same bytes.
:mod:`mtad.paper.plan` (:func:`~mtad.paper.plan.plan_from_records`) rebuilds the plan from them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mtad.runs.folder import (
    ENVIRONMENT_FILE,
    dumps,
    per_prompt,
    read_config,
    read_metrics,
    write_atomic,
)

RECORDS_DIR = "records"
RUNS_FILE = "runs.jsonl"
PLAN_FILE = "plan.jsonl"
RECORDS_VERSION = 1
# Per prompt, what the comparisons resample (mtad.runs.comparison.PER_PROMPT and the score),
# what the spec asks a run to record (tokens, time, target forwards, PPL terms) and its stop.
PROMPT_FIELDS = (
    "new_tokens",
    "output_tokens",
    "target_forwards",
    "wall_time",
    "time_draft",
    "time_verify",
    "time_other",
    "mean_logprob",
)


@dataclass
class StoredRun:
    """One complete run as the renderer reads it (module docstring)."""

    signature: str
    metrics: dict[str, Any]
    comparison_key: str
    hardware: str
    commit: str | None
    prompts: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> fields

    @property
    def fields(self) -> tuple[str, ...]:
        score = self.metrics.get("score_record")
        return (*PROMPT_FIELDS, score) if score and score not in PROMPT_FIELDS else PROMPT_FIELDS

    def to_json(self) -> dict[str, Any]:
        columns = ["id", *self.fields]
        rows = [[pid, *(rec.get(c) for c in columns[1:])] for pid, rec in self.prompts.items()]
        return {
            "signature": self.signature,
            "comparison_key": self.comparison_key,
            "hardware": self.hardware,
            "commit": self.commit,
            "metrics": self.metrics,
            "prompts": {"columns": columns, "rows": rows},
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> StoredRun:
        columns = obj["prompts"]["columns"]
        prompts = {}
        for row in obj["prompts"]["rows"]:
            record = dict(zip(columns, row, strict=True))
            # null in JSON is NaN in the folder's files (a prompt without a log-prob)
            prompts[str(record["id"])] = {
                k: math.nan if v is None and k == "mean_logprob" else v for k, v in record.items()
            }
        return cls(
            signature=str(obj["signature"]),
            metrics=dict(obj["metrics"]),
            comparison_key=str(obj["comparison_key"]),
            hardware=str(obj["hardware"]),
            commit=obj.get("commit"),
            prompts=prompts,
        )


def stored_run(folder: Path) -> StoredRun:
    """The compact record of the complete run in ``folder``."""
    from mtad.runs.frame import folder_facts

    metrics = read_metrics(folder)
    if metrics is None:
        raise FileNotFoundError(f"{folder}: no readable metrics.json (not a complete run)")
    key, hardware = folder_facts(read_config(folder), metrics)
    try:
        env = json.loads((folder / ENVIRONMENT_FILE).read_text())
    except (OSError, ValueError):
        env = {}
    run = StoredRun(
        signature=folder.name,
        metrics=json.loads(dumps(metrics, indent=None)),
        comparison_key=key,
        hardware=hardware,
        commit=(env.get("git") or {}).get("commit"),
    )
    wanted = run.fields
    run.prompts = {
        str(pid): {"id": str(pid), **{k: rec.get(k) for k in wanted}}
        for pid, rec in per_prompt(folder).items()
    }
    return run


@dataclass
class Records:
    """A records folder read back: the plan's header, its statuses by override set, the runs."""

    header: dict[str, Any]
    statuses: dict[tuple[str, ...], dict[str, Any]]
    runs: dict[str, StoredRun]


def write_records(
    folder: Path,
    header: Mapping[str, Any],
    statuses: Iterable[Mapping[str, Any]],
    runs: Iterable[StoredRun],
) -> None:
    """``runs.jsonl`` and ``plan.jsonl`` under ``folder`` (module docstring). A status is
    ``{"key": [override, ...], "state", "reason", "signature"}``."""
    by_sig = {r.signature: r for r in runs}
    lines = [dumps(by_sig[s].to_json(), indent=None) for s in sorted(by_sig)]
    write_atomic(folder / RUNS_FILE, "".join(line + "\n" for line in lines))
    plan = [{"version": RECORDS_VERSION, **header}]
    plan += sorted((dict(s) for s in statuses), key=lambda s: list(s["key"]))
    text = "".join(json.dumps(row, sort_keys=True, default=str) + "\n" for row in plan)
    write_atomic(folder / PLAN_FILE, text)


def read_records(folder: Path) -> Records:
    plan_file, runs_file = folder / PLAN_FILE, folder / RUNS_FILE
    if not plan_file.is_file() or not runs_file.is_file():
        raise FileNotFoundError(f"{folder}: no {PLAN_FILE} and {RUNS_FILE} (not a records folder)")
    lines = [json.loads(line) for line in plan_file.read_text().splitlines() if line.strip()]
    header, rest = lines[0], lines[1:]
    if header.get("version") != RECORDS_VERSION:
        raise ValueError(f"{plan_file}: records version {header.get('version')!r}, expected 1")
    runs = {}
    for line in runs_file.read_text().splitlines():
        if line.strip():
            run = StoredRun.from_json(json.loads(line))
            runs[run.signature] = run
    statuses = {tuple(s["key"]): s for s in rest}
    return Records(header, statuses, runs)


__all__ = [
    "PLAN_FILE",
    "PROMPT_FIELDS",
    "RECORDS_DIR",
    "RUNS_FILE",
    "Records",
    "StoredRun",
    "read_records",
    "stored_run",
    "write_records",
]
