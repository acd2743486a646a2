"""Any lm-eval task through our decoders: an lm-eval model (``mtad``) and the ``lm_eval`` task.

:class:`MTADLM` is registered with lm-eval as ``"mtad"``. ``generate_until`` runs the harness's
decoding method (MTAD, SpS, AR, ...) through :class:`~mtad.tasks.base.TextGenerator`, honouring
``until`` and ``max_gen_toks``; sampling settings in ``gen_kwargs`` (``do_sample``,
``temperature``) are ignored because the method's config owns the warping. ``loglikelihood`` and
``loglikelihood_rolling`` score with the target model alone (:mod:`mtad.tasks.quality`), with
lm-eval's own context/continuation split (``TemplateLM``) and rolling windows.

:class:`LMEvalTask` runs a list of lm-eval tasks through ``lm_eval.simple_evaluate``. Local tasks
are YAML files in ``include_path`` folders (``dataset_path: json`` + ``data_files``); relative
``data_files`` are resolved against the YAML's folder (lm-eval would resolve them against the
working directory), by evaluating a copy of the folder with absolute paths.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from mtad.tasks.base import (
    DATA_DIR,
    Generation,
    Sample,
    SampleOutput,
    Task,
    TaskResult,
    TextGenerator,
    resolve_data_path,
)
from mtad.tasks.quality import continuation_logprobs, max_context

if TYPE_CHECKING:
    from lm_eval.api.instance import Instance
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)

LOCAL_TASKS_DIR = DATA_DIR / "lm_eval_local"
_IGNORED_GEN_KWARGS = ("do_sample", "temperature", "top_k", "top_p")


@register_model("mtad")
class MTADLM(TemplateLM):
    """lm-eval model around a :class:`TextGenerator` (our decoder) and the target model.

    Built by the harness from built objects (``generator``, ``target_model``), or from simple
    arguments for the ``tiny`` test pair: ``MTADLM(pair="tiny", method="ar", ...)`` or
    ``--model mtad --model_args pair=tiny,method=mtad,gamma=4``.
    """

    backend = "causal"

    def __init__(
        self,
        generator: TextGenerator | None = None,
        target_model: PreTrainedModel | None = None,
        *,
        pair: str | None = None,
        method: str = "ar",
        family: str = "llama",
        seed: int = 0,
        max_length: int | None = None,
        max_gen_toks: int = 256,
        **method_params: Any,
    ) -> None:
        super().__init__()
        if generator is None:
            if pair != "tiny":
                raise ValueError(
                    "MTADLM: pass a built `generator` and `target_model`, or pair=tiny for the "
                    "random test pair"
                )
            generator, target_model = _tiny_generator(method, family, seed, method_params)
        elif method_params:
            raise ValueError(f"MTADLM: method parameters {sorted(method_params)} need pair=tiny")
        if target_model is None:
            target_model = generator.decoder.target.model  # type: ignore[attr-defined]
        self.generator = generator
        self.tokenizer = generator.tokenizer
        self.target_model = target_model
        self._max_length = max_length
        self.max_gen_toks = max_gen_toks
        self.generations: dict[tuple[str | None, int | None], list[Generation]] = {}
        self._warned: set[str] = set()

    # ------------------------------------------------------------------ lm-eval properties

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:
        bos = self.tokenizer.bos_token_id
        return bos if bos is not None else self.eot_token_id

    @property
    def max_length(self) -> int:
        return self._max_length or max_context(self.target_model) or 2048

    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self.tokenizer, "name_or_path", "mtad")).replace("/", "__")

    def tok_encode(
        self, string: str, add_special_tokens: bool | None = None, **_: Any
    ) -> list[int]:
        special = True if add_special_tokens is None else add_special_tokens
        return self.tokenizer(string, add_special_tokens=special)["input_ids"]

    def apply_chat_template(
        self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> str:
        return self.tokenizer.apply_chat_template(
            chat_history, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    # ----------------------------------------------------------------------- scoring

    def _loglikelihood_tokens(
        self, requests: list[tuple[tuple[str, str], list[int], list[int]]], **_: Any
    ) -> list[tuple[float, bool]]:
        out = []
        for key, context, continuation in requests:
            logp, greedy = continuation_logprobs(
                self.target_model, context, continuation, self.max_length
            )
            result = (float(logp.double().sum()), greedy)
            if key is not None and key[0] is not None:
                self.cache_hook.add_partial("loglikelihood", key, result)
            out.append(result)
        return out

    def loglikelihood_rolling(
        self, requests: list[Instance], disable_tqdm: bool = False
    ) -> list[float]:
        out = []
        for (text,) in [r.args for r in requests]:
            tokens = self.tok_encode(text, add_special_tokens=False)
            windows = [
                make_disjoint_window(w)
                for w in get_rolling_token_windows(
                    tokens, self.prefix_token_id, self.max_length, context_len=1
                )
            ]
            total = sum(
                ll for ll, _ in self._loglikelihood_tokens([(None, c, t) for c, t in windows])
            )
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), total)
            out.append(total)
        return out

    # --------------------------------------------------------------------- generation

    def generate_until(self, requests: list[Instance], disable_tqdm: bool = False) -> list[str]:
        out = []
        for req in requests:
            context, gen_kwargs = req.args
            gen_kwargs = dict(gen_kwargs or {})
            until = gen_kwargs.pop("until", None)
            if isinstance(until, str):
                until = [until]
            stop = list(until or [])
            eos_text = self.tokenizer.decode([self.eot_token_id])
            if eos_text and eos_text not in stop:
                stop.append(eos_text)
            max_new = int(gen_kwargs.pop("max_gen_toks", self.max_gen_toks))
            ignored = sorted(k for k in gen_kwargs if k in _IGNORED_GEN_KWARGS)
            if ignored and "sampling" not in self._warned:
                self._warned.add("sampling")
                log.warning(
                    "lm-eval gen_kwargs %s ignored: the decoding method's config sets sampling",
                    ignored,
                )
            bos = self.tokenizer.bos_token
            special = not (bos and context.startswith(bos))
            gen = self.generator(
                context,
                max_new_tokens=max_new,
                stop=stop,
                add_special_tokens=special,
                key=f"lm_eval/{req.task_name}/{req.doc_id}/{req.idx}",
                max_prompt_tokens=max(1, self.max_length - max_new),
            )
            self.generations.setdefault((req.task_name, req.doc_id), []).append(gen)
            self.cache_hook.add_partial("generate_until", req.args, gen.text)
            out.append(gen.text)
        return out


def _tiny_generator(
    method: str, family: str, seed: int, params: dict[str, Any]
) -> tuple[TextGenerator, PreTrainedModel]:
    from mtad.engine import Decoder
    from mtad.engine.runner import ModelRunner
    from mtad.engine.tiny import build_tiny_pair, build_tiny_tokenizer
    from mtad.methods import build_method

    tokenizer = build_tiny_tokenizer()
    target, draft = build_tiny_pair(family=family, seed=seed)
    decoder = Decoder(
        build_method(method, **params),
        ModelRunner(target, "target"),
        ModelRunner(draft, "draft"),
        eos_token_ids=[tokenizer.eos_token_id],
        seed=seed,
    )
    return TextGenerator(decoder, tokenizer, seed), target


# ---------------------------------------------------------------------------------- the task


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

    def __init__(
        self,
        *,
        tasks: Sequence[str] = ("mtad_local_arith",),
        include_path: Sequence[str] | str | None = None,
        num_fewshot: int | None = None,
        bootstrap_iters: int = 1000,
        max_new_tokens: int = 256,
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
            from lm_eval.tasks import TaskManager

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
        import lm_eval

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
