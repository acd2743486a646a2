"""The quick tables of a study (``analysis/make_tables.py``), the sweep summary and the table of
a comparison sweep (``python run.py +experiment=compare``), each a pandas group-by over runs
(:func:`mtad.runs.frame.load_study`, :func:`mtad.runs.frame.load_runs`) with the comparison
columns of :mod:`mtad.runs.comparison`.

Rows are (pair, task, method label), values averaged over seeds (a ratio on the log scale:
:func:`mtad.runs.comparison.seed_means`). A study that holds runs of
more than one machine (re-run on another CPU) gets one row per machine as well: its runs are
compared within their machine, and averaging them across machines would mix timings.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from mtad.runs.claims import (
    NOT_APPLICABLE,
    Claim,
    decide,
    interval_text,
    method_interval,
)
from mtad.runs.comparison import (
    BY_COLUMN,
    COMPARISON_COLUMNS,
    COMPARISONS,
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


# --------------------------------------------------------------------------------------------
# the comparison sweep: a few methods on the same prompts, one table and the claims' verdicts

# Columns of the comparison table, with their headers; comparison columns show the estimate and
# its 95% interval (mtad.runs.claims.interval_text).
COMPARE_COLUMNS: dict[str, str] = {
    "tokens_per_s": "tok/s",
    "speedup_vs_ar": "x AR [95%] (prompts x seeds)",
    "speedup_vs_sps": "x SpS [95%]",
    "block_efficiency": "tok/target fwd",
    "ppl": "PPL",
    "ppl_change_vs_ar": "PPL vs AR [95%]",
}
BASELINE_CELL = "baseline"


@dataclass(frozen=True)
class CompareSummary:
    """``table``: one row per method (and pair, task, machine where the runs hold several);
    ``setting``: what ran where (prompts, seeds, machine, dtypes), one line each;
    ``verdicts``: one sentence per claim (and pair and task), its verdict and its estimate."""

    table: pd.DataFrame
    setting: list[str]
    verdicts: list[str]


def _label_order(labels: Sequence[str]) -> list[str]:
    """The baselines first (AR, then SpS: :data:`COMPARISONS` order), then the others."""
    baselines = list(dict.fromkeys(c.baseline for c in COMPARISONS))
    first = [b for b in baselines if b in labels]
    return first + sorted(set(labels) - set(first))


def _mean(group: pd.DataFrame, column: str) -> float:
    if column not in group.columns:
        return math.nan
    values = pd.to_numeric(group[column], errors="coerce").dropna()
    return float(values.mean()) if not values.empty else math.nan


def _comparison_cell(group: pd.DataFrame, runs: pd.DataFrame, column: str) -> str:
    label = str(group["label"].iloc[0])
    if label == BY_COLUMN[column].baseline:
        return BASELINE_CELL
    interval = method_interval(group, column, runs)
    if interval.n_seeds == 0 or not math.isfinite(interval.mean):
        return NOT_APPLICABLE  # no baseline run under the same key, or no value
    return interval_text(interval, column, interval.mean)


def _distinct(runs: pd.DataFrame, column: str) -> str:
    if column not in runs.columns:
        return NOT_APPLICABLE
    values = sorted({str(v) for v in runs[column].dropna()})
    return ", ".join(values) if values else NOT_APPLICABLE


def compare_summary(runs: pd.DataFrame, claims: Sequence[Claim]) -> CompareSummary:
    """The comparison of the runs of one sweep (rows of :func:`mtad.runs.frame.load_runs`):
    every figure is the tables' (comparison columns by :func:`mtad.runs.claims.method_interval`,
    the one pairing rule and its 95% interval), every verdict the paper's
    (:func:`mtad.runs.claims.decide`). A claim is about the runs labelled ``claim.method``."""
    if runs.empty:
        return CompareSummary(
            pd.DataFrame(), [], [f"{c.claim}: unresolved (no run)" for c in claims]
        )
    runs = add_comparisons(runs)
    keys = row_keys(runs)
    group_keys = [k for k in keys if k != "label"]
    rows = []
    for key, where in runs.groupby(group_keys, sort=False, dropna=False):
        head = dict(zip(group_keys, key if isinstance(key, tuple) else (key,), strict=True))
        for label in _label_order([str(x) for x in where["label"].unique()]):
            group = where[where["label"] == label]
            row: dict[str, object] = {**head, "method": label}
            for column in COMPARE_COLUMNS:
                row[column] = (
                    _comparison_cell(group, runs, column)
                    if column in BY_COLUMN
                    else _mean(group, column)
                )
            rows.append(row)
    table = pd.DataFrame(rows)
    if runs[["pair", "task"]].drop_duplicates().shape[0] == 1:
        table = table.drop(columns=["pair", "task"])  # said once, in the setting
    table = table.rename(columns=COMPARE_COLUMNS)
    return CompareSummary(table, _setting(runs), _verdicts(runs, claims))


def _setting(runs: pd.DataFrame) -> list[str]:
    prompts = sorted({int(n) for n in pd.to_numeric(runs["n_samples"], errors="coerce").dropna()})
    seeds = sorted({str(s) for s in runs["seed"].dropna()}) if "seed" in runs else []
    dtypes = [
        f"{role} {_distinct(runs, f'dtypes.{role}.dtype')}"
        for role in ("target", "draft")
        if f"dtypes.{role}.dtype" in runs.columns
    ]
    return [
        f"{_distinct(runs, 'pair')} / {_distinct(runs, 'task')}: "
        f"{'/'.join(map(str, prompts)) or NOT_APPLICABLE} prompts, "
        f"seed{'s' if len(seeds) != 1 else ''} {', '.join(seeds) or NOT_APPLICABLE}",
        f"{_distinct(runs, 'hardware')}; dtype: {', '.join(dtypes) or NOT_APPLICABLE}",
    ]


def _verdicts(runs: pd.DataFrame, claims: Sequence[Claim]) -> list[str]:
    """One sentence per claim and (pair, task): ``<claim>: <verdict>: <estimate>``."""
    places = runs[["pair", "task"]].drop_duplicates()
    several = len(places) > 1
    out = []
    for claim in claims:
        sub = runs[runs["label"] == claim.method]
        said = False
        for (pair, task), group in sub.groupby(["pair", "task"], sort=False):
            interval, decided = decide(claim, group, runs)
            if interval.n_seeds == 0:
                continue
            where = f" on {pair}/{task}" if several else ""
            estimate = interval_text(interval, claim.metric, interval.mean)
            out.append(f"{claim.claim}{where}: {decided}: {estimate}")
            said = True
        if not said:
            base = BY_COLUMN[claim.metric].baseline
            out.append(
                f"{claim.claim}: unresolved: no {claim.method} run with a {base} run to "
                "compare it with"
            )
    return out


__all__ = [
    "COMPARE_COLUMNS",
    "CompareSummary",
    "STUDY_TABLES",
    "SUMMARY_COLUMNS",
    "TABLE_ROWS",
    "compare_summary",
    "row_keys",
    "study_tables",
    "summary_frame",
]
