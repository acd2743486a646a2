"""Where each planned run stands: done, failed, not run (and why) or missing.

A planned run is composed exactly as ``run.py`` would compose it and passed through the harness's
own :func:`mtad.harness.prepare.prepare` (validation, task data, signature; no model loads), so
the signature found here is the one the run writes. Task data that is not there (Spider without
``task.data_dir``) or a task the profile does not run becomes "not run" with the reason; any
other bad value is a real error and stops everything before a run starts.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
import yaml
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf, open_dict

from mtad.harness import preflight
from mtad.harness.config import ConfigError, register_configs
from mtad.harness.prepare import prepare
from mtad.harness.results import CONFIG_FILE, FAILED_FILE, METRICS_FILE, is_complete
from mtad.harness.signature import config_hash
from mtad.paper.expansion import PlannedRun
from mtad.paper.recipes import REPO, RecipeError

CONF = REPO / "conf"
# ConfigErrors under these keys mean "this data / judge is not here", not "this value is
# wrong": the run is listed as not runnable, not a broken recipe. The device and the weights
# are not checked when planning (they are the job host's business: a login node without GPUs
# plans GPU runs); a planning host without the configured device is noted once instead.
UNAVAILABLE_KEYS = ("task",)
# The part of a run's identity that only the host running it knows (mtad.harness.prepare
# hashes it into the signature): a planner matches finished runs without it.
HOST_KEYS = (("hardware", "gpu_model"),)

Composer = Callable[[Sequence[str]], DictConfig]


@dataclass
class RunStatus:
    planned: PlannedRun
    state: str  # "done" | "failed" | "not_run" | "missing"
    signature: str | None = None
    result_dir: Path | None = None
    reason: str | None = None
    n_samples: int = 0
    max_new_tokens: int = 0
    host_note: str | None = None  # why this planning host could not run it itself

    @property
    def runnable(self) -> bool:
        return self.state in ("missing", "failed")

    def metrics(self) -> dict[str, Any]:
        assert self.result_dir is not None
        return json.loads((self.result_dir / METRICS_FILE).read_text())

    def config(self) -> dict[str, Any]:
        assert self.result_dir is not None
        return yaml.safe_load((self.result_dir / CONFIG_FILE).read_text())

    def cell(self) -> str:
        """What a table shows where this run has no number."""
        if self.state == "not_run":
            return str(self.reason)
        if self.state == "failed":
            return f"failed: {self.reason} (see {FAILED_FILE})"
        return "missing: not run yet"


@contextmanager
def hydra_composer(conf_dir: Path = CONF) -> Iterator[Composer]:
    """Compose configs as ``run.py`` does, outside a running Hydra app."""
    register_configs()
    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    with hydra.initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        yield CachedComposer(lambda overrides: hydra.compose("config", overrides=list(overrides)))


class CachedComposer:
    """Compose each distinct set of config-group choices once, then apply the plain value
    overrides to a copy, exactly as Hydra does after composing (its own
    ``_apply_overrides_to_config``). A paper plan is hundreds of runs but a few dozen group
    choice sets (pair x method x task), and one Hydra composition costs ~0.2-0.4 s.
    ``tests/test_paper.py`` checks the result equals a direct composition."""

    def __init__(self, compose: Composer, conf_dir: Path = CONF) -> None:
        self.compose = compose
        self.conf_dir = conf_dir
        self.cache: dict[tuple[str, ...], DictConfig] = {}

    def _is_group(self, override: Any) -> bool:
        key = override.key_or_group
        return "/" in key or (self.conf_dir / key).is_dir()

    def __call__(self, overrides: Sequence[str]) -> DictConfig:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
        groups = tuple(o.input_line for o in parsed if self._is_group(o))
        values = [o for o in parsed if not self._is_group(o)]
        if groups not in self.cache:
            self.cache[groups] = self.compose(list(groups))
        cfg = copy.deepcopy(self.cache[groups])
        ConfigLoaderImpl._apply_overrides_to_config(values, cfg)
        return cfg


def _without_hydra(cfg: DictConfig) -> DictConfig:
    if "hydra" in cfg:
        cfg = cfg.copy()
        with open_dict(cfg):
            del cfg["hydra"]
    return cfg


def _failure_reason(folder: Path) -> str:
    try:
        info = json.loads((folder / FAILED_FILE).read_text())
    except (OSError, ValueError):
        return "unreadable failure record"
    return str(info.get("error") or info.get("message") or "error").splitlines()[0][:200]


def portable_key(config: dict[str, Any]) -> str:
    """The run's identity without what only its host knows (the GPU model)."""
    tree = json.loads(json.dumps(config, default=str))
    tree.pop("signature", None)
    for path in HOST_KEYS:
        node = tree
        for key in path[:-1]:
            node = node.get(key, {}) if isinstance(node, dict) else {}
        if isinstance(node, dict):
            node.pop(path[-1], None)
    return config_hash(tree)


