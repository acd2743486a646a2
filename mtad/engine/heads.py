"""The logits head a :class:`~mtad.engine.runner.ModelRunner` calls: the model's own, or a CPU
projection with the kernel measured fastest on this machine for each row count
(:class:`CPUHeadLM`)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from transformers import PreTrainedModel

from mtad.engine.kernels import KernelTable, kernel_table
from mtad.engine.packed import PackedWeight, packable, weight_key
from mtad.engine.packed import linear as packed_linear

HEAD_MODES = ("auto", "stock", "fast")
# Causal LMs whose logits are exactly ``lm_head(base_model(...).last_hidden_state)`` (no bias,
# scaling or soft-capping): the only ones :class:`CPUHeadLM` may stand in for.
PLAIN_HEAD_ARCHS = ("LlamaForCausalLM", "OPTForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
FAST_HEAD_MIN_VOCAB = 8192
FAST_HEAD_DTYPES = (torch.float32, torch.bfloat16)
# The output-projection kernels, in tie-break order (the stock one first); ``packed`` (oneDNN's
# blocked copy of the weight, mtad.engine.packed) only where the weight is packable.
HEAD_KERNELS = ("linear", "copy", "w_xt", "packed")
# Rows up to this are measured (decoding: verification blocks, beams, trees); beyond it (prefill
# with every position's logits) F.linear runs unmeasured: sgemm's own blocking is efficient there
# and timing a candidate would cost as much as the forward it serves.
MEASURED_MAX_ROWS = 64


class CPUHeadLM(torch.nn.Module):
    """A causal LM whose output projection runs the kernel measured fastest on this CPU.

    Decoding projects 1 to ~10 hidden rows onto a 32k-150k vocabulary, and the fastest way to
    do that depends on the CPU, the dtype and the row count (``bench/lm_head.py``). On an AVX2
    EPYC (MKL, 1 thread, float32, SmolLM2's 49152 x 576 head) ``F.linear(x, W)`` -- ``x @ W.T``
    with the weight read transposed -- took 18.9 ms for 1 row, ``x @ W.T.contiguous()`` 9.3 ms
    and ``(W @ x.T).T`` was fastest from 2 rows on; on an AVX-512 Xeon with AMX that rule was
    1.8-2.6x slower than the best kernel for 2-5 rows; in bfloat16 oneDNN's ``F.linear`` is
    usually the fastest of the three, and oneDNN on a prepacked copy of the weight
    (:mod:`mtad.engine.packed`) 1.7-1.8x faster still. So the kernel is chosen by measurement:
    the first projection of each (dtype, head shape, row count) times the kernels (``linear``,
    ``copy``, ``w_xt``, and ``packed`` where the weight is packable; :data:`HEAD_KERNELS`)
    through :class:`~mtad.engine.kernels.KernelTable`, whose file cache makes later runs start
    at once. The choices made are in :attr:`kernels` (recorded in ``metrics.json`` as
    ``lm_head_kernels``).

    Same arithmetic, different summation order: logits agree with ``F.linear`` to ~1e-6
    relative in float32 (bfloat16: to the output's own rounding). The transposed and the packed
    copies each cost one extra head's worth of memory and exist only while some row count uses
    them. Each is remade whenever the head weight changes: a new tensor (``data_ptr``), another
    shape, or an in-place write (``weight._version``, bumped by ``mul_``, ``copy_``,
    ``load_state_dict``), so edited or reloaded weights are never projected with stale values.
    Writes through ``weight.data`` bypass the version counter and are not seen: edit weights
    under ``torch.no_grad()`` instead
    (as ``load_state_dict`` does).

    ``kernel`` forces one kernel for every row count (tests and benchmarks); ``table`` replaces
    the process-wide :func:`~mtad.engine.kernels.kernel_table`.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        kernel: str | None = None,
        table: KernelTable | None = None,
    ) -> None:
        super().__init__()
        if kernel is not None and kernel not in HEAD_KERNELS:
            raise ValueError(f"kernel must be one of {HEAD_KERNELS}, got {kernel!r}")
        self.lm = model
        self.forced = kernel
        self.table = table
        self._chosen: dict[tuple[int, torch.dtype, tuple[int, ...]], str] = {}
        self._wt: torch.Tensor | None = None
        self._wt_key: tuple[int, int, tuple[int, ...]] | None = None
        self._pack = PackedWeight()  # oneDNN's blocked copy, made when "packed" is timed

    @property
    def weight(self) -> torch.Tensor:
        return self.lm.get_output_embeddings().weight

    @property
    def kernels(self) -> dict[int, str]:
        """Row count -> the kernel it runs, for the head weight's current dtype and shape."""
        w = self.weight
        return {
            rows: k
            for (rows, dtype, shape), k in sorted(self._chosen.items(), key=lambda kv: kv[0][0])
            if dtype == w.dtype and shape == tuple(w.shape)
        }

    def kernel_for(self, rows: int) -> str:
        """The kernel ``rows`` rows run: forced, remembered, or measured now (first use)."""
        if self.forced is not None:
            return self.forced
        w = self.weight
        key = (rows, w.dtype, tuple(w.shape))
        kernel = self._chosen.get(key)
        if kernel is None:
            kernel = self._chosen[key] = head_kernel(
                w, rows, self.table, lambda: self._transposed(w), self._pack
            )
            # measured, not kept: free the copies no row count runs
            if "copy" not in self._chosen.values():
                self._wt = self._wt_key = None
            if "packed" not in self._chosen.values():
                self._pack = PackedWeight()
        return kernel

    def _transposed(self, weight: torch.Tensor) -> torch.Tensor:
        key = weight_key(weight)
        if self._wt is None or self._wt_key != key:
            self._wt = weight.detach().T.contiguous()
            self._wt_key = key
        return self._wt

    def _run(self, kernel: str, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return project_rows(kernel, x, weight, lambda: self._transposed(weight), self._pack)

    def project(self, hidden: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        x = hidden.reshape(-1, hidden.shape[-1])
        out = self._run(self.kernel_for(x.shape[0]), x, weight)
        return out.view(*hidden.shape[:-1], out.shape[-1])

    def forward(self, input_ids: torch.Tensor, logits_to_keep: int = 0, **kwargs: Any):
        hidden = self.lm.base_model(input_ids=input_ids, **kwargs).last_hidden_state
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        return self.project(hidden)


def head_kernels(weight: torch.Tensor) -> tuple[str, ...]:
    """The :data:`HEAD_KERNELS` that can run on ``weight`` (``packed``: where packable)."""
    return tuple(k for k in HEAD_KERNELS if k != "packed" or packable(weight))


def project_rows(
    kernel: str,
    x: torch.Tensor,
    weight: torch.Tensor,
    transposed: Callable[[], torch.Tensor],
    pack: PackedWeight | None = None,
) -> torch.Tensor:
    """``F.linear(x, weight)`` for ``x`` ``[rows, hidden]`` by one of :data:`HEAD_KERNELS`:
    ``linear``; ``copy``, ``x @ W.T`` with ``W.T`` made contiguous (``transposed()``, made once
    by the caller); ``w_xt``, ``(W @ x.T).T`` (the weight as stored, the rows as columns);
    ``packed``, oneDNN on ``pack``'s blocked copy of the weight (``F.linear`` where the weight
    is not packable or no ``pack`` is given)."""
    if kernel == "copy":
        return x @ transposed()
    if kernel == "w_xt":
        return (weight @ x.T).T.contiguous()
    if kernel == "packed":
        return packed_linear(x, weight, pack=pack)
    return torch.nn.functional.linear(x, weight)


def head_kernel(
    weight: torch.Tensor,
    rows: int,
    table: KernelTable | None = None,
    transposed: Callable[[], torch.Tensor] | None = None,
    pack: PackedWeight | None = None,
) -> str:
    """The fastest of :data:`HEAD_KERNELS` for projecting ``rows`` rows onto ``weight`` on this
    machine: the table's cached choice, or measured now on random rows (and cached). The one
    rule :class:`CPUHeadLM` and ``bench/lm_head.py`` both follow; ``linear`` unmeasured beyond
    :data:`MEASURED_MAX_ROWS` rows and off the CPU."""
    if rows > MEASURED_MAX_ROWS or weight.device.type != "cpu":
        return "linear"  # (off the CPU: the stock kernel, unmeasured)
    table = table if table is not None else kernel_table()
    if transposed is None:  # made on first call, once
        transposed = functools.cache(lambda: weight.detach().T.contiguous())
    x = torch.randn(rows, weight.shape[1]).mul_(weight.shape[1] ** -0.5).to(weight.dtype)
    pack = pack if pack is not None else PackedWeight()
    key = KernelTable.key("lm_head", weight.dtype, rows, *weight.shape)
    kernels = {
        k: (lambda k=k: project_rows(k, x, weight, transposed, pack)) for k in head_kernels(weight)
    }
    return table.choose(key, kernels)


def head_for(model: PreTrainedModel, mode: str = "auto") -> torch.nn.Module:
    """The module a :class:`ModelRunner` calls for logits: the model itself (``stock``) or a
    :class:`CPUHeadLM` around it (``fast``; ``auto`` picks it for a float32 or bfloat16 model
    on the CPU with a large vocabulary and a plain head, where it costs nothing: when
    ``F.linear`` is fastest it runs that)."""
    if mode not in HEAD_MODES:
        raise ValueError(f"head must be one of {HEAD_MODES}, got {mode!r}")
    if mode == "stock":
        return model
    head = model.get_output_embeddings()
    plain = (
        type(model).__name__ in PLAIN_HEAD_ARCHS
        and isinstance(head, torch.nn.Linear)
        and head.bias is None
        and hasattr(model, "base_model")
    )
    if mode == "fast":
        if not plain:
            raise ValueError(f"head: 'fast' needs one of {PLAIN_HEAD_ARCHS} with a bias-free head")
        return CPUHeadLM(model)
    if (
        plain
        and head.weight.device.type == "cpu"
        and head.weight.dtype in FAST_HEAD_DTYPES
        and head.weight.shape[0] >= FAST_HEAD_MIN_VOCAB
    ):
        return CPUHeadLM(model)
    return model
