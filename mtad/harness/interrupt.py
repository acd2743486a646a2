"""Ctrl-C: one line saying what finished, what did not, and that the same command resumes;
exit status 130 (128 + SIGINT, what shells report for a program ended by Ctrl-C).

Nothing needs saving on the way out: a run's result folder counts as complete only once its
``metrics.json`` is written (last), the run's lease is released as the exception unwinds
(:mod:`mtad.harness.lease`), and its W&B run is finished as failed (:mod:`mtad.harness.job`),
so the same command skips what is complete and redoes the rest exactly once
(``tests/test_interrupt.py``).

:class:`InterruptReport` (a Hydra callback, ``conf/hydra/default.yaml``) keeps count of the
jobs this process starts and ends; ``run.py`` turns the ``KeyboardInterrupt`` into
:func:`exit_interrupted`. With launchers that run jobs in other processes (joblib, SLURM) the
count covers what this process saw.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, NoReturn

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

EXIT_INTERRUPTED = 130


@dataclass
class Progress:
    """What this process has started and ended. ``jobs``: the sweep's override lists (basic
    sweeper; None: a single run, or a sweeper that chooses jobs as it goes)."""

    sweep: bool = False
    jobs: list[list[str]] | None = None
    ended: list[str] = field(default_factory=list)  # statuses: done, skipped, claimed, failed
    current: str | None = None  # the job running now, as its varying overrides

    def line(self) -> str:
        """The one line printed on Ctrl-C."""
        if not self.sweep:
            if self.ended:
                return "interrupted after the run finished; nothing is left to do"
            return (
                "interrupted: the run did not finish (its result folder is not complete); "
                "the same command runs it again"
            )
        if self.current is None and not self.ended:
            return "interrupted before any run of the sweep started; the same command starts it"
        counts = ", ".join(f"{self.ended.count(s)} {s}" for s in dict.fromkeys(self.ended))
        total = f" of {len(self.jobs)}" if self.jobs else ""
        runs = "runs" if self.jobs or len(self.ended) != 1 else "run"  # "1 of 3 runs", "1 run"
        parts = [f"{len(self.ended)}{total} {runs} finished" + (f" ({counts})" if counts else "")]
        if self.current is not None:
            parts.append(f"{self.current} did not finish")
        again = "the missing ones"
        if self.jobs is not None:
            missing = len(self.jobs) - len(self.ended)
            parts.append(f"{missing - (self.current is not None)} not started")
            again = f"the {missing} missing"
        return (
            f"interrupted: {', '.join(parts)}; the same command skips the complete runs "
            f"and runs {again}"
        )


PROGRESS = Progress()


def _varying(jobs: list[list[str]], overrides: list[str]) -> list[str]:
    """``overrides`` without those every job of the sweep shares."""
    common = set.intersection(*(set(j) for j in jobs)) if len(jobs) > 1 else set()
    return [o for o in overrides if o not in common]


class InterruptReport(Callback):
    """Counts the jobs for :func:`exit_interrupted` (see the module docstring)."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from mtad.harness.callbacks import basic_sweeper, sweep_jobs

        PROGRESS.sweep = True
        if basic_sweeper(config):
            PROGRESS.jobs = sweep_jobs(config)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        overrides = list(config.hydra.overrides.task)
        shown = _varying(PROGRESS.jobs, overrides) if PROGRESS.jobs else overrides
        num = config.hydra.job.get("num")
        PROGRESS.current = f"job {num} ({' '.join(shown) or 'no overrides'})"

    def on_job_end(self, config: DictConfig, job_return: Any = None, **kwargs: Any) -> None:
        outcome = getattr(job_return, "return_value", None)
        PROGRESS.ended.append(str(getattr(outcome, "status", "failed")))
        PROGRESS.current = None


def exit_interrupted(sweep: bool) -> NoReturn:
    """Print :meth:`Progress.line` on stderr and exit with status 130. ``sweep``: the command
    is a sweep (``-m``), known from the command line even before its jobs are counted."""
    PROGRESS.sweep = PROGRESS.sweep or sweep
    print(PROGRESS.line(), file=sys.stderr)
    sys.exit(EXIT_INTERRUPTED)
