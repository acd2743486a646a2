"""The quick tables of a study (``analysis/make_tables.py``) and the sweep summary, each a
pandas group-by over the runs of :func:`mtad.runs.frame.load_study` with the comparison
columns of :mod:`mtad.runs.comparison`.

Rows are (pair, task, method label), values averaged over seeds (a ratio on the log scale:
:func:`mtad.runs.comparison.seed_means`). A study that holds runs of
more than one machine (re-run on another CPU) gets one row per machine as well: its runs are
compared within their machine, and averaging them across machines would mix timings.
"""

from __future__ import annotations

import math

import pandas as pd

from mtad.runs.comparison import (
    BY_COLUMN,
    COMPARISON_COLUMNS,
    add_comparisons,
    comparison_interval,
    paired_runs,
    seed_means,
)

TABLE_ROWS = ["pair", "task", "label"]
STUDY_TABLES: dict[str, dict[str, str]] = {
    "speed": {
        "ms_per_token": "ms/token",
        "speedup_vs_ar": "speed-up vs AR",
        "speedup_vs_sps": "speed-up vs SpS",
        "acceptance_rate": "acceptance",
        "node_acceptance_rate": "acceptance per node",
        "block_efficiency": "tokens/target fwd",
        "mean_accepted": "mean accepted",
    },
    "quality": {
        "ppl": "ppl",
        "ppl_token_weighted": "ppl (token-weighted)",
        "ppl_change_vs_ar": "ppl change vs AR",
        "score": "score",
        "score_change_vs_ar": "score change vs AR",
    },
    "energy": {
        "energy.j_per_token": "J/token",
        "energy.kwh": "kWh",
        "energy_ratio_vs_sps": "SpS J / J",
        "energy.cpu_mode": "CPU energy by",
        "energy.gpu_mode": "GPU energy by",
    },
}
# The columns of the sweep summary, in order, with their headers.
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


def _numeric_scores(runs: pd.DataFrame) -> pd.DataFrame:
    """``score`` as numbers: None (a pending judge) must not make the column text."""
    if "score" not in runs.columns:
        return runs
    runs = runs.copy()
    runs["score"] = pd.to_numeric(runs["score"], errors="coerce")
    return runs


def row_keys(runs: pd.DataFrame) -> list[str]:
    """:data:`TABLE_ROWS`, plus ``hardware`` when the runs come from more than one machine."""
    several = "hardware" in runs.columns and runs["hardware"].nunique(dropna=False) > 1
    return [*TABLE_ROWS, "hardware"] if several else list(TABLE_ROWS)


def study_tables(runs: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """``{name: table}`` of :data:`STUDY_TABLES`: one row per :func:`row_keys` group, values
    averaged over seeds (``seeds`` counts them); each comparison column is followed by its 95%
    interval (``... [95%: lo]``, ``[95%: hi]``, ``[95%: prompts]``: :func:`comparison_interval`
    of the group's runs)."""
    if runs.empty:
        return {}
    runs = add_comparisons(_numeric_scores(runs))
    keys = row_keys(runs)
    tables = {}
    for name, columns in STUDY_TABLES.items():
        columns = dict(columns)  # gains the interval headers
        present = [c for c in columns if c in runs.columns and runs[c].notna().any()]
        numeric = [c for c in present if pd.api.types.is_numeric_dtype(runs[c])]
        text = [c for c in present if c not in numeric]
        grouped = runs.groupby(keys, dropna=False)
        table = seed_means(grouped, numeric)
        for c in text:
            table[c] = grouped[c].agg(lambda s: ",".join(sorted(set(map(str, s.dropna())))))
        table["seeds"] = grouped["seed"].nunique()
        order = [*present, "seeds"]
        for c in [c for c in present if c in COMPARISON_COLUMNS]:
            order[order.index(c) + 1 : order.index(c) + 1] = _add_bounds(table, runs, c, columns)
        tables[name] = table[order].rename(columns=columns)
    return tables


def _add_bounds(
    table: pd.DataFrame, runs: pd.DataFrame, column: str, headers: dict[str, str]
) -> list[str]:
    """Columns ``<column>_lo``, ``_hi``, ``_prompts`` of ``table`` (one row per group of
    :func:`row_keys`): :func:`comparison_interval` of the group's runs; their names."""
    comparison = BY_COLUMN[column]
    names = [f"{column}_{part}" for part in ("lo", "hi", "prompts")]
    bounds = {
        key: comparison_interval(paired_runs(group, comparison, runs))
        for key, group in runs.groupby(row_keys(runs), dropna=False)
    }
    for name, part in zip(names, ("lo", "hi", "n_prompts"), strict=True):
        table[name] = [getattr(bounds.get(key), part, math.nan) for key in table.index]
        headers[name] = f"{headers[column]} [95%: {part.removeprefix('n_')}]"
    return names


def summary_frame(runs: pd.DataFrame) -> pd.DataFrame:
    """The sweep summary: one row per run, sorted by pair, task and method label."""
    if runs.empty:
        return runs
    runs = add_comparisons(_numeric_scores(runs))
    cols = [c for c in SUMMARY_COLUMNS if c in runs.columns]
    out = runs.sort_values([c for c in TABLE_ROWS if c in runs.columns])[cols]
    out = out.dropna(axis=1, how="all")
    return out.rename(columns=SUMMARY_COLUMNS).reset_index(drop=True)


__all__ = [
    "STUDY_TABLES",
    "SUMMARY_COLUMNS",
    "TABLE_ROWS",
    "row_keys",
    "study_tables",
    "summary_frame",
]
