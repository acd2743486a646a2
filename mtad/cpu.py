"""What this CPU can do fast, read from ``/proc/cpuinfo`` (no torch import): native bfloat16
matrix instructions decide the ``auto`` dtype of CPU models.

On a CPU with AMX (``amx_bf16``) or AVX-512 BF16 (``avx512_bf16``) a bfloat16 forward of the
smollm2 target costs about the same for 1 and for 5 tokens (verification nearly free, the regime
the MTAD paper is about), and less than float32; without them (AVX2 only) bfloat16 is emulated
and every extra row costs, so float32 is the faster choice (``bench/forward_shapes.py``
measures both).
"""

from __future__ import annotations

import functools
import platform
from pathlib import Path

# flags, best first, that give this CPU native bfloat16 matrix products
BF16_FLAGS = ("amx_bf16", "avx512_bf16")
DTYPE_CHOICES = ("float32", "float16", "bfloat16", "auto")


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The ``flags`` of the first processor in ``/proc/cpuinfo`` (empty where there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def native_bf16(flags: frozenset[str] | None = None) -> str | None:
    """The best native-bfloat16 flag this CPU has (``amx_bf16``, ``avx512_bf16``), or None."""
    flags = cpu_flags() if flags is None else flags
    return next((f for f in BF16_FLAGS if f in flags), None)


def choose_dtype(
    requested: str, device: str, flags: frozenset[str] | None = None
) -> tuple[str, str]:
    """``(dtype, why)`` for a model asked to run in ``requested`` on ``device``.

    ``auto`` is bfloat16 on a CPU with native bfloat16 (:func:`native_bf16`) and float32 on
    any other CPU; on a GPU it is bfloat16 (every GPU this harness targets has it). Any other
    value is kept as it is."""
    if requested != "auto":
        return requested, "set in the config"
    kind = str(device).split(":", 1)[0]
    if kind != "cpu":
        return "bfloat16", f"auto on {kind}: bfloat16"
    flag = native_bf16(flags)
    if flag:
        return "bfloat16", f"auto: this CPU has native bfloat16 ({flag})"
    return "float32", (f"auto: this CPU ({platform.machine()}) has no native bfloat16 "
                       f"({' / '.join(BF16_FLAGS)} absent), float32 is faster")


def bf16_identity(device: str) -> str | None:
    """What the run signature records of the CPU: its native-bfloat16 flag or ``none`` (the
    same dtype runs at very different speeds with and without it); None off the CPU."""
    if str(device).split(":", 1)[0] != "cpu":
        return None
    return native_bf16() or "none"
