"""The study's W&B analysis run: every rendered table, figure and cross-run ratio as one run
of the study's group (``job_type="analysis"``), with an id fixed by study and profile.

Constants shared by the W&B modules live here too (``mtad.paper.wandb_publish`` is the
entry point that ties them together)."""

from __future__ import annotations

import hashlib
import math
import os
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import wandb

from mtad.paper.rendered import Rendered
from mtad.runs.comparison import COMPARISON_COLUMNS
from mtad.runs.intervals import DOES_NOT_HOLD, HOLDS, UNRESOLVED, VERDICTS

ANALYSIS_JOB_TYPE = "analysis"
REPORT_DIR = "report"
DEFINITION_FILE = "report.json"
MARKDOWN_FILE = "report.md"
PUBLISH_FILE = "PUBLISH.md"
PUBLISHED_FILE = "published.json"
DEFINITION_FORMAT = "mtad.report/1: wandb_workspaces.reports.v2 ReportViewspec (by alias)"

# Summary keys a harness run logs (mtad.harness.records.wandb_summary: flat metrics, nested
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
    so a Report can chart them), the claims as a table (``claims``) and their verdicts counted
    (:func:`claims_summary`). The config records the study, profile, the W&B ids of the runs
    behind it and the commands.

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
    Path(dir).mkdir(parents=True, exist_ok=True)
    if mode == "offline":
        _remove_superseded(Path(dir) / "wandb", run_id)
    run = _start_run(rendered, project=project, entity=entity, mode=mode, dir=dir)
    try:
        run.log(_payload(rendered))
        run.summary.update(ratio_summary(rendered.ratios))
        run.summary.update(claims_summary(rendered.claims))
        run_dir = Path(run.dir).parent  # run.dir is <run folder>/files
    except BaseException:
        run.finish(exit_code=1)
        raise
    run.finish()
    return {"id": run_id, "dir": str(run_dir), "mode": mode, "name": name}


def _start_run(rendered: Rendered, *, project: str, entity: str | None, mode: str, dir: Any) -> Any:
    """``wandb.init`` of the analysis run (id and name from study and profile, resumed)."""
    settings = wandb.Settings(
        console="off",  # as mtad.harness.wandb_logger: the console stays ours
        x_disable_stats=True,  # no system-metrics sampler: nothing here is worth sampling
        silent=True,
    )
    return wandb.init(
        project=project,
        entity=entity,
        mode=mode,
        dir=str(dir),
        id=analysis_run_id(rendered.study, rendered.profile),
        resume="allow",
        name=analysis_run_name(rendered.study, rendered.profile),
        group=rendered.study,
        job_type=ANALYSIS_JOB_TYPE,
        tags=[ANALYSIS_JOB_TYPE, rendered.profile],
        config=_analysis_config(rendered),
        settings=settings,
        reinit="finish_previous",
    )


def _analysis_config(rendered: Rendered) -> dict[str, Any]:
    """The analysis run's config: study, profile, the runs behind it and the commands."""
    return {
        "study": rendered.study,
        "profile": rendered.profile,
        "out_dir": str(rendered.out_dir),
        "run_ids": list(rendered.run_ids),
        "n_runs": len(rendered.run_ids),
        "commands": list(rendered.commands),
        "tables": sorted(rendered.tables),
        "figures": sorted(rendered.figures),
    }


def _payload(rendered: Rendered) -> dict[str, Any]:
    """Every table (display and numeric), figure, the ratios and the claims, by W&B key."""
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
    return payload


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
        for col in COMPARISON_COLUMNS:
            value = row.get(col)
            if isinstance(value, (int, float)) and math.isfinite(value):
                out[f"ratio/{where}/{col}"] = float(value)
    return out


def claims_summary(claims: pd.DataFrame) -> dict[str, int]:
    """How many claim rows hold, do not hold and are unresolved (the renderer's ``verdict``
    column, :func:`mtad.paper.render.claims_table`), and their total."""
    if claims.empty or "verdict" not in claims:
        return {}
    verdicts = claims["verdict"].astype(str)
    unknown = sorted(set(verdicts) - set(VERDICTS))
    if unknown:
        raise ValueError(f"claims: verdict must be one of {VERDICTS}, not {unknown}")
    return {
        "claims_total": int(len(claims)),
        "claims_holding": int((verdicts == HOLDS).sum()),
        "claims_not_holding": int((verdicts == DOES_NOT_HOLD).sum()),
        "claims_unresolved": int((verdicts == UNRESOLVED).sum()),
    }
