"""CPU kernel choice by measurement: time the candidates once per machine, keep the fastest.

Several CPU fast paths of the engine have more than one way to compute the same thing (the
logits head: :class:`~mtad.engine.heads.CPUHeadLM`; the top-k candidate search:
:func:`mtad.engine._warping_cpu.topk_rows`), and which one is fastest depends on the CPU, its
BLAS / oneDNN kernels, the dtype, the shape and the thread count: a rule measured on one machine
is wrong on the next (issue 22: the AVX2 rule for the head was 1.8-2.6x slower than the best
kernel on an AVX-512 Xeon with AMX). So nothing is hard-coded: the first time a fast path meets a
shape, :meth:`KernelTable.choose` times every candidate (interleaved rounds, best of a few, well
under a second in total) and keeps the fastest. The table is cached in a small JSON file per CPU
model and torch version (``$MTAD_KERNEL_CACHE``, else ``$XDG_CACHE_HOME/mtad/`` or
``~/.cache/mtad/``), so later runs start at once. A file that cannot be read, is malformed or was
written for another machine is ignored and rebuilt; delete it to measure again.

The idea is the one of autotuners such as ATLAS (Whaley & Dongarra, "Automatically Tuned Linear
Algebra Software", SC 1998) and FFTW's planner (Frigo & Johnson, ICASSP 1998): measure on the
machine at hand instead of predicting, and remember the answer ("wisdom").
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import statistics
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from mtad.runs.hardware import cpu_model

CACHE_ENV = "MTAD_KERNEL_CACHE"
FORMAT = 3  # bump when how a choice is measured changes: older tables are then remeasured
ROUNDS = 4  # timed rounds per candidate after one warm-up round; the best round counts
CLOSE = 0.15  # ... unless the two fastest are this close: then MORE_ROUNDS more, and the median
MORE_ROUNDS = 8


@functools.cache
def _machine_items() -> tuple[tuple[str, str], ...]:
    capability = str(torch.backends.cpu.get_cpu_capability())
    return (("cpu", cpu_model()), ("capability", capability), ("torch", torch.__version__))


def machine() -> dict[str, str]:
    """What a measured choice is valid for: CPU model, ISA level torch dispatches to, torch."""
    return dict(_machine_items())


def default_cache_path() -> Path:
    """``$MTAD_KERNEL_CACHE``, else ``<cache folder>/mtad/kernels-<machine hash>.json``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    digest = hashlib.sha1(json.dumps(machine(), sort_keys=True).encode()).hexdigest()[:12]
    return root / "mtad" / f"kernels-{digest}.json"


def cpu_clock() -> Callable[[], float]:
    """The clock candidates are timed by: with one torch thread, the process's CPU time (a
    busy neighbour that preempts us does not count, as on a shared 2-core box it otherwise
    would); with more, wall time (CPU time would favour kernels that use fewer threads)."""
    return time.process_time if torch.get_num_threads() == 1 else time.perf_counter


def last_level_cache_bytes() -> int:
    """Size of the CPU's largest cache (Linux sysfs; 32 MiB when unknown)."""
    sizes = []
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        try:
            text = path.read_text().strip().upper()
        except OSError:
            continue
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes, default=32 * 2**20)


# The most an evictor writes: about what a small pair's decoding forward streams (the smollm2
# target's weights are 270 MB in bfloat16). Twice a 480 MiB L3 (an Intel Xeon here) made every
# timed call write ~1 GB: 10 s of a topk measurement, paid on every new host and test worker.
EVICTOR_MAX_BYTES = 256 * 2**20


