"""The ``auto`` dtype of a model: what this CPU runs fastest (no torch import).

On a CPU with AMX (``amx_bf16``) or AVX-512 BF16 (``avx512_bf16``) a bfloat16 forward of the
smollm2 target costs about the same for 1 and for 5 tokens (verification nearly free, the regime
the MTAD paper is about), and less than float32; without them (AVX2 only) bfloat16 is emulated
and every extra row costs, so float32 is the faster choice (``bench/forward_shapes.py``
measures both). The CPU's flags are read by :mod:`mtad.runs.hardware`.
"""

from __future__ import annotations

import platform

from mtad.runs.hardware import BF16_FLAGS, device_kind, native_bf16

DTYPE_CHOICES = ("float32", "float16", "bfloat16", "auto")


def choose_dtype(
    requested: str, device: str, flags: frozenset[str] | None = None
) -> tuple[str, str]:
    """``(dtype, why)`` for a model asked to run in ``requested`` on ``device``.

    ``auto`` is bfloat16 on a CPU with native bfloat16 (:func:`native_bf16`) and float32 on
    any other CPU; on a GPU it is bfloat16 (every GPU this harness targets has it). Any other
    value is kept as it is."""
    if requested != "auto":
        return requested, "set in the config"
    kind = device_kind(device)
    if kind != "cpu":
        return "bfloat16", f"auto on {kind}: bfloat16"
    flag = native_bf16(flags)
    if flag:
        return "bfloat16", f"auto: this CPU has native bfloat16 ({flag})"
    return "float32", (
        f"auto: this CPU ({platform.machine()}) has no native bfloat16 "
        f"({' / '.join(BF16_FLAGS)} absent), float32 is faster"
    )


__all__ = ["DTYPE_CHOICES", "choose_dtype", "native_bf16"]
