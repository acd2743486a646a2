"""The one rule that compares runs, and the intervals of the comparisons.

Every table of the project goes through here, by way of :mod:`mtad.runs.tables`: the quick
per-study tables (``analysis/make_tables.py``), the summary printed after a sweep
(:mod:`mtad.harness.summary`), the paper's tables, figures and claims
(:mod:`mtad.paper.render`) and the W&B analysis run.

**The rule.** A run is compared with a baseline run (:data:`COMPARISONS`: ``ar`` for speed-up
and quality changes, ``sps`` for speed and energy) when both have the same comparison key
(:meth:`mtad.runs.identity.RunIdentity.comparison_key`): the run's identity without the method,
within one study. So the same pair with its dtypes, task and its data, seed, warping, runtime
and energy settings, and the same hardware (device kind; CPU model, native bfloat16 and threads,
or GPU model and count): a ratio is never taken across machines. The baseline is the run
labelled with the bare baseline method name: in a paper plan, the baseline planned at its
defaults; in a study read from disk, the baseline method when its parameters do not vary in the
study (``sps`` swept over gamma has no run called ``sps``, so nothing is compared with an
arbitrary one of them). Several baseline runs under one key are averaged. A ratio is taken per
run (so per seed) and averaged over seeds by the tables
(:func:`mtad.runs.tables.group_figures`: a factor on the log scale,
:func:`mtad.runs.intervals.seed_mean`). This is the spec's "same pair, task, hardware and seed
set, measured in the same sweep".

**Pairing.** :func:`paired_runs` yields, for one comparison, each run with its baseline run
(same key, hence same seed); :func:`paired_samples` joins two paired runs' per-prompt records
(``samples.jsonl`` and ``timings.jsonl``) by prompt id. The intervals over prompts and seeds
(:mod:`mtad.runs.intervals`) start from these two functions.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from mtad.runs.folder import per_prompt
from mtad.runs.identity import identity_of
from mtad.runs.intervals import (
    BOOTSTRAP_METHOD,
    Interval,
    Kind,
    PairedValues,
    identity,
    mean_bootstrap,
    paired_bootstrap,
    perplexity,
    seed_interval,
)


@dataclass(frozen=True)
class Comparison:
    """One cross-run figure: ``column`` compares ``metric`` of a run with the baseline's.

    ``factor``: ``baseline / run``, for metrics where lower is better (ms/token, J/token), so
    > 1 means the run is faster or uses less energy; averaged over seeds and given its interval
    on the log scale (:mod:`mtad.runs.intervals`). ``change``: ``run / baseline - 1``, the
    relative change (PPL, downstream score); undefined (NaN) at a zero baseline.
    """

    column: str
    metric: str
    baseline: str
    kind: Kind

    def of(self, run: Any, base: Any) -> float:
        r, b = number(run), number(base)
        if r is None or b is None:
            return math.nan
        if self.kind == "change":
            return r / b - 1.0 if b != 0 else math.nan
        return b / r if r != 0 else math.nan


COMPARISONS: tuple[Comparison, ...] = (
    Comparison("speedup_vs_ar", "ms_per_token", "ar", "factor"),
    Comparison("speedup_vs_sps", "ms_per_token", "sps", "factor"),
    Comparison("energy_ratio_vs_sps", "j_per_token", "sps", "factor"),
    Comparison("gpu_energy_ratio_vs_sps", "gpu_j_per_token", "sps", "factor"),
    Comparison("ppl_change_vs_ar", "ppl", "ar", "change"),
    Comparison("score_change_vs_ar", "score", "ar", "change"),
)
COMPARISON_COLUMNS: tuple[str, ...] = tuple(c.column for c in COMPARISONS)
FACTOR_COLUMNS: tuple[str, ...] = tuple(c.column for c in COMPARISONS if c.kind == "factor")
CHANGE_COLUMNS: tuple[str, ...] = tuple(c.column for c in COMPARISONS if c.kind == "change")
BY_COLUMN: dict[str, Comparison] = {c.column: c for c in COMPARISONS}


def number(value: Any) -> float | None:
    """``value`` as a finite float, else None."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


