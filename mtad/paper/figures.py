"""The recipes' figures (matplotlib, PNG + PDF): ablation sweeps with error bars over seeds,
bars per method, and the stacked draft / verify / other time split. Axes carry units."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.pyplot as plt
import pandas as pd

from mtad.runs.comparison import seed_means

matplotlib.use("Agg")  # figures are files; no display

ROW_KEYS = ["pair", "task", "method"]
# Axis labels with units; ratio columns are plain factors.
LABELS: dict[str, str] = {
    "speedup_vs_ar": "speed-up vs AR (x)",
    "speedup_vs_sps": "speed-up vs SpS (x)",
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
    """Mean and std over seeds per (pair, task, method) for one metric (done runs only); a
    ratio's mean on the log scale (:func:`mtad.runs.comparison.seed_means`)."""
    done = runs[runs["state"] == "done"].copy()
    if done.empty or column not in done.columns:
        return pd.DataFrame(columns=[*ROW_KEYS, "mean", "std"])
    done[column] = pd.to_numeric(done[column], errors="coerce")
    grouped = done.groupby(ROW_KEYS, sort=False)[column]
    mean = seed_means(done.groupby(ROW_KEYS, sort=False), [column])[column]
    return pd.DataFrame({"mean": mean, "std": grouped.std(ddof=1)}).reset_index()


def draw_figure(spec: dict[str, Any], runs: pd.DataFrame, path: Path, title: str) -> bool:
    """One figure of a recipe as PNG and PDF; False when there is nothing to draw."""
    kind, ys = spec["kind"], list(spec["y"])
    if runs.empty or not (runs["state"] == "done").any():
        return False
    if kind == "stacked":
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
