"""The runs behind a plan as one pandas frame, with the cross-run ratios.

One row per planned run of a recipe (a run shared by recipes appears in each); done runs carry
their ``metrics.json`` (flattened) and derived per-token figures. A ratio is taken between a run
and the baseline run (``ar`` or ``sps`` at its defaults) whose resolved config differs only in
the method and that ran on the same hardware (device kind, GPU model and count, CPU model): same
pair, task, data, seed and settings. Runs on other hardware never share a ratio.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

import pandas as pd

from mtad.harness.signature import relevant_config
from mtad.paper.plan import Plan
from mtad.paper.status import RunStatus

HARDWARE_KEYS = ("device_kind", "gpu_model", "gpu_count", "cpu_model")
# (ratio column, metric, baseline label, higher is better): higher-is-better metrics give
# run / baseline - 1 (a change), lower-is-better ones baseline / run (a speed-up factor).
RATIOS: tuple[tuple[str, str, str, bool], ...] = (
    ("speedup_vs_ar", "ms_per_token", "ar", False),
    ("speedup_vs_sps", "ms_per_token", "sps", False),
    ("energy_ratio_vs_sps", "j_per_token", "sps", False),
    ("gpu_energy_ratio_vs_sps", "gpu_j_per_token", "sps", False),
)
CHANGES: tuple[tuple[str, str, str], ...] = (
    ("ppl_change_vs_ar", "ppl", "ar"),
    ("score_change_vs_ar", "score", "ar"),
)
J_PER_KWH = 3.6e6


def comparison_key(config: dict[str, Any], metrics: dict[str, Any]) -> str:
    """Hash of everything that must match for two runs to be compared, except the method."""
    tree = relevant_config(config)
    tree.pop("method", None)
    tree.pop("signature", None)
    tree["hardware"] = {k: metrics.get(k) for k in HARDWARE_KEYS}
    canonical = json.dumps(tree, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha1(canonical.encode()).hexdigest()[:12]


def _per_token(metrics: dict[str, Any]) -> dict[str, float]:
    tokens = float(metrics.get("new_tokens") or 0)
    out: dict[str, float] = {}
    if tokens <= 0:
        return out
    for name, key in (("draft", "time_draft"), ("verify", "time_verify"), ("other", "time_other")):
        if metrics.get(key) is not None:
            out[f"{name}_ms_per_token"] = 1000.0 * float(metrics[key]) / tokens
    energy = metrics.get("energy") or {}
    if energy.get("j_per_token") is not None:
        out["j_per_token"] = float(energy["j_per_token"])
    if energy.get("gpu_kwh") is not None and energy.get("gpu_mode", "none") != "none":
        out["gpu_j_per_token"] = float(energy["gpu_kwh"]) * J_PER_KWH / tokens
    return out


def _pending(metrics: dict[str, Any]) -> str | None:
    """A task's own "pending: ..." note (MT-Bench without a judge) stands in for its score."""
    for value in metrics.values():
        if isinstance(value, str) and value.startswith("pending"):
            return value
    return None


def run_rows(plan: Plan, recipe: str) -> pd.DataFrame:
    """One row per planned run of ``recipe`` (identity, state, and metrics when done)."""
    rows = []
    cache: dict[str, dict[str, Any]] = {}
    for status in plan.statuses(recipe):
        rows.append(_row(status, cache))
    df = pd.DataFrame(rows)
    return _add_ratios(df, plan) if not df.empty else df


def _row(status: RunStatus, cache: dict[str, dict[str, Any]]) -> dict[str, Any]:
    p = status.planned
    row: dict[str, Any] = {
        "pair": p.pair,
        "task": p.task,
        "method": p.label,
        "method_name": p.method,
        "seed": p.seed,
        "state": status.state,
        "cell": status.cell() if status.state != "done" else "",
        "signature": status.signature,
        **{f"param.{k}": v for k, v in p.params.items()},
    }
    if status.state != "done":
        return row
    sig = str(status.signature)
    if sig not in cache:
        metrics = status.metrics()
        flat = pd.json_normalize(metrics, sep=".").iloc[0].to_dict()
        flat.update(_per_token(metrics))
        flat["comparison_key"] = comparison_key(status.config(), metrics)
        flat["pending"] = _pending(metrics)
        cache[sig] = flat
    for key, value in cache[sig].items():
        row.setdefault(key, value)
    return row


def _add_ratios(df: pd.DataFrame, plan: Plan) -> pd.DataFrame:
    """Ratios against the baseline runs of the whole plan (any recipe may hold them)."""
    baselines = _baseline_table(plan)
    df = df.copy()
    for column, metric, label, _ in RATIOS:
        df[column] = [
            _ratio(baselines.get((label, key), {}).get(metric), row.get(metric), higher=False)
            for key, row in zip(
                df.get("comparison_key", [None] * len(df)), df.to_dict("records"), strict=True
            )
        ]
    for column, metric, label in CHANGES:
        df[column] = [
            _ratio(baselines.get((label, key), {}).get(metric), row.get(metric), higher=True)
            for key, row in zip(
                df.get("comparison_key", [None] * len(df)), df.to_dict("records"), strict=True
            )
        ]
    return df


def _baseline_table(plan: Plan) -> dict[tuple[str, str], dict[str, Any]]:
    """``(baseline label, comparison key) -> metrics`` for the plan's done ``ar``/``sps`` runs
    at their defaults (label exactly the method name)."""
    labels = {label for _, _, label, _ in RATIOS} | {label for _, _, label in CHANGES}
    out: dict[tuple[str, str], dict[str, Any]] = {}
    cache: dict[str, dict[str, Any]] = {}
    for status in plan.status.values():
        if status.state != "done" or status.planned.label not in labels:
            continue
        row = _row(status, cache)
        out[(status.planned.label, str(row["comparison_key"]))] = row
    return out


def _number(value: Any) -> float | None:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _ratio(base: Any, run: Any, *, higher: bool) -> float:
    b, r = _number(base), _number(run)
    if b is None or r is None:
        return math.nan
    if higher:  # relative change run / base - 1; undefined at a zero baseline
        return r / b - 1.0 if b != 0 else math.nan
    return b / r if r != 0 else math.nan


__all__ = ["CHANGES", "RATIOS", "comparison_key", "run_rows"]
