"""Short rich tables printed at the end of a run and of a sweep."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd
from rich.console import Console
from rich.table import Table

from mtad.runs.claims import NOT_APPLICABLE, VERDICT_RULE, Claim
from mtad.runs.intervals import BOOTSTRAP_METHOD, MIN_PROMPTS
from mtad.runs.tables import compare_summary, summary_frame

# Piped output (logs, CI) would otherwise wrap at 80 columns.
PIPE_WIDTH = 180


def console() -> Console:
    c = Console()
    return c if c.is_terminal else Console(width=PIPE_WIDTH)


def fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        if value != 0 and not 1e-3 <= abs(value) < 1e6:
            return f"{value:.3g}"
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def render(frame: pd.DataFrame, title: str, out: Console | None = None) -> None:
    table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    for col in frame.columns:
        numeric = pd.api.types.is_numeric_dtype(frame[col])
        table.add_column(str(col), justify="right" if numeric else "left")
    for row in frame.itertuples(index=False):
        table.add_row(*(fmt(v) for v in row))
    (out or console()).print(table)


def print_runs(runs: pd.DataFrame, title: str, out: Console | None = None) -> None:
    """One row per run of ``runs`` (rows of :func:`mtad.runs.frame.load_runs`)."""
    frame = summary_frame(runs)
    if frame.empty:
        (out or console()).print(f"{title}: no completed runs")
        return
    render(frame, title, out)


def print_compare(
    runs: pd.DataFrame, claims: Sequence[Claim], title: str, out: Console | None = None
) -> None:
    """The table of a comparison sweep (``python run.py +experiment=compare``): what ran where,
    one row per method, one sentence per claim, and what the intervals and verdicts mean
    (:func:`mtad.runs.tables.compare_summary`: the paper's comparison and verdict rule)."""
    out = out or console()
    summary = compare_summary(runs, claims)
    if summary.table.empty:
        out.print(f"{title}: no completed runs")
    else:
        render(summary.table, "\n".join([title, *summary.setting]), out)
    out.print()
    for sentence in summary.verdicts:
        out.print(f"- {sentence}", highlight=False)
    intervals = (
        f"Intervals: {BOOTSTRAP_METHOD}; [{NOT_APPLICABLE}]: none (fewer than {MIN_PROMPTS} "
        "prompts)."
    )
    out.print(f"{VERDICT_RULE} {intervals}", style="dim", highlight=False)


def print_run(metrics: dict[str, Any], title: str, out: Console | None = None) -> None:
    """The end-of-run summary: the figures that matter, one per line."""
    energy = metrics.get("energy") or {}
    overhead = metrics.get("overhead_s") or {}
    rows = [
        (
            "run",
            f"{metrics.get('method')} on {metrics.get('pair')} / {metrics.get('task')}"
            f", seed {metrics.get('seed')}, {metrics.get('n_samples')} prompts",
        ),
        (
            "tokens",
            f"{metrics.get('new_tokens')} in {fmt(metrics.get('wall_time'))} s: "
            f"{fmt(metrics.get('tokens_per_s'))} tok/s, "
            f"{fmt(metrics.get('ms_per_token'))} ms/tok",
        ),
        (
            "draft",
            f"acceptance {fmt(metrics.get('acceptance_rate'))}, "
            f"{fmt(metrics.get('block_efficiency'))} tok/target forward, "
            f"time draft {fmt(metrics.get('time_draft'))} s / verify "
            f"{fmt(metrics.get('time_verify'))} s",
        ),
        (
            "by depth",
            "acceptance "
            + " / ".join(fmt(a) for a in metrics.get("depth_acceptance") or [])
            + "; iterations accepting 0.."
            + str(len(metrics.get("accept_histogram") or [1]) - 1)
            + ": "
            + " ".join(str(n) for n in metrics.get("accept_histogram") or []),
        ),
        (
            "quality",
            f"ppl {fmt(metrics.get('ppl'))}"
            + (
                f", {metrics['score_name']} {fmt(metrics.get('score'))}"
                if metrics.get("score_name")
                else ""
            ),
        ),
        (
            "energy",
            f"{fmt(energy.get('kwh'))} kWh, {fmt(energy.get('j_per_token'))} J/tok "
            f"(cpu: {energy.get('cpu_mode', '-')}, gpu: {energy.get('gpu_mode', '-')})"
            + (f"; warning: {energy['warning']}" if energy.get("warning") else "")
            if energy.get("tracker", "none") != "none"
            else "not measured",
        ),
        ("overhead", ", ".join(f"{k} {fmt(v)} s" for k, v in overhead.items())),
    ]
    table = Table(
        title=title, title_justify="left", show_header=False, show_edge=False, pad_edge=False
    )
    table.add_column(style="bold")
    table.add_column()
    for key, value in rows:
        table.add_row(key, value)
    (out or console()).print(table)