# --------------------------------------------------------------------------------------------
# pairing and the comparison columns


@dataclass(frozen=True)
class PairedRuns:
    """A run and the baseline run it is compared with under ``comparison`` (rows as dicts)."""

    comparison: Comparison
    run: dict[str, Any]
    baseline: dict[str, Any]

    @property
    def seed(self) -> Any:
        return self.run.get("seed")


def _key_column(frame: pd.DataFrame) -> list[Any]:
    return list(frame["comparison_key"]) if "comparison_key" in frame else [None] * len(frame)


def baseline_runs(baselines: pd.DataFrame, comparison: Comparison) -> dict[str, list[dict]]:
    """``comparison key -> baseline rows`` (label exactly the baseline method's name)."""
    out: dict[str, list[dict[str, Any]]] = {}
    if baselines.empty or "label" not in baselines:
        return out
    done = baselines["state"] == "done" if "state" in baselines else True
    chosen = baselines[(baselines["label"] == comparison.baseline) & done]
    seen: set[str] = set()
    for key, row in zip(_key_column(chosen), chosen.to_dict("records"), strict=True):
        run = str(row.get("result_dir") or row.get("signature") or id(row))
        if key is not None and run not in seen:  # a run planned by two recipes counts once
            seen.add(run)
            out.setdefault(str(key), []).append(row)
    return out


class BaselineRuns:
    """:func:`baseline_runs` of one frame, found once per baseline method: a table pairs the
    runs of each of its cells with the same baselines, and each look-up converts the frame's
    rows (``DataFrame.to_dict`` of a frame of a hundred columns: milliseconds, asked for
    hundreds of times by a paper rendering). The frame must not change while this is used."""

    def __init__(self, frame: pd.DataFrame) -> None:
        self.frame = frame
        self._by_baseline: dict[str, dict[str, list[dict[str, Any]]]] = {}

    def __call__(self, comparison: Comparison) -> dict[str, list[dict[str, Any]]]:
        # baseline_runs depends on the comparison only through its baseline label
        if comparison.baseline not in self._by_baseline:
            self._by_baseline[comparison.baseline] = baseline_runs(self.frame, comparison)
        return self._by_baseline[comparison.baseline]


def paired_runs(
    runs: pd.DataFrame,
    comparison: Comparison,
    baselines: pd.DataFrame | BaselineRuns | None = None,
) -> Iterator[PairedRuns]:
    """Each row of ``runs`` with each baseline run of ``baselines`` (default: ``runs``) that
    shares its comparison key; rows without a baseline yield nothing."""
    if isinstance(baselines, BaselineRuns):
        by_key = baselines(comparison)
    else:
        by_key = baseline_runs(runs if baselines is None else baselines, comparison)
    for key, row in zip(_key_column(runs), runs.to_dict("records"), strict=True):
        for base in by_key.get(str(key), []) if key is not None else []:
            yield PairedRuns(comparison, row, base)


def compare_runs(
    runs: pd.DataFrame,
    comparison: Comparison,
    baselines: pd.DataFrame | BaselineRuns | None = None,
) -> list[float]:
    """``comparison`` for every row of ``runs`` (NaN without a baseline or a value): the
    baseline's metric averaged over its runs under the key, then :meth:`Comparison.of`."""
    if isinstance(baselines, BaselineRuns):
        by_key = baselines(comparison)
    else:
        by_key = baseline_runs(runs if baselines is None else baselines, comparison)
    values = []
    for key, row in zip(_key_column(runs), runs.to_dict("records"), strict=True):
        bases = [number(b.get(comparison.metric)) for b in by_key.get(str(key), [])]
        bases = [b for b in bases if b is not None]
        base = sum(bases) / len(bases) if bases else None
        values.append(comparison.of(row.get(comparison.metric), base))
    return values


