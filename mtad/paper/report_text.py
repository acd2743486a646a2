"""The report as text: a Markdown rendering of what the W&B Report shows, and PUBLISH.md
with the exact commands that upload the runs and save the report."""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import wandb_workspaces.reports.v2 as wr

from mtad.paper.rendered import Rendered
from mtad.paper.wandb_run import DEFINITION_FILE, analysis_run_id


def report_markdown(
    report: wr.Report, *, figures: dict[str, Path] | None = None, base: Path | None = None
) -> str:
    """A Markdown rendering of ``report``: its text blocks as they are, and for each panel
    grid the runs it shows and what each panel plots; a MediaBrowser's figures are embedded
    from the local PNGs (``figures``, linked relative to ``base``)."""
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


def _run_notes(
    rendered: Rendered, missing: Sequence[str], wandb_dir: str | os.PathLike[str]
) -> list[str]:
    """PUBLISH.md's lines on harness runs it cannot upload: unlogged, or without a folder."""
    lines = []
    if rendered.unlogged_runs:
        lines.append(
            f"{rendered.unlogged_runs} harness runs behind the tables logged nothing to W&B "
            "(`logger=none`): there is nothing of theirs to upload and the report's run panels "
            "cannot show them; the analysis run holds every table and figure."
        )
    if missing:
        lines.append(
            f"No local folder under `{wandb_dir}/wandb` for {len(missing)} run ids "
            f"(already synced, logged from another folder, or `logger=none`): "
            + ", ".join(f"`{m}`" for m in missing[:20])
            + (" ..." if len(missing) > 20 else "")
        )
    return lines


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
    lines += _run_notes(rendered, missing, wandb_dir)
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
