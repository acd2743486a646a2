"""Hydra callbacks of a sweep (``-m``): every job validated before any starts, a summary at the end.

:class:`ValidateSweep` (``on_multirun_start``) expands the sweep into its jobs exactly as
Hydra's basic sweeper will (Hydra's override parser over ``hydra.sweeper.params`` plus the
command line, every value of each sweep, their cartesian product in that order), composes
each job's config with Hydra's own config loader (``load_sweep_config``, what the launcher
does per job) and runs :func:`mtad.harness.prepare.prepare` on it: every value, device,
weights, vocabularies, token budget and output folder. The first bad job stops the command
before any job starts, with one line naming the key and the job's overrides, and exit status
2. Why here and not in the sweeper: a custom sweeper must live in the ``hydra_plugins``
namespace package (Hydra refuses others), and validating inside each job would let the good
jobs before a bad one run first. Sweepers other than the basic one (Optuna, Ax) choose jobs
as they go; their jobs are checked one by one at run time, where a bad one fails
(``failed.json``) without stopping the others.

:class:`SweepSummary` (``on_multirun_end``): every job leaves ``result.json`` (signature,
result folder, status) in its Hydra output folder; they are gathered from the sweep folder, so
the table covers exactly this sweep's runs, whatever launcher ran them, including the ones
skipped as complete, the ones another live process had claimed and the failures, which are
listed; when any job failed, the command exits with status 1 after the table.
:class:`CompareSummary` (``conf/experiment/compare.yaml``) prints instead one comparison table
of the sweep's methods and the verdicts of the preset's claims.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, open_dict

from mtad.harness.cli import composition_error, parse_overrides, report_config_error
from mtad.harness.config import ConfigError, validate
from mtad.harness.summary import print_compare, print_runs
from mtad.runs.claims import Claim
from mtad.runs.folder import METRICS_FILE, write_json
from mtad.runs.frame import load_runs

POINTER_FILE = "result.json"
EXIT_JOBS_FAILED = 1
# Hydra's basic sweeper: its class, as hydra/sweeper=basic (Hydra's default) sets it
BASIC_SWEEPER_CLASS = "BasicSweeper"


def write_pointer(output_dir: str | Path, info: dict[str, Any]) -> None:
    write_json(Path(output_dir) / POINTER_FILE, info)


def read_pointers(sweep_dir: str | Path) -> list[dict[str, Any]]:
    pointers = []
    for path in sorted(Path(sweep_dir).rglob(POINTER_FILE)):
        try:
            pointers.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return pointers


def basic_sweeper(config: DictConfig) -> bool:
    """Whether Hydra's basic sweeper runs the sweep ``config`` (its jobs are known up front)."""
    # By the class name: the class's module path is Hydra's private package, which nothing
    # here imports or names (the recipe sweeper and Optuna or Ax have other names).
    target = str(config.hydra.sweeper.get("_target_", ""))
    return target.rpartition(".")[2] == BASIC_SWEEPER_CLASS


def sweep_jobs(config: DictConfig) -> list[list[str]]:
    """The override lists of every job of the sweep ``config`` will run, in the basic sweeper's
    order: each key's values (a later ``key=...`` replaces an earlier one), then their product."""
    params = config.hydra.sweeper.get("params") or {}
    arguments = [f"{key}={value}" for key, value in params.items()]
    arguments += list(config.hydra.overrides.task)
    parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
    values: dict[str, list[str]] = {}
    for override in parser.parse_overrides(arguments):
        key = override.get_key_element()
        if not override.is_sweep_override():
            values[key] = [f"{key}={override.get_value_element_as_str()}"]
        elif override.is_discrete_sweep():
            values[key] = [f"{key}={value}" for value in override.sweep_string_iterator()]
        else:  # interval(...): the basic sweeper refuses it too
            raise ConfigError(key, f"{override.input_line}: the basic sweeper takes no interval")
    return [list(job) for job in itertools.product(*values.values())]


def validate_sweep(config: DictConfig) -> int:
    """Compose and prepare every job of the sweep; raise :class:`ConfigError` naming the key
    and the job. Returns the number of jobs."""
    loader = GlobalHydra.instance().config_loader()
    jobs = sweep_jobs(config)
    configs = []
    for num, overrides in enumerate(jobs):  # the values first: no torch import yet
        with _naming_the_job(num, overrides):
            job_cfg = loader.load_sweep_config(master_config=config, sweep_overrides=overrides)
            with open_dict(job_cfg):
                job_cfg.pop("hydra", None)  # hydra.job.num & co. exist only inside the job
            validate(job_cfg)
        configs.append(job_cfg)
    # Imported here: prepare brings the engine and transformers (~4 s), which a sweep with a
    # bad value, a command whose sweeper is not the basic one (a paper preset refused for its
    # device, a dry run) never needs, and Hydra imports this module for every multirun.
    from mtad.harness.prepare import prepare

    for num, (overrides, job_cfg) in enumerate(zip(jobs, configs, strict=True)):
        with _naming_the_job(num, overrides):
            prepare(job_cfg)
    return len(jobs)


