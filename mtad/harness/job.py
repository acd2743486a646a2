"""One harness run: validate, claim, skip if done, load, generate (timed + metered), score, write.

Order matters for honest numbers and cheap failures:

1. :func:`prepare` checks every value (method params included) and what the values need from
   this machine (device, weights, vocabularies, token budget, writable folders; see
   :mod:`mtad.harness.preflight`) before anything heavy happens; the run signature is computed
   and a complete result folder means the run is skipped. Its time is ``overhead_s.validate``;
   torch and the engine are imported with this module, before that clock starts.
2. The run leases its result folder (:mod:`mtad.harness.lease`): a run another live process
   holds is reported as claimed and skipped.
3. Models load (:mod:`mtad.harness.generation`), then W&B (run id from the signature, see
   :mod:`mtad.harness.wandb_logger`) and codecarbon initialise (seconds each, recorded in
   ``overhead_s``), then one short untimed warm-up generation.
4. Only the generation loop runs between ``energy.start()`` and ``energy.stop()``; decoding time
   is the decoder's own clock (``DecodeStats``), summed over prompts.
5. ``config.yaml``, ``samples.jsonl`` (the generations: ids, outputs, token counters, no scores
   yet), ``timings.jsonl`` and ``environment.json`` are written atomically
   (:mod:`mtad.harness.records`), so that a scoring failure loses no generation.
6. Scoring (downstream score, perplexity by a separate target forward) happens after; then
   ``samples.jsonl`` is rewritten with the scores; then W&B gets the summary and the
   per-sample table and finishes; then ``metrics.json``, whose presence marks the folder
   complete (so a result folder is complete only when its W&B run is too).

A run that raises after step 2 writes ``failed.json`` (traceback, config, environment, time)
into its result folder. That folder does not count as complete, so the next run of the same
command retries it; in a sweep (``-m``) the failure is recorded and the sweep goes on
(:func:`run_from_hydra`), and the sweep exits non-zero at the end
(:class:`mtad.harness.callbacks.SweepSummary`).
"""

from __future__ import annotations

import contextlib
import inspect
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from mtad.engine import DecodeStats, LoadedPair
from mtad.engine.loop import ContextOverflow
from mtad.harness import generation
from mtad.harness.callbacks import write_pointer
from mtad.harness.config import ConfigError
from mtad.harness.energy import EnergyMeter
from mtad.harness.lease import LeaseHeld, describe, lease
from mtad.harness.prepare import Prepared, prepare
from mtad.harness.records import (
    commit,
    run_metrics,
    sample_record,
    split_timings,
    unscored_record,
    wandb_summary,
    write_failure,
    write_outputs,
    write_samples,
)
from mtad.harness.summary import print_run
from mtad.harness.wandb_logger import NullLogger, make_logger, wandb_run_id
from mtad.runs.folder import ResultsNotWritten
from mtad.runs.index import find_complete
from mtad.tasks.base import score_outputs, total_stats
from mtad.tasks.generator import TextGenerator
from mtad.tasks.samples import SampleOutput


@dataclass
class RunOutcome:
    """``status``: ``done``, ``skipped`` (complete already), ``claimed`` (another live process
    runs it; ``note`` says who) or ``failed`` (``note``: the error; ``failed.json`` has more)."""

    status: str
    signature: str
    result_dir: Path | None
    metrics: dict[str, Any] = field(default_factory=dict)
    note: str = ""

    def pointer(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "signature": self.signature,
            "result_dir": str(self.result_dir.resolve()) if self.result_dir else None,
            "note": self.note,
        }


def run(cfg: DictConfig) -> RunOutcome:
    """Run one configured run, or skip it when its result folder is complete or claimed.

    Raises :class:`ConfigError` for bad input (nothing written, except for a prompt longer than
    the models' context, found once the tokenizer is loaded). Any other exception is recorded
    in ``failed.json`` in the result folder, then re-raised. The run's models are freed before
    it returns or raises.
    """
    t0 = time.perf_counter()
    generation.freeze_heap()
    prep = prepare(cfg)
    if skipped := _skip_complete(prep):
        return skipped
    try:
        with lease(prep.result_dir) as owner:
            # the previous owner may have finished between our check and our claim
            if skipped := _skip_complete(prep):
                return skipped
            try:
                return _execute(prep, t0)
            except Exception as err:
                # failed.json may not fit either (a full disk): the first error is the news
                with contextlib.suppress(OSError):
                    write_failure(prep, err, owner)
                _clear_frames(err)
                raise
            finally:
                # Success or failure, the next job of an in-process sweep (basic launcher)
                # must find the GPUs as empty as the first did.
                generation.release_memory()
    except LeaseHeld as held:
        note = f"claimed by {describe(held.owner)}"
        print(f"skip {prep.result_dir} ({note}; rerun to complete it if that owner dies)")
        return RunOutcome("claimed", prep.signature, prep.result_dir, note=note)