def add_comparisons(runs: pd.DataFrame, baselines: pd.DataFrame | None = None) -> pd.DataFrame:
    """``runs`` with one column per :data:`COMPARISONS` entry (``speedup_vs_ar``, ...,
    ``score_change_vs_ar``). Baselines are looked up in ``baselines`` (default ``runs``): the
    paper passes every run of its plan, since any recipe may hold a baseline."""
    if runs.empty:
        return runs
    runs = with_identity(runs)
    # Baselines found once per baseline method. Not ``runs`` itself: the loop adds columns to
    # it, and a run's comparisons read only its metrics and key, which the loop leaves alone.
    pairing = BaselineRuns(with_identity(runs if baselines is None else baselines))
    for comparison in COMPARISONS:
        runs[comparison.column] = compare_runs(runs, comparison, pairing)
    return runs


def with_identity(frame: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``frame`` with ``comparison_key`` and ``label`` filled in where a frame built
    by hand lacks them: the key from the row's own identity and hardware columns (no config),
    the label from the method."""
    frame = frame.copy()
    if "comparison_key" not in frame.columns:
        frame["comparison_key"] = [
            identity_of({}, row).comparison_key(row.get("study"))
            for row in frame.to_dict("records")
        ]
    if "label" not in frame.columns and "method" in frame.columns:
        frame["label"] = frame["method"].astype(str)
    return frame


# The row column holding a stored run's per-prompt records (mtad.runs.store): a run re-rendered
# from a committed reference has no result folder.
STORED_PROMPTS = "stored_prompts"


def run_prompts(row: dict[str, Any]) -> dict[Any, dict[str, Any]]:
    """A run row's per-prompt records: its stored ones (:data:`STORED_PROMPTS`), else those of
    its result folder (:func:`mtad.runs.folder.per_prompt`)."""
    stored = row.get(STORED_PROMPTS)
    if isinstance(stored, dict):
        return stored
    return per_prompt(Path(str(row["result_dir"])))


def paired_samples(pair: PairedRuns) -> Iterator[tuple[Any, dict[str, Any], dict[str, Any]]]:
    """``(prompt id, run record, baseline record)`` for every prompt both runs decoded, in the
    run's order; a record is the prompt's ``samples.jsonl`` line merged with its
    ``timings.jsonl`` line (``mean_logprob``, ``new_tokens``, ``wall_time``, ...)."""
    run, base = run_prompts(pair.run), run_prompts(pair.baseline)
    for prompt_id, record in run.items():
        if prompt_id in base:
            yield prompt_id, record, base[prompt_id]


# --------------------------------------------------------------------------------------------
# intervals (the statistics: mtad.runs.intervals)


@dataclass(frozen=True)
class PerPrompt:
    """How a run's ``metric`` is made of its per-prompt records: ``scale * sum(numerator) /
    sum(denominator)`` (denominator None: a mean over prompts), then ``transform``."""

    numerator: str
    denominator: str | None = None
    scale: float = 1.0
    transform: Any = identity


PER_PROMPT: dict[str, PerPrompt] = {
    "ms_per_token": PerPrompt("wall_time", "new_tokens", scale=1000.0),  # timings / samples
    "ppl": PerPrompt("mean_logprob", transform=perplexity),  # exp(-mean log-prob)
}


def _per_prompt_form(comparison: Comparison, pairs: list[PairedRuns]) -> PerPrompt | None:
    """The metric's :data:`PER_PROMPT` form; a score is the mean of the per-prompt field its
    task names (``metrics.json`` ``score_record``), when both runs' tasks name the same one."""
    if comparison.metric != "score":
        return PER_PROMPT.get(comparison.metric)
    fields = {str(p.run.get("score_record")) for p in pairs}
    fields |= {str(p.baseline.get("score_record")) for p in pairs}
    field = fields.pop() if len(fields) == 1 else None
    return PerPrompt(field) if field and field not in ("None", "nan") else None


def paired_values(pairs: list[PairedRuns], form: PerPrompt) -> PairedValues | None:
    """The per-prompt numerators and denominators of every pair (one row per pair, so per
    seed), over the prompts that every pair decoded under both methods; None without any."""
    rows = [{pid: (r, b) for pid, r, b in paired_samples(pair)} for pair in pairs]
    if not rows:
        return None
    common = [pid for pid in rows[0] if all(pid in row for row in rows[1:])]
    if not common:
        return None

    def grid(side: int, key: str | None, scale: float) -> np.ndarray:
        def value(record: dict[str, Any]) -> float:
            if key is None:
                return 1.0
            x = number(record.get(key))
            return math.nan if x is None else x

        return scale * np.array([[value(row[pid][side]) for pid in common] for row in rows])

    return PairedValues(
        run_num=grid(0, form.numerator, form.scale),
        run_den=grid(0, form.denominator, 1.0),
        base_num=grid(1, form.numerator, form.scale),
        base_den=grid(1, form.denominator, 1.0),
    )


def comparison_interval(pairs: Iterable[PairedRuns]) -> Interval:
    """The comparison of paired runs (one :class:`Comparison`) with its 95% interval: the
    paired, seed-stratified bootstrap over prompts of :mod:`mtad.runs.intervals` where the
    metric is made of per-prompt records (:data:`PER_PROMPT`, a task's ``score_record``), else
    (energy: measured per run) a Student-t interval over the per-seed comparisons."""
    pairs = list(pairs)
    if not pairs:
        return seed_interval([])
    comparison = pairs[0].comparison
    form = _per_prompt_form(comparison, pairs)
    if form is not None:
        values = paired_values(pairs, form)
        if values is None:  # no prompt decoded by every pair: nothing to resample
            return Interval(math.nan, math.nan, math.nan, 0, len(pairs), BOOTSTRAP_METHOD)
        return paired_bootstrap(values, comparison.kind, form.transform)
    metric = comparison.metric
    per_seed = [comparison.of(p.run.get(metric), p.baseline.get(metric)) for p in pairs]
    prompts = {int(n) for p in pairs if (n := number(p.run.get("n_samples"))) is not None}
    return seed_interval(per_seed, min(prompts) if prompts else 0, comparison.kind)


def score_interval(runs: pd.DataFrame) -> Interval | None:
    """The downstream score of ``runs`` (one method on one pair and task, one row per seed)
    with its 95% interval over prompts (:func:`mtad.runs.intervals.mean_bootstrap`), from
    the per-prompt field the task names (``score_record``), over the prompts every run
    decoded; None when the task has no per-prompt score."""
    rows = runs.to_dict("records")
    fields = {str(r.get("score_record")) for r in rows}
    if not rows or len(fields) != 1 or fields & {"None", "nan"}:
        return None
    field = fields.pop()
    per_run = [run_prompts(r) for r in rows]
    common = [pid for pid in per_run[0] if all(pid in p for p in per_run[1:])]
    if not common:
        return None

    def value(record: dict[str, Any]) -> float:
        x = number(record.get(field))
        return math.nan if x is None else x

    return mean_bootstrap(np.array([[value(p[pid]) for pid in common] for p in per_run]))


__all__ = [
    "BY_COLUMN",
    "BaselineRuns",
    "STORED_PROMPTS",
    "CHANGE_COLUMNS",
    "COMPARISONS",
    "COMPARISON_COLUMNS",
    "FACTOR_COLUMNS",
    "Comparison",
    "PairedRuns",
    "add_comparisons",
    "comparison_interval",
    "number",
    "paired_runs",
    "paired_samples",
    "run_prompts",
    "score_interval",
]
