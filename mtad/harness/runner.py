"""One harness run: validate, skip if done, load, generate (timed + metered), score, write.

Order matters for honest numbers and cheap failures:

1. :func:`mtad.harness.config.validate` checks every value (method params included) before
   anything heavy happens; the run signature is computed and a complete result folder means
   the run is skipped.
2. Models load, then W&B and codecarbon initialise (seconds each, recorded in ``overhead_s``),
   then one short untimed warm-up generation.
3. Only the generation loop runs between ``energy.start()`` and ``energy.stop()``; decoding time
   is the decoder's own clock (``DecodeStats``), summed over prompts.
4. Scoring (downstream score, perplexity by a separate target forward) happens after.
5. ``config.yaml``, ``samples.jsonl``, ``environment.json`` and finally ``metrics.json`` are
   written atomically; then W&B gets the summary and the per-sample table.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from mtad.harness.config import ConfigError, RunSpec, validate
from mtad.harness.energy import EnergyMeter
from mtad.harness.results import (
    CONFIG_FILE,
    ENVIRONMENT_FILE,
    METRICS_FILE,
    SAMPLES_FILE,
    environment,
    hardware_identity,
    is_complete,
    result_dir,
    write_atomic,
    write_json,
    write_jsonl,
)
from mtad.harness.signature import run_signature
from mtad.harness.wandb_logger import make_logger

SCHEMA_VERSION = 1


@dataclass
class RunOutcome:
    status: str  # "done" | "skipped"
    signature: str
    result_dir: Path
    metrics: dict[str, Any] = field(default_factory=dict)

    def pointer(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "signature": self.signature,
            "result_dir": str(self.result_dir.resolve()),
        }


@dataclass
class Prepared:
    """A validated run before any model loads: what to run and where its results go."""

    spec: RunSpec
    config: dict[str, Any]  # resolved; method params with defaults filled in
    task: Any  # mtad.tasks.base.Task
    method: Any  # mtad.engine.DecodingMethod (holds no model)
    signature: str
    result_dir: Path


def prepare(cfg: DictConfig) -> Prepared:
    """Validate ``cfg``, build the method and the task (its data, no model). Raises
    :class:`ConfigError`."""
    from mtad.methods import make_method

    spec = validate(cfg)
    task = build_task(spec)
    method = make_method(spec.method_name, spec.params)
    if method.uses_draft and spec.draft is None:
        raise ConfigError("pair.draft", f"method {spec.method_name!r} needs a draft model")
    _check_local_models(spec, method.uses_draft)
    config = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(config, dict)
    config.pop("hydra", None)
    config["method"] = {"name": spec.method_name, **spec.method_params}
    # What the task says identifies its data (file hashes, subset) joins the hashed config.
    config["task_data"] = task.signature()
    signature = run_signature(config)
    folder = result_dir(spec.cfg.results.root, spec.cfg.results.study, signature)
    return Prepared(spec, config, task, method, signature, folder)


def _check_local_models(spec: RunSpec, uses_draft: bool) -> None:
    """A missing shipped model folder fails here, not after the target has loaded."""
    from mtad.engine.loading import resolve_path

    for role, model in (("target", spec.target), ("draft", spec.draft if uses_draft else None)):
        if model is None or model.loader != "local":
            continue
        folder = Path(resolve_path(model.path or ""))
        if not folder.is_dir():
            raise ConfigError(f"pair.{role}.path", f"model folder {folder} is missing")


def build_task(spec: RunSpec) -> Any:
    """The task of ``spec``; ``chat_template: auto`` follows the pair's ``chat_template``."""
    from mtad.tasks import build_task as build

    options = dict(spec.cfg.task)
    if options.get("chat_template", "auto") == "auto":
        options["chat_template"] = spec.cfg.pair.chat_template
    try:
        task = build(options)
        task.samples()  # reads the data: a missing file fails here, before any model loads
    except (TypeError, ValueError, OSError) as err:
        raise ConfigError.from_exception("task", err) from err
    return task


