"""W&B: one run per harness run with the resolved config, summary metrics and a sample table.

Offline by default (``logger.mode`` reads ``$WANDB_MODE``); ``wandb sync`` uploads later.
``logger=none`` gives :class:`NullLogger`. ``wandb`` is imported only when used: its import and
``init`` cost about two seconds, which the job keeps out of the timed region and records.

One result, one W&B run: the run id is a function of the study and the run signature
(:func:`wandb_run_id`) and W&B is started with ``resume="allow"``, so a run started again after
a crash, a ``kill -9`` or a SLURM pre-emption continues the same W&B run online. Offline, W&B
writes a new ``offline-run-<time>-<id>`` folder per start; the attempts before this one (they
hold no result: a finished run is never started again) are deleted before ``wandb.init``, so
``wandb sync`` never uploads a second copy and counting runs by id gives one per result. The
job holds the run's lease (:mod:`mtad.harness.lease`) at that point, so no live process is
writing those folders.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mtad.harness.config import LoggerConfig

if TYPE_CHECKING:
    from wandb.sdk.wandb_run import Run

OFFLINE_RUN = re.compile(r"^offline-run-\d{8}_\d{6}-(?P<id>[A-Za-z0-9]+)(-\d+)?$")


def wandb_run_id(study: str, signature: str) -> str:
    """A W&B run id (letters and digits) that follows from the result folder's identity."""
    return hashlib.sha1(f"{study}/{signature}".encode()).hexdigest()[:16]


def logged_run_id(metrics: dict[str, Any]) -> str | None:
    """The W&B run id a finished run logged under, read from its ``metrics.json`` (the
    ``wandb`` entry, :meth:`WandbLogger.info`); ``None`` when it logged nothing
    (``logger=none``, or W&B mode ``disabled``)."""
    info = metrics.get("wandb") or {}
    return str(info["run_id"]) if info.get("logger") == "wandb" and info.get("run_id") else None


def offline_runs(wandb_dir: Path) -> dict[str, list[Path]]:
    """Offline run folders under ``<logger.dir>/wandb`` grouped by run id."""
    runs: dict[str, list[Path]] = {}
    if not wandb_dir.is_dir():
        return runs
    for path in sorted(wandb_dir.iterdir()):
        m = OFFLINE_RUN.match(path.name)
        if m and path.is_dir():
            runs.setdefault(m.group("id"), []).append(path)
    return runs


def drop_earlier_attempts(wandb_dir: Path, run_id: str) -> list[Path]:
    """Delete the offline folders of earlier starts of ``run_id``; return them."""
    gone = offline_runs(wandb_dir).get(run_id, [])
    for path in gone:
        shutil.rmtree(path, ignore_errors=True)
    return gone


class NullLogger:
    init_s = 0.0
    run_dir: str | None = None
    run_id: str | None = None

    def start(
        self,
        name: str,
        group: str,
        job_type: str,
        config: dict[str, Any],
        tags: list[str],
        run_id: str | None = None,
    ) -> None:
        pass

    def log_result(self, summary: dict[str, Any], samples: list[dict[str, Any]]) -> None:
        pass

    def finish(self, exit_code: int = 0) -> None:
        pass

    def info(self) -> dict[str, Any]:
        return {"logger": "none"}


class WandbLogger(NullLogger):
    def __init__(self, cfg: LoggerConfig) -> None:
        self.cfg = cfg
        self.run: Run | None = None

    def start(
        self,
        name: str,
        group: str,
        job_type: str,
        config: dict[str, Any],
        tags: list[str],
        run_id: str | None = None,
    ) -> None:
        t0 = time.perf_counter()
        import wandb  # here, timed (init_s): logger=none runs never import it (module docstring)

        Path(self.cfg.dir).mkdir(parents=True, exist_ok=True)
        if run_id is not None and self.cfg.mode == "offline":
            drop_earlier_attempts(Path(self.cfg.dir) / "wandb", run_id)
        settings = wandb.Settings(
            console="off",  # the console stays ours; results are in the result folder
            x_disable_stats=True,  # no system-metrics sampler competing with the timed loop
            silent=True,
        )
        self.run = wandb.init(
            project=self.cfg.project,
            entity=self.cfg.entity,
            mode=self.cfg.mode,
            dir=self.cfg.dir,
            name=name,
            group=group,
            job_type=job_type,
            tags=tags,
            config=config,
            settings=settings,
            id=run_id,
            resume="allow" if run_id else None,
            reinit="finish_previous",  # several runs per process in a basic-launcher sweep
        )
        self.run_id = self.run.id
        # run.dir is <run folder>/files; the run folder holds run-<id>.wandb
        self.run_dir = str(Path(self.run.dir).parent)
        self.init_s = time.perf_counter() - t0

    def log_result(self, summary: dict[str, Any], samples: list[dict[str, Any]]) -> None:
        if self.run is None:
            return
        import wandb

        self.run.summary.update(summary)
        if self.cfg.log_samples and samples:
            columns = list(samples[0])
            data = [[_cell(row.get(c)) for c in columns] for row in samples]
            self.run.log({"samples": wandb.Table(columns=columns, data=data)})

    def finish(self, exit_code: int = 0) -> None:
        if self.run is not None:
            self.run.finish(exit_code=exit_code)
            self.run = None

    def info(self) -> dict[str, Any]:
        return {
            "logger": "wandb",
            "mode": self.cfg.mode,
            "run_id": self.run_id,
            "run_dir": self.run_dir,
            "init_s": self.init_s,
        }


def _cell(value: Any) -> Any:
    # W&B tables take scalars and strings; lists (accept lengths) become strings.
    if isinstance(value, (list, tuple, dict)):
        return str(value)
    return value


def make_logger(cfg: LoggerConfig) -> NullLogger:
    return NullLogger() if cfg.name == "none" or cfg.mode == "disabled" else WandbLogger(cfg)
