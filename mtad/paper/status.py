"""Where each planned run stands: done, failed, not run (and why) or missing.

A planned run is composed exactly as ``run.py`` would compose it and passed through the harness's
own :func:`mtad.harness.prepare.prepare` (validation, task data, identity; no model loads), so
the identity found here is the one the run records. A run is done when a complete folder of the
study holds that identity (:class:`mtad.runs.index.StudyIndex`, whatever the folder's name): on
this machine, a study re-run on another CPU runs every run again, baselines included, so that
its speed-ups pair runs of one machine. A run of a device this host cannot run (a login node
planning GPU runs) is found on the machine that ran the study's runs of that kind. Task data
that is not there (Spider without ``task.data_dir``) or a task the profile does not run becomes
"not run" with the reason; any other bad value is a real error and stops everything before a
run starts.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
from hydra._internal.config_repository import IConfigRepository
from hydra.core.config_loader import ConfigLoader
from hydra.core.config_search_path import ConfigSearchPath
from hydra.core.global_hydra import GlobalHydra
from hydra.core.object_type import ObjectType
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import ConfigCompositionException
from hydra.plugins.config_source import ConfigResult, ConfigSource
from omegaconf import DictConfig, OmegaConf, open_dict

from mtad.harness.config import ConfigError, register_configs
from mtad.harness.device import check_device
from mtad.harness.prepare import prepare
from mtad.paper.expansion import PlannedRun
from mtad.paper.recipes import REPO, RecipeError
from mtad.runs.comparison import STORED_PROMPTS
from mtad.runs.folder import FAILED_FILE, read_config, read_failure, read_metrics
from mtad.runs.frame import record_of, run_record
from mtad.runs.index import StudyIndex
from mtad.runs.store import StoredRun

CONF = REPO / "conf"
# ConfigErrors under these keys mean "this data / judge is not here", not "this value is
# wrong": the run is listed as not runnable, not a broken recipe. The device and the weights
# are not checked when planning (they are the job host's business: a login node without GPUs
# plans GPU runs); a planning host without the configured device is noted once instead.
UNAVAILABLE_KEYS = ("task",)

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
    dtype: str | None = None  # the target's, as this host resolves "auto" (the cost model's)
    # a done run read from a records folder (a committed reference), which has no result folder
    stored: StoredRun | None = None

    @property
    def runnable(self) -> bool:
        return self.state in ("missing", "failed")

    def metrics(self) -> dict[str, Any]:
        if self.stored is not None:
            return self.stored.metrics
        assert self.result_dir is not None
        return read_metrics(self.result_dir) or {}

    def record(self) -> dict[str, Any] | None:
        """A done run's row (:func:`mtad.runs.frame.record_of`), from its result folder or its
        stored record (with its per-prompt records under ``STORED_PROMPTS``); None otherwise."""
        if self.state != "done":
            return None
        if self.stored is not None:
            s = self.stored
            return {**record_of(s.metrics, s.comparison_key, s.hardware), STORED_PROMPTS: s.prompts}
        return run_record(self.result_dir) if self.result_dir is not None else None

    def as_record(self) -> dict[str, Any]:
        """What a records folder keeps of this status (:mod:`mtad.runs.store`)."""
        return {
            "key": list(self.planned.key),
            "state": self.state,
            "reason": self.reason,
            "signature": self.signature,
            "n_samples": self.n_samples,
            "max_new_tokens": self.max_new_tokens,
            "dtype": self.dtype,
        }

    def config(self) -> dict[str, Any]:
        assert self.result_dir is not None
        return read_config(self.result_dir)

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
    with (
        hydra.initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"),
        shared_loads(GlobalHydra.instance().config_loader()),  # the loader just initialized
    ):
        yield CachedComposer(lambda overrides: hydra.compose("config", overrides=list(overrides)))


@contextmanager
def shared_loads(loader: ConfigLoader) -> Iterator[None]:
    """While inside, ``loader`` reads each config file once for all its compositions
    (:class:`SharedLoads`); on exit it is as it was. A loader without Hydra 1.3's
    ``repository`` composes as before."""
    repository = getattr(loader, "repository", None)
    if not isinstance(repository, IConfigRepository):
        yield
        return
    loader.repository = SharedLoads(repository)  # type: ignore[attr-defined]
    try:
        yield
    finally:
        loader.repository = repository  # type: ignore[attr-defined]


class SharedLoads(IConfigRepository):
    """A config repository that keeps what it loads for every later composition.

    Hydra 1.3 reads and parses every config file (YAML, and the structured configs' copies)
    again for each composition: its cache (``CachingConfigRepository``) lives for one
    composition and starts with a deep copy of the loader's repository. A paper plan composes
    330 group choice sets from the same few dozen files; reading them and copying the
    repository were ~45% of each composition (cProfile). With the loads shared a composition
    takes ~40% less CPU time (0.11 s -> 0.065 s on the Intel Xeon; the paper profile's plan
    47 s -> 33 s).
    Each load here returns a deep copy of the first, untouched load: Hydra mutates what it
    loads (a primary config's ``hydra`` node is popped, a config is replaced by its merge with
    a schema, merged nodes are shared into the result), so no composition sees another's.
    ``tests/test_paper.py`` checks that compositions equal Hydra's own.
    """

    def __init__(
        self,
        delegate: IConfigRepository,
        loads: dict[tuple[Any, ...], ConfigResult | None] | None = None,
    ) -> None:
        self.delegate = delegate
        self.loads: dict[tuple[Any, ...], ConfigResult | None] = {} if loads is None else loads

    def __deepcopy__(self, memo: dict[int, Any]) -> SharedLoads:
        # Each composition's CachingConfigRepository deep-copies its delegate so that
        # initialize_sources (a primary config's hydra.searchpath) leaves the loader's sources
        # alone. ConfigRepository.initialize_sources binds a new list of new sources, so a
        # shallow copy of the delegate suffices; the loads stay shared (keyed by the sources).
        return SharedLoads(copy.copy(self.delegate), self.loads)

    def load_config(self, config_path: str) -> ConfigResult | None:
        sources = tuple((type(s), s.provider, s.path) for s in self.delegate.get_sources())
        key = (sources, config_path)
        if key not in self.loads:
            self.loads[key] = self.delegate.load_config(config_path=config_path)
        loaded = self.loads[key]
        return None if loaded is None else copy.deepcopy(loaded)

    def get_schema_source(self) -> ConfigSource:
        return self.delegate.get_schema_source()

    def group_exists(self, config_path: str) -> bool:
        return self.delegate.group_exists(config_path=config_path)

    def config_exists(self, config_path: str) -> bool:
        return self.delegate.config_exists(config_path=config_path)

    def get_group_options(
        self, group_name: str, results_filter: ObjectType | None = ObjectType.CONFIG
    ) -> list[str]:
        return self.delegate.get_group_options(group_name=group_name, results_filter=results_filter)

    def get_sources(self) -> list[ConfigSource]:
        return self.delegate.get_sources()

    def initialize_sources(self, config_search_path: ConfigSearchPath) -> None:
        self.delegate.initialize_sources(config_search_path)


class CachedComposer:
    """Compose each distinct set of config-group choices once, then apply the plain value
    overrides to a copy, as Hydra does after composing (:func:`apply_value_overrides`). A
    paper plan is ~1,300 runs but 330 group choice sets (pair x method x task), and one Hydra
    composition costs ~0.07 s even with :class:`SharedLoads`.
    ``tests/test_paper.py`` checks the result equals a direct composition."""

    def __init__(self, compose: Composer, conf_dir: Path = CONF) -> None:
        self.compose = compose
        self.conf_dir = conf_dir
        self.cache: dict[tuple[str, ...], DictConfig] = {}
        # each distinct override string parsed once: a plan repeats the same few dozen
        self.parser = OverridesParser.create()
        self.parsed: dict[str, Override] = {}

    def _is_group(self, override: Any) -> bool:
        key = override.key_or_group
        return "/" in key or (self.conf_dir / key).is_dir()

    def _parse(self, override: str) -> Override:
        if override not in self.parsed:
            self.parsed[override] = self.parser.parse_overrides([override])[0]
        return self.parsed[override]

    def __call__(self, overrides: Sequence[str]) -> DictConfig:
        parsed = [self._parse(o) for o in overrides]
        groups = tuple(o.input_line for o in parsed if self._is_group(o))
        values = [o for o in parsed if not self._is_group(o)]
        if groups not in self.cache:
            self.cache[groups] = self.compose(list(groups))
        cfg = copy.deepcopy(self.cache[groups])
        apply_value_overrides(values, cfg)
        return cfg


def apply_value_overrides(overrides: Sequence[Override], cfg: DictConfig) -> None:
    """Apply ``key=value``, ``+key=value``, ``++key=value`` and ``~key`` to a composed ``cfg``
    with OmegaConf's public API, as Hydra applies them after composing (Hydra's own function
    for it is private to its config loader)."""
    for override in overrides:
        key, value = override.key_or_group, override.value()
        if override.is_delete():
            parent, _, name = key.rpartition(".")
            node = OmegaConf.select(cfg, parent) if parent else cfg
            if not isinstance(node, DictConfig) or name not in node:
                raise ConfigCompositionException(f"Could not delete from config: no {key}")
            with open_dict(cfg):
                del node[name]
        elif override.is_add() and not isinstance(value, (dict, list)) and _is_set(cfg, key):
            raise ConfigCompositionException(f"Could not append to config: {key} is set")
        else:
            adding = override.is_add() or override.is_force_add()
            OmegaConf.update(cfg, key, value, merge=True, force_add=adding)


def _is_set(cfg: DictConfig, key: str) -> bool:
    return OmegaConf.select(cfg, key, throw_on_missing=False) is not None


def _without_hydra(cfg: DictConfig) -> DictConfig:
    if "hydra" in cfg:
        cfg = cfg.copy()
        with open_dict(cfg):
            del cfg["hydra"]
    return cfg


class PlanIndex(StudyIndex):
    """The studies' complete runs (:class:`~mtad.runs.index.StudyIndex`) and the caches of
    :func:`~mtad.harness.prepare.prepare` (tasks, writable folders), shared by every run of a
    plan."""

    def __init__(self) -> None:
        super().__init__()
        self.tasks: dict[str, Any] = {}
        self.writable: set[Path] = set()


def resolve(planned: PlannedRun, compose: Composer, index: PlanIndex | None = None) -> RunStatus:
    if planned.unavailable is not None:
        return RunStatus(planned, "not_run", reason=planned.unavailable.text())
    index = index or PlanIndex()
    try:
        cfg = _without_hydra(compose(planned.overrides))
        prep = prepare(cfg, host_checks=False, task_cache=index.tasks, writable=index.writable)
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
        dtype=prep.spec.target.dtype,
    )
    try:
        check_device(str(OmegaConf.select(cfg, "runtime.device")))
    except ConfigError as err:
        status.host_note = str(err)
    study_dir = prep.result_dir.parent
    identity = prep.identity
    if status.host_note is not None:  # run elsewhere: as the study's machine of its kind ran it
        identity = index.elsewhere(study_dir, identity) or identity
    done = index.find(study_dir, identity)
    if done is not None:
        status.state, status.result_dir, status.signature = "done", done, done.name
    elif (prep.result_dir / FAILED_FILE).is_file():
        status.state, status.reason = "failed", read_failure(prep.result_dir)
    return status


def resolve_all(
    planned: Sequence[PlannedRun], compose: Composer
) -> dict[tuple[str, ...], RunStatus]:
    """Status per distinct override set (``PlannedRun.key``)."""
    out: dict[tuple[str, ...], RunStatus] = {}
    index = PlanIndex()
    for run in planned:
        if run.key not in out:
            out[run.key] = resolve(run, compose, index)
    return out


def estimate_seconds(status: RunStatus, overhead_s: float, s_per_token: float) -> float:
    """The dry-run cost model: fixed overhead plus tokens x seconds per token."""
    return overhead_s + status.n_samples * status.max_new_tokens * s_per_token


__all__ = [
    "RunStatus",
    "SharedLoads",
    "estimate_seconds",
    "hydra_composer",
    "resolve",
    "resolve_all",
    "shared_loads",
]