def cache_evictor() -> Callable[[], None]:
    """A function that writes a buffer twice the size of the last-level cache (at most
    :data:`EVICTOR_MAX_BYTES`), as a decoding forward streams its weights through it: the code
    between forwards runs with cold caches (the dispatcher's instructions included), where
    every extra small op costs several times what it does in a tight loop. Kernels for that
    code are timed after calling it. The buffer lives as long as the function."""
    buffer = torch.zeros(min(2 * last_level_cache_bytes(), EVICTOR_MAX_BYTES) // 4)

    def evict() -> None:
        buffer.add_(1.0)

    return evict


def time_candidates(
    candidates: Mapping[str, Callable[[], object]],
    rounds: int = ROUNDS,
    close: float = CLOSE,
    more: int = MORE_ROUNDS,
    clock: Callable[[], float] | None = None,
    before: Callable[[], None] | None = None,
) -> dict[str, float]:
    """Time (seconds, by :func:`cpu_clock`) of each candidate: the best of ``rounds``
    interleaved rounds after one warm-up round; when the two fastest are within ``close`` of
    each other, the median of ``rounds + more`` rounds instead (a close call deserves more
    samples, and the median is what a long run sees). Interleaving spreads a busy neighbour's
    noise over all candidates alike. ``before`` runs (untimed) before every timed call, e.g.
    one made by :func:`cache_evictor`."""
    times: dict[str, list[float]] = {name: [] for name in candidates}
    clock = clock or cpu_clock()

    def run(n: int) -> None:
        for _ in range(n):
            for name, fn in candidates.items():
                if before is not None:
                    before()  # untimed
                start = clock()
                fn()
                times[name].append(clock() - start)

    for fn in candidates.values():  # warm-up: first-call allocations, caches
        fn()
    run(rounds)
    best = sorted(min(t) for t in times.values())
    if len(best) < 2 or best[1] > best[0] * (1 + close):
        return {name: min(t) for name, t in times.items()}
    run(more)
    return {name: statistics.median(t) for name, t in times.items()}


class KernelTable:
    """Measured kernel choices, one per key, cached in a JSON file for this machine.

    A key names the operation, dtype, shape and thread count (:meth:`key`); the value is the
    name of the fastest candidate. The file holds ``{"format", "machine", "choices"}``; any
    other content, or another machine's, counts as empty and is overwritten on the next choice.
    Writing is best effort (a read-only cache folder keeps the table in memory only).
    """

    def __init__(self, path: Path | str | None = None) -> None:
        self.path = Path(path) if path is not None else default_cache_path()
        self.machine = machine()
        self.choices: dict[str, str] = {}
        self.measured: dict[str, dict[str, float]] = {}  # this process's timings (ms)
        self.loaded_from_file = self._load()

    @staticmethod
    def key(op: str, dtype: torch.dtype, *shape: int) -> str:
        """``op|dtype|d0xd1x...|t<threads>``: what a choice depends on besides the machine."""
        dims = "x".join(str(int(d)) for d in shape)
        return f"{op}|{str(dtype).removeprefix('torch.')}|{dims}|t{torch.get_num_threads()}"

    def _load(self) -> bool:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return False
        if (
            not isinstance(data, dict)
            or data.get("format") != FORMAT
            or data.get("machine") != self.machine
            or not isinstance(data.get("choices"), dict)
            or not all(isinstance(v, str) for v in data["choices"].values())
        ):
            return False
        self.choices = {str(k): v for k, v in data["choices"].items()}
        return True

    def save(self) -> None:
        """Write the table atomically (temporary file + rename); errors are ignored."""
        data = {"format": FORMAT, "machine": self.machine, "choices": self.choices}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
            os.replace(tmp, self.path)
        except OSError:
            pass

    def known(self, key: str, names: tuple[str, ...]) -> str | None:
        """The cached choice for ``key`` when it is one of ``names`` (None: not measured)."""
        known = self.choices.get(key)
        return known if known in names else None

    def choose(
        self,
        key: str,
        candidates: Mapping[str, Callable[[], object]],
        before: Callable[[], None] | None = None,
    ) -> str:
        """The cached choice for ``key`` if it names a candidate; else time them all (each
        call after ``before``, see :func:`time_candidates`), keep the fastest (the first listed
        on a tie) and save the table."""
        known = self.choices.get(key)
        if known in candidates:
            return known
        with torch.inference_mode():
            best = time_candidates(candidates, before=before)
        choice = min(candidates, key=lambda name: best[name])
        self.choices[key] = choice
        self.measured[key] = {name: 1e3 * t for name, t in best.items()}
        self.save()
        return choice


_table: KernelTable | None = None


def kernel_table() -> KernelTable:
    """The process-wide table (made on first use, from :func:`default_cache_path`)."""
    global _table
    if _table is None or _table.path != default_cache_path():
        _table = KernelTable()
    return _table
