"""Structured configs of a harness run, registered in Hydra's ConfigStore, and their validation.

``conf/config.yaml`` puts ``run_schema`` (:class:`RunConfig`) first in its defaults list, so every
YAML group composed on top of it is type-checked by OmegaConf at compose time (unknown keys, wrong
types). The method and task defaults come from their params dataclasses
(:mod:`mtad.methods.params`, :mod:`mtad.tasks.params`), stored here as ``method/params/<name>``
and ``task/params/<name>`` for ``conf/method/*.yaml`` and ``conf/task/*.yaml`` to compose
(:func:`register_configs`): runtime, results, method and task defaults each have one place.
Value checks live in the dataclasses' ``__post_init__`` and in the method params dataclasses;
:func:`validate` runs all of them *before* any model loads and turns the first failure into a
one-line :class:`ConfigError` that names the offending key (the task's own checks run when
:mod:`mtad.harness.prepare` builds it).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from mtad.config_types import field_defaults, hints, type_problem
from mtad.cpu import choose_dtype, native_bf16
from mtad.engine.spec import LOADER_READS, ModelSpec, draft_kind
from mtad.methods.params import PARAMS as METHOD_PARAMS
from mtad.tasks.base import PROTOCOLS
from mtad.tasks.params import PARAMS as TASK_PARAMS

# The method modules import torch (seconds): their registry (mtad.methods.METHODS) is used
# inside validate(), not here, because run.py imports this module before Hydra composes anything
# (--help, --cfg job). Model specs and the methods' params come from torch-free modules
# (mtad.engine.spec, mtad.methods.params).

LOGGERS = ("wandb", "none")
WANDB_MODES = ("offline", "online", "disabled")
ENERGY_TRACKERS = ("offline", "online", "none")
TRACKING_MODES = ("process", "machine")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
# Warping parameters whose null turns the warper off (transformers' convention): the value it
# becomes, so null and the explicit "off" share one run signature.
NULL_MEANS_OFF: dict[str, Any] = {"top_k": 0, "top_p": 1.0}


class ConfigError(ValueError):
    """A bad config value; ``str(err)`` is one line starting with the dotted key."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        self.message = message
        super().__init__(f"{key}: {message}")

    @classmethod
    def from_exception(
        cls, prefix: str, err: BaseException, names: Sequence[str] = ()
    ) -> ConfigError:
        """The error ``err`` raised while building the section at ``prefix``, on one line.

        OmegaConf errors carry the key (``full_key``). Messages of the project's dataclasses
        start with the field name ("gamma must be ...") or with the dotted key
        ("task.limit must be ..."); either becomes part of the key (``method.gamma``).
        """
        lines = str(err).strip().splitlines()
        msg = lines[0] if lines else type(err).__name__
        full_key = getattr(err, "full_key", None)
        if full_key:
            return cls(f"{prefix}.{full_key}", msg)
        m = re.match(rf"({re.escape(prefix)}\.)?(\w+)(?::\s*|\s+)(.*)", msg)
        if m and (m.group(1) or m.group(2) in names):
            return cls(f"{prefix}.{m.group(2)}", m.group(3))
        return cls(prefix, msg)


@dataclass
class PairConfig:
    """A (target, draft) pair; ``draft`` is null for target-only pairs."""

    name: str = MISSING
    target: ModelSpec = MISSING
    draft: ModelSpec | None = None
    chat_template: bool = False  # prompts go through the tokenizer's chat template
    notes: str = ""  # provenance, e.g. "draft chosen by us"


