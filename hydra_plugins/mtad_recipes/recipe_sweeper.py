"""``hydra/sweeper=recipes``: a multirun over the runs the paper recipes need.

Hydra's basic sweeper runs one cartesian product; a paper table needs a union of them (every
method on every task, plus each ablation's grid), deduplicated, minus what is already done. This
sweeper expands ``experiments/`` recipes under a profile with :mod:`mtad.paper` -- the same code
``scripts/reproduce.py`` uses -- composes every job as the launcher will, skips complete runs,
reports the runs that cannot run here (and why), and hands the rest to the configured launcher
(basic, joblib, submitit/SLURM) in batches. So ``python run.py +experiment=llama70b`` starts the
Llama-2-70B paper runs on whatever launcher the command line names.

Hydra only instantiates plugins from the ``hydra_plugins`` namespace package, hence this home;
the logic lives in ``mtad.paper``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)


class RecipeSweeper(Sweeper):
    def __init__(
        self,
        recipes: Sequence[str] = ("all",),
        profile: str = "paper",
        pairs: Sequence[str] | None = None,
        max_batch_size: int | None = None,
        dry_run: bool = False,
        params: Any = None,
    ) -> None:
        if params:  # e.g. a paper preset combined with +sweep=...: say so, do not ignore it
            raise ValueError(
                "hydra.sweeper.params: a paper preset runs the experiments/ recipes, not a grid; "
                "for your own grid select the pair instead (-m pair=<pair> runtime.device=cuda "
                "+sweep=...), or add hydra.mode=RUN for one run of the preset"
            )
        self.recipes = list(recipes)
        self.profile = profile
        self.pairs = list(pairs) if pairs else None
        self.max_batch_size = max_batch_size
        self.dry_run = dry_run
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.launcher: Any = None

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        self.hydra_context = hydra_context
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def _check_host_device(self) -> None:
        """A launcher that runs the jobs on this host (basic, joblib) needs the preset's device
        here: one line up front (exit 2) instead of a failed.json per job, minutes later. A
        cluster launcher (submitit) checks the device where each job runs."""
        from mtad.harness.cli import report_config_error
        from mtad.harness.config import ConfigError
        from mtad.harness.device import check_device

        assert self.config is not None
        launcher = str(self.config.hydra.launcher.get("_target_", ""))
        if self.dry_run or "submitit" in launcher.lower():
            return
        try:
            check_device(str(self.config.runtime.device))
        except ConfigError as err:
            where = launcher.rsplit(".", 1)[-1] or "this launcher"
            report_config_error(
                ConfigError(
                    err.key,
                    f"{str(err).split(': ', 1)[1]} ({where} runs the jobs on this host; launch "
                    "on a GPU machine or with a cluster launcher, e.g. hydra/launcher=slurm_2gpu)",
                )
            )

    def _compose(self, overrides: Sequence[str]) -> DictConfig:
        assert self.hydra_context is not None and self.config is not None
        return self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))

    def sweep(self, arguments: list[str]) -> Any:
        assert self.config is not None and self.launcher is not None
        self._check_host_device()  # before the planner's imports (the engine, transformers)
        from mtad.paper.plan import describe, make_plan
        from mtad.paper.status import CachedComposer, shared_loads

        assert self.hydra_context is not None
        compose = CachedComposer(self._compose)
        # each config file read once for all the plan's compositions
        with shared_loads(self.hydra_context.config_loader):
            plan = make_plan(self.recipes, self.profile, compose, self.pairs, arguments)
        print(describe(plan, verbose=self.dry_run), flush=True)
        not_run = sorted({s.reason for s in plan.status.values() if s.state == "not_run"})
        for reason in not_run:
            print(f"  {reason}")
        if self.dry_run:
            return []
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        jobs = [list(s.planned.overrides) for s in plan.jobs]
        size = self.max_batch_size or max(len(jobs), 1)
        returns = []
        with self._sharing_loads_in_process():
            for start in range(0, len(jobs), size):
                batch = jobs[start : start + size]
                returns.append(self.launcher.launch(batch, initial_job_idx=start))
        return returns

    def _sharing_loads_in_process(self) -> AbstractContextManager[None]:
        """Hydra's basic launcher composes each job in this process with this loader: its
        compositions read the config files once too (``shared_loads``). Other launchers
        (joblib, submitit) send themselves, loader included, to other processes: they compose
        with Hydra's loader as it is."""
        from hydra._internal.core_plugins.basic_launcher import BasicLauncher

        from mtad.paper.status import shared_loads

        assert self.hydra_context is not None
        if isinstance(self.launcher, BasicLauncher):
            return shared_loads(self.hydra_context.config_loader)
        return nullcontext()
