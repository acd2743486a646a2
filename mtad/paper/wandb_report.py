"""The W&B Report of a study, built with W&B's own report API (``wandb_workspaces``), and
its serialised definition (written offline, loaded back to publish)."""

from __future__ import annotations

import copy
import hashlib
import json
import os
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pandas as pd
import wandb_workspaces
import wandb_workspaces.reports.v2 as wr
from wandb_workspaces import expr
from wandb_workspaces.reports.v2 import internal

from mtad.paper.rendered import Rendered
from mtad.paper.wandb_run import (
    ABLATION_METRICS,
    ABLATION_PARAMS,
    ANALYSIS_JOB_TYPE,
    DEFINITION_FORMAT,
    RUN_METRICS,
    TIME_SPLIT,
    analysis_run_id,
    analysis_run_name,
    flat_frame,
)

# --------------------------------------------------------------------------------------------
# the report


def build_report(
    rendered: Rendered,
    *,
    project: str = "mtad",
    entity: str | None = None,
    main_table: str | None = None,
) -> wr.Report:
    """The study's W&B Report (``wandb_workspaces.reports.v2``; W&B docs, "Reports and
    Workspaces API": https://docs.wandb.ai/ref/wandb_workspaces).

    Blocks: title, the claims and the main table (Markdown, as rendered), the ratios, panels
    over the study's harness runs (filtered by ``Group == study`` and, when known, their ids;
    bar charts per method of the summary keys the harness logs, and scatter plots of the
    ablated method parameters from the run config against speed and quality), the analysis
    run's figures (a MediaBrowser over ``figure/*``) and tables (summary-table panels), and the
    whole rendering.

    Building makes no network call as long as ``entity`` is given or ``None`` (``None`` is
    kept as ``""``: W&B's own default would ask the server). Panel and run-set ids are derived
    from the study so that re-rendering writes the same definition.
    """
    study, profile = rendered.study, rendered.profile
    main_key = main_table or (
        "main" if "main" in rendered.tables else next(iter(rendered.tables), None)
    )
    runs, analysis = _runsets(rendered, project, entity or "")
    blocks = _summary_blocks(rendered, main_key) + [
        wr.H2("Per method, over the study's runs"),
        wr.PanelGrid(runsets=[runs], panels=_per_method_panels()),
        wr.H2("Ablations: method parameters against speed and quality"),
        wr.PanelGrid(runsets=[copy.deepcopy(runs)], panels=_ablation_panels()),
    ]
    analysis_panels = _analysis_panels(rendered, main_key)
    if analysis_panels:
        blocks += [
            wr.H2("Figures and tables (analysis run)"),
            wr.PanelGrid(runsets=[analysis], panels=analysis_panels),
        ]
    if rendered.markdown:
        blocks += [wr.H2("The whole rendering"), wr.MarkdownBlock(rendered.markdown)]
    report = wr.Report(
        project=project,
        entity=entity or "",
        title=f"MTAD reproduction: {study} ({profile})"[:128],
        description=f"Tables, figures and claims of study {study}, profile {profile}.",
        blocks=blocks,
    )
    _fix_ids(report, f"{study}\0{profile}")
    return report


def _runsets(rendered: Rendered, project: str, entity: str) -> tuple[Any, Any]:
    """The study's harness runs (group == study, not the analysis run, and when known their
    ids) and the analysis run, as two run sets."""
    study, profile = rendered.study, rendered.profile
    run_filters = [expr.Metric("Group") == study, expr.Metric("JobType") != ANALYSIS_JOB_TYPE]
    if rendered.run_ids:
        run_filters.append(expr.Metric("ID").isin(list(rendered.run_ids)))
    runs = wr.Runset(
        entity=entity,
        project=project,
        name=f"{study} runs",
        filters=run_filters,
        groupby=["JobType"],
    )
    analysis = wr.Runset(
        entity=entity,
        project=project,
        name=analysis_run_name(study, profile),
        filters=[expr.Metric("ID") == analysis_run_id(study, profile)],
    )
    return runs, analysis


def _summary_blocks(rendered: Rendered, main_key: str | None) -> list[Any]:
    """The opening text, the claims, the main table and the ratios, as Markdown."""
    study, profile = rendered.study, rendered.profile
    blocks: list[Any] = [
        wr.P(
            f"Study {study}, profile {profile}: {len(rendered.run_ids)} harness runs in W&B "
            f"group {study}; analysis run {analysis_run_id(study, profile)}. Regenerate with: "
            + ("; ".join(rendered.commands) or "scripts/reproduce.py")
        ),
        wr.H2("Claims"),
        wr.MarkdownBlock(
            _markdown_table(rendered.claims) if not rendered.claims.empty else "(no claims)"
        ),
    ]
    if main_key:
        blocks += [
            wr.H2(f"Main table ({main_key})"),
            wr.MarkdownBlock(_markdown_table(rendered.tables[main_key])),
        ]
    if not rendered.ratios.empty:
        blocks += [wr.H2("Ratios per method"), wr.MarkdownBlock(_markdown_table(rendered.ratios))]
    return blocks