@dataclass
class RuntimeConfig:
    device: str = "cpu"
    # torch.set_num_threads; null keeps torch's default (the thread count is recorded either
    # way). 1 because our 2-core machines are shared: with other jobs running, 2 threads made
    # SmolLM2 decoding 2x and its prefill 9x slower than 1 (spinning threads oversubscribe the
    # cores). Dedicated CPU boxes: runtime.threads=null. GPU presets set null.
    threads: int | None = 1
    seed: int = 0
    warmup_tokens: int = 8  # one untimed generation of this many tokens first; 0 = none
    progress: bool = True  # tqdm bar over prompts
    # logits head: auto (float32 CPU models with a large vocabulary project logits with
    # mtad.engine.heads.CPUHeadLM: 2x faster on our CPUs, same logits to ~1e-6), stock (the
    # model's own lm_head call) or fast (force)
    head: str = "auto"
    # the models' projections: auto (bfloat16 on a CPU whose oneDNN supports it: prepacked
    # weights, mtad.engine.packed: the same logits bit for bit, decoding +13-17% tokens/s on
    # an AMX Xeon) or stock (F.linear as transformers calls it)
    linears: str = "auto"

    def __post_init__(self) -> None:
        if self.head not in ("auto", "stock", "fast"):
            raise ValueError(f"head must be auto, stock or fast, got {self.head!r}")
        if self.linears not in ("auto", "stock"):
            raise ValueError(f"linears must be auto or stock, got {self.linears!r}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1 or null, got {self.threads}")
        if self.warmup_tokens < 0:
            raise ValueError(f"warmup_tokens must be >= 0, got {self.warmup_tokens}")
        if not re.fullmatch(r"cpu|cuda(:\d+)?|mps", self.device):
            raise ValueError(f"device must be cpu, cuda, cuda:N or mps, got {self.device!r}")


@dataclass
class ResultsConfig:
    root: str = "results"  # relative to the current directory unless absolute
    study: str = "default"  # results/<study>/<signature>/; a sweep shares one study
    skip_existing: bool = True  # a complete result folder is not run again

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_.=+-]+", self.study):
            raise ValueError(f"study must be a plain folder name, got {self.study!r}")


@dataclass
class LoggerConfig:
    """W&B: one run per harness run. ``name: none`` turns logging off."""

    name: str = "wandb"
    project: str = "mtad"
    entity: str | None = None
    mode: str = "offline"  # conf/logger/wandb.yaml reads $WANDB_MODE, offline when unset
    dir: str = "."  # W&B writes <dir>/wandb/<run>
    log_samples: bool = True  # per-sample table

    def __post_init__(self) -> None:
        if self.name not in LOGGERS:
            raise ValueError(f"name must be one of {LOGGERS}, got {self.name!r}")
        if self.mode not in WANDB_MODES:
            raise ValueError(f"mode must be one of {WANDB_MODES}, got {self.mode!r}")
        # W&B's own rule (wandb_settings.validate_project), which it applies only at init,
        # after the models have loaded
        bad = "".join(c for c in "/\\#?%:" if c in self.project)
        if self.name == "wandb" and (bad or not self.project or len(self.project) > 128):
            team, _, name = self.project.partition("/")
            hint = f"; for a team's project: logger.entity={team} logger.project={name}"
            raise ValueError(
                f"project must be a W&B project name (1-128 characters, none of / \\ # ? % :), "
                f"got {self.project!r}{hint if bad == '/' and name else ''}"
            )


@dataclass
class EnergyConfig:
    """codecarbon around the generation loop only. ``tracker: none`` turns it off."""

    tracker: str = "offline"  # OfflineEmissionsTracker; "online" needs the codecarbon API
    country_iso_code: str = "USA"  # offline carbon intensity; energy (kWh) does not depend on it
    tracking_mode: str = "process"  # "machine" counts every process on the box
    measure_power_secs: float = 15.0
    log_level: str = "error"

    def __post_init__(self) -> None:
        if self.tracker not in ENERGY_TRACKERS:
            raise ValueError(f"tracker must be one of {ENERGY_TRACKERS}, got {self.tracker!r}")
        if self.tracking_mode not in TRACKING_MODES:
            raise ValueError(
                f"tracking_mode must be one of {TRACKING_MODES}, got {self.tracking_mode!r}"
            )
        if self.log_level.lower() not in LOG_LEVELS:
            raise ValueError(f"log_level must be one of {LOG_LEVELS}, got {self.log_level!r}")
        if self.measure_power_secs <= 0:
            raise ValueError(f"measure_power_secs must be > 0, got {self.measure_power_secs}")


