"""Recipes rendered: tables (Markdown, LaTeX booktabs, CSV), figures (PNG + PDF), claims.

Every number is the mean over seeds of per-run values (ratios taken per seed against that seed's
baseline run by the one comparison rule, :mod:`mtad.runs.comparison`, and averaged on the log
scale, :func:`mtad.runs.intervals.seed_mean`), shown as
``mean ± std (n=seeds)``; a ratio or change cell shows its 95% interval instead,
``mean [lo, hi] (prompts x seeds)`` (:mod:`mtad.runs.intervals`, named in each table's caption), as
does a downstream score made of per-prompt verdicts (its own bootstrap over prompts), and
each claim gets the verdict of its interval: ``holds``, ``does not hold`` or ``unresolved``.
A cell without runs says why: ``not run: ...`` with the override that enables it,
``failed: ...``, ``pending: ...`` (MT-Bench without a judge) or ``missing``; a metric that does
not apply is ``—``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from mtad.harness.wandb_logger import logged_run_id
from mtad.paper.figures import ROW_KEYS, draw_figure
from mtad.paper.plan import Plan
from mtad.paper.recipes import Recipe
from mtad.paper.rendered import Rendered
from mtad.paper.status import RunStatus
from mtad.runs.claims import (
    INTERVAL_RULE,
    NOT_APPLICABLE,
    VERDICT_RULE,
    Claim,
    decide,
)
from mtad.runs.claims import figure_text as _fmt
from mtad.runs.claims import interval_text as _interval_text
from mtad.runs.claims import method_interval as group_interval
from mtad.runs.comparison import (
    BY_COLUMN,
    COMPARISON_COLUMNS,
    COMPARISONS,
    add_comparisons,
)
from mtad.runs.intervals import UNRESOLVED
from mtad.runs.tables import (
    Figure,
    distinct_text,
    done_runs,
    done_values,
    figures_frame,
    group_figures,
)

ENERGY_COLUMNS = (
    "j_per_token",
    "gpu_j_per_token",
    "energy_ratio_vs_sps",
    "gpu_energy_ratio_vs_sps",
    "energy.cpu_mode",
    "energy.gpu_mode",
    "energy.ram_mode",
)
CLAIMS_CAPTION = VERDICT_RULE
INTERVAL_CAPTION = INTERVAL_RULE  # what every table with ratio or change cells says of them


# --------------------------------------------------------------------------------------------
# the runs of a recipe


def recipe_runs(plan: Plan, recipe: str) -> pd.DataFrame:
    """One row per planned run of ``recipe``: identity and state, and for a done run its
    :func:`mtad.runs.frame.run_record` with the comparison columns (baselines from the whole
    plan: any recipe may hold them). A run shared by recipes appears in each."""
    cache: dict[str, dict[str, Any]] = {}
    df = pd.DataFrame([_planned_row(status, cache) for status in plan.statuses(recipe)])
    if df.empty:
        return df
    return add_comparisons(df, plan_baselines(plan, cache))


def plan_baselines(plan: Plan, cache: dict[str, dict[str, Any]] | None = None) -> pd.DataFrame:
    """Every done run of ``plan`` that is a comparison's baseline (``ar``, ``sps``)."""
    cache = {} if cache is None else cache
    labels = {c.baseline for c in COMPARISONS}
    return pd.DataFrame(
        [
            _planned_row(status, cache)
            for status in plan.status.values()
            if status.state == "done" and status.planned.label in labels
        ]
    )


def _planned_row(status: RunStatus, cache: dict[str, dict[str, Any]]) -> dict[str, Any]:
    p = status.planned
    row: dict[str, Any] = {
        "pair": p.pair,
        "task": p.task,
        "method": p.label,
        "method_name": p.method,
        "label": p.label,
        "seed": p.seed,
        "state": status.state,
        "cell": status.cell() if status.state != "done" else "",
        "signature": status.signature,
        **{f"param.{k}": v for k, v in p.params.items()},
    }
    if status.state != "done":
        return row
    sig = str(status.signature)
    if sig not in cache:
        cache[sig] = status.record() or {}
    for key, value in cache[sig].items():
        row.setdefault(key, value)
    return row


# --------------------------------------------------------------------------------------------
# aggregation


