"""Every table of runs: the paper's (:mod:`mtad.paper.render`), the quick tables of a study
(``analysis/make_tables.py``), the sweep summary and the table of a comparison sweep
(``python run.py +experiment=compare``), each a pandas group-by over runs
(:func:`mtad.runs.frame.load_study`, :func:`mtad.runs.frame.load_runs`, a paper plan's runs)
with the comparison columns of :mod:`mtad.runs.comparison`.

Rows are (pair, task, method label); a column of a row is its :class:`Figure`
(:func:`group_figures`): the mean over seeds (a ratio on the log scale:
:func:`mtad.runs.intervals.seed_mean`), its spread and, for a comparison, its paired 95%
interval. A study that holds runs of more than one machine (re-run on another CPU) gets one row
per machine as well: its runs are compared within their machine, and averaging them across
machines would mix timings.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

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
    BaselineRuns,
    add_comparisons,
    score_interval,
)
from mtad.runs.intervals import Interval, seed_mean

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


# The long frame of figures (:func:`figures_frame`): after the row keys, one row per column.
FIGURE_COLUMNS = ("metric", "mean", "std", "n", "lo", "hi", "n_prompts")


@dataclass(frozen=True)
class Figure:
    """One column over one group of runs (a label on a pair and task, its seeds), as every
    table gives it. ``values``: the finite values of the group's done runs; ``mean`` over them
    (a comparison's by its kind, :func:`mtad.runs.intervals.seed_mean`: a factor's geometric);
    ``std`` (NaN below two values); ``interval``: a comparison's, its runs paired with their
    baseline runs (:func:`mtad.runs.claims.method_interval`), a per-prompt score's over prompts
    (:func:`mtad.runs.comparison.score_interval`), else None."""

    values: tuple[float, ...]
    mean: float
    std: float
    interval: Interval | None


def done_runs(group: pd.DataFrame) -> pd.DataFrame:
    """The complete runs of ``group``: a paper plan's rows carry a ``state``, rows read from
    result folders are all complete."""
    return group[group["state"] == "done"] if "state" in group.columns else group


def done_values(group: pd.DataFrame, column: str) -> tuple[float, ...]:
    """The finite values of ``column`` in the done runs of ``group``."""
    if column not in group.columns:
        return ()
    numbers = pd.to_numeric(done_runs(group)[column], errors="coerce").dropna()
    return tuple(float(v) for v in numbers if math.isfinite(float(v)))


def distinct_text(group: pd.DataFrame, column: str) -> list[str]:
    """The distinct values of ``column`` in the done runs of ``group``, as sorted text."""
    if column not in group.columns:
        return []
    return sorted({str(v) for v in done_runs(group)[column].dropna() if str(v) not in ("", "nan")})


def column_figure(
    group: pd.DataFrame,
    column: str,
    baselines: pd.DataFrame | BaselineRuns,
    intervals: bool = True,
) -> Figure:
    """The :class:`Figure` of ``column`` over ``group``; ``intervals=False`` leaves the
    interval out (a figure that draws only the mean)."""
    done = done_runs(group)
    values = done_values(group, column)
    if not values:
        mean = math.nan
    elif column in BY_COLUMN:
        mean = seed_mean(values, BY_COLUMN[column].kind)
    else:
        mean = sum(values) / len(values)
    std = pd.Series(values).std(ddof=1) if len(values) > 1 else math.nan
    interval = None
    if intervals and column in BY_COLUMN:
        interval = method_interval(group, column, baselines)
    elif intervals and column == "score" and values:
        interval = score_interval(done)
    return Figure(values, mean, std, interval)


def group_figures(
    runs: pd.DataFrame,
    columns: Sequence[str],
    keys: Sequence[str] = TABLE_ROWS,
    baselines: pd.DataFrame | None = None,
    *,
    sort: bool = True,
    intervals: bool = True,
) -> Iterator[tuple[tuple[Any, ...], pd.DataFrame, dict[str, Figure]]]:
    """``(key, group, {column: Figure})`` for each group of ``runs`` by ``keys`` (sorted, or in
    the order of ``runs`` with ``sort=False``), comparisons paired with the baseline runs of
    ``baselines`` (default ``runs``)."""
    # every group is paired with the same baselines: their rows by key are found once
    pairing = BaselineRuns(runs if baselines is None else baselines)
    for key, group in runs.groupby(list(keys), sort=sort, dropna=False):
        figures = {c: column_figure(group, c, pairing, intervals) for c in columns}
        yield (key if isinstance(key, tuple) else (key,)), group, figures


def figures_frame(
    rows: Iterable[tuple[tuple[Any, ...], dict[str, Figure]]], keys: Sequence[str]
) -> pd.DataFrame:
    """The long frame of ``(key, figures)`` rows: ``*keys, *FIGURE_COLUMNS``, one row per
    figure with a value, in the order given (the interval's bounds NaN where it has none)."""
    out = []
    for key, figures in rows:
        for column, figure in figures.items():
            if not figure.values:
                continue
            interval = figure.interval
            out.append(
                {
                    **dict(zip(keys, key, strict=True)),
                    "metric": column,
                    "mean": figure.mean,
                    "std": figure.std,
                    "n": len(figure.values),
                    "lo": interval.lo if interval else math.nan,
                    "hi": interval.hi if interval else math.nan,
                    "n_prompts": interval.n_prompts if interval else math.nan,
                }
            )
    return pd.DataFrame(out, columns=[*keys, *FIGURE_COLUMNS])


def study_tables(runs: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """``{name: table}`` of :data:`STUDY_TABLES`: one row per :func:`row_keys` group, values
    averaged over seeds (``seeds`` counts them; :func:`group_figures`); each comparison column
    is followed by its 95% interval (``... [95%: lo]``, ``[95%: hi]``, ``[95%: prompts]``)."""
    if runs.empty:
        return {}
    runs = add_comparisons(_numeric_scores(runs))
    keys = row_keys(runs)
    tables = {}
    for name, headers in STUDY_TABLES.items():
        present = [c for c in headers if c in runs.columns and runs[c].notna().any()]
        numeric = [c for c in present if pd.api.types.is_numeric_dtype(runs[c])]
        rows, names = [], dict(headers)  # names gains the interval headers
        for key, group, figures in group_figures(runs, numeric, keys):
            row: dict[str, Any] = dict(zip(keys, key, strict=True))
            for c in present:
                row[c] = figures[c].mean if c in figures else ",".join(distinct_text(group, c))
                if c in COMPARISON_COLUMNS:
                    row.update(_bounds(figures[c], c, names))
            row["seeds"] = group["seed"].nunique()
            rows.append(row)
        tables[name] = pd.DataFrame(rows).set_index(keys).rename(columns=names)
    return tables


def _bounds(figure: Figure, column: str, headers: dict[str, str]) -> dict[str, Any]:
    """``<column>_lo``, ``_hi``, ``_prompts`` of a comparison's figure; their headers are added
    to ``headers``."""
    out = {}
    for part in ("lo", "hi", "n_prompts"):
        name = f"{column}_{part.removeprefix('n_')}"
        out[name] = getattr(figure.interval, part, math.nan)
        headers[name] = f"{headers[column]} [95%: {part.removeprefix('n_')}]"
    return out


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


def _compare_cell(group: pd.DataFrame, runs: pd.DataFrame, column: str) -> float | str:
    """A comparison table's cell: the baseline's own comparison says so; a comparison shows its
    estimate and interval (:class:`Figure`), another column its mean."""
    if column in BY_COLUMN and str(group["label"].iloc[0]) == BY_COLUMN[column].baseline:
        return BASELINE_CELL
    figure = column_figure(group, column, runs)
    if figure.interval is None:
        return figure.mean
    interval = figure.interval
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
                row[column] = _compare_cell(group, runs, column)
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
    "FIGURE_COLUMNS",
    "CompareSummary",
    "Figure",
    "STUDY_TABLES",
    "SUMMARY_COLUMNS",
    "TABLE_ROWS",
    "column_figure",
    "compare_summary",
    "distinct_text",
    "done_runs",
    "done_values",
    "figures_frame",
    "group_figures",
    "row_keys",
    "study_tables",
    "summary_frame",
]