@dataclass
class RunConfig:
    """The root config. ``method`` and ``task`` are free-form here: their keys are checked by the
    method params dataclasses (:func:`mtad.methods.build_params`) and by the task code."""

    pair: PairConfig = field(default_factory=PairConfig)
    method: dict[str, Any] = field(default_factory=dict)
    task: dict[str, Any] = field(default_factory=dict)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    energy: EnergyConfig = field(default_factory=EnergyConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    results: ResultsConfig = field(default_factory=ResultsConfig)
    tags: list[str] = field(default_factory=list)


def if_native_bf16(native: str, otherwise: str) -> str:
    """``${mtad.if_native_bf16:A,B}`` in a config: ``A`` on a CPU with native bfloat16
    (:func:`mtad.cpu.native_bf16`), else ``B``. The smollm2 pair's default draft is chosen so:
    where the pair runs in bfloat16 the feature head's step costs ~0.05 of the target's and it
    beats the independent draft; elsewhere the independent draft is the better one (issue 39,
    ``bench/overhead.py``'s figures in ``assets/drafts/smollm2-head/report.md``)."""
    return native if native_bf16() else otherwise


def register_configs() -> None:
    """Register the schema, the defaults and the resolvers (idempotent). Call before Hydra
    composes ``conf/config.yaml``.

    ``run_schema`` (:class:`RunConfig`) types the root. ``method/params/<name>`` is method
    ``<name>``'s name and every field of its params dataclass at its default
    (:data:`mtad.methods.params.PARAMS`), the node ``conf/method/<name>.yaml`` composes first
    (``params/<name>@_here_``): the YAML holds only what differs on purpose, and every key
    exists for ``method.<key>=...``; ``task/params/<name>`` likewise for the tasks
    (:data:`mtad.tasks.params.PARAMS`). Plain mappings, not typed nodes: the values are checked
    by the method's dataclass and the task's code in :func:`validate` and ``prepare``, with the
    one-line messages of :class:`ConfigError`.
    """
    cs = ConfigStore.instance()
    cs.store(name="run_schema", node=RunConfig)
    for group, params in (("method", METHOD_PARAMS), ("task", TASK_PARAMS)):
        for name, cls in params.items():
            node = {"name": name, **field_defaults(cls)}
            cs.store(group=f"{group}/params", name=name, node=node)
    OmegaConf.register_new_resolver("mtad.if_native_bf16", if_native_bf16, replace=True)


register_configs()


# --------------------------------------------------------------------------------------------
# Validation


@dataclass
class RunSpec:
    """A validated run: typed sections, the pair's model specs and the method's params
    (defaults filled in)."""

    cfg: RunConfig
    target: ModelSpec
    draft: ModelSpec | None
    method_name: str
    params: Any  # the method's params dataclass, built once here
    method_params: dict[str, Any]  # the same as a dict (result record, run signature)
    task_name: str
    # why each model runs in its dtype ("set in the config", or what "auto" found on this host)
    dtype_choice: dict[str, str] = field(default_factory=dict)


@functools.cache
def _schema_node(schema: type) -> DictConfig:
    """The structured config of ``schema``, built once: building it is most of a merge's cost,
    and a planner validates each of a thousand runs' seven sections (``merge`` copies it)."""
    return OmegaConf.structured(schema)


# Sections already typed, by their content: a planner validates ~1,300 runs whose seven
# sections are a few dozen distinct ones, and the merge into the schema is most of the cost.
_TYPED_CACHE_SIZE = 512
_typed_cache: dict[tuple[type, str, str], Any] = {}


def _typed(node: Any, prefix: str, schema: type) -> Any:
    """``node`` merged into ``schema`` (types, unknown keys), then built as the schema's
    dataclass, whose ``__post_init__`` checks values. Each call returns its own object (the
    caller may set fields); a section seen before is copied from the first one's result."""
    key = _content_key(node)
    cache_key = (schema, prefix, key) if key is not None else None
    if cache_key is not None and cache_key in _typed_cache:
        return copy.deepcopy(_typed_cache[cache_key])
    names = [f.name for f in dataclasses.fields(schema)]
    try:
        typed = OmegaConf.to_object(OmegaConf.merge(_schema_node(schema), node))
    except Exception as err:  # noqa: BLE001 - OmegaConf and __post_init__ raise many kinds
        raise ConfigError.from_exception(prefix, err, names) from err
    if cache_key is not None:
        if len(_typed_cache) >= _TYPED_CACHE_SIZE:
            _typed_cache.pop(next(iter(_typed_cache)))
        _typed_cache[cache_key] = copy.deepcopy(typed)
    return typed


def _content_key(node: Any) -> str | None:
    """What a section holds, as written and as resolved (the resolvers of a config read no
    other key); None for what cannot be keyed (it is then typed every time)."""
    if not isinstance(node, DictConfig):
        return None
    try:
        written = OmegaConf.to_container(node, resolve=False)
        resolved = OmegaConf.to_container(node, resolve=True)
        return repr((written, resolved))
    except Exception:  # noqa: BLE001 - a failing interpolation is _typed's error to name
        return None


def validate(cfg: DictConfig) -> RunSpec:
    """Check every value that can be checked without loading a model; raise :class:`ConfigError`.

    Builds the typed sections, the pair's :class:`~mtad.engine.spec.ModelSpec` and the method's
    params dataclass (where gamma=0 or tau=1.5 fail). Imports torch (through mtad.methods) but
    loads nothing.
    """
    _check_top_level(cfg)
    sections = {
        "runtime": RuntimeConfig,
        "results": ResultsConfig,
        "logger": LoggerConfig,
        "energy": EnergyConfig,
    }
    pair, target, draft = _pair(cfg)
    typed = {key: _typed(cfg.get(key, {}), key, cls) for key, cls in sections.items()}
    # dtype "auto" becomes what this host runs (mtad.cpu.choose_dtype) before anything hashes it
    dtype_choice: dict[str, str] = {}
    for role, model in (("target", target), ("draft", draft)):
        if model is not None:
            model.dtype, dtype_choice[role] = choose_dtype(model.dtype, typed["runtime"].device)
            getattr(pair, role).dtype = model.dtype
    if draft is not None:  # kind "auto" likewise becomes what the folder holds
        draft.kind = draft_kind(draft)
        pair.draft.kind = draft.kind
    method_name, params = _method(cfg)
    params_dict = dataclasses.asdict(params)
    task = _task(cfg)
    run_cfg = RunConfig(
        pair=pair,
        method={"name": method_name, **params_dict},
        task=task,
        tags=list(cfg.get("tags") or []),
        **typed,
    )
    return RunSpec(
        run_cfg, target, draft, method_name, params, params_dict, str(task["name"]), dtype_choice
    )


def _check_top_level(cfg: DictConfig) -> None:
    """Only the sections of :class:`RunConfig` (and Hydra's), and no float NaN or infinite."""
    known = {f.name for f in dataclasses.fields(RunConfig)} | {"hydra"}
    for key in cfg:
        if key not in known:
            raise ConfigError(
                str(key), f"unknown top-level key; known: {', '.join(sorted(known - {'hydra'}))}"
            )
        if key != "hydra":
            check_finite(str(key), OmegaConf.to_container(cfg[key], resolve=True))


def _pair(cfg: DictConfig) -> tuple[PairConfig, ModelSpec, ModelSpec | None]:
    """The typed pair and its model specs (a bad value in a spec is named under
    ``pair.target`` / ``pair.draft``, so the specs are built first)."""
    node = cfg.get("pair")
    if node is None:
        raise ConfigError("pair", "missing (pick a pair: pair=<name>)")
    target = _typed(node.target, "pair.target", ModelSpec)
    _check_loader_reads("pair.target", target)
    draft = None
    if node.get("draft") is not None:
        draft = _typed(node.draft, "pair.draft", ModelSpec)
        _check_loader_reads("pair.draft", draft)
    return _typed(node, "pair", PairConfig), target, draft


def _method(cfg: DictConfig) -> tuple[str, Any]:
    """The method's name and its validated params dataclass, defaults filled in."""
    method = OmegaConf.to_container(cfg.get("method") or {}, resolve=True)
    assert isinstance(method, dict)
    name = method.pop("name", None)
    if not name:
        raise ConfigError("method.name", "missing (pick a method: method=<name>)")
    return str(name), _method_params(str(name), method)


def _task(cfg: DictConfig) -> dict[str, Any]:
    """The task's options (checked against the task's code when it is built)."""
    task = OmegaConf.to_container(cfg.get("task") or {}, resolve=True)
    assert isinstance(task, dict)
    if not task.get("name"):
        raise ConfigError("task.name", "missing (pick a task: task=<name>)")
    protocol = task.get("protocol")
    # spider / humaneval / mtbench: as the authors ran them, or ours
    if protocol is not None and protocol not in PROTOCOLS:
        raise ConfigError("task.protocol", f"must be one of {PROTOCOLS}, got {protocol!r}")
    return task


def check_finite(key: str, value: Any) -> None:
    """NaN and infinities are no setting: every float of the config is finite (a NaN slips
    through every range check, ``nan < 0`` being false)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(key, f"must be a finite number, got {value}")
    items = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for name, item in items:
        check_finite(f"{key}.{name}", item)


def _check_loader_reads(prefix: str, spec: ModelSpec) -> None:
    """A key the spec's loader ignores (``path`` under ``smollm2_gguf``, ``device_map`` under
    ``tiny`` ...) must not be set: the run would silently use something else. ``tiny`` options
    are checked against :func:`mtad.engine.tiny.build_tiny_model`'s parameters."""
    reads = LOADER_READS[spec.loader]
    for f in dataclasses.fields(ModelSpec):
        value = getattr(spec, f.name)
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        unset = value is None or value == default
        if f.name != "loader" and f.name not in reads and not unset:
            users = sorted(k for k, v in LOADER_READS.items() if f.name in v)
            raise ConfigError(
                f"{prefix}.{f.name}",
                f"the {spec.loader} loader ignores {f.name} (set to {value!r}); remove it "
                f"({prefix}.{f.name}=null), or pick a loader that reads it ({', '.join(users)})",
            )
    if not spec.tiny:
        return
    from mtad.engine.tiny import build_tiny_model  # transformers: only for the tiny loader

    options = hints(build_tiny_model)
    for name, value in spec.tiny.items():
        if name not in options:
            raise ConfigError(f"{prefix}.tiny.{name}", f"not an option (has {sorted(options)})")
        problem = type_problem(value, options[name])
        if problem:
            raise ConfigError(f"{prefix}.tiny.{name}", problem)


def _method_params(name: str, params: dict[str, Any]) -> Any:
    """The method's validated params dataclass, defaults filled in (no model is built)."""
    from mtad.methods.params import PARAMS, build_params

    if name not in PARAMS:
        raise ConfigError("method.name", f"unknown method {name!r}; choose from {sorted(PARAMS)}")
    # null means "off", as in transformers' generation config
    for key, off in NULL_MEANS_OFF.items():
        if key in params and params[key] is None:
            params[key] = off
    try:
        obj = build_params(name, **params)
    except (TypeError, ValueError) as err:
        names = [f.name for f in dataclasses.fields(build_params(name))]
        raise ConfigError.from_exception("method", err, names) from err
    return obj
