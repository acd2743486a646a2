"""What a run records: the per-sample rows (task record + decode counters), the run's
``metrics.json`` block and the flat W&B summary. Split from :mod:`mtad.harness.runner`, which
only orchestrates."""

from __future__ import annotations

import math
import time
from typing import Any

from mtad.harness.prepare import Prepared
from mtad.harness.results import hardware_identity

SCHEMA_VERSION = 1


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


def sample_stats(output: Any) -> dict[str, Any]:
    from mtad.engine import DecodeStats

    stats = DecodeStats.total([g.stats for g in output.generations if g.stats is not None])
    row = stats.as_dict(with_lengths=True)
    row["prompt_tokens"] = sum(len(g.prompt_ids) for g in output.generations)
    row["turns"] = len(output.generations)
    return row


def sample_record(record: dict[str, Any], output: Any) -> dict[str, Any]:
    """The task's record (id, output text, its scores) plus the sample's decode counters.

    The task's ``new_tokens`` (tokens kept up to the stop string, what is scored) is renamed
    ``output_tokens``; ``new_tokens`` is what the decoder generated, as in ``DecodeStats``.
    """
    row = dict(record)
    if "new_tokens" in row:
        row["output_tokens"] = row.pop("new_tokens")
    row.update(sample_stats(output))
    return row


def run_metrics(
    prep: Prepared,
    stats: Any,
    task_metrics: dict[str, Any],
    energy: dict[str, Any],
    records: list[dict[str, Any]],
    overhead: dict[str, float],
) -> dict[str, Any]:
    rc = prep.spec.cfg
    import torch

    metrics: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "study": rc.results.study,
        "signature": prep.signature,
        "pair": rc.pair.name,
        "method": prep.spec.method_name,
        "task": prep.spec.task_name,
        "seed": rc.runtime.seed,
        "device": rc.runtime.device,
        # What a ratio may be taken across: runs on other hardware never share a ratio
        # (mtad.harness.tables.GROUP_KEYS).
        **hardware_identity(rc.runtime.device),
        "threads": torch.get_num_threads(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "params": dict(prep.spec.method_params),
        "n_samples": len(records),
        "output_tokens": sum(int(r.get("output_tokens", 0)) for r in records),
    }
    metrics.update(stats.as_dict())
    metrics.update(task_metrics)
    score_key = getattr(prep.task, "primary_metric", None)
    if score_key and score_key in task_metrics:
        metrics["score"] = task_metrics[score_key]
        metrics["score_name"] = score_key
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


__all__ = [
    "SCHEMA_VERSION",
    "TIMING_KEYS",
    "run_metrics",
    "sample_record",
    "sample_stats",
    "wandb_summary",
]
