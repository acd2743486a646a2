"""Count the host synchronisations a decoding loop would make on a GPU, on any device.

On CUDA a host read (``.item()``, ``.tolist()``, ``bool(t)``, ``int(t)``, ...) or an op whose
output size depends on the data (``nonzero``, boolean-mask indexing, ``masked_select``, ...)
waits for every kernel queued before it: each one idles the GPU while the host catches up.
Torch's own detector (``torch.cuda.set_sync_debug_mode``) exists on CUDA only, so this counts
the same calls at the Python level, through a :class:`~torch.overrides.TorchFunctionMode`, on
the CPU too: :class:`HostReads` records each with the line of ``mtad/`` that made it.

A CPU run takes the CPU-only fast paths of :mod:`mtad.engine._warping_cpu` (host reads are free
there) where top-k applies or rows are vocabulary-wide; a count meant for the GPU path warps
without top-k on tiny vocabularies (:data:`GPU_PATH_WARP`), where no fast path applies, and
:meth:`HostReads.sites` shows that none ran.

Timer synchronisations (``torch.cuda.synchronize`` before a timer is read, GPU only) are not
reads; :func:`count_per_iteration` counts them apart.
"""

from __future__ import annotations

import sys
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from mtad.engine import loop
from mtad.engine.warping import WarpConfig
from mtad.methods import beam

# the ops that read a device value on the host
READS = frozenset(
    {"item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__", "__index__"}
)
# ops whose output size depends on the data (the host waits for that size)
DATA_SIZED = frozenset(
    {"nonzero", "argwhere", "masked_select", "unique", "unique_consecutive", "multinomial"}
)
# warping for which no CPU-only fast path applies (tiny vocabularies): the GPU's code path
GPU_PATH_WARP = {"temperature": 1.0, "top_k": 0, "top_p": 0.9}
_MTAD = str(Path(__file__).resolve().parents[1] / "mtad")


def _is_bool_index(index: Any) -> bool:  # noqa: ANN401 - any __getitem__ index
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts)


def _site() -> str:
    """``file:line`` of the innermost frame under ``mtad/`` (else the innermost caller)."""
    frames = traceback.extract_stack(sys._getframe(2))
    for fr in reversed(frames):
        if fr.filename.startswith(_MTAD):
            return f"{Path(fr.filename).relative_to(Path(_MTAD).parent)}:{fr.lineno}"
    return f"{Path(frames[-1].filename).name}:{frames[-1].lineno}"


class HostReads(TorchFunctionMode):
    """Records every host read and data-sized op made while active (``events``: op, site)."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, str]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        name = getattr(func, "__name__", "")
        if name in READS or name in DATA_SIZED:
            self.events.append((name, _site()))
        elif name == "where" and len(args) == 1 and not kwargs:
            self.events.append(("where(cond)", _site()))
        elif name in ("__getitem__", "__setitem__") and len(args) > 1 and _is_bool_index(args[1]):
            self.events.append((f"{name}[bool]", _site()))
        return func(*args, **(kwargs or {}))

    def sites(self) -> Counter[str]:
        return Counter(f"{op} @ {site}" for op, site in self.events)


@dataclass
class SyncCount:
    """Host reads per iteration (``reads``) and before the first (``setup``), timer syncs per
    iteration (``timer_syncs``, GPU only) and every read's op and site (``sites``)."""

    reads: list[int]
    setup: int
    timer_syncs: list[int]
    sites: Counter[str] = field(default_factory=Counter)


def count_per_iteration(
    decoder: loop.Decoder, prompt: list[int], max_new_tokens: int, seed: int = 0
) -> SyncCount:
    """Decode once, counting host reads per iteration (a step and its commit) and calls of
    :func:`mtad.engine.loop.synchronize` (the time split's and the wall clock's)."""
    mode = HostReads()
    marks: list[tuple[int, int]] = []  # (reads, timer syncs) when each step starts
    syncs = [0]
    step, sync = decoder.method.step, loop.synchronize

    def counted_step(ctx: loop.DecodeContext) -> loop.StepResult:
        marks.append((len(mode.events), syncs[0]))
        return step(ctx)

    def counted_sync(gpus: Any) -> None:  # noqa: ANN401
        syncs[0] += 1
        sync(gpus)

    decoder.method.step = counted_step  # type: ignore[method-assign]
    loop.synchronize = counted_sync  # type: ignore[assignment]
    host_devices, beam.HOST_BOOKKEEPING_DEVICES = beam.HOST_BOOKKEEPING_DEVICES, frozenset()
    try:
        with mode:
            out = decoder.generate(prompt, max_new_tokens, seed=seed)
    finally:
        del decoder.method.step
        loop.synchronize = sync  # type: ignore[assignment]
        beam.HOST_BOOKKEEPING_DEVICES = host_devices
    # the last iteration ends where the loop does: before its closing wall-clock sync
    ends = [*marks[1:], (len(mode.events), syncs[0] - 1)]
    assert len(marks) == out.stats.iterations
    return SyncCount(
        reads=[e[0] - s[0] for s, e in zip(marks, ends, strict=True)],
        setup=marks[0][0],
        timer_syncs=[e[1] - s[1] for s, e in zip(marks, ends, strict=True)],
        sites=mode.sites(),
    )


def gpu_path_warp() -> WarpConfig:
    return WarpConfig(**GPU_PATH_WARP)
