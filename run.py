#!/usr/bin/env python
"""Hydra entry point of the MTAD harness: one run, or a sweep with ``-m``.

    python run.py                                  # pair=smollm2 method=mtad task=prompts
    python run.py +experiment=compare              # AR, SpS, MTAD: one table, a verdict per claim
    python run.py +experiment=llama70b --cfg job   # print a preset's full config
    python run.py -m +experiment=smoke method.gamma=2,3 method.tau=0.3,0.6

Results: ``results/<study>/<signature>/`` (see ``mtad/harness/job.py``). Bad values stop the
run before any model loads, with one line on stderr naming the key, and exit status 2. Ctrl-C
ends with one line (what finished, what did not; the same command resumes) and exit status 130.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from mtad.harness.cli import report_config_error, run_app
from mtad.harness.config import ConfigError, register_configs, validate
from mtad.harness.interrupt import exit_interrupted

if TYPE_CHECKING:
    from mtad.harness.job import RunOutcome

CONF_DIR = Path(__file__).resolve().parent / "conf"


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> RunOutcome | None:
    from mtad.runs.folder import ResultsNotWritten

    try:
        # A single run's bad value is one line before the runner's imports (torch and
        # transformers: ~4 s, which --help, --cfg and a command line Hydra cannot compose do
        # not need either). In a sweep it is that job's failure (run_from_hydra), and the
        # basic sweeper validated every job before any started.
        if HydraConfig.get().mode != RunMode.MULTIRUN:
            validate(cfg)
        from mtad.harness.job import run_from_hydra

        return run_from_hydra(cfg)  # the outcome goes to the callbacks (InterruptReport)
    except ConfigError as err:
        report_config_error(err)
    except ResultsNotWritten as err:  # e.g. the disk filled up: one line, exit status 1
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    # A W&B service inherited from a parent process (the SDK exports WANDB_SERVICE to its
    # children) would hold every run of this command: a `kill -9` of this command would leave
    # its run's stream open there, and the rerun's resume of the same run id would be refused
    # ("run ID ... is in use"). Each run.py owns its W&B service.
    os.environ.pop("WANDB_SERVICE", None)
    register_configs()
    try:
        run_app(main, sys.argv[1:], CONF_DIR)  # Hydra's composition errors: one line, exit 2
    except KeyboardInterrupt:  # Ctrl-C: one line, exit 130 (mtad/harness/interrupt.py)
        exit_interrupted(sweep=bool({"-m", "--multirun"} & set(sys.argv[1:])))
