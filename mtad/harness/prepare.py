"""A run prepared before any model loads: validated config, method and task (its data),
identity and result folder, after the preflight checks (mtad.harness.preflight).

Split from :mod:`mtad.harness.job` so that planners (``mtad.paper``, the sweep
pre-validation callback) use the same preparation without the run machinery.
"""

from __future__ import annotations

import importlib.metadata
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from mtad.engine import DecodingMethod
from mtad.engine.smollm2 import GGUF_PACKAGE
from mtad.engine.spec import ModelSpec, resolve_path
from mtad.harness import preflight
from mtad.harness.config import ConfigError, RunSpec, validate
from mtad.harness.device import check_device
from mtad.harness.results import host_hardware
from mtad.methods import make_method
from mtad.runs.folder import result_dir
from mtad.runs.identity import RunIdentity, folder_signature
from mtad.tasks import build_task as build_task_from_options
from mtad.tasks.base import Task


@dataclass
class Prepared:
    """A validated run before any model loads: what to run, what it is and where it goes."""

    spec: RunSpec
    config: dict[str, Any]  # resolved; method params with defaults filled in
    task: Task
    method: DecodingMethod  # holds no model
    identity: RunIdentity
    hardware: dict[str, Any]  # every hardware fact of this host (metrics.json records them)
    result_dir: Path

    @property
    def signature(self) -> str:
        return self.identity.signature


def prepare(
    cfg: DictConfig,
    *,
    host_checks: bool = True,
    task_cache: dict[str, Task | ConfigError] | None = None,
    writable: set[Path] | None = None,
) -> Prepared:
    """Validate ``cfg``, build the method and the task (its data, no model). Raises
    :class:`ConfigError`.

    ``host_checks=False`` is for planning runs that will execute elsewhere (a login node
    planning SLURM jobs, ``mtad.paper``): the device and the model weights are checked where
    the run executes, not here. ``task_cache`` lets a planner that prepares hundreds of runs
    build each distinct task (its data) once, failures included: a data set that is not there
    may cost a network time-out to find out. ``writable`` likewise holds the output folders
    found writable, each checked once (a probe directory made and removed: milliseconds each
    on some file systems, for every run of a plan that writes to one or two folders)."""
    spec = validate(cfg)
    rc = spec.cfg
    if host_checks:
        check_device(rc.runtime.device)
    task = build_task(spec) if task_cache is None else _cached_task(spec, task_cache)
    if host_checks:  # e.g. HumanEval's sandbox and interpreter (task.python)
        try:
            task.check_host()
        except ValueError as err:
            raise ConfigError.from_exception("task", err) from err
    method = make_method(spec.method_name, spec.params)
    preflight.check_token_budget(method, task.max_new_tokens)
    if method.uses_draft and spec.draft is None:
        raise ConfigError("pair.draft", f"method {spec.method_name!r} needs a draft model")
    if host_checks:
        _check_models(spec, task, method)
    config = resolved_config(cfg, spec, task)
    hardware = host_hardware(rc.runtime.device, rc.runtime.threads)
    identity = RunIdentity.of(config, hardware)
    config["hardware"] = identity.hardware
    folder = result_dir(rc.results.root, rc.results.study, identity.signature)
    # Last, because they create folders: the checks above leave nothing behind.
    _check_writable("results.root", Path(rc.results.root) / rc.results.study, writable)
    if rc.logger.name == "wandb" and rc.logger.mode != "disabled":
        _check_writable("logger.dir", Path(rc.logger.dir), writable)
    return Prepared(spec, config, task, method, identity, hardware, folder)


def resolved_config(cfg: DictConfig, spec: RunSpec, task: Task) -> dict[str, Any]:
    """The config a run records and is identified by: ``cfg`` resolved, the method's params
    with their defaults, what identifies the task's data (file hashes, subset), what identifies
    the pair's weights (:func:`model_signature`) and the dtypes ``auto`` resolved to here."""
    config = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(config, dict)
    config.pop("hydra", None)
    config["method"] = {"name": spec.method_name, **spec.method_params}
    config["task_data"] = task.signature()
    # Both models, whichever the method loads: the pair is one setting of a study, within which
    # runs are compared (mtad.runs.comparison); an AR baseline kept across a retrained draft
    # would be averaged with SpS runs of two different drafts under one key.
    models = {"target": spec.target, "draft": spec.draft}
    config["model_data"] = {
        role: model_signature(model) for role, model in models.items() if model is not None
    }
    for role, model in models.items():
        if model is not None and isinstance(config["pair"].get(role), dict):
            config["pair"][role]["dtype"] = model.dtype
    return config


def model_signature(spec: ModelSpec) -> dict[str, Any] | None:
    """What identifies the weights ``spec`` loads beyond its config: a local folder's files by
    content (:func:`~mtad.runs.identity.folder_signature`); the ``smollm2_gguf`` target by its
    package's version (the GGUF ships inside it); None where the config says it all (``tiny``:
    built from its seed) or nothing on this disk can tell (a hub name: it is in the config)."""
    if spec.loader == "smollm2_gguf":
        return {"package": GGUF_PACKAGE, "version": importlib.metadata.version(GGUF_PACKAGE)}
    if spec.loader in ("local", "hub") and spec.path:
        folder = Path(resolve_path(spec.path) if spec.loader == "local" else spec.path)
        if folder.is_dir():
            return folder_signature(folder)
    return None


def _check_models(spec: RunSpec, task: Task, method: DecodingMethod) -> None:
    """What the run needs of this host's files before any model loads: missing or corrupt
    weights, mismatched vocabularies, a device_map that fights runtime.device, a budget past
    the context (the draft is checked only when the method uses it)."""
    models: dict[str, ModelSpec] = {"target": spec.target}
    if method.uses_draft and spec.draft is not None:
        models["draft"] = spec.draft
    for role, model in models.items():
        preflight.check_weights(role, model)
    if "draft" in models:
        preflight.check_vocab(spec.target, models["draft"])
    device = spec.cfg.runtime.device
    preflight.check_placement(device, models)
    preflight.check_context(spec.task_name, task.max_new_tokens, method.max_step_tokens, models)


def _check_writable(key: str, folder: Path, writable: set[Path] | None) -> None:
    """:func:`preflight.check_writable`, skipped for a folder in ``writable`` (found writable
    before), which a passed check adds to."""
    if writable is not None and folder in writable:
        return
    preflight.check_writable(key, folder)
    if writable is not None:
        writable.add(folder)


def _cached_task(spec: RunSpec, cache: dict[str, Task | ConfigError]) -> Task:
    key = json.dumps(
        [dict(spec.cfg.task), spec.cfg.pair.chat_template],
        sort_keys=True,
        default=str,
    )
    if key not in cache:
        try:
            cache[key] = build_task(spec)
        except ConfigError as err:
            cache[key] = err
    if isinstance(cache[key], ConfigError):
        raise cache[key]
    return cache[key]


def build_task(spec: RunSpec) -> Task:
    """The task of ``spec``; ``chat_template: auto`` follows the pair's ``chat_template``."""
    options = dict(spec.cfg.task)
    if options.get("chat_template", "auto") == "auto":
        options["chat_template"] = spec.cfg.pair.chat_template
    try:
        task = build_task_from_options(options)
        samples = task.samples()  # reads the data: a missing file fails here, before any model
    except (TypeError, ValueError, OSError) as err:
        raise ConfigError.from_exception("task", err) from err
    if not samples:
        raise ConfigError("task", f"{spec.task_name} selects no samples (empty data?)")
    return task


__all__ = ["Prepared", "build_task", "prepare", "resolved_config"]