def _per_method_panels() -> list[Any]:
    """Bar charts per method of the summary keys the harness logs, the time split and the
    acceptance rate."""
    panels: list[Any] = [
        wr.BarPlot(
            title=f"{key}: {label}",
            metrics=[wr.SummaryMetric(key)],
            groupby="JobType",
            groupby_aggfunc="mean",
            groupby_rangefunc="stddev",
            title_x=label,
        )
        for key, label in RUN_METRICS.items()
    ]
    panels.append(
        wr.BarPlot(
            title="time split: draft / verify / other (s)",
            metrics=[wr.SummaryMetric(k) for k in TIME_SPLIT],
            groupby="JobType",
            groupby_aggfunc="mean",
            title_x="seconds",
        )
    )
    panels.append(
        wr.ScalarChart(
            title="acceptance rate (mean over runs)",
            metric=wr.SummaryMetric("acceptance_rate"),
            groupby_aggfunc="mean",
            groupby_rangefunc="stddev",
        )
    )
    return panels


def _ablation_panels() -> list[Any]:
    """Scatter plots of the ablated method parameters (run config) against speed and quality."""
    return [
        wr.ScatterPlot(
            title=f"{metric} vs {param}",
            x=wr.Config(f"method.{param}"),
            y=wr.SummaryMetric(metric),
        )
        for param in ABLATION_PARAMS
        for metric in ABLATION_METRICS
    ]


def _analysis_panels(rendered: Rendered, main_key: str | None) -> list[Any]:
    """The analysis run's figures (a MediaBrowser over ``figure/*``) and tables."""
    media: list[Any] = []
    if rendered.figures:
        media.append(
            wr.MediaBrowser(
                title="figures",
                media_keys=[f"figure/{k}" for k in rendered.figures],
                num_columns=1,
                layout=wr.Layout(w=24, h=12),
            )
        )
    tables = [
        wr.WeavePanelSummaryTable(table_name=key, layout=wr.Layout(w=24, h=10))
        for key in (
            ([f"table/{main_key}"] if main_key else [])
            + (["ratios"] if not rendered.ratios.empty else [])
            + (["claims"] if not rendered.claims.empty else [])
        )
    ]
    return media + tables


def _fix_ids(report: wr.Report, seed: str) -> None:
    """Replace the random panel and run-set ids (``internal._generate_name``) by ones derived
    from ``seed`` and the position, so that the definition file is stable across renders."""
    for b, block in enumerate(report.blocks):
        if not isinstance(block, wr.PanelGrid):
            continue
        for r, runset in enumerate(block.runsets):
            runset._id = _short_id(f"{seed}\0{b}\0runset\0{r}")
        for p, panel in enumerate(block.panels):
            panel._id = _short_id(f"{seed}\0{b}\0panel\0{p}")


def _short_id(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:11]


def _markdown_table(frame: pd.DataFrame) -> str:
    flat = flat_frame(frame)
    flat = flat.astype(object).where(flat.notna(), None)  # tabulate shows None as missingval
    return flat.to_markdown(index=False, missingval="-")


def report_definition(report: wr.Report) -> dict[str, Any]:
    """The report's serialised model, as ``Report.save()`` would send it, without a network
    call.

    wandb-workspaces has no public serialiser; ``Report._to_model()`` is what ``save()`` itself
    calls before sending ``model.spec`` (and ``Report._from_model`` what ``Report.from_url``
    calls after loading), so the file holds exactly what saving would upload. A run set with
    both entity and project set looks up the project's internal id on the server while it is
    serialised; the written copy therefore leaves run-set entities empty and records the
    intended entity and project beside the model (``runsets``), and publishing rebuilds the
    report with them set.
    """
    offline = copy.deepcopy(report)
    runsets = []
    for block in offline.blocks:
        if isinstance(block, wr.PanelGrid):
            for rs in block.runsets:
                runsets.append(
                    {
                        "name": rs.name,
                        "entity": rs.entity,
                        "project": rs.project,
                        "filters": rs.filters,
                    }
                )
                rs.entity = ""
    model = offline._to_model()
    return {
        "format": DEFINITION_FORMAT,
        "wandb_workspaces_version": getattr(wandb_workspaces, "__version__", _dist_version()),
        "title": report.title,
        "entity": report.entity or None,
        "project": report.project,
        "runsets": runsets,
        "viewspec": model.model_dump(mode="json", by_alias=True, exclude_none=True),
    }


def _dist_version() -> str:
    return version("wandb-workspaces")


def load_report_definition(path: str | os.PathLike[str]) -> wr.Report:
    """The ``wr.Report`` of a definition file written by :func:`write_report` (run-set
    entities and projects restored); no network call."""
    data = json.loads(Path(path).read_text())
    if data.get("format") != DEFINITION_FORMAT:
        raise ValueError(f"{path}: not a report definition ({data.get('format')!r})")
    report = wr.Report._from_model(internal.ReportViewspec.model_validate(data["viewspec"]))
    saved = iter(data.get("runsets", []))
    for block in report.blocks:
        if isinstance(block, wr.PanelGrid):
            for rs in block.runsets:
                info = next(saved, {})
                rs.entity = info.get("entity") or ""
                rs.project = info.get("project") or data["project"]
    return report
