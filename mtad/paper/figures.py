"""The recipes' figures (matplotlib, PNG + PDF): ablation sweeps with error bars over seeds,
bars per method, the stacked draft / verify / other time split, and the quality-speed frontier
(each point a method's two comparisons with their paired 95% intervals, as the tables give
them: :func:`mtad.paper.render.frontier_points`). Axes carry units."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.ticker import PercentFormatter

from mtad.runs.comparison import CHANGE_COLUMNS
from mtad.runs.tables import group_figures

matplotlib.use("Agg")  # figures are files; no display

ROW_KEYS = ["pair", "task", "method"]
# Axis labels with units; ratio columns are plain factors.
LABELS: dict[str, str] = {
    "speedup_vs_ar": "speed-up vs AR (x)",
    "speedup_vs_sps": "speed-up vs SpS (x)",
    "ppl_change_vs_ar": "PPL change vs AR",
    "score_change_vs_ar": "score change vs AR",
    "block_efficiency": "tokens per target forward",
    "acceptance_rate": "acceptance rate",
    "ppl": "perplexity (target-scored)",
    "ms_per_token": "ms per token",
    "draft_ms_per_token": "draft (ms/token)",
    "verify_ms_per_token": "verify (ms/token)",
    "other_ms_per_token": "other (ms/token)",
    "j_per_token": "energy (J/token)",
    "method.tau": "tau",
    "method.beam_width": "beam width B",
    "method.gamma": "block size gamma",
}

# --------------------------------------------------------------------------------------------
# figures


def _series(runs: pd.DataFrame, column: str) -> pd.DataFrame:
    """Mean and std over seeds per (pair, task, method) for one metric (done runs only), as
    the tables have them (:func:`mtad.runs.tables.group_figures`: a ratio's mean on the log
    scale)."""
    done = runs[runs["state"] == "done"]
    if done.empty or column not in done.columns:
        return pd.DataFrame(columns=[*ROW_KEYS, "mean", "std"])
    figures = group_figures(done, [column], ROW_KEYS, sort=False, intervals=False)
    rows = [
        {**dict(zip(ROW_KEYS, key, strict=True)), "mean": f[column].mean, "std": f[column].std}
        for key, _, f in figures
    ]
    return pd.DataFrame(rows, columns=[*ROW_KEYS, "mean", "std"])


def draw_figure(
    spec: dict[str, Any],
    runs: pd.DataFrame,
    path: Path,
    title: str,
    points: pd.DataFrame | None = None,
) -> bool:
    """One figure of a recipe as PNG and PDF; False when there is nothing to draw. A
    ``frontier`` draws ``points`` (:func:`mtad.paper.render.frontier_points`), nothing else."""
    kind, ys = spec["kind"], list(spec["y"])
    if runs.empty or not (runs["state"] == "done").any():
        return False
    if kind == "frontier":
        if points is None or points.empty:
            return False
        fig = _frontier(spec, points)
    elif kind == "stacked":
        groups = list(runs.groupby(["pair", "task"], sort=False))
        fig, axes = plt.subplots(1, len(groups), figsize=(6 * len(groups), 4), squeeze=False)
        for ax, ((pair, task), group) in zip(axes[0], groups, strict=True):
            bottom = None
            for column in ys:
                s = _series(group, column)
                if s.empty:
                    continue
                label = LABELS.get(column, column)
                ax.bar(s["method"], s["mean"], bottom=bottom, label=label)
                bottom = s["mean"].to_numpy() if bottom is None else bottom + s["mean"].to_numpy()
            ax.set_title(f"{pair} / {task}")
            ax.set_ylabel("ms per generated token")
            ax.set_xlabel("method")
            ax.tick_params(axis="x", rotation=30)
            ax.legend(fontsize=8)
    else:
        fig, axes = plt.subplots(1, len(ys), figsize=(4.5 * len(ys), 3.8), squeeze=False)
        for ax, column in zip(axes[0], ys, strict=True):
            if kind == "sweep":
                _sweep_panel(ax, spec, runs, column)
            else:
                _bar_panel(ax, runs, column)
            ax.set_ylabel(LABELS.get(column, column))
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path.with_suffix(".png"), dpi=120)
    fig.savefig(path.with_suffix(".pdf"))
    plt.close(fig)
    return True


def _frontier(spec: dict[str, Any], points: pd.DataFrame) -> Any:
    """One panel per y column and (pair, task): x against y, each point with both of its
    intervals as error bars (none where there is no interval). A method with several settings
    (``mtad`` over tau, ``bild`` over its thresholds) is a line through its points in order of
    x, each point labelled with its settings; ``spec['points']`` (the reference methods: AR,
    the exact verifiers, MTJD) are single square markers."""
    x, ys = str(spec["x"]), [str(y) for y in spec["y"]]
    reference = [str(m) for m in spec.get("points") or ()]
    groups = list(points.groupby(["pair", "task"], sort=False))
    fig, axes = plt.subplots(
        len(ys), len(groups), figsize=(6.5 * len(groups), 4.8 * len(ys)), squeeze=False
    )
    for row, y in enumerate(ys):
        for ax, ((pair, task), group) in zip(axes[row], groups, strict=True):
            for name, series in group.groupby("method_name", sort=False):
                series = series.dropna(subset=[x, y]).sort_values(x)
                if series.empty:
                    continue
                single = name in reference or len(series) == 1
                bars = ax.errorbar(
                    series[x],
                    series[y],
                    xerr=_errors(series, x),
                    yerr=_errors(series, y),
                    marker="s" if name in reference else "o",
                    ls="none" if single else "-",
                    capsize=3,
                    label=str(name),
                )
                if not single:  # each setting of the sweep named beside its point
                    for _, point in series.iterrows():
                        setting = str(point["method"]).removeprefix(str(name)).strip("()")
                        ax.annotate(
                            setting,
                            (point[x], point[y]),
                            textcoords="offset points",
                            xytext=(4, 4),
                            fontsize=6,
                            color=bars[0].get_color(),
                        )
            ax.axvline(1.0, color="grey", lw=0.8, ls="--")
            ax.axhline(0.0, color="grey", lw=0.8, ls="--")
            if y in CHANGE_COLUMNS:
                ax.yaxis.set_major_formatter(PercentFormatter(1.0))
            ax.set_title(f"{pair} / {task}")
            ax.set_xlabel(LABELS.get(x, x))
            ax.set_ylabel(LABELS.get(y, y))
            ax.legend(fontsize=7)
    return fig


def _errors(series: pd.DataFrame, column: str) -> list[list[float]]:
    """Asymmetric error bars ``[mean - lo, hi - mean]`` from a column's interval; 0 where it
    has none (matplotlib refuses a negative length: a BCa interval may, rarely, leave out the
    estimate by a rounding error)."""
    below = (series[column] - series[f"{column}_lo"]).fillna(0.0).clip(lower=0.0)
    above = (series[f"{column}_hi"] - series[column]).fillna(0.0).clip(lower=0.0)
    return [below.tolist(), above.tolist()]


def _sweep_panel(ax: Any, spec: dict[str, Any], runs: pd.DataFrame, column: str) -> None:
    x_key = str(spec["x"]).removeprefix("method.")
    sub = runs[(runs["method_name"] == spec["method"]) & runs[f"param.{x_key}"].notna()]
    for (pair, task), group in sub.groupby(["pair", "task"], sort=False):
        s = _series(group, column)
        xs = group.drop_duplicates("method").set_index("method")[f"param.{x_key}"]
        s["x"] = s["method"].map(xs).astype(float)
        s = s.sort_values("x")
        ax.errorbar(
            s["x"],
            s["mean"],
            yerr=s["std"].fillna(0),
            marker="o",
            capsize=3,
            label=f"{pair}/{task}",
        )
    if column.startswith("speedup"):
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xlabel(LABELS.get(str(spec["x"]), str(spec["x"])))
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)


def _bar_panel(ax: Any, runs: pd.DataFrame, column: str) -> None:
    s = _series(runs, column).dropna(subset=["mean"])
    groups = list(s.groupby(["pair", "task"], sort=False))
    width = 0.8 / max(len(groups), 1)
    methods = list(dict.fromkeys(s["method"]))
    for i, ((pair, task), group) in enumerate(groups):
        xs = [methods.index(m) + i * width for m in group["method"]]
        ax.bar(
            xs, group["mean"], width, yerr=group["std"].fillna(0), capsize=3, label=f"{pair}/{task}"
        )
    ax.set_xticks(
        [i + width * (len(groups) - 1) / 2 for i in range(len(methods))], methods, rotation=30
    )
    if column.startswith("speedup") or "ratio" in column:
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("method")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)


__all__ = ["LABELS", "draw_figure"]
