"""A rendered study on W&B: one analysis run, and a W&B Report built with W&B's report API.

The harness logs one W&B run per harness run (:mod:`mtad.harness.wandb_logger`). What no single
run holds -- the cross-run ratios, the paper-layout tables, the figures and the claims -- is
logged here as one more run of the study's group (``job_type="analysis"``), and a Report
(``wandb_workspaces.reports.v2``) puts the claims, the main table, panels over the study's runs
and the figures on one page.

Offline is the default and makes no network call: the analysis run goes to a local
``offline-run-*`` folder, and the report definition, a Markdown rendering of it and the
commands that publish it are written to ``<out_dir>/report/``. Publishing is explicit
(``publish=True`` with ``WANDB_MODE=online`` and a W&B login); the only URL ever printed or
stored is the one the saved report returns.

``wandb`` and ``wandb_workspaces`` are imported inside the functions: importing them costs about
a second, which a process that only renders tables should not pay.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import shlex
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from mtad.paper.rendered import Rendered

if TYPE_CHECKING:
    import wandb_workspaces.reports.v2 as wr

ANALYSIS_JOB_TYPE = "analysis"
REPORT_DIR = "report"
DEFINITION_FILE = "report.json"
MARKDOWN_FILE = "report.md"
PUBLISH_FILE = "PUBLISH.md"
PUBLISHED_FILE = "published.json"
DEFINITION_FORMAT = "mtad.report/1: wandb_workspaces.reports.v2 ReportViewspec (by alias)"

# The cross-run ratios of Rendered.ratios, one summary key each per (pair, task, method).
RATIO_COLUMNS = (
    "speedup_vs_ar",
    "speedup_vs_sps",
    "energy_ratio_vs_sps",
    "ppl_change_vs_ar",
    "score_change_vs_ar",
)
# Summary keys a harness run logs (mtad.harness.runner._wandb_summary: flat metrics, nested
# blocks as ``block/key``) and what they mean, for the per-method bar charts.
RUN_METRICS: dict[str, str] = {
    "ms_per_token": "ms/token (lower is faster)",
    "block_efficiency": "tokens per target forward",
    "acceptance_rate": "accepted / drafted depth",
    "ppl": "output perplexity under the target",
    "score": "task score",
    "energy/j_per_token": "J/token (codecarbon)",
}
TIME_SPLIT = ("time_draft", "time_verify", "time_other")
# Method parameters the ablations vary; in a harness run's config under ``method``.
ABLATION_PARAMS = ("tau", "beam_width", "gamma")
ABLATION_METRICS = ("block_efficiency", "ms_per_token", "ppl")


class PublishError(RuntimeError):
    """Publishing was asked for but W&B is not reachable as configured; the message says what
    to do."""


# --------------------------------------------------------------------------------------------
# ids and names


def analysis_run_id(study: str, profile: str) -> str:
    """The analysis run's W&B id: the same study and profile always give the same id.

    With ``resume="allow"`` an online run with this id is resumed rather than duplicated (W&B
    docs, "Resume a run": https://docs.wandb.ai/guides/runs/resuming). W&B ids allow letters,
    digits, ``-`` and ``_``; a hash keeps any study name within that.
    """
    digest = hashlib.sha256(f"{study}\0{profile}".encode()).hexdigest()[:16]
    return f"analysis-{digest}"


def analysis_run_name(study: str, profile: str) -> str:
    return f"analysis-{study}-{profile}"


# --------------------------------------------------------------------------------------------
# the analysis run


def log_analysis_run(
    rendered: Rendered,
    *,
    project: str = "mtad",
    entity: str | None = None,
    mode: str | None = None,
    dir: str | os.PathLike[str] = ".",
) -> dict[str, Any]:
    """Log ``rendered`` as one W&B run (job_type ``analysis``, group = the study).

    Logged: every display and numeric table as a ``wandb.Table`` (``table/<name>``,
    ``numeric/<name>``), every figure as a ``wandb.Image`` (``figure/<name>``), the ratios as a
    table (``ratios``) and one summary key per value (``ratio/<pair>/<task>/<method>/<ratio>``,
    so a Report can chart them), the claims as a table (``claims``). The config records the
    study, profile, the W&B ids of the runs behind it and the commands.

    Re-rendering updates the same run, never a second one: the id is derived from study and
    profile (:func:`analysis_run_id`) and ``resume="allow"`` resumes it online. Offline, W&B
    writes each ``init`` to a new ``offline-run-<time>-<id>`` folder (two in the same second
    share one), and ``wandb sync`` would replay every such folder into the one run in start
    order (``wandb sync --help``: "files that are part of the same run are synced
    sequentially"). The older folders of this id hold what the new render supersedes, so they
    are removed before it is logged, and one folder per id remains. Harness runs' folders are
    never touched.

    ``mode`` defaults to ``$WANDB_MODE`` or ``offline`` (as ``conf/logger/wandb.yaml``);
    ``disabled`` logs nothing. Returns ``{"id", "dir", "mode", "name"}`` (``dir`` is the run
    folder that holds ``run-<id>.wandb`` and ``files/``).
    """
    mode = mode or os.environ.get("WANDB_MODE", "offline")
    run_id = analysis_run_id(rendered.study, rendered.profile)
    name = analysis_run_name(rendered.study, rendered.profile)
    if mode == "disabled":
        return {"id": None, "dir": None, "mode": mode, "name": name}
    import wandb

    Path(dir).mkdir(parents=True, exist_ok=True)
    if mode == "offline":
        _remove_superseded(Path(dir) / "wandb", run_id)
    settings = wandb.Settings(
        console="off",  # as mtad.harness.wandb_logger: the console stays ours
        x_disable_stats=True,  # no system-metrics sampler: nothing here is worth sampling
        silent=True,
    )
    run = wandb.init(
        project=project,
        entity=entity,
        mode=mode,
        dir=str(dir),
        id=run_id,
        resume="allow",
        name=name,
        group=rendered.study,
        job_type=ANALYSIS_JOB_TYPE,
        tags=[ANALYSIS_JOB_TYPE, rendered.profile],
        config={
            "study": rendered.study,
            "profile": rendered.profile,
            "out_dir": str(rendered.out_dir),
            "run_ids": list(rendered.run_ids),
            "n_runs": len(rendered.run_ids),
            "commands": list(rendered.commands),
            "tables": sorted(rendered.tables),
            "figures": sorted(rendered.figures),
        },
        settings=settings,
        reinit="finish_previous",
    )
    try:
        payload: dict[str, Any] = {}
        for key, frame in rendered.tables.items():
            payload[f"table/{key}"] = wandb_table(frame)
        for key, frame in rendered.numeric.items():
            payload[f"numeric/{key}"] = wandb_table(frame)
        for key, png in rendered.figures.items():
            if not Path(png).is_file():
                raise FileNotFoundError(f"figure {key!r}: {png} does not exist")
            payload[f"figure/{key}"] = wandb.Image(str(png), caption=key)
        if not rendered.ratios.empty:
            payload["ratios"] = wandb_table(rendered.ratios)
        if not rendered.claims.empty:
            payload["claims"] = wandb_table(rendered.claims)
        run.log(payload)
        run.summary.update(ratio_summary(rendered.ratios))
        run.summary.update(_claims_summary(rendered.claims))
        run_dir = Path(run.dir).parent  # run.dir is <run folder>/files
    except BaseException:
        run.finish(exit_code=1)
        raise
    run.finish()
    return {"id": run_id, "dir": str(run_dir), "mode": mode, "name": name}


def _remove_superseded(wandb_root: Path, run_id: str) -> list[Path]:
    """Remove the offline folders of the analysis run ``run_id`` under ``wandb_root`` (see
    :func:`log_analysis_run`); only ``offline-run-*-<run_id>`` folders of an analysis id."""
    if not run_id.startswith(f"{ANALYSIS_JOB_TYPE}-"):
        raise ValueError(f"not an analysis run id: {run_id}")
    removed = []
    for folder in sorted(wandb_root.glob(f"offline-run-*-{run_id}")):
        if folder.is_dir() and not folder.is_symlink():
            shutil.rmtree(folder)
            removed.append(folder)
    return removed


def wandb_table(frame: pd.DataFrame) -> Any:
    """A ``wandb.Table`` of ``frame``: column groups joined with `` / ``, a named index kept as
    columns, numbers as numbers (NaN -> None) and everything else as text.

    W&B types each table column from its values and rejects a row whose type differs
    (``wandb.Table``: "Data row contained incompatible types"); display cells mix numbers and
    "not run: why" labels, so non-numeric columns become text.
    """
    import wandb

    flat = flat_frame(frame)
    columns = [str(c) for c in flat.columns]
    cells: list[list[Any]] = [[] for _ in range(len(flat))]
    for col in flat.columns:
        numeric = pd.api.types.is_numeric_dtype(flat[col])
        for i, value in enumerate(flat[col].tolist()):
            cells[i].append(_cell(value, numeric))
    return wandb.Table(columns=columns, data=cells)


def flat_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with one header row and the index (when it carries information) as columns."""
    flat = frame.copy()
    if isinstance(flat.columns, pd.MultiIndex):
        flat.columns = [" / ".join(str(p) for p in parts if str(p) != "") for parts in flat.columns]
    if not (isinstance(flat.index, pd.RangeIndex) and flat.index.name is None):
        flat = flat.reset_index()
    flat.columns = [str(c) for c in flat.columns]
    return flat


def _cell(value: Any, numeric: bool) -> Any:
    if value is None:
        return None
    if isinstance(value, float) and math.isnan(value):
        return None
    if numeric:
        return value.item() if hasattr(value, "item") else value
    if not isinstance(value, (list, tuple, dict)) and pd.isna(value):
        return None
    return str(value)


def ratio_summary(ratios: pd.DataFrame) -> dict[str, float]:
    """``ratio/<pair>/<task>/<method>/<ratio>`` -> value for every finite ratio."""
    out: dict[str, float] = {}
    if ratios.empty:
        return out
    for row in ratios.to_dict("records"):
        where = "/".join(str(row.get(k, "")) for k in ("pair", "task", "method"))
        for col in RATIO_COLUMNS:
            value = row.get(col)
            if isinstance(value, (int, float)) and math.isfinite(value):
                out[f"ratio/{where}/{col}"] = float(value)
    return out


def _claims_summary(claims: pd.DataFrame) -> dict[str, int]:
    if claims.empty or "holds" not in claims:
        return {}
    holds = claims["holds"]
    return {
        "claims_total": int(len(claims)),
        "claims_holding": int((holds == True).sum()),  # noqa: E712 (holds may be None)
    }


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
    import wandb_workspaces.reports.v2 as wr
    from wandb_workspaces import expr

    study, profile = rendered.study, rendered.profile
    analysis_id = analysis_run_id(study, profile)
    entity_name = entity or ""
    main_key = main_table or (
        "main" if "main" in rendered.tables else next(iter(rendered.tables), None)
    )

    run_filters = [expr.Metric("Group") == study, expr.Metric("JobType") != ANALYSIS_JOB_TYPE]
    if rendered.run_ids:
        run_filters.append(expr.Metric("ID").isin(list(rendered.run_ids)))
    runs = wr.Runset(
        entity=entity_name,
        project=project,
        name=f"{study} runs",
        filters=run_filters,
        groupby=["JobType"],
    )
    analysis = wr.Runset(
        entity=entity_name,
        project=project,
        name=analysis_run_name(study, profile),
        filters=[expr.Metric("ID") == analysis_id],
    )

    per_method: list[Any] = [
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
    per_method.append(
        wr.BarPlot(
            title="time split: draft / verify / other (s)",
            metrics=[wr.SummaryMetric(k) for k in TIME_SPLIT],
            groupby="JobType",
            groupby_aggfunc="mean",
            title_x="seconds",
        )
    )
    per_method.append(
        wr.ScalarChart(
            title="acceptance rate (mean over runs)",
            metric=wr.SummaryMetric("acceptance_rate"),
            groupby_aggfunc="mean",
            groupby_rangefunc="stddev",
        )
    )
    ablations: list[Any] = [
        wr.ScatterPlot(
            title=f"{metric} vs {param}",
            x=wr.Config(f"method.{param}"),
            y=wr.SummaryMetric(metric),
        )
        for param in ABLATION_PARAMS
        for metric in ABLATION_METRICS
    ]
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
    tables: list[Any] = [
        wr.WeavePanelSummaryTable(table_name=key, layout=wr.Layout(w=24, h=10))
        for key in (
            ([f"table/{main_key}"] if main_key else [])
            + (["ratios"] if not rendered.ratios.empty else [])
            + (["claims"] if not rendered.claims.empty else [])
        )
    ]

    blocks: list[Any] = [
        wr.P(
            f"Study {study}, profile {profile}: {len(rendered.run_ids)} harness runs in W&B "
            f"group {study}; analysis run {analysis_id}. Regenerate with: "
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
    blocks += [
        wr.H2("Per method, over the study's runs"),
        wr.PanelGrid(runsets=[runs], panels=per_method),
        wr.H2("Ablations: method parameters against speed and quality"),
        wr.PanelGrid(runsets=[copy.deepcopy(runs)], panels=ablations),
    ]
    if media or tables:
        blocks += [
            wr.H2("Figures and tables (analysis run)"),
            wr.PanelGrid(runsets=[analysis], panels=media + tables),
        ]
    if rendered.markdown:
        blocks += [wr.H2("The whole rendering"), wr.MarkdownBlock(rendered.markdown)]

    report = wr.Report(
        project=project,
        entity=entity_name,
        title=f"MTAD reproduction: {study} ({profile})"[:128],
        description=f"Tables, figures and claims of study {study}, profile {profile}.",
        blocks=blocks,
    )
    _fix_ids(report, f"{study}\0{profile}")
    return report


def _fix_ids(report: wr.Report, seed: str) -> None:
    """Replace the random panel and run-set ids (``internal._generate_name``) by ones derived
    from ``seed`` and the position, so that the definition file is stable across renders."""
    import wandb_workspaces.reports.v2 as wr

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
    import wandb_workspaces
    import wandb_workspaces.reports.v2 as wr

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
    from importlib.metadata import version

    return version("wandb-workspaces")


def load_report_definition(path: str | os.PathLike[str]) -> wr.Report:
    """The ``wr.Report`` of a definition file written by :func:`write_report` (run-set
    entities and projects restored); no network call."""
    import wandb_workspaces.reports.v2 as wr
    from wandb_workspaces.reports.v2 import internal

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


def report_markdown(
    report: wr.Report, *, figures: dict[str, Path] | None = None, base: Path | None = None
) -> str:
    """A Markdown rendering of ``report``: its text blocks as they are, and for each panel
    grid the runs it shows and what each panel plots; a MediaBrowser's figures are embedded
    from the local PNGs (``figures``, linked relative to ``base``)."""
    import wandb_workspaces.reports.v2 as wr

    figures = figures or {}
    out = [f"# {report.title}", "", report.description, ""]
    for block in report.blocks:
        if isinstance(block, (wr.H1, wr.H2, wr.H3)):
            level = {wr.H1: "#", wr.H2: "##", wr.H3: "###"}[type(block)]
            out += [f"{level} {_text(block.text)}", ""]
        elif isinstance(block, wr.P):
            out += [_text(block.text), ""]
        elif isinstance(block, wr.MarkdownBlock):
            out += [block.text, ""]
        elif isinstance(block, wr.PanelGrid):
            for rs in block.runsets:
                out.append(f"Runs: *{rs.name}*, project `{rs.project}`, filter `{rs.filters}`.")
            out.append("")
            for panel in block.panels:
                out += _panel_markdown(panel, figures, base)
            out.append("")
        else:
            out += [f"({type(block).__name__})", ""]
    return "\n".join(out).rstrip() + "\n"


def _panel_markdown(panel: Any, figures: dict[str, Path], base: Path | None) -> list[str]:
    import wandb_workspaces.reports.v2 as wr

    if isinstance(panel, wr.BarPlot):
        metrics = ", ".join(_metric_text(m) for m in panel.metrics)
        how = f"{panel.groupby_aggfunc} over runs"
        return [f"- Bar chart *{panel.title}*: {metrics} per {panel.groupby} ({how})."]
    if isinstance(panel, wr.ScatterPlot):
        y, x = _metric_text(panel.y), _metric_text(panel.x)
        return [f"- Scatter plot *{panel.title}*: {y} against {x}, one point per run."]
    if isinstance(panel, wr.ScalarChart):
        return [
            f"- Scalar *{panel.title}*: {panel.groupby_aggfunc} of {_metric_text(panel.metric)}."
        ]
    if isinstance(panel, wr.MediaBrowser):
        lines = [f"- Media browser *{panel.title}*: the analysis run's images:"]
        for key in panel.media_keys:
            name = key.split("/", 1)[-1]
            png = figures.get(name)
            if png is None:
                lines.append(f"  - `{key}`")
                continue
            link = os.path.relpath(png, base) if base is not None else str(png)
            lines += [f"  - `{key}`", "", f"    ![{name}]({Path(link).as_posix()})", ""]
        return lines
    if isinstance(panel, wr.WeavePanelSummaryTable):
        return [
            f"- Table panel: the analysis run's `{panel.table_name}` (the same table as above)."
        ]
    return [f"- {type(panel).__name__}"]


def _metric_text(metric: Any) -> str:
    import wandb_workspaces.reports.v2 as wr

    if isinstance(metric, wr.SummaryMetric):
        return f"summary `{metric.name}`"
    if isinstance(metric, wr.Config):
        return f"config `{metric.name}`"
    if isinstance(metric, wr.Metric):
        return f"`{metric.name}`"
    return f"`{metric}`"


def _text(text: Any) -> str:
    if isinstance(text, str):
        return text
    if isinstance(text, Iterable):
        return "".join(_text(t) for t in text)
    return str(getattr(text, "text", text))


# --------------------------------------------------------------------------------------------
# writing and publishing


def find_run_dirs(
    wandb_dir: str | os.PathLike[str], run_ids: Sequence[str]
) -> tuple[list[Path], list[str]]:
    """The local W&B run folders (``<wandb_dir>/wandb/{offline-,}run-*-<id>``) of ``run_ids``,
    and the ids with none here (logged elsewhere, or with ``logger=none``)."""
    root = Path(wandb_dir) / "wandb"
    found: list[Path] = []
    missing: list[str] = []
    for run_id in run_ids:
        hits = sorted(root.glob(f"offline-run-*-{run_id}")) + sorted(root.glob(f"run-*-{run_id}"))
        hits = [h for h in hits if h.is_dir()]
        if hits:
            found += hits
        else:
            missing.append(run_id)
    return found, missing


def publish_instructions(
    rendered: Rendered,
    *,
    project: str,
    entity: str | None,
    analysis_dir: str | None,
    run_dirs: Sequence[Path],
    missing: Sequence[str],
    wandb_dir: str | os.PathLike[str],
    publish_command: str | None = None,
) -> str:
    """PUBLISH.md: upload the offline runs with ``wandb sync`` (``wandb sync --help``: PATHS
    are run folders; with no PATHS it syncs every unsynced run under ``./wandb`` and ``--yes``
    skips its prompt), then publish the report."""
    command = publish_command or _publish_command(rendered)
    paths = ([analysis_dir] if analysis_dir else []) + [str(p) for p in run_dirs]
    paths = [_relative_to(p, wandb_dir) for p in paths]
    where = f"--project {shlex.quote(project)}" + (
        f" --entity {shlex.quote(entity)}" if entity else ""
    )
    lines = [
        f"# Publishing the W&B report of {rendered.study} ({rendered.profile})",
        "",
        "Everything here was logged offline; nothing has been uploaded. With a W&B account, from",
        f"the folder the runs were logged in (`logger.dir`: `{wandb_dir}`):",
        "",
        "```bash",
        "wandb login",
        f"cd {shlex.quote(str(wandb_dir))}",
        "# 1. upload the analysis run and the harness runs behind the tables",
    ]
    if paths:
        lines.append(f"wandb sync {where} " + " ".join(shlex.quote(p) for p in paths))
        lines.append("# or every unsynced run of this folder at once (wandb >= 0.30):")
    lines += [
        f"wandb sync --yes {where}",
        "cd -",
        "# 2. build and save the report from the synced runs; it prints the report's URL",
        f"WANDB_MODE=online {command}",
        "```",
        "",
        f"Analysis run: id `{analysis_run_id(rendered.study, rendered.profile)}`, "
        f"folder `{_relative_to(analysis_dir, wandb_dir) if analysis_dir else 'not logged'}`.",
        f"Harness runs: {len(rendered.run_ids)} ids, {len(run_dirs)} local folders found.",
    ]
    if missing:
        lines.append(
            f"No local folder under `{wandb_dir}/wandb` for {len(missing)} run ids "
            f"(already synced, logged from another folder, or `logger=none`): "
            + ", ".join(f"`{m}`" for m in missing[:20])
            + (" ..." if len(missing) > 20 else "")
        )
    lines += [
        "",
        f"The report definition in `{DEFINITION_FILE}` is what step 2 saves "
        "(wandb-workspaces' ReportViewspec); `report.md` shows the same content.",
        "",
    ]
    return "\n".join(lines)


def _relative_to(path: str, base: str | os.PathLike[str]) -> str:
    """``path`` relative to ``base`` where it lies inside it (PUBLISH.md may be committed)."""
    try:
        return Path(path).resolve().relative_to(Path(base).resolve()).as_posix()
    except ValueError:
        return str(path)


def _publish_command(rendered: Rendered) -> str:
    for cmd in rendered.commands:
        if "reproduce.py" in cmd:
            return cmd if "--publish" in cmd else f"{cmd} --publish"
    return (
        f"python scripts/reproduce.py {shlex.quote(rendered.study)} "
        f"--profile {shlex.quote(rendered.profile)} --publish"
    )


def write_report(
    rendered: Rendered,
    *,
    project: str = "mtad",
    entity: str | None = None,
    publish: bool = False,
    mode: str | None = None,
    wandb_dir: str | os.PathLike[str] = ".",
    analysis: dict[str, Any] | None = None,
    main_table: str | None = None,
    publish_command: str | None = None,
) -> dict[str, Any]:
    """Write ``<out_dir>/report/``: the report definition (:func:`report_definition`),
    ``report.md`` and ``PUBLISH.md``; with ``publish`` also save the report on W&B.

    ``analysis`` is what :func:`log_analysis_run` returned (its folder goes into the sync
    command; otherwise it is looked up under ``wandb_dir``). Without ``publish`` no network
    call is made. With it, ``mode`` (default ``$WANDB_MODE``, else ``offline``) must be
    ``online`` and ``wandb.Api()`` must find a login, else :class:`PublishError` says what to
    do. Returns the paths written and ``url``: the URL of the saved report, or ``None``.
    """
    report = build_report(rendered, project=project, entity=entity, main_table=main_table)
    folder = Path(rendered.out_dir) / REPORT_DIR
    folder.mkdir(parents=True, exist_ok=True)

    definition = folder / DEFINITION_FILE
    definition.write_text(
        json.dumps(report_definition(report), indent=1, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    markdown = folder / MARKDOWN_FILE
    markdown.write_text(
        report_markdown(report, figures=rendered.figures, base=folder), encoding="utf-8"
    )

    analysis_dir = (analysis or {}).get("dir")
    if analysis_dir is None:
        hits, _ = find_run_dirs(wandb_dir, [analysis_run_id(rendered.study, rendered.profile)])
        analysis_dir = str(hits[-1]) if hits else None
    run_dirs, missing = find_run_dirs(wandb_dir, rendered.run_ids)
    instructions = folder / PUBLISH_FILE
    instructions.write_text(
        publish_instructions(
            rendered,
            project=project,
            entity=entity,
            analysis_dir=analysis_dir,
            run_dirs=run_dirs,
            missing=missing,
            wandb_dir=wandb_dir,
            publish_command=publish_command,
        ),
        encoding="utf-8",
    )
    out: dict[str, Any] = {
        "dir": str(folder),
        "definition": str(definition),
        "markdown": str(markdown),
        "publish_md": str(instructions),
        "url": None,
    }
    if publish:
        url = publish_report(
            rendered, project=project, entity=entity, mode=mode, main_table=main_table
        )
        (folder / PUBLISHED_FILE).write_text(json.dumps({"url": url}, indent=1) + "\n")
        print(f"W&B report: {url}")
        out["url"] = url
    return out


def publish_report(
    rendered: Rendered,
    *,
    project: str = "mtad",
    entity: str | None = None,
    mode: str | None = None,
    main_table: str | None = None,
) -> str:
    """Save the report on W&B and return the URL of the saved report (``Report.url``: built by
    wandb-workspaces from the id the server returned on save)."""
    mode = mode or os.environ.get("WANDB_MODE", "offline")
    if mode != "online":
        raise PublishError(
            f"W&B mode is {mode!r}: run `wandb login`, sync the runs as PUBLISH.md says, then "
            "rerun with WANDB_MODE=online and --publish"
        )
    import wandb

    try:
        api = wandb.Api()
        entity = entity or api.default_entity
    except Exception as err:  # wandb raises UsageError without a key, others without a server
        raise PublishError(
            f"cannot reach W&B ({type(err).__name__}: {err}): run `wandb login` (or set "
            "WANDB_API_KEY), then rerun with --publish"
        ) from err
    if not entity:
        raise PublishError("W&B returned no default entity: set logger.entity and rerun")
    report = build_report(rendered, project=project, entity=entity, main_table=main_table)
    try:
        report.save()
    except ValueError as err:  # a run set's project is looked up first: not there until synced
        raise PublishError(
            f"{err} -- sync the runs first (see {REPORT_DIR}/{PUBLISH_FILE}), then rerun"
        ) from err
    return str(report.url)


__all__ = [
    "ANALYSIS_JOB_TYPE",
    "PublishError",
    "analysis_run_id",
    "analysis_run_name",
    "build_report",
    "find_run_dirs",
    "flat_frame",
    "load_report_definition",
    "log_analysis_run",
    "publish_instructions",
    "publish_report",
    "ratio_summary",
    "report_definition",
    "report_markdown",
    "wandb_table",
    "write_report",
]
