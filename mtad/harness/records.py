"""What a run records and writes: the per-sample rows (task record + decode counters), the
run's ``metrics.json`` block, the flat W&B summary, and the files of its result folder (their
format: :mod:`mtad.runs.folder`). Split from :mod:`mtad.harness.job`, which only
orchestrates."""

from __future__ import annotations

import math
import time
import traceback
from typing import Any

from mtad.engine import DecodeStats
from mtad.harness.prepare import Prepared
from mtad.harness.results import environment
from mtad.runs.folder import (
    CONFIG_FILE,
    ENVIRONMENT_FILE,
    FAILED_FILE,
    METRICS_FILE,
    SAMPLES_FILE,
    TIMINGS_FILE,
    write_config,
    write_json,
    write_jsonl,
)
from mtad.tasks.base import Task
from mtad.tasks.samples import SampleOutput

# 2: the hardware facts of the identity (threads, cpu_bf16 on every device), score_record
SCHEMA_VERSION = 2


# Per-sample decode counters that are clock readings: they go to timings.jsonl, so that
# samples.jsonl is a function of the config and seed alone (byte-identical on a rerun, CPU).
TIMING_KEYS = (
    "time_draft",
    "time_verify",
    "time_other",
    "wall_time",
    "tokens_per_s",
    "ms_per_token",
)


def sample_stats(output: SampleOutput) -> dict[str, Any]:
    stats = DecodeStats.total([g.stats for g in output.generations if g.stats is not None])
    row = stats.as_dict(with_lengths=True)
    row["prompt_tokens"] = sum(len(g.prompt_ids) for g in output.generations)
    row["turns"] = len(output.generations)
    return row


def sample_record(record: dict[str, Any], output: SampleOutput) -> dict[str, Any]:
    """The task's record (id, output text, ``output_tokens`` kept up to the stop string, its
    scores) plus the sample's decode counters (``new_tokens``: what the decoder generated)."""
    return {**record, **sample_stats(output)}


def unscored_record(output: SampleOutput) -> dict[str, Any]:
    """What :func:`sample_record` holds before the task scores it: the task's base record
    (id, output text, ``output_tokens``, ``stopped_by``) and the decode counters."""
    return sample_record(Task.base_record(output), output)


def split_timings(
    rows: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``rows`` as ``samples.jsonl`` records (no clock readings) and ``timings.jsonl`` rows."""
    records = [{k: v for k, v in row.items() if k not in TIMING_KEYS} for row in rows]
    timings = [{"id": row.get("id"), **{k: row[k] for k in TIMING_KEYS}} for row in rows]
    return records, timings


def run_metrics(
    prep: Prepared,
    stats: DecodeStats,
    task_metrics: dict[str, Any],
    energy: dict[str, Any],
    records: list[dict[str, Any]],
    overhead: dict[str, float],
) -> dict[str, Any]:
    rc = prep.spec.cfg
    metrics: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "study": rc.results.study,
        "signature": prep.signature,
        "pair": rc.pair.name,
        "method": prep.spec.method_name,
        "task": prep.spec.task_name,
        "seed": rc.runtime.seed,
        "device": rc.runtime.device,
        # every fact of the hardware rule; the run's identity holds those that decide timing
        # (mtad.runs.hardware), so a ratio is never taken across machines
        **prep.hardware,
        "dtypes": {
            role: {"dtype": m.dtype, "why": prep.spec.dtype_choice.get(role)}
            for role, m in (("target", prep.spec.target), ("draft", prep.spec.draft))
            if m is not None
        },
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "params": dict(prep.spec.method_params),
        "n_samples": len(records),
        "output_tokens": sum(int(r.get("output_tokens", 0)) for r in records),
    }
    metrics.update(stats.as_dict())
    metrics.update(task_metrics)
    score_key = prep.task.primary_metric
    if score_key and score_key in task_metrics:
        metrics["score"] = task_metrics[score_key]
        metrics["score_name"] = score_key
        metrics["score_record"] = prep.task.score_record  # its per-prompt field
    metrics["energy"] = energy
    metrics["overhead_s"] = overhead
    return metrics


def wandb_summary(metrics: dict[str, Any]) -> dict[str, Any]:
    """Scalars for ``run.summary``: flat metrics plus ``energy/...`` and ``overhead/...``."""
    out: dict[str, Any] = {}
    for key, value in metrics.items():
        if isinstance(value, dict):
            for sub, v in value.items():
                if isinstance(v, (int, float, str, bool)) or v is None:
                    out[f"{key}/{sub}"] = v
        elif isinstance(value, (int, float, str, bool)):
            out[key] = value
    return {
        k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in out.items()
    }


# --------------------------------------------------------------------------------------------
# the result folder


def write_outputs(
    prep: Prepared, records: list[dict[str, Any]], timings: list[dict[str, Any]]
) -> None:
    """``config.yaml``, ``samples.jsonl``, ``timings.jsonl`` and ``environment.json``."""
    folder = prep.result_dir
    folder.mkdir(parents=True, exist_ok=True)
    write_config(folder / CONFIG_FILE, {**prep.config, "signature": prep.signature})
    write_jsonl(folder / SAMPLES_FILE, records)
    write_jsonl(folder / TIMINGS_FILE, timings)
    write_json(folder / ENVIRONMENT_FILE, environment())


def write_samples(prep: Prepared, records: list[dict[str, Any]]) -> None:
    """``samples.jsonl`` again, with the scores (the folder holds the rest already)."""
    write_jsonl(prep.result_dir / SAMPLES_FILE, records)


def commit(prep: Prepared, metrics: dict[str, Any]) -> None:
    """``metrics.json``, last: its presence marks the folder complete."""
    (prep.result_dir / FAILED_FILE).unlink(missing_ok=True)  # an earlier attempt's failure
    write_json(prep.result_dir / METRICS_FILE, metrics)


def write_failure(prep: Prepared, err: BaseException, owner: dict[str, Any]) -> None:
    """``failed.json``: what failed, where and when, enough to reproduce it. Call it from the
    ``except`` block handling ``err`` (the traceback is the one being handled)."""
    write_json(
        prep.result_dir / FAILED_FILE,
        {
            "status": "failed",
            "signature": prep.signature,
            "error": f"{type(err).__name__}: {err}".splitlines()[0],
            "traceback": traceback.format_exc(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "owner": owner,
            "config": prep.config,
            "environment": environment(),
        },
    )


__all__ = [
    "SCHEMA_VERSION",
    "TIMING_KEYS",
    "commit",
    "run_metrics",
    "sample_record",
    "sample_stats",
    "split_timings",
    "unscored_record",
    "wandb_summary",
    "write_failure",
    "write_outputs",
    "write_samples",
]