class StudyIndex:
    """Finished and failed result folders of studies by :func:`portable_key`, read once, so a
    run planned on one host finds its results written on another (a GPU node)."""

    def __init__(self) -> None:
        self.studies: dict[Path, dict[str, list[Path]]] = {}
        self.tasks: dict[str, Any] = {}  # runner.prepare's task cache, shared by a plan

    def folders(self, study_dir: Path, key: str) -> list[Path]:
        if study_dir not in self.studies:
            index: dict[str, list[Path]] = {}
            for cfg_file in sorted(study_dir.glob("*/config.yaml")):
                try:
                    config = yaml.safe_load(cfg_file.read_text())
                except (OSError, yaml.YAMLError):
                    continue
                if isinstance(config, dict):
                    index.setdefault(portable_key(config), []).append(cfg_file.parent)
            self.studies[study_dir] = index
        return self.studies[study_dir].get(key, [])


def resolve(planned: PlannedRun, compose: Composer, index: StudyIndex | None = None) -> RunStatus:
    if planned.unavailable is not None:
        return RunStatus(planned, "not_run", reason=planned.unavailable.text())
    try:
        cfg = _without_hydra(compose(planned.overrides))
        index = index or StudyIndex()
        prep = prepare(cfg, host_checks=False, task_cache=index.tasks)
    except ConfigError as err:
        if any(err.key == k or err.key.startswith(f"{k}.") for k in UNAVAILABLE_KEYS):
            return RunStatus(planned, "not_run", reason=f"not run: {err}")
        raise RecipeError(
            f"recipe {planned.recipe!r}, run {' '.join(planned.overrides)}: {err}"
        ) from err
    status = RunStatus(
        planned,
        "missing",
        signature=prep.signature,
        result_dir=prep.result_dir,
        n_samples=len(prep.task.samples()),
        max_new_tokens=int(OmegaConf.select(cfg, "task.max_new_tokens", default=0) or 0),
    )
    try:
        preflight.check_device(str(OmegaConf.select(cfg, "runtime.device")))
    except ConfigError as err:
        status.host_note = str(err)
    if is_complete(prep.result_dir):
        status.state = "done"
        return status
    # Written on another host (another GPU model): the same run by its portable key.
    elsewhere = index.folders(prep.result_dir.parent, portable_key(prep.config))
    done = [f for f in elsewhere if is_complete(f)]
    if done:
        status.state, status.result_dir, status.signature = "done", done[0], done[0].name
    elif (prep.result_dir / FAILED_FILE).is_file():
        status.state, status.reason = "failed", _failure_reason(prep.result_dir)
    return status


def resolve_all(
    planned: Sequence[PlannedRun], compose: Composer
) -> dict[tuple[str, ...], RunStatus]:
    """Status per distinct override set (``PlannedRun.key``)."""
    out: dict[tuple[str, ...], RunStatus] = {}
    index = StudyIndex()
    for run in planned:
        if run.key not in out:
            out[run.key] = resolve(run, compose, index)
    return out


def estimate_seconds(status: RunStatus, overhead_s: float, s_per_token: float) -> float:
    """The dry-run cost model: fixed overhead plus tokens x seconds per token."""
    return overhead_s + status.n_samples * status.max_new_tokens * s_per_token


__all__ = ["RunStatus", "estimate_seconds", "hydra_composer", "resolve", "resolve_all"]