def _skip_complete(prep: Prepared) -> RunOutcome | None:
    """The outcome of a run whose identity has a complete folder (its signature's, or one
    written under an older name), when complete runs are skipped."""
    if not prep.spec.cfg.results.skip_existing:
        return None
    done = find_complete(prep.result_dir.parent, prep.identity)
    if done is None:
        return None
    print(f"skip {done} (complete)")
    return RunOutcome("skipped", prep.signature, done)


def _execute(prep: Prepared, t0: float) -> RunOutcome:
    """Steps 3-6 of the module docstring for a prepared, leased run."""
    rc = prep.spec.cfg
    overhead: dict[str, float] = {"validate": time.perf_counter() - t0}
    generation.configure_torch(rc.runtime)

    memory_before_load = generation.reset_peak_memory()
    with _timer(overhead, "load_models"):
        pair = generation.load_models(prep)
    generator = generation.text_generator(prep, pair)

    logger = make_logger(rc.logger)
    energy = EnergyMeter(rc.energy, rc.runtime.device, generation.gpu_ids(pair))
    _start_wandb(prep, logger)
    overhead["wandb_init"] = logger.init_s
    try:
        outputs, stats, energy_block = _generate(prep, pair, generator, energy, overhead)
        scores, rows, records = _write_then_score(prep, pair, outputs, overhead)
        metrics = run_metrics(prep, stats, scores, energy_block, records, overhead)
        metrics.update(generation.model_facts(pair, memory_before_load))
        metrics["wandb"] = logger.info()
        _finish(prep, logger, metrics, records, rows)
    except BaseException:
        _cleanup(energy.close, logger.finish, exit_code=1)
        raise
    print_run(metrics, f"{prep.signature} -> {prep.result_dir}")
    return RunOutcome("done", prep.signature, prep.result_dir, metrics)


def _start_wandb(prep: Prepared, logger: NullLogger) -> None:
    """The run's W&B run: named by the signature, its id a function of study and signature."""
    rc = prep.spec.cfg
    logger.start(
        name=prep.signature,
        group=rc.results.study,
        job_type=prep.spec.method_name,
        config={**prep.config, "signature": prep.signature},
        tags=list(rc.tags),
        run_id=wandb_run_id(rc.results.study, prep.signature),
    )


def _generate(
    prep: Prepared,
    pair: LoadedPair,
    generator: TextGenerator,
    energy: EnergyMeter,
    overhead: dict[str, float],
) -> tuple[list[SampleOutput], DecodeStats, dict[str, Any]]:
    """Warm-up, then the timed and metered generation loop: ``(outputs, stats, energy)``."""
    energy.prepare()
    overhead["energy_init"] = energy.init_s
    with _timer(overhead, "warmup"), _context_is_bad_input(prep):
        generation.warmup(prep, generator)

    with (
        generation.Progress(prep) as progress,
        _timer(overhead, "generate_loop"),
        _context_is_bad_input(prep),
    ):
        energy.start()
        outputs = prep.task.generate(
            generator, pair.tokenizer, **generation.task_kwargs(prep, pair), progress=progress
        )
        stats = total_stats(outputs)
        energy_block = energy.stop(stats.new_tokens)
    return outputs, stats, energy_block


def _write_then_score(
    prep: Prepared, pair: LoadedPair, outputs: list[SampleOutput], overhead: dict[str, float]
) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """The generations to disk, then their scores: ``(task metrics, rows, records)``, the rows
    with their timings (W&B's table), the records without (``samples.jsonl``)."""
    # The generations reach the disk before anything scores them: a scorer that fails
    # (a hostile completion, a broken gold answer, OOM in the perplexity forward) then
    # costs the scores, never the decoding.
    generated, timings = split_timings([unscored_record(out) for out in outputs])
    with _writing(prep):
        write_outputs(prep, generated, timings)
    with _timer(overhead, "score"):
        scored = score_outputs(prep.task, outputs, pair.target.model)
    rows = [sample_record(rec, out) for rec, out in zip(scored.records, outputs, strict=True)]
    records, _ = split_timings(rows)
    return scored.metrics, rows, records


