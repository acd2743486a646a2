"""A run prepared before any model loads: validated config, method and task (its data),
signature and result folder, after the preflight checks (mtad.harness.preflight).

Split from :mod:`mtad.harness.job` so that planners (``mtad.paper``, the sweep
pre-validation callback) use the same preparation without the run machinery.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from mtad.cpu import bf16_identity
from mtad.harness import preflight
from mtad.harness.config import ConfigError, RunSpec, validate
from mtad.harness.results import hardware_identity, result_dir
from mtad.harness.signature import run_signature
from mtad.tasks import build_task as build_task_from_options
from mtad.tasks.base import Task

if TYPE_CHECKING:
    from mtad.engine import DecodingMethod
    from mtad.engine.loading import ModelSpec


@dataclass
class Prepared:
    """A validated run before any model loads: what to run and where its results go."""

    spec: RunSpec
    config: dict[str, Any]  # resolved; method params with defaults filled in
    task: Task
    method: DecodingMethod  # holds no model
    signature: str
    result_dir: Path


def prepare(
    cfg: DictConfig,
    *,
    host_checks: bool = True,
    task_cache: dict[str, Task | ConfigError] | None = None,
) -> Prepared:
    """Validate ``cfg``, build the method and the task (its data, no model). Raises
    :class:`ConfigError`.

    ``host_checks=False`` is for planning runs that will execute elsewhere (a login node
    planning SLURM jobs, ``mtad.paper``): the device and the model weights are checked where
    the run executes, not here. ``task_cache`` lets a planner that prepares hundreds of runs
    build each distinct task (its data) once, failures included: a data set that is not there
    may cost a network time-out to find out."""
    # Here, not at the top: mtad.methods imports torch, and this module is imported by CLIs
    # that must start fast (scripts/reproduce.py --help, through mtad.paper.status).
    from mtad.methods import make_method

    spec = validate(cfg)
    rc = spec.cfg
    if host_checks:
        preflight.check_device(rc.runtime.device)
    task = build_task(spec) if task_cache is None else _cached_task(spec, task_cache)
    if host_checks:  # e.g. HumanEval's sandbox and interpreter (task.python)
        try:
            task.check_host()
        except ValueError as err:
            raise ConfigError.from_exception("task", err) from err
    method = make_method(spec.method_name, spec.params)
    preflight.check_token_budget(spec.method_params, getattr(task, "max_new_tokens", None))
    if method.uses_draft and spec.draft is None:
        raise ConfigError("pair.draft", f"method {spec.method_name!r} needs a draft model")
    if host_checks:
        _check_models(spec, method.uses_draft)
        models = _models(spec, method.uses_draft)
        preflight.check_placement(rc.runtime.device, models)
        preflight.check_context(
            spec.task_name,
            getattr(task, "max_new_tokens", None),
            method.max_step_tokens,
            models,
        )
    config = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(config, dict)
    config.pop("hydra", None)
    config["method"] = {"name": spec.method_name, **spec.method_params}
    # What the task says identifies its data (file hashes, subset) joins the hashed config.
    config["task_data"] = task.signature()
    # Hardware that changes the numbers: device kind and GPU model (the pair's dtypes are in
    # pair.*.dtype). Threads and the CPU model stay out (recorded in metrics.json).
    identity = hardware_identity(rc.runtime.device)
    config["hardware"] = {k: identity[k] for k in ("device_kind", "gpu_model")}
    # ... and on the CPU whether it has native bfloat16 (the same dtype runs at other speeds),
    # with the dtypes "auto" resolved to on this host
    if (bf16 := bf16_identity(rc.runtime.device)) is not None:
        config["hardware"]["cpu_bf16"] = bf16
    for role, model in (("target", spec.target), ("draft", spec.draft)):
        if model is not None and isinstance(config["pair"].get(role), dict):
            config["pair"][role]["dtype"] = model.dtype
    signature = run_signature(config)
    folder = result_dir(rc.results.root, rc.results.study, signature)
    # Last, because they create folders: the checks above leave nothing behind.
    preflight.check_writable("results.root", Path(rc.results.root) / rc.results.study)
    if rc.logger.name == "wandb" and rc.logger.mode != "disabled":
        preflight.check_writable("logger.dir", Path(rc.logger.dir))
    return Prepared(spec, config, task, method, signature, folder)


def _models(spec: RunSpec, uses_draft: bool) -> dict[str, ModelSpec]:
    """The models the run loads, by role (the draft only when the method uses it)."""
    models = {"target": spec.target}
    if uses_draft and spec.draft is not None:
        models["draft"] = spec.draft
    return models


def _check_models(spec: RunSpec, uses_draft: bool) -> None:
    """Missing or corrupt weights and mismatched vocabularies fail here, not after the target
    has loaded (the draft is checked only when the method uses it)."""
    draft = spec.draft if uses_draft else None
    for role, model in (("target", spec.target), ("draft", draft)):
        if model is not None:
            preflight.check_weights(role, model)
    if draft is not None:
        preflight.check_vocab(spec.target, draft)


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


__all__ = ["Prepared", "build_task", "prepare"]
