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

import json
import os
from pathlib import Path
from typing import Any

import wandb

from mtad.paper.rendered import Rendered
from mtad.paper.report_text import find_run_dirs, publish_instructions, report_markdown
from mtad.paper.wandb_report import build_report, load_report_definition, report_definition
from mtad.paper.wandb_run import (
    DEFINITION_FILE,
    MARKDOWN_FILE,
    PUBLISH_FILE,
    PUBLISHED_FILE,
    REPORT_DIR,
    PublishError,
    analysis_run_id,
    log_analysis_run,
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

    instructions = folder / PUBLISH_FILE
    instructions.write_text(
        _instructions(rendered, project, entity, wandb_dir, analysis, publish_command),
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


def _instructions(
    rendered: Rendered,
    project: str,
    entity: str | None,
    wandb_dir: str | os.PathLike[str],
    analysis: dict[str, Any] | None,
    publish_command: str | None,
) -> str:
    """``PUBLISH.md``: the sync commands for the local run folders of the analysis run (the
    one logged, else the newest under ``wandb_dir``) and of the harness runs behind it."""
    analysis_dir = (analysis or {}).get("dir")
    if analysis_dir is None:
        hits, _ = find_run_dirs(wandb_dir, [analysis_run_id(rendered.study, rendered.profile)])
        analysis_dir = str(hits[-1]) if hits else None
    run_dirs, missing = find_run_dirs(wandb_dir, rendered.run_ids)
    return publish_instructions(
        rendered,
        project=project,
        entity=entity,
        analysis_dir=analysis_dir,
        run_dirs=run_dirs,
        missing=missing,
        wandb_dir=wandb_dir,
        publish_command=publish_command,
    )


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
    "PublishError",
    "analysis_run_id",
    "build_report",
    "find_run_dirs",
    "load_report_definition",
    "log_analysis_run",
    "publish_instructions",
    "publish_report",
    "report_definition",
    "report_markdown",
    "write_report",
]
