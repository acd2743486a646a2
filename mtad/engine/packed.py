"""Linear layers on oneDNN-prepacked weights: the CPU's bfloat16 decoding projections.

``F.linear`` on bfloat16 CPU tensors runs oneDNN's matmul, which first reorders the weight
into its blocked (AMX / AVX-512 BF16) layout, on every call: for decoding's few rows that
reorder costs about as much as the product itself. Reordering once and keeping the blocked copy
(what IPEX and Inductor's CPU freezing pass do, through the same ``torch.ops.mkldnn`` ops) gives
the same numbers for less (bit for bit on the Xeon below; elsewhere at most another summation
order). Measured on a 2-core Intel Xeon (AVX-512 BF16, AMX), torch 2.13, one thread, timed
side by side (``bench/README.md``; ``bench.packed_linears`` repeats the whole-model part):

* SmolLM2-135M's shapes: 576x576 2.0-2.1x faster packed at 1-5 rows, 1.3x at 128, 1.2x at 512;
  1536x576 2.2-2.7x at 1-5 rows; the 49152x576 output projection 1.7-1.8x at 1-128 rows, 1.0x
  at 512; outputs equal (``torch.equal``) at every size tried;
* at 1,024-2,048 rows (long prefills) the two trade places (0.7-1.2x), so more than
  :data:`PACKED_MAX_ROWS` rows take the stock path;
* float32 packed was 0.73x of MKL's sgemm: float32 keeps the stock path.

Whole decoding loops (``bench.overhead --dtype bfloat16 --methods ar,sps,mtad``, ``--linears
stock`` against the default, the same tokens): AR +13% tokens/s, SpS +17%, MTAD with the
feature head +17%.

What may be packed is decided in one place (:func:`packable`): a 2-D bfloat16 CPU weight when
torch's oneDNN supports bfloat16 on this CPU, and a call that needs no gradient (training falls
back to ``F.linear``, whose backward autograd knows). The blocked copy (:class:`PackedWeight`)
costs the weight's size again in memory and is remade whenever the weight changes: a new tensor
(``data_ptr``), another shape, or an in-place write (``_version``, as
:class:`~mtad.engine.heads.CPUHeadLM` checks for its transposed copy).

Two kinds of module use it: every ``nn.Linear`` (swapped in place to :class:`PackedLinear`,
parameters and state dict unchanged) and modules that project onto a weight they hold as a
tensor (the FR-Spec :class:`~mtad.engine.subvocab.SubVocabHead`, the feature head's logits):
those define ``packs_projection = True`` and call :func:`linear` with their ``pack``
attribute. :func:`set_linears` turns both on or off for a model (``runtime.linears``).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

LINEARS_MODES = ("auto", "stock")
# More rows than this (long prefills) take the stock path: there oneDNN's own per-call choice
# was as fast or faster (measured above).
PACKED_MAX_ROWS = 512
# oneDNN's reorder takes the expected row count as a hint for the blocked layout; the layout
# made for decoding's few rows served 1-512 rows as measured above.
PACK_ROWS_HINT = 4


@functools.cache
def bf16_packing_supported() -> bool:
    """Whether torch's oneDNN runs bfloat16 matmuls on this CPU (AVX-512 BF16 / AMX)."""
    try:
        return bool(
            torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
        )
    except (AttributeError, RuntimeError):
        return False


def packable(weight: torch.Tensor) -> bool:
    """The one rule for what gets a blocked copy: a 2-D bfloat16 CPU weight, where oneDNN
    supports bfloat16."""
    return (
        weight.dim() == 2
        and weight.dtype == torch.bfloat16
        and weight.device.type == "cpu"
        and bf16_packing_supported()
    )


def weight_key(weight: torch.Tensor) -> tuple[int, int, tuple[int, ...]]:
    """What a copy derived from ``weight`` is valid for: the tensor (``data_ptr``), its
    in-place writes (``_version``; -1 for an inference tensor, made under
    ``torch.inference_mode``, which counts none) and its shape."""
    version = -1 if weight.is_inference() else weight._version
    return (weight.data_ptr(), version, tuple(weight.shape))


class PackedWeight:
    """oneDNN's blocked copy of one weight, made on first use and remade when the weight
    changes (new tensor, shape, or an in-place write; not seen: in-place writes to an inference
    tensor, which counts no versions, and writes through ``weight.data``)."""

    __slots__ = ("_key", "_packed")

    def __init__(self) -> None:
        self._key: tuple[int, int, tuple[int, ...]] | None = None
        self._packed: torch.Tensor | None = None

    def of(self, weight: torch.Tensor) -> torch.Tensor:
        key = weight_key(weight)
        if self._packed is None or key != self._key:
            self._packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_ROWS_HINT)
            self._key = key
        return self._packed


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    pack: PackedWeight | None = None,
) -> torch.Tensor:
    """``F.linear(x, weight, bias)``, on ``pack``'s blocked copy of ``weight`` when there is
    one, the weight is :func:`packable`, ``x`` matches it, no gradient is needed and ``x`` has
    at most :data:`PACKED_MAX_ROWS` rows; else the stock call."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if (
        pack is None
        or not 0 < rows <= PACKED_MAX_ROWS
        or x.dtype != weight.dtype
        or x.device != weight.device
        or not packable(weight)
        or (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
    ):
        return F.linear(x, weight, bias)
    flat = x.reshape(rows, x.shape[-1]).contiguous()
    out = torch.ops.mkldnn._linear_pointwise(flat, pack.of(weight), bias, "none", [], "")
    return out.view(*x.shape[:-1], out.shape[-1])


class PackedLinear(torch.nn.Linear):
    """An ``nn.Linear`` whose forward runs :func:`linear` on a blocked copy of its weight.
    Made by swapping the class of an existing layer (:func:`set_linears`): same parameters,
    same state dict, same outputs."""

    pack: PackedWeight

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 (nn.Linear's name)
        return linear(input, self.weight, self.bias, self.pack)


def set_linears(model: torch.nn.Module, mode: str = "auto") -> int:
    """Run ``model``'s projections on blocked weights (``auto``, where :func:`packable`) or as
    stock (``stock``, undoing an earlier ``auto``); returns how many are packed now. A blocked
    copy is made on a projection's first call: one never called (an output projection that
    :class:`~mtad.engine.heads.CPUHeadLM` stands in for) costs no memory."""
    if mode not in LINEARS_MODES:
        raise ValueError(f"linears must be one of {LINEARS_MODES}, got {mode!r}")
    on = mode == "auto"
    packed = 0
    for module in model.modules():
        # exactly nn.Linear: a subclass (quantised, LoRA, ...) computes something else
        if type(module) is torch.nn.Linear and on and packable(module.weight):
            module.__class__ = PackedLinear
            module.pack = PackedWeight()
        elif type(module) is PackedLinear and not on:
            module.__class__ = torch.nn.Linear
            del module.pack
        if type(module) is PackedLinear:
            packed += 1
        elif getattr(module, "packs_projection", False):
            weight = module.projection_weight
            module.pack = PackedWeight() if on and packable(weight) else None
            packed += module.pack is not None
    return packed