def _finish(
    prep: Prepared,
    logger: NullLogger,
    metrics: dict[str, Any],
    records: list[dict[str, Any]],
    rows: list[dict[str, Any]],
) -> None:
    """The scored samples, then W&B's summary and table, then ``metrics.json``."""
    with _writing(prep):
        write_samples(prep, records)
    logger.log_result(wandb_summary(metrics), rows)
    logger.finish()
    # Last: the folder counts as complete only once W&B has the run too, so a failure or a
    # kill in W&B's logging leaves it incomplete and the next attempt redoes both.
    with _writing(prep):
        commit(prep, metrics)


def run_from_hydra(cfg: DictConfig) -> RunOutcome:
    """``run`` plus the pointer file the sweep summary reads (in Hydra's job folder).

    In a sweep (``-m``) a failing job must not stop the sweep: its exception is printed,
    recorded (``failed.json`` by :func:`run`; the pointer says ``failed``) and the job returns,
    so Hydra's launcher goes on with the next job; the sweep summary exits non-zero at the end.
    A single run re-raises (Hydra prints it; exit status 1; bad input: :class:`ConfigError`,
    which ``run.py`` reports on one line with exit status 2). A sweep validated every job before
    any started, so a :class:`ConfigError` inside a sweep job (a sweeper other than the basic
    one, or the machine changed meanwhile) is that job's failure.
    """
    hydra_cfg = HydraConfig.get()
    output_dir = hydra_cfg.runtime.output_dir
    try:
        outcome = run(cfg)
    except Exception as err:
        if hydra_cfg.mode != RunMode.MULTIRUN:
            raise
        traceback.print_exc()
        print(
            f"error: job {hydra_cfg.job.num} failed: {type(err).__name__}: {err}", file=sys.stderr
        )
        outcome = _failed_outcome(cfg, err)
    pointer = outcome.pointer()
    pointer["job"] = hydra_cfg.job.get("num")
    pointer["overrides"] = list(hydra_cfg.overrides.task)
    write_pointer(output_dir, pointer)
    return outcome


def _failed_outcome(cfg: DictConfig, err: BaseException) -> RunOutcome:
    try:
        prep = prepare(cfg)  # cheap; the run got past it once
        signature, folder = prep.signature, prep.result_dir
    except Exception:  # noqa: BLE001 - the failure may lie in preparing itself
        signature, folder = "", None
    note = f"{type(err).__name__}: {err}".splitlines()[0][:300]
    return RunOutcome("failed", signature, folder, note=note)


# --------------------------------------------------------------------------------------------
# pieces


def _cleanup(*steps: Callable[..., Any], **kwargs: Any) -> None:
    """Close what a dying run holds without masking why it dies. A SLURM pre-emption, for one,
    arrives as submitit's ``SystemExit`` (it requeues the job) after SLURM's SIGTERM has killed
    W&B's service process: an error from closing W&B must not replace that ``SystemExit``, or
    the job would be recorded as failed instead of requeued."""
    for step in steps:
        try:
            params = inspect.signature(step).parameters
            step(**{k: v for k, v in kwargs.items() if k in params})
        except Exception as err:  # noqa: BLE001 - best effort, reported
            print(
                f"warning: cleanup {getattr(step, '__qualname__', step)}: {err!r}", file=sys.stderr
            )


def _clear_frames(err: BaseException) -> None:
    """The tracebacks' frames (of ``err`` and of the exceptions it chains) hold the failed
    run's models (pair, decoder, runners): clear their locals so that ``release_memory`` frees
    the models of a failed run too. The traceback text is kept."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [err]
    while todo:
        exc = todo.pop()
        if exc is None or id(exc) in seen:
            continue
        seen.add(id(exc))
        traceback.clear_frames(exc.__traceback__)
        todo += [exc.__cause__, exc.__context__]


@contextmanager
def _context_is_bad_input(prep: Prepared) -> Iterator[None]:
    """A prompt too long for the models' context is bad input: one line naming the task (the
    budget alone is checked before loading, :func:`mtad.harness.preflight.check_context`)."""
    try:
        yield
    except ContextOverflow as err:
        raise ConfigError("task", f"task {prep.spec.task_name}: {err}") from err


@contextmanager
def _writing(prep: Prepared) -> Iterator[None]:
    """An ``OSError`` while writing the result folder becomes :class:`ResultsNotWritten`."""
    try:
        yield
    except OSError as err:
        raise ResultsNotWritten(prep.result_dir, err) from err


@contextmanager
def _timer(into: dict[str, float], key: str) -> Iterator[None]:
    """A phase's wall time into ``into[key]``, read once the GPUs finished what it queued (a
    model's copy to the GPU may still be in flight when ``load_models`` returns)."""
    start = time.perf_counter()
    yield
    generation.synchronize_gpus()
    into[key] = time.perf_counter() - start


__all__ = ["Prepared", "RunOutcome", "prepare", "run", "run_from_hydra"]