@contextlib.contextmanager
def _naming_the_job(num: int, overrides: Sequence[str]) -> Iterator[None]:
    """A :class:`ConfigError` (or Hydra's composition error) of sweep job ``num`` as one
    :class:`ConfigError` that names the job."""
    where = f" [job {num}: {' '.join(overrides) or 'no overrides'}]"
    try:
        yield
    except ConfigError as err:
        raise ConfigError(err.key, err.message + where) from err
    except Exception as err:  # noqa: BLE001 - Hydra's composition errors span lines
        found = composition_error(err, parse_overrides(overrides))
        raise ConfigError(found.key, found.message + where) from err


class ValidateSweep(Callback):
    """Every job of a sweep is validated before any starts (see the module docstring)."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not basic_sweeper(config):
            return
        try:
            n = validate_sweep(config)
        except ConfigError as err:
            report_config_error(err)  # one line, exit 2: nothing has run
        print(f"sweep: {n} job(s) validated")


class SweepSummary(Callback):
    def print_table(self, runs: Any, title: str) -> None:
        print_runs(runs, title)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        pointers = read_pointers(config.hydra.sweep.dir)
        done = [p for p in pointers if p.get("status") in ("done", "skipped")]
        runs = load_runs({Path(p["result_dir"]) / METRICS_FILE for p in done})
        statuses = ("done", "skipped", "claimed", "failed")
        counts = {s: sum(p.get("status") == s for p in pointers) for s in statuses}
        studies = sorted({str(Path(p["result_dir"]).parent) for p in done})
        title = (
            f"sweep: {counts['done']} run, {counts['skipped']} skipped (already complete), "
            f"{counts['claimed']} claimed by another process, {counts['failed']} failed"
            f" -> {', '.join(studies) or 'no results'}"
        )
        try:
            self.print_table(runs, title)
        except Exception as err:  # noqa: BLE001 - the table must not hide the failures below
            print(f"{title}\n(summary table unavailable: {type(err).__name__}: {err})")
        for p in pointers:
            if p.get("status") == "claimed":
                print(f"claimed: {p.get('result_dir')}: {p.get('note')} (rerun to complete it)")
        signatures = [p.get("signature") for p in done]
        repeated = len(signatures) - len(set(signatures))
        if repeated:
            print(
                f"note: {repeated} job(s) repeated another job's signature: they differ only in "
                "keys the run identity ignores (mtad/runs/identity.py: EXCLUDED), so they were "
                "skipped. Sweep those keys in separate studies."
            )
        launcher = str(config.hydra.launcher.get("_target_", ""))
        if counts["done"] > 1 and "BasicLauncher" not in launcher:
            print(
                f"note: {launcher.rsplit('.', 1)[-1]} may run jobs side by side; timings and "
                "energy of jobs sharing a machine are not comparable (time with the basic "
                "launcher, or one job per node)."
            )
        failed = [p for p in pointers if p.get("status") == "failed"]
        for p in failed:
            where = p.get("result_dir") or " ".join(p.get("overrides") or [])
            print(f"FAILED job {p.get('job')}: {where}: {p.get('note')}")
        if failed:
            print(
                f"{len(failed)} job(s) failed (failed.json in each result folder); the same "
                "command retries them",
                file=sys.stderr,
            )
            sys.exit(EXIT_JOBS_FAILED)


class CompareSummary(SweepSummary):
    """:class:`SweepSummary` whose table is the comparison of the sweep's methods with the
    verdicts of ``claims`` (mappings with the keys of :class:`mtad.runs.claims.Claim`), as
    ``python run.py +experiment=compare`` prints it (:func:`mtad.harness.summary.print_compare`)."""

    def __init__(self, claims: Any = ()) -> None:
        # a bad claim fails here, when Hydra builds the callbacks: before any job runs
        self.claims = [Claim.of(dict(c)) for c in claims]

    def print_table(self, runs: Any, title: str) -> None:
        print_compare(runs, self.claims, title)
