"""The model side of one run: torch settings, the loaded pair, the text generator around the
engine's ``Decoder``, the untimed warm-up and the progress bar over prompts.

Split from :mod:`mtad.harness.job`, which orders these steps (and times them); this module
imports torch and the engine, so planners that only prepare runs (:mod:`mtad.harness.prepare`)
never import it.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import torch
from tqdm.auto import tqdm

from mtad.engine import Decoder, LoadedPair, loading
from mtad.harness.config import RuntimeConfig
from mtad.harness.prepare import Prepared
from mtad.tasks.generator import TextGenerator
from mtad.tokens import eos_token_ids


def configure_torch(runtime: RuntimeConfig) -> None:
    """Intra-op threads (``runtime.threads``; null keeps torch's default) and the seed."""
    if runtime.threads is not None:
        torch.set_num_threads(runtime.threads)
    torch.manual_seed(runtime.seed)


def load_models(prep: Prepared) -> LoadedPair:
    """Target, and the draft only when the method uses one."""
    draft = prep.spec.draft if prep.method.uses_draft else None
    rt = prep.spec.cfg.runtime
    roles = (("target", prep.spec.target), ("draft", draft))
    chosen = [
        f"{role} {model.dtype} ({prep.spec.dtype_choice.get(role, 'set in the config')})"
        for role, model in roles
        if model is not None
    ]
    print("dtype: " + "; ".join(chosen))
    # loading.load_pair, looked up when called: tests replace it to prove a run loads nothing
    # runtime.head chooses the output projection (lm_head) of both models, runtime.linears
    # whether their projections run on prepacked weights
    return loading.load_pair(prep.spec.target, draft, rt.device, rt.head, rt.linears)


def text_generator(prep: Prepared, pair: LoadedPair) -> TextGenerator:
    """The method's ``Decoder`` over the pair, behind a prompt-in, text-out generator."""
    seed = prep.spec.cfg.runtime.seed
    decoder = Decoder(
        prep.method,
        pair.target,
        pair.draft,
        eos_token_ids=eos_token_ids(pair.tokenizer, pair.target.model),
        seed=seed,
    )
    return TextGenerator(decoder, pair.tokenizer, seed=seed)


def warmup(prep: Prepared, generator: TextGenerator) -> None:
    """One short generation on the first prompt: lazy initialisation out of the timed loop."""
    n = prep.spec.cfg.runtime.warmup_tokens
    samples = prep.task.samples()
    if n <= 0 or not samples:
        return
    prompt, special = prep.task.build_prompt(samples[0], generator.tokenizer)
    generator(prompt, max_new_tokens=n, add_special_tokens=special, key="warmup")


def task_kwargs(prep: Prepared, pair: LoadedPair) -> dict[str, Any]:
    """``target_model`` for tasks whose ``generate`` also scores with it (lm_eval)."""
    return {"target_model": pair.target.model} if prep.task.needs_target_model else {}


class Progress:
    """A tqdm bar over prompts fed by the task's ``progress(done, total)`` callback."""

    def __init__(self, prep: Prepared) -> None:
        self.prep = prep
        self.bar: tqdm | None = None
        self.done = 0

    def __enter__(self) -> Callable[[int, int], None]:
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


def synchronize_gpus() -> None:
    """Wait for the work queued on every GPU this process uses (none before CUDA is
    initialised: a CPU run on a GPU machine does not start a CUDA context for it), so that a
    phase's clock counts the device work the phase queued."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for index in range(torch.cuda.device_count()):
            torch.cuda.synchronize(index)


_heap_frozen = False  # freeze_heap: once per process


def freeze_heap() -> None:
    """Before this process's first job loads anything, move every object alive (the imports,
    Hydra's state) out of the cycle collector's reach, so that :func:`release_memory` scans
    only what came after: a full ``gc.collect()`` walks the ~430k objects torch, transformers
    and Hydra leave (~0.2 s each job of an in-process sweep, 14 s of an 80-run smoke study).
    Frozen objects are still freed when their last reference goes; a cycle among them is not,
    hence once per process: the first job's own config is the most it keeps (a freeze before
    every job would keep every job's config, whose nodes point at their parents)."""
    global _heap_frozen
    if not _heap_frozen:
        gc.freeze()
        _heap_frozen = True


def release_memory() -> None:
    """Give a finished run's memory back before the next job of an in-process (basic launcher)
    sweep loads its own. A model dispatched by accelerate holds a reference cycle (its hooks set
    ``module.forward = partial(new_forward, module)``), so only the cycle collector frees it.
    cuBLAS keeps a workspace per handle and stream (32 MiB each on Hopper) allocated through
    the caching allocator, which ``empty_cache`` cannot return while it is held: clear those
    first (as torch's own CUDA leak check does), then the allocator returns the freed blocks
    to the driver, on every GPU (a target spread by ``device_map`` used several)."""
    gc.collect()
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            torch.cuda.synchronize(index)
        clear_workspaces = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear_workspaces is not None:  # absent from CPU builds
            clear_workspaces()
        torch.cuda.empty_cache()


def reset_peak_memory() -> dict[str, int]:
    """Start this run's peak GPU memory count (read by :func:`placement`); returns the GPU
    memory allocated before this run loads anything, per GPU (the previous run's leftovers:
    0 when it freed everything)."""
    before: dict[str, int] = {}
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            torch.cuda.reset_peak_memory_stats(index)
            before[f"cuda:{index}"] = int(torch.cuda.memory_allocated(index))
    return before


def gpu_ids(pair: LoadedPair) -> list[int]:
    """Indices of the GPUs the pair's models occupy (what codecarbon meters)."""
    draft = pair.draft.model if pair.draft is not None else None
    return list(loading.placement(pair.target.model, draft)["gpu_ids"])


def model_facts(pair: LoadedPair, memory_before_load: dict[str, int]) -> dict[str, Any]:
    """``metrics.json``'s record of the loaded models: each one's logits head (``lm_head``) and,
    for a CPU head, the kernel each row count ran (``lm_head_kernels``), how many of its
    projections ran on prepacked weights (``packed_linears``), and where they lived
    (``placement``, with the GPU memory the run found allocated before it loaded)."""
    runners = [r for r in (pair.target, pair.draft) if r is not None]
    return {
        "lm_head": {r.role: r.lm_head for r in runners},
        "lm_head_kernels": {r.role: r.lm_head_kernels for r in runners},
        "packed_linears": {r.role: r.packed_linears for r in runners},
        "placement": {**placement(pair), "gpu_memory_before_load_bytes": memory_before_load},
    }


def placement(pair: LoadedPair) -> dict[str, Any]:
    """``metrics.json`` ``placement``: devices and ``hf_device_map`` per role, GPUs used, and
    the peak GPU memory per used GPU over load, warm-up and generation (bytes)."""
    target = pair.target.model
    draft = pair.draft.model if pair.draft is not None else None
    out = loading.placement(target, draft)
    peaks: dict[str, int] = {}
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            peak = torch.cuda.max_memory_allocated(index)
            if peak:
                peaks[f"cuda:{index}"] = int(peak)
    out["peak_gpu_memory_bytes"] = peaks
    return out


__all__ = [
    "Progress",
    "configure_torch",
    "freeze_heap",
    "gpu_ids",
    "load_models",
    "model_facts",
    "placement",
    "release_memory",
    "reset_peak_memory",
    "synchronize_gpus",
    "task_kwargs",
    "text_generator",
    "warmup",
]