def aggregate(
    runs: pd.DataFrame, columns: Sequence[str], baselines: pd.DataFrame | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(display, numeric)``: one display row per (pair, task, method) in plan order, and the
    long numeric frame (``pair, task, method, metric, mean, std, n, lo, hi, n_prompts``:
    :func:`mtad.runs.tables.figures_frame`), both of the tables' figures
    (:func:`mtad.runs.tables.group_figures`: the interval of a ratio or change column, NaN
    elsewhere). Baselines for the intervals come from ``baselines`` (default ``runs``)."""
    display_rows, figure_rows = [], []
    for key, group, figures in group_figures(runs, columns, ROW_KEYS, baselines, sort=False):
        done = done_runs(group)
        seeds = int(done["seed"].nunique()) if not done.empty else 0
        reason = "" if seeds else str(group.loc[group["state"] != "done", "cell"].iloc[0])
        row: dict[str, Any] = dict(zip(ROW_KEYS, key, strict=True))
        for column in columns:
            if figures[column].values:
                row[column] = _figure_cell(figures[column], column)
            elif not seeds:  # the reason once, in the first column; a short label after it
                row[column] = reason if column == columns[0] else reason.split(":", 1)[0]
            else:
                row[column] = _status_cell(group, column)
        row["seeds"] = seeds
        display_rows.append(row)
        figure_rows.append((key, figures))
    return pd.DataFrame(display_rows), figures_frame(figure_rows, ROW_KEYS)


def _figure_cell(figure: Figure, column: str) -> str:
    """``mean [lo, hi] (prompts x seeds)`` with an interval, else ``mean ± std (n=runs)``."""
    if figure.interval is not None:
        return _interval_text(figure.interval, column, figure.mean)
    text = _fmt(figure.mean, column)
    if len(figure.values) > 1:
        text += f" ± {_fmt(figure.std, column).lstrip('+')}"
    return f"{text} (n={len(figure.values)})"


def _status_cell(group: pd.DataFrame, column: str) -> str:
    """A cell of done runs without a value: why, or the runs' text (an energy mode)."""
    if column == "score" and distinct_text(group, "pending"):
        return distinct_text(group, "pending")[0]
    if column in ENERGY_COLUMNS and distinct_text(group, "energy.tracker") == ["none"]:
        return "not measured (energy=none)"
    texts = distinct_text(group, column)
    return ",".join(texts) if texts else NOT_APPLICABLE


def recipe_table(
    recipe: Recipe, runs: pd.DataFrame, baselines: pd.DataFrame | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    columns = dict(recipe.table.get("columns") or {})
    display, numeric = aggregate(runs, list(columns), baselines)
    display = display.rename(columns=columns)
    return display, numeric


# --------------------------------------------------------------------------------------------
# claims


CLAIM_COLUMNS = ("claim", "source", "paper", "where", "ours", "verdict")
# The claims' numbers, in the CSV and the W&B table beside the display columns.
CLAIM_NUMBERS = ("mean", "lo", "hi", "n_prompts", "n_seeds")


def claims_table(
    recipe: Recipe, runs: pd.DataFrame, baselines: pd.DataFrame | None = None
) -> pd.DataFrame:
    """One row per claim of ``recipe`` and (pair, task) with comparable runs: the paper's
    figure, our estimate with its 95% interval and the verdict of the interval
    (:func:`mtad.runs.claims.decide`: ``holds``, ``does not hold``, ``unresolved``),
    then the same estimate as numbers (:data:`CLAIM_NUMBERS`). A claim without comparable runs
    gets one ``unresolved`` row that says so."""
    baselines = runs if baselines is None else baselines
    out = []
    for raw in recipe.claims:
        claim = Claim.of(raw)
        metric = claim.metric
        head = {
            "claim": raw["claim"],
            "source": raw.get("source", ""),
            "paper": str(raw.get("paper", "")),
        }
        rows = []
        sub = runs[runs["method"] == claim.method] if not runs.empty else runs
        for (pair, task), group in sub.groupby(["pair", "task"], sort=False):
            if not done_values(group, metric):
                continue
            interval, decided = decide(claim, group, baselines)  # the one rule (mtad.runs)
            rows.append(
                {
                    **head,
                    "where": f"{pair}/{task}",
                    "ours": _interval_text(interval, metric, interval.mean),
                    "verdict": decided,
                    **{k: getattr(interval, k) for k in CLAIM_NUMBERS},
                }
            )
        if not rows:
            rows.append(
                {
                    **head,
                    "where": NOT_APPLICABLE,
                    "ours": _why_no_estimate(sub, metric, baselines),
                    "verdict": UNRESOLVED,
                }
            )
        out += rows
    return pd.DataFrame(out, columns=[*CLAIM_COLUMNS, *CLAIM_NUMBERS])


def _why_no_estimate(method_runs: pd.DataFrame, metric: str, baselines: pd.DataFrame) -> str:
    """Why a claim has no estimate: named when the baseline's figure is zero in every run
    (a relative change from 0 is undefined: e.g. a target that passes no HumanEval problem),
    else the generic reason."""
    generic = "no comparable runs (baseline missing or metric undefined)"
    comparison = next((c for c in COMPARISONS if c.column == metric), None)
    if comparison is None or comparison.kind != "change" or method_runs.empty:
        return generic
    zero = []
    for (pair, task), _ in method_runs.groupby(["pair", "task"], sort=False):
        base = baselines[
            (baselines["method"] == comparison.baseline)
            & (baselines["pair"] == pair)
            & (baselines["task"] == task)
        ]
        values = done_values(base, comparison.metric)
        if values and all(v == 0 for v in values):
            zero.append(f"{pair}/{task} ({len(values)} runs)")
    if not zero:
        return generic
    return (
        f"undefined: {comparison.baseline.upper()}'s {comparison.metric} is 0 in every run on "
        f"{', '.join(zero)}, and a change relative to 0 has no value"
    )


# --------------------------------------------------------------------------------------------
# files


def _latex(table: pd.DataFrame, caption: str | None = None) -> str:
    styler = table.style.hide(axis="index").format(escape="latex")
    if caption:
        styler = styler.set_caption(_escape_latex(caption))
    return styler.to_latex(hrules=True, column_format="l" * len(table.columns))


def _escape_latex(text: str) -> str:
    for char, escaped in (("\\", r"\textbackslash{}"), ("%", r"\%"), ("&", r"\&"), ("_", r"\_")):
        text = text.replace(char, escaped)
    return text


def table_caption(columns: Sequence[str]) -> str | None:
    """:data:`INTERVAL_CAPTION` for a table with a ratio or change column, else None."""
    return INTERVAL_CAPTION if set(columns) & set(BY_COLUMN) else None


def write_table(
    table: pd.DataFrame, numeric: pd.DataFrame, stem: Path, caption: str | None = None
) -> None:
    """``stem``.md (the caption below the table), .tex (booktabs, ``\\caption``) and .csv."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    below = f"\nTable: {caption}\n" if caption else ""
    stem.with_suffix(".md").write_text(table.to_markdown(index=False) + "\n" + below)
    stem.with_suffix(".tex").write_text(_latex(table, caption))
    numeric.to_csv(stem.with_suffix(".csv"), index=False)


def render(plan: Plan, out_dir: Path, commands: Sequence[str] = ()) -> Rendered:
    """Render every recipe of ``plan`` into ``out_dir`` (tables/, figures/, paper.md)."""
    rendered = Rendered(
        study=plan.profile.study,
        profile=plan.profile.name,
        out_dir=out_dir,
        commands=list(commands),
    )
    sections = [
        f"# Paper reproduction: profile `{plan.profile.name}`, study `{plan.profile.study}`",
        "",
        plan.profile.description,
        "",
    ]
    if commands:
        sections += ["Generated by:", "", "```bash", *commands, "```", ""]
    ratio_frames = []
    logged: dict[str, str | None] = {}  # signature -> W&B run id (None: logged nothing)
    baselines = plan_baselines(plan)
    for recipe in plan.recipes:
        runs = recipe_runs(plan, recipe.name)
        sections += render_recipe(recipe, runs, baselines, out_dir, rendered)
        if not runs.empty:
            ratio_frames.append(runs)
        for status in plan.statuses(recipe.name):
            if status.state != "done" or status.signature in logged:
                continue
            # the id the harness run logged under (metrics.json), none with logger=none
            logged[status.signature] = logged_run_id(status.metrics())
            if logged[status.signature] is None:
                rendered.unlogged_runs += 1
            elif logged[status.signature] not in rendered.run_ids:
                rendered.run_ids.append(str(logged[status.signature]))
    rendered.ratios = _ratios(ratio_frames)
    rendered.markdown = "\n".join(sections)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "paper.md").write_text(rendered.markdown)
    return rendered


def render_recipe(
    recipe: Recipe, runs: pd.DataFrame, baselines: pd.DataFrame, out_dir: Path, rendered: Rendered
) -> list[str]:
    """One recipe's table or claims and figures, written under ``out_dir`` and kept in
    ``rendered``; its section of ``paper.md`` (lines)."""
    sections = [f"## {recipe.title} (`experiments/{recipe.name}.yaml`)", "", recipe.reproduces, ""]
    if recipe.table.get("columns"):
        table, numeric = recipe_table(recipe, runs, baselines)
        caption = table_caption(list(recipe.table["columns"]))
        write_table(table, numeric, out_dir / "tables" / recipe.name, caption)
        rendered.tables[recipe.name] = table
        rendered.numeric[recipe.name] = numeric
        sections += [table.to_markdown(index=False), ""]
        sections += [f"Table: {caption}", ""] if caption else []
    if recipe.claims:
        claims = claims_table(recipe, runs, baselines)
        shown = claims[list(CLAIM_COLUMNS)]
        caption = f"{CLAIMS_CAPTION} {INTERVAL_CAPTION}"
        write_table(shown, claims, out_dir / "tables" / recipe.name, caption)
        rendered.tables[recipe.name] = shown
        rendered.claims = claims
        sections += [shown.to_markdown(index=False), "", f"Table: {caption}", ""]
    for spec in recipe.figures:
        name = f"{recipe.name}_{spec['name']}"
        path = out_dir / "figures" / name
        points = frontier_points(spec, runs, baselines) if spec["kind"] == "frontier" else None
        if draw_figure(spec, runs, path, str(spec.get("title", recipe.title)), points):
            if points is not None:  # the numbers drawn, beside the figure
                points.to_csv(path.with_suffix(".csv"), index=False)
            rendered.figures[name] = path.with_suffix(".png")
            sections += [f"![{spec.get('title', name)}](figures/{name}.png)", ""]
        else:
            sections += [f"*{name}: no completed runs to draw.*", ""]
    return sections


def frontier_points(
    spec: dict[str, Any], runs: pd.DataFrame, baselines: pd.DataFrame | None = None
) -> pd.DataFrame:
    """The points of a ``frontier`` figure: one row per (pair, task, method label) with a done
    run, its ``method_name``, and for ``spec['x']`` and each of ``spec['y']`` (comparison
    columns) the estimate and its interval as the tables compute them (:func:`aggregate`:
    :func:`group_interval`, the paired bootstrap of :mod:`mtad.runs.intervals`), as
    ``<column>``, ``<column>_lo``, ``<column>_hi``, with ``<column>_prompts`` and ``seeds``."""
    columns = [str(spec["x"]), *map(str, spec["y"])]
    if bad := [c for c in columns if c not in BY_COLUMN]:
        raise ValueError(f"a frontier's axes are comparison columns, not {bad[0]!r}")
    _, numeric = aggregate(runs, columns, baselines)
    # the method behind each label (a frame without labels: the label is the method)
    name_column = "method_name" if "method_name" in runs.columns else "method"
    names = dict(zip(runs["method"], runs[name_column], strict=True))
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    for rec in numeric.to_dict("records"):
        key = tuple(rec[k] for k in ROW_KEYS)
        row = rows.setdefault(
            key, {**dict(zip(ROW_KEYS, key, strict=True)), "method_name": names[key[-1]]}
        )
        column = rec["metric"]
        row[column], row[f"{column}_lo"], row[f"{column}_hi"] = rec["mean"], rec["lo"], rec["hi"]
        row[f"{column}_prompts"], row["seeds"] = rec["n_prompts"], rec["n"]
    order = ["method_name"]
    for c in columns:
        order += [c, f"{c}_lo", f"{c}_hi", f"{c}_prompts"]
    return pd.DataFrame(list(rows.values()), columns=[*ROW_KEYS, *order, "seeds"])


def _ratios(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """The comparison columns of every done run rendered, averaged over seeds per row."""
    columns = list(COMPARISON_COLUMNS)
    if not frames:
        return pd.DataFrame(columns=[*ROW_KEYS, *columns])
    runs = pd.concat(frames, ignore_index=True)
    runs = runs[runs["state"] == "done"].drop_duplicates(["signature", "method"])
    if runs.empty:
        return pd.DataFrame(columns=[*ROW_KEYS, *columns])
    present = [c for c in columns if c in runs.columns]
    figures = group_figures(runs, present, ROW_KEYS, sort=False, intervals=False)
    rows = [
        {**dict(zip(ROW_KEYS, key, strict=True)), **{c: f.mean for c, f in by_column.items()}}
        for key, _, by_column in figures
    ]
    return pd.DataFrame(rows, columns=[*ROW_KEYS, *present])


__all__ = [
    "aggregate",
    "claims_table",
    "frontier_points",
    "group_interval",
    "plan_baselines",
    "recipe_runs",
    "recipe_table",
    "render",
]
