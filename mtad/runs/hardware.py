"""The hardware rule: which facts about a machine decide a run's timing, so that they are part
of its identity (:mod:`mtad.runs.identity`) and every speed-up pairs runs of one machine kind.

Per device kind (:data:`TIMING_KEYS`):

- ``cpu``: the CPU model, its native-bfloat16 flag (the same dtype runs at very different
  speeds with and without AMX / AVX-512 BF16) and the torch thread count;
- ``cuda``: the GPU model and how many GPUs the run sees;
- ``mps``: the chip (its CPU model) and the thread count.

The dtypes are the pair's (``pair.*.dtype``, resolved from ``auto`` on the host), so they are
in the config part of the identity. The device *index* (``cuda:0`` vs ``cuda:1``) is not
hardware. What this module reads of the host (``/proc/cpuinfo``) needs no torch; the GPU facts
and the default thread count are torch's, probed by the harness
(:func:`mtad.harness.results.host_hardware`).
"""

from __future__ import annotations

import functools
import os
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# flags, best first, that give a CPU native bfloat16 matrix products
BF16_FLAGS = ("amx_bf16", "avx512_bf16")
# What decides timing on each device kind, besides the kind itself.
TIMING_KEYS: dict[str, tuple[str, ...]] = {
    "cpu": ("cpu_model", "cpu_bf16", "threads"),
    "cuda": ("gpu_model", "gpu_count"),
    "mps": ("cpu_model", "threads"),
}
# Every hardware fact metrics.json records (the union of the above).
HARDWARE_KEYS: tuple[str, ...] = (
    "device_kind",
    "cpu_model",
    "cpu_bf16",
    "gpu_model",
    "gpu_count",
    "threads",
)


def device_kind(device: object) -> str:
    """``cuda:1`` -> ``cuda``: the kind of a ``runtime.device`` string (or a ``torch.device``)."""
    return str(device).split(":", 1)[0]


@functools.cache
def _cpuinfo() -> tuple[str, ...]:
    try:
        return tuple(Path("/proc/cpuinfo").read_text().splitlines())
    except OSError:
        return ()


def cpu_flags() -> frozenset[str]:
    """The ``flags`` of the first processor in ``/proc/cpuinfo`` (empty where there is none)."""
    for line in _cpuinfo():
        if line.startswith(("flags", "Features")):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; ``platform.processor()`` elsewhere). The one
    host probe: the run identity, the kernel table's cache key (:mod:`mtad.engine.kernels`) and
    the benchmarks' CPU lines read it here."""
    for line in _cpuinfo():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def kernels_capped_below_avx512() -> bool:
    """Whether the environment keeps torch's kernels below AVX-512 on this host
    (``ATEN_CPU_CAPABILITY=avx2`` or ``default``, or ``ONEDNN_MAX_CPU_ISA`` naming an AVX2 or
    older ISA): bfloat16 products are then emulated whatever the flags say. The test command's
    AVX2 estimate runs on an AVX-512 host capped so (``scripts/test_time.py``)."""
    aten = os.environ.get("ATEN_CPU_CAPABILITY", "").lower()
    onednn = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    return aten in ("avx2", "default") or onednn in ("SSE41", "AVX") or onednn.startswith("AVX2")


def native_bf16(flags: frozenset[str] | None = None) -> str | None:
    """The best native-bfloat16 flag this CPU has (``amx_bf16``, ``avx512_bf16``), or None;
    None on this host too while its kernels are capped below AVX-512
    (:func:`kernels_capped_below_avx512`)."""
    if flags is None:
        if kernels_capped_below_avx512():
            return None
        flags = cpu_flags()
    return next((f for f in BF16_FLAGS if f in flags), None)


def cpu_features_text(flags: frozenset[str] | None = None) -> str:
    """The CPU's bfloat16 and matrix units as the benchmarks' CPU line names them:
    ``avx512_bf16, AMX`` or ``no avx512_bf16, no AMX`` (AMX: any ``amx_*`` flag)."""
    flags = cpu_flags() if flags is None else flags
    bf16 = "avx512_bf16" if "avx512_bf16" in flags else "no avx512_bf16"
    amx = "AMX" if any(f.startswith("amx") for f in flags) else "no AMX"
    return f"{bf16}, {amx}"


def cpu_hardware() -> dict[str, Any]:
    """What this host says of its CPU: model and native-bfloat16 flag (``none`` without)."""
    return {"cpu_model": cpu_model(), "cpu_bf16": native_bf16() or "none"}


def hardware_key(facts: Mapping[str, Any]) -> dict[str, Any]:
    """The facts of ``facts`` (a ``metrics.json`` or a host probe) that decide timing: the
    device kind and the :data:`TIMING_KEYS` of that kind, missing ones as None."""
    kind = facts.get("device_kind")
    if kind is None and facts.get("device") is not None:
        kind = device_kind(str(facts["device"]))
    return {"device_kind": kind, **{k: facts.get(k) for k in TIMING_KEYS.get(str(kind), ())}}


def hardware_text(key: Mapping[str, Any]) -> str:
    """A short readable form of a :func:`hardware_key` for tables: ``cpu: <model> (amx_bf16,
    1 thread)``, ``cpu: <model> (no native bfloat16, 1 thread)``, ``cuda: 2 x NVIDIA H100``."""
    kind = key.get("device_kind")
    if kind == "cuda":
        count = key.get("gpu_count")
        return (
            f"cuda: {count} x {key.get('gpu_model')}" if count else f"cuda: {key.get('gpu_model')}"
        )
    details = [str(key[k]) for k in ("cpu_bf16",) if key.get(k) is not None]
    details = ["no native bfloat16" if d == "none" else d for d in details]  # cpu_bf16 none
    if key.get("threads") is not None:
        n = int(key["threads"])
        details.append(f"{n} thread{'s' if n != 1 else ''}")
    inner = f" ({', '.join(details)})" if details else ""
    return f"{kind}: {key.get('cpu_model')}{inner}"


__all__ = [
    "BF16_FLAGS",
    "HARDWARE_KEYS",
    "TIMING_KEYS",
    "cpu_features_text",
    "cpu_flags",
    "cpu_hardware",
    "cpu_model",
    "device_kind",
    "hardware_key",
    "hardware_text",
    "kernels_capped_below_avx512",
    "native_bf16",
]
