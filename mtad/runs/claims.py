"""Claims about a method and their verdicts: the one rule that decides a claim on runs, and how
its estimate is written.

A claim names a method, a comparison column of :mod:`mtad.runs.comparison` and the side of "no
change" it claims (``holds_if: above 1`` for a speed-up, ``below 0`` for a PPL change). Its
estimate is the comparison of the method's done runs with their baseline runs (the one pairing
rule, :func:`~mtad.runs.comparison.paired_runs`) with its 95% interval
(:func:`~mtad.runs.comparison.comparison_interval`); its verdict is the interval's
(:func:`mtad.runs.intervals.verdict`: holds, does not hold, unresolved).

Two places decide claims, both here: the paper's claims table
(:func:`mtad.paper.render.claims_table`, the claims of ``experiments/*.yaml``) and the table of
one comparison sweep, ``python run.py +experiment=compare``
(:func:`mtad.runs.tables.compare_summary`, the claims of ``conf/experiment/compare.yaml``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from mtad.runs.comparison import (
    BY_COLUMN,
    CHANGE_COLUMNS,
    FACTOR_COLUMNS,
    BaselineRuns,
    comparison_interval,
    paired_runs,
)
from mtad.runs.intervals import (
    BOOTSTRAP_METHOD,
    MIN_PROMPTS,
    SEED_METHOD,
    Direction,
    Interval,
    verdict,
)

NOT_APPLICABLE = "—"
# What a verdict means, under every table that shows verdicts.
VERDICT_RULE = (
    "Verdict: holds (the interval lies entirely on the claimed side of no change), "
    "does not hold (entirely on the other side) or unresolved (it contains no change, "
    "or there is no interval)."
)
# What every table with ratio or change cells says about them.
INTERVAL_RULE = (
    f"Ratio, change and per-prompt score cells: mean [95% interval] (prompts x seeds); the "
    f"interval is a "
    f"{BOOTSTRAP_METHOD.removeprefix('95% ')}; energy ratios (measured per run, not per prompt): "
    f"{SEED_METHOD}. Ratios (x) are averaged over seeds and bounded on the log scale "
    f"(geometric mean; bounds > 0). [{NOT_APPLICABLE}]: no interval (fewer than {MIN_PROMPTS} "
    "prompts, or one seed)."
)
# The keys of a claim (a recipe's claim may hold more: source, paper).
CLAIM_FIELDS = ("claim", "method", "metric", "holds_if")


@dataclass(frozen=True)
class Claim:
    """``claim``: the sentence; ``method``: the label of the runs it is about; ``metric``: a
    comparison column (:data:`mtad.runs.comparison.COMPARISONS`); ``holds_if``: ``above X`` or
    ``below X``, the claimed side of ``X`` (no change: 1 for a factor, 0 for a change)."""

    claim: str
    method: str
    metric: str
    holds_if: str

    def __post_init__(self) -> None:
        if self.metric not in BY_COLUMN:
            raise ValueError(
                f"claim {self.claim!r}: metric must be a comparison column "
                f"({', '.join(BY_COLUMN)}), not {self.metric!r}"
            )
        parts = self.holds_if.split()
        ok = len(parts) == 2 and parts[0] in ("above", "below")
        try:
            ok = ok and math.isfinite(float(parts[1]))
        except ValueError:
            ok = False
        if not ok:
            raise ValueError(
                f"claim {self.claim!r}: holds_if must be 'above X' or 'below X', "
                f"not {self.holds_if!r}"
            )

    @classmethod
    def of(cls, mapping: Mapping[str, Any]) -> Claim:
        """A claim from a mapping with the :data:`CLAIM_FIELDS` (a recipe's or a preset's)."""
        missing = [k for k in CLAIM_FIELDS if k not in mapping]
        if missing:
            raise ValueError(f"claim {dict(mapping)!r}: missing {', '.join(missing)}")
        return cls(**{k: str(mapping[k]) for k in CLAIM_FIELDS})

    @property
    def direction(self) -> Direction:
        return "above" if self.holds_if.split()[0] == "above" else "below"

    @property
    def threshold(self) -> float:
        return float(self.holds_if.split()[1])


def method_interval(
    runs: pd.DataFrame, column: str, baselines: pd.DataFrame | BaselineRuns | None = None
) -> Interval:
    """The interval of comparison ``column`` over the done runs of ``runs`` (one method on one
    pair and task), each paired with its baseline run in ``baselines`` (default ``runs``; a
    :class:`~mtad.runs.comparison.BaselineRuns` of them when many groups share them)."""
    done = runs[runs["state"] == "done"] if "state" in runs.columns else runs
    frame = baselines.frame if isinstance(baselines, BaselineRuns) else baselines
    base = runs if frame is None or frame.empty else baselines
    return comparison_interval(paired_runs(done, BY_COLUMN[column], base))


def decide(
    claim: Claim, runs: pd.DataFrame, baselines: pd.DataFrame | None = None
) -> tuple[Interval, str]:
    """``claim``'s estimate over ``runs`` (its method's runs on one pair and task; baselines
    from ``baselines``, default ``runs``) and the verdict of its interval."""
    interval = method_interval(runs, claim.metric, baselines)
    return interval, verdict(interval.lo, interval.hi, claim.direction, claim.threshold)


def figure_text(x: float, column: str) -> str:
    """A figure as the tables write it: a change as ``+1.2%``, a factor as ``1.23x``, other
    figures with fixed decimals by magnitude, so a mean and its std line up."""
    if column in CHANGE_COLUMNS:
        return f"{100 * x:+.1f}%"
    if column in FACTOR_COLUMNS:
        return f"{x:.2f}x"
    for limit, decimals in ((10, 3), (100, 2), (1000, 1)):
        if abs(x) < limit:
            return f"{x:.{decimals}f}"
    return f"{x:.0f}"


def interval_text(interval: Interval, column: str, mean: float) -> str:
    """``mean [lo, hi] (prompts x seeds)``; ``[—]`` without an interval."""
    bounds = (
        f"[{figure_text(interval.lo, column)}, {figure_text(interval.hi, column)}]"
        if interval.has_interval
        else f"[{NOT_APPLICABLE}]"
    )
    return f"{figure_text(mean, column)} {bounds} ({interval.n_prompts} x {interval.n_seeds})"


__all__ = [
    "CLAIM_FIELDS",
    "INTERVAL_RULE",
    "NOT_APPLICABLE",
    "VERDICT_RULE",
    "Claim",
    "decide",
    "figure_text",
    "interval_text",
    "method_interval",
]
