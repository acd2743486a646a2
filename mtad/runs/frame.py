"""Runs as one pandas frame: one row per complete result folder.

A row is the run's ``metrics.json`` flattened (nested blocks as dotted columns:
``params.gamma``, ``energy.j_per_token``), the figures per generated token derived from it
(:func:`per_token`), the run's ``comparison_key`` and ``hardware`` (from its identity,
:mod:`mtad.runs.identity`), a task's ``pending`` note, the ``result_dir`` and a ``label``
(:mod:`mtad.runs.labels`).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from mtad.runs.folder import J_PER_KWH, METRICS_FILE, read_config, read_metrics
from mtad.runs.hardware import hardware_text
from mtad.runs.identity import identity_of
from mtad.runs.labels import run_labels


def per_token(metrics: dict[str, Any]) -> dict[str, float]:
    """Figures per generated token derived from ``metrics.json``: the time split
    (``draft_ms_per_token``, ...), ``j_per_token`` and the GPU-only ``gpu_j_per_token``."""
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


def pending_note(metrics: dict[str, Any]) -> str | None:
    """A task's own "pending: ..." note (MT-Bench without a judge) stands in for its score."""
    for value in metrics.values():
        if isinstance(value, str) and value.startswith("pending"):
            return value
    return None


def folder_facts(config: dict[str, Any], metrics: dict[str, Any]) -> tuple[str, str]:
    """What a run's ``config.yaml`` adds to its row: its comparison key and hardware text."""
    identity = identity_of(config, metrics)
    return identity.comparison_key(metrics.get("study")), hardware_text(identity.hardware)


def record_of(
    metrics: dict[str, Any], comparison_key: str, hardware: str, result_dir: Path | None = None
) -> dict[str, Any]:
    """One run as a flat row (module docstring), from its ``metrics.json`` and
    :func:`folder_facts`: a folder's and a stored record's rows are made here, the same way."""
    row = pd.json_normalize(metrics, sep=".").iloc[0].to_dict()
    row.update(per_token(metrics))
    row["comparison_key"] = comparison_key
    row["hardware"] = hardware
    row["pending"] = pending_note(metrics)
    row["result_dir"] = str(result_dir) if result_dir is not None else None
    return row


def run_record(result_dir: Path) -> dict[str, Any] | None:
    """One complete run as a flat row (module docstring); None when ``metrics.json`` cannot be
    read (a half-written folder is not a result)."""
    metrics = read_metrics(result_dir)
    if metrics is None:
        return None
    return record_of(metrics, *folder_facts(read_config(result_dir), metrics), result_dir)


def load_runs(metrics_files: Iterable[Path]) -> pd.DataFrame:
    """One row per metrics.json (:func:`run_record`) plus a readable ``label`` per run."""
    records = [run_record(Path(p).parent) for p in sorted(Path(p) for p in metrics_files)]
    records = [r for r in records if r is not None]
    if not records:
        return pd.DataFrame()
    df = pd.DataFrame(records)
    df["label"] = run_labels(df)
    return df


def load_study(root: str | Path, study: str | None = None) -> pd.DataFrame:
    """All runs of ``<root>/<study>/`` (or of every study under ``root`` when study is None)."""
    base = Path(root) / study if study else Path(root)
    pattern = f"*/{METRICS_FILE}" if study else f"*/*/{METRICS_FILE}"
    return load_runs(base.glob(pattern))


__all__ = [
    "folder_facts",
    "load_runs",
    "load_study",
    "pending_note",
    "per_token",
    "record_of",
    "run_record",
]
