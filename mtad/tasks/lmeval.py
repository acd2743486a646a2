"""Any lm-eval task through our decoders: the ``lm_eval`` task.

:class:`LMEvalTask` runs a list of lm-eval tasks through ``lm_eval.simple_evaluate`` with the
lm-eval model ``mtad`` (:class:`~mtad.tasks.lmeval_model.MTADLM`: our decoder for generation,
the target for log-likelihoods). Local tasks are YAML files in ``include_path`` folders
(``dataset_path: json`` + ``data_files``); relative ``data_files`` are resolved against the
YAML's folder (lm-eval would resolve them against the working directory), by evaluating a copy
of the folder with absolute paths.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lm_eval
import yaml
from lm_eval.tasks import TaskManager

from mtad.tasks.base import DATA_DIR, Task, resolve_data_path
from mtad.tasks.lmeval_model import MTADLM
from mtad.tasks.params import LMEvalParams
from mtad.tasks.samples import Sample, SampleOutput, TaskResult

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from mtad.tasks.generator import TextGenerator

LOCAL_TASKS_DIR = DATA_DIR / "lm_eval_local"


class _Tagged:
    """A YAML scalar with a custom tag (lm-eval's ``!function``), kept as written."""

    def __init__(self, tag: str, value: str) -> None:
        self.tag, self.value = tag, value


class _Loader(yaml.SafeLoader):
    pass


class _Dumper(yaml.SafeDumper):
    pass


_Loader.add_multi_constructor(
    "!", lambda loader, suffix, node: _Tagged("!" + suffix, loader.construct_scalar(node))
)
_Dumper.add_representer(_Tagged, lambda dumper, t: dumper.represent_scalar(t.tag, t.value))


def _absolute_data_files(cfg: dict[str, Any], base: Path) -> bool:
    """Rewrite relative ``dataset_kwargs.data_files`` against ``base``; True if any changed."""
    kwargs = cfg.get("dataset_kwargs")
    if not isinstance(kwargs, dict) or "data_files" not in kwargs:
        return False
    changed = False

    def fix(value: Any) -> Any:
        nonlocal changed
        if isinstance(value, str):
            if "://" not in value and not Path(value).is_absolute():
                changed = True
                return str((base / value).resolve())
            return value
        if isinstance(value, list):
            return [fix(v) for v in value]
        if isinstance(value, dict):
            return {k: fix(v) for k, v in value.items()}
        return value

    kwargs["data_files"] = fix(kwargs["data_files"])
    return changed


def materialize_local_tasks(include_path: Path, workdir: Path) -> Path:
    """``include_path`` itself, or a copy of it whose YAMLs name their data files absolutely."""
    rewrites: dict[Path, dict[str, Any]] = {}
    for path in include_path.rglob("*.yaml"):
        cfg = yaml.load(path.read_text(), Loader=_Loader)  # noqa: S506 (SafeLoader subclass)
        if isinstance(cfg, dict) and _absolute_data_files(cfg, path.parent):
            rewrites[path.relative_to(include_path)] = cfg
    if not rewrites:
        return include_path
    copy = workdir / include_path.name
    shutil.copytree(include_path, copy, ignore=shutil.ignore_patterns("__pycache__"))
    for rel, cfg in rewrites.items():
        (copy / rel).write_text(yaml.dump(cfg, Dumper=_Dumper, sort_keys=False))
    return copy


def _plain(value: int | float) -> int | float:
    """numpy scalars to Python numbers (JSON- and pandas-friendly)."""
    return int(value) if isinstance(value, int) else float(value)


def _flatten_results(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``{"task": {"acc,none": x}}`` -> ``{"task/acc": x}`` (the filter name kept unless none)."""
    flat: dict[str, Any] = {}
    for task, values in results.items():
        for key, value in values.items():
            if key == "alias" or not isinstance(value, int | float) or isinstance(value, bool):
                continue
            metric, _, filt = key.partition(",")
            name = metric if filt in ("", "none") else f"{metric}[{filt}]"
            flat[f"{task}/{name}"] = _plain(value)
    return flat


class LMEvalTask(Task):
    """Runs lm-eval tasks with our decoders. ``generate`` runs ``simple_evaluate`` (decoding and
    the target's log-likelihoods); ``score`` reports lm-eval's metrics as ``<task>/<metric>``."""

    name = "lm_eval"
    needs_target_model = True

    def __init__(
        self,
        *,
        tasks: Sequence[str] = LMEvalParams.tasks,
        include_path: Sequence[str] | str | None = LMEvalParams.include_path,
        num_fewshot: int | None = LMEvalParams.num_fewshot,
        bootstrap_iters: int = LMEvalParams.bootstrap_iters,
        max_new_tokens: int = LMEvalParams.max_new_tokens,
        **common: Any,
    ) -> None:
        super().__init__(max_new_tokens=max_new_tokens, **common)
        if isinstance(tasks, str):
            tasks = [tasks]
        if not tasks:
            raise ValueError("task.tasks: give at least one lm-eval task name")
        self.tasks = list(tasks)
        paths = [include_path] if isinstance(include_path, str) else list(include_path or [])
        self.include_paths = [LOCAL_TASKS_DIR] + [resolve_data_path(p) for p in paths]
        for p in self.include_paths:
            if not p.is_dir():
                raise FileNotFoundError(f"task.include_path: {p} is not a folder")
        self.num_fewshot = num_fewshot
        self.bootstrap_iters = bootstrap_iters
        self.results: dict[str, Any] | None = None
        self._task_manager: Any = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    def samples(self) -> list[Sample]:
        """One sample per evaluated document (``limit`` / ``offset`` apply per lm-eval task),
        its prompt the task's ``doc_to_text``: for the run's progress bar and warm-up, and to
        fail on missing data before a model loads. lm-eval builds the real requests itself."""
        if self._samples is None:
            end = None if self.limit is None else self.offset + self.limit
            samples = []
            for name, task in self._manager().load(self.tasks)["tasks"].items():
                docs = list(task.eval_docs)
                for doc_id in range(len(docs))[self.offset : end]:
                    samples.append(
                        Sample(
                            id=f"{name}/{doc_id}",
                            turns=[str(task.doc_to_text(docs[doc_id]))],
                            max_new_tokens=self.max_new_tokens,
                            reference={"task": name, "doc_id": doc_id},
                        )
                    )
            self._samples = samples
        return self._samples

    def load_samples(self) -> list[Sample]:
        return self.samples()

    def _manager(self) -> Any:
        """lm-eval's TaskManager over the include paths (copies with absolute data files), built
        once. lm-eval's own task folders are indexed only when a requested name is not local:
        indexing them takes tens of seconds."""
        if self._task_manager is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="mtad-lm-eval-")
            paths = [
                str(materialize_local_tasks(p, Path(self._tmp.name))) for p in self.include_paths
            ]
            manager = TaskManager(include_path=paths, include_defaults=False)
            if any(name not in manager.task_index for name in self.tasks):
                manager = TaskManager(include_path=paths)
            self._task_manager = manager
        return self._task_manager

    def signature(self) -> dict[str, Any]:
        return {**super().signature(), "tasks": self.tasks, "num_fewshot": self.num_fewshot}

    def _subset(self) -> dict[str, Any]:
        """lm-eval's ``limit``, or with an offset its ``samples`` (document ids per task)."""
        if not self.offset:
            return {"limit": self.limit}
        chosen: dict[str, list[int]] = {}
        for s in self.samples():
            chosen.setdefault(s.reference["task"], []).append(s.reference["doc_id"])
        return {"samples": chosen}

    def generate(
        self,
        generator: TextGenerator,
        tokenizer: PreTrainedTokenizerBase | None = None,
        progress: Any = None,
        target_model: PreTrainedModel | None = None,
    ) -> list[SampleOutput]:
        lm = MTADLM(generator, target_model, max_gen_toks=self.max_new_tokens)
        chat = self.use_chat(tokenizer if tokenizer is not None else generator.tokenizer)
        subset = self._subset()
        results = lm_eval.simple_evaluate(
            model=lm,
            tasks=self.tasks,
            task_manager=self._manager(),
            num_fewshot=self.num_fewshot,
            bootstrap_iters=self.bootstrap_iters,
            apply_chat_template=chat,
            fewshot_as_multiturn=chat,
            log_samples=True,
            random_seed=generator.seed,
            numpy_random_seed=generator.seed,
            torch_random_seed=generator.seed,
            fewshot_random_seed=generator.seed,
            **subset,
        )
        if results is None:
            raise RuntimeError("lm_eval.simple_evaluate returned nothing")
        self.results = results
        if progress is not None:
            n = len(self.samples())
            progress(n, n)
        outputs = []
        for task, logged in results.get("samples", {}).items():
            for entry in logged:
                doc_id = entry.get("doc_id")
                metrics = {
                    m: _plain(entry[m])
                    for m in entry.get("metrics", [])
                    if isinstance(entry.get(m), int | float)
                }
                sample = Sample(
                    id=f"{task}/{doc_id}",
                    turns=[],
                    reference={"task": task, "doc_metrics": metrics},
                )
                outputs.append(SampleOutput(sample, lm.generations.get((task, doc_id), [])))
        return outputs

    def score(self, outputs: Sequence[SampleOutput]) -> TaskResult:
        if self.results is None:
            raise RuntimeError("lm_eval: score() needs the results of generate()")
        records = [
            {
                **self.base_record(o),
                "task": o.sample.reference["task"],
                **o.sample.reference["doc_metrics"],
            }
            for o in outputs
        ]
        metrics = _flatten_results(self.results["results"])
        # Headline: the first task's first metric (lm-eval lists them in metric_list order).
        self.primary_metric = next(
            (k for k in metrics if not k.endswith(("_stderr", "/sample_len"))), None
        )
        return TaskResult(records, metrics)
