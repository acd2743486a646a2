"""Results as a pandas DataFrame (one row per run) and the paper's tables as group-bys.

``load_study`` reads every ``metrics.json`` under ``<root>/<study>/``; ``add_ratios`` adds the
speed-up versus ``ar`` (and ``sps``) and the energy ratio versus ``sps`` within groups of runs
that share pair, task, seed and device -- the "same sweep, same hardware" rule of the spec.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import pandas as pd

from mtad.harness.results import METRICS_FILE

# Runs are compared only within a group sharing these columns: same study, pair, task and
# seed (same prompts), and the same hardware (device kind, GPU model and count, CPU model).
GROUP_KEYS: tuple[str, ...] = (
    "study",
    "pair",
    "task",
    "seed",
    "device",
    "gpu_model",
    "gpu_count",
    "cpu_model",
)


def load_runs(metrics_files: Iterable[Path]) -> pd.DataFrame:
    """One row per metrics.json; nested blocks become dotted columns (``energy.kwh``,
    ``params.gamma``). Adds ``result_dir`` and a readable ``label`` per run."""
    records = []
    for path in sorted(Path(p) for p in metrics_files):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # a half-written folder is not a result
        record["result_dir"] = str(path.parent)
        records.append(record)
    if not records:
        return pd.DataFrame()
    df = pd.json_normalize(records, sep=".")
    df["label"] = run_labels(df)
    return df


def load_study(root: str | Path, study: str | None = None) -> pd.DataFrame:
    """All runs of ``<root>/<study>/`` (or of every study under ``root`` when study is None)."""
    base = Path(root) / study if study else Path(root)
    pattern = f"*/{METRICS_FILE}" if study else f"*/*/{METRICS_FILE}"
    return load_runs(base.glob(pattern))


def run_labels(df: pd.DataFrame) -> list[str]:
    """``method`` plus the params that vary among that method's runs: ``mtad(gamma=2,tau=0.3)``."""
    param_cols = [c for c in df.columns if c.startswith("params.")]
    labels = []
    for _, row in df.iterrows():
        same = df[df["method"] == row["method"]]
        # as text: list-valued params (specinfer's branching) are unhashable
        varying = [c for c in param_cols if same[c].dropna().astype(str).nunique() > 1]
        inner = ",".join(f"{c.removeprefix('params.')}={_fmt(row[c])}" for c in varying)
        labels.append(f"{row['method']}({inner})" if inner else str(row["method"]))
    return labels


def _fmt(value: object) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _baseline_ratio(
    df: pd.DataFrame, baseline: str, column: str, keys: Sequence[str], higher_is_better: bool
) -> pd.Series:
    """``baseline / run`` of ``column`` (``run / baseline`` when higher is better) per group;
    NaN where the group has no baseline run. Several baseline runs in a group are averaged."""
    if column not in df.columns:
        return pd.Series(float("nan"), index=df.index)
    keys = [k for k in keys if k in df.columns]
    # Keys as text: a key that is None for every run (gpu_model on a CPU) would otherwise
    # merge an object column against the float column groupby makes of it.
    frame = df[keys + [column]].astype({k: str for k in keys})
    base = frame[df["method"] == baseline].groupby(keys, dropna=False)[column].mean()
    base = base.rename("_base").reset_index()
    merged = frame.merge(base, on=keys, how="left")
    merged.index = df.index
    if higher_is_better:
        return merged[column] / merged["_base"]
    return merged["_base"] / merged[column]


def add_ratios(df: pd.DataFrame, keys: Sequence[str] = GROUP_KEYS) -> pd.DataFrame:
    """Add ``speedup_vs_ar``, ``speedup_vs_sps`` (ms/token ratios), ``energy_ratio_vs_sps``
    (sps J/token over the run's: > 1 means less energy than SpS), ``ppl_change_vs_ar`` and
    ``score_change_vs_ar``: the relative change of the downstream score versus AR (the paper's
    "+x% downstream"), NaN where AR scored 0 or has no score (e.g. MT-Bench pending a judge)."""
    if df.empty:
        return df
    df = df.copy()
    if "score" in df.columns:  # None (a pending judge) must not make the column non-numeric
        df["score"] = pd.to_numeric(df["score"], errors="coerce")
    df["speedup_vs_ar"] = _baseline_ratio(df, "ar", "ms_per_token", keys, False)
    df["speedup_vs_sps"] = _baseline_ratio(df, "sps", "ms_per_token", keys, False)
    df["energy_ratio_vs_sps"] = _baseline_ratio(df, "sps", "energy.j_per_token", keys, False)
    df["ppl_change_vs_ar"] = _baseline_ratio(df, "ar", "ppl", keys, True) - 1.0
    score = _baseline_ratio(df, "ar", "score", keys, True) - 1.0
    df["score_change_vs_ar"] = score.where(score.abs() != float("inf"))
    return df


# The columns of the summary tables, in order, with their headers.
SUMMARY_COLUMNS: dict[str, str] = {
    "pair": "pair",
    "task": "task",
    "label": "method",
    "n_samples": "n",
    "new_tokens": "tokens",
    "ms_per_token": "ms/tok",
    "tokens_per_s": "tok/s",
    "speedup_vs_ar": "x AR",
    "speedup_vs_sps": "x SpS",
    "acceptance_rate": "accept",
    "block_efficiency": "tok/fwd",
    "ppl": "ppl",
    "score": "score",
    "energy.j_per_token": "J/tok",
    "energy_ratio_vs_sps": "SpS J / J",
    "energy.cpu_mode": "energy by",
    "energy.warning": "energy warning",
}


def summary_frame(df: pd.DataFrame) -> pd.DataFrame:
    """The summary table: one row per run, sorted by group then method."""
    if df.empty:
        return df
    df = add_ratios(df)
    cols = [c for c in SUMMARY_COLUMNS if c in df.columns]
    out = df.sort_values([c for c in ("pair", "task", "label") if c in df.columns])[cols]
    out = out.dropna(axis=1, how="all")
    return out.rename(columns=SUMMARY_COLUMNS).reset_index(drop=True)