def run(cfg: DictConfig) -> RunOutcome:
    """Run one configured run, or skip it when its result folder is complete."""
    t0 = time.perf_counter()
    prep = prepare(cfg)
    rc = prep.spec.cfg
    if rc.results.skip_existing and is_complete(prep.result_dir):
        print(f"skip {prep.result_dir} (complete)")
        return RunOutcome("skipped", prep.signature, prep.result_dir)
    overhead: dict[str, float] = {"validate": time.perf_counter() - t0}

    import torch

    from mtad.tasks.base import score_outputs, total_stats

    if rc.runtime.threads is not None:
        torch.set_num_threads(rc.runtime.threads)
    torch.manual_seed(rc.runtime.seed)

    with _timer(overhead, "load_models"):
        pair = _load_pair(prep)
    generator = _generator(prep, pair)

    logger = make_logger(rc.logger)
    energy = EnergyMeter(rc.energy)
    logger.start(
        name=prep.signature,
        group=rc.results.study,
        job_type=prep.spec.method_name,
        config={**prep.config, "signature": prep.signature},
        tags=list(rc.tags),
    )
    overhead["wandb_init"] = logger.init_s
    try:
        energy.prepare()
        overhead["energy_init"] = energy.init_s
        with _timer(overhead, "warmup"):
            _warmup(prep, generator)

        with _progress(prep) as progress, _timer(overhead, "generate_loop"):
            energy.start()
            outputs = prep.task.generate(
                generator, pair.tokenizer, **_task_kwargs(prep, pair), progress=progress
            )
            stats = total_stats(outputs)
            energy_block = energy.stop(stats.new_tokens)

        with _timer(overhead, "score"):
            scored = score_outputs(prep.task, outputs, pair.target.model)
        records = [
            _sample_record(rec, out) for rec, out in zip(scored.records, outputs, strict=True)
        ]
        metrics = _metrics(prep, stats, scored.metrics, energy_block, records, overhead)
        metrics["lm_head"] = {r.role: r.head for r in (pair.target, pair.draft) if r is not None}
        metrics["wandb"] = logger.info()
        _write(prep, records, metrics)
        logger.log_result(_wandb_summary(metrics), records)
        logger.finish()
    except BaseException:
        energy.close()
        logger.finish(exit_code=1)
        raise
    from mtad.harness.summary import print_run

    print_run(metrics, f"{prep.signature} -> {prep.result_dir}")
    return RunOutcome("done", prep.signature, prep.result_dir, metrics)


def run_from_hydra(cfg: DictConfig) -> RunOutcome:
    """``run`` plus the pointer file the sweep summary reads (in Hydra's job folder)."""
    from hydra.core.hydra_config import HydraConfig

    from mtad.harness.callbacks import write_pointer

    outcome = run(cfg)
    write_pointer(HydraConfig.get().runtime.output_dir, outcome.pointer())
    return outcome


# --------------------------------------------------------------------------------------------
# pieces


@contextmanager
def _timer(into: dict[str, float], key: str) -> Iterator[None]:
    start = time.perf_counter()
    yield
    into[key] = time.perf_counter() - start


def _load_pair(prep: Prepared) -> Any:
    """Target, and the draft only when the method uses one."""
    from mtad.engine.loading import load_pair

    draft = prep.spec.draft if prep.method.uses_draft else None
    rt = prep.spec.cfg.runtime
    return load_pair(prep.spec.target, draft, rt.device, rt.head)


def _generator(prep: Prepared, pair: Any) -> Any:
    from mtad.engine import Decoder
    from mtad.tasks.generator import TextGenerator

    seed = prep.spec.cfg.runtime.seed
    decoder = Decoder(prep.method, pair.target, pair.draft, eos_token_ids=_eos_ids(pair), seed=seed)
    return TextGenerator(decoder, pair.tokenizer, seed=seed)


def _eos_ids(pair: Any) -> list[int]:
    """The tokenizer's EOS plus the target's generation-config EOS ids (chat models add
    end-of-turn tokens there)."""
    ids: set[int] = set()
    eos = getattr(pair.tokenizer, "eos_token_id", None)
    if eos is not None:
        ids.add(int(eos))
    gen_cfg = getattr(pair.target.model, "generation_config", None)
    extra = getattr(gen_cfg, "eos_token_id", None)
    if isinstance(extra, int):
        ids.add(extra)
    elif isinstance(extra, (list, tuple)):
        ids.update(int(e) for e in extra)
    return sorted(ids)


def _warmup(prep: Prepared, generator: Any) -> None:
    """One short generation on the first prompt: lazy initialisation out of the timed loop."""
    n = prep.spec.cfg.runtime.warmup_tokens
    samples = prep.task.samples()
    if n <= 0 or not samples:
        return
    prompt, special = prep.task.build_prompt(samples[0], generator.tokenizer)
    generator(prompt, max_new_tokens=n, add_special_tokens=special, key="warmup")


class _progress:
    """A tqdm bar over prompts fed by the task's ``progress(done, total)`` callback."""

    def __init__(self, prep: Prepared) -> None:
        self.prep = prep
        self.bar: Any = None
        self.done = 0

    def __enter__(self) -> Callable[[int, int], None]:
        from tqdm.auto import tqdm

        spec = self.prep.spec
        self.bar = tqdm(
            total=len(self.prep.task.samples()),
            desc=f"{spec.method_name} {spec.cfg.pair.name} {spec.task_name}",
            unit="prompt",
            disable=None if spec.cfg.runtime.progress else True,  # None: off when not a TTY
            leave=False,
            dynamic_ncols=True,
        )
        return self.update

    def update(self, done: int, total: int) -> None:
        self.bar.update(done - self.done)
        self.done = done

    def __exit__(self, *exc: object) -> None:
        self.bar.close()


def _task_kwargs(prep: Prepared, pair: Any) -> dict[str, Any]:
    """``target_model`` for tasks whose ``generate`` also scores log-likelihoods (lm_eval)."""
    import inspect

    params = inspect.signature(prep.task.generate).parameters
    return {"target_model": pair.target.model} if "target_model" in params else {}


def _sample_stats(output: Any) -> dict[str, Any]:
    from mtad.engine import DecodeStats

    stats = DecodeStats.total([g.stats for g in output.generations if g.stats is not None])
    row = stats.as_dict(with_lengths=True)
    row["prompt_tokens"] = sum(len(g.prompt_ids) for g in output.generations)
    row["turns"] = len(output.generations)
    return row


def _sample_record(record: dict[str, Any], output: Any) -> dict[str, Any]:
    """The task's record (id, output text, its scores) plus the sample's decode counters.

    The task's ``new_tokens`` (tokens kept up to the stop string, what is scored) is renamed
    ``output_tokens``; ``new_tokens`` is what the decoder generated, as in ``DecodeStats``.
    """
    row = dict(record)
    if "new_tokens" in row:
        row["output_tokens"] = row.pop("new_tokens")
    row.update(_sample_stats(output))
    return row


def _metrics(
    prep: Prepared,
    stats: Any,
    task_metrics: dict[str, Any],
    energy: dict[str, Any],
    records: list[dict[str, Any]],
    overhead: dict[str, float],
) -> dict[str, Any]:
    rc = prep.spec.cfg
    import torch

    metrics: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "study": rc.results.study,
        "signature": prep.signature,
        "pair": rc.pair.name,
        "method": prep.spec.method_name,
        "task": prep.spec.task_name,
        "seed": rc.runtime.seed,
        "device": rc.runtime.device,
        # What a ratio may be taken across: runs on other hardware never share a ratio
        # (mtad.harness.tables.GROUP_KEYS).
        **hardware_identity(rc.runtime.device),
        "threads": torch.get_num_threads(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "params": dict(prep.spec.method_params),
        "n_samples": len(records),
        "output_tokens": sum(int(r.get("output_tokens", 0)) for r in records),
    }
    metrics.update(stats.as_dict())
    metrics.update(task_metrics)
    score_key = getattr(prep.task, "primary_metric", None)
    if score_key and score_key in task_metrics:
        metrics["score"] = task_metrics[score_key]
        metrics["score_name"] = score_key
    metrics["energy"] = energy
    metrics["overhead_s"] = overhead
    return metrics


def _write(prep: Prepared, records: list[dict[str, Any]], metrics: dict[str, Any]) -> None:
    folder = prep.result_dir
    folder.mkdir(parents=True, exist_ok=True)
    config_text = OmegaConf.to_yaml(OmegaConf.create({**prep.config, "signature": prep.signature}))
    write_atomic(folder / CONFIG_FILE, config_text)
    write_jsonl(folder / SAMPLES_FILE, records)
    write_json(folder / ENVIRONMENT_FILE, environment())
    write_json(folder / METRICS_FILE, metrics)  # last: its presence marks the folder complete


def _wandb_summary(metrics: dict[str, Any]) -> dict[str, Any]:
    """Scalars for ``run.summary``: flat metrics plus ``energy/...`` and ``overhead/...``."""
    out: dict[str, Any] = {}
    for key, value in metrics.items():
        if isinstance(value, dict):
            for sub, v in value.items():
                if isinstance(v, (int, float, str, bool)) or v is None:
                    out[f"{key}/{sub}"] = v
        elif isinstance(value, (int, float, str, bool)):
            out[key] = value
    return {
        k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in out.items()
    }


__all__ = ["Prepared", "RunOutcome", "prepare", "run", "run_from_hydra"]
