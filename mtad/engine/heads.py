"""The logits head a :class:`~mtad.engine.runner.ModelRunner` calls: the model's own, or a CPU
projection that is faster for the few rows decoding projects (:class:`CPUHeadLM`)."""

from __future__ import annotations

from typing import Any

import torch
from transformers import PreTrainedModel

HEAD_MODES = ("auto", "stock", "fast")
# Causal LMs whose logits are exactly ``lm_head(base_model(...).last_hidden_state)`` (no bias,
# scaling or soft-capping): the only ones :class:`CPUHeadLM` may stand in for.
PLAIN_HEAD_ARCHS = ("LlamaForCausalLM", "OPTForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
FAST_HEAD_MIN_VOCAB = 8192
FAST_HEAD_MAX_ROWS = 10  # beyond this, sgemm's own blocking wins again (bench/lm_head.py)


class CPUHeadLM(torch.nn.Module):
    """A causal LM whose output projection is computed the way a CPU BLAS is fastest.

    Decoding projects 1 to ~10 hidden rows onto a 32k-150k vocabulary. On the CPUs we measured
    (AVX2, MKL, 1 thread; ``bench/forward_shapes.py``), ``F.linear(x, W)`` -- ``x @ W.T`` with
    the weight read transposed -- is the slow case of sgemm: for SmolLM2's 49152 x 576 head,
    1 row took 18.9 ms and 5 rows 52 ms, while ``x @ W.T.contiguous()`` took 9.3 ms for one row
    and ``(W @ x.T).T`` 26-32 ms for five (and was fastest for every size from 2 to 128 rows).
    That head is a fifth of a target forward and most of a draft forward, so the choice matters.
    From ~16 rows on (prefill, large trees) ``F.linear`` is faster again and is used.
    Same arithmetic, different summation order: logits agree with the stock head to ~1e-6
    relative. The transposed copy costs one extra head's worth of memory (made on first use).
    The copy is remade whenever the head weight changes: a new tensor (``data_ptr``), another
    shape, or an in-place write (``weight._version``, bumped by ``mul_``, ``copy_``,
    ``load_state_dict``), so edited or reloaded weights are never projected with stale values.
    Writes through ``weight.data`` bypass the version counter and are not seen: edit weights
    under ``torch.no_grad()`` instead (as ``load_state_dict`` does).
    """

    @staticmethod
    def kernel_for(rows: int) -> str:
        """``copy`` (x @ W.T made contiguous once), ``w_xt`` ((W @ x.T).T) or ``linear``."""
        if rows == 1:
            return "copy"
        return "w_xt" if rows <= FAST_HEAD_MAX_ROWS else "linear"

    def __init__(self, model: PreTrainedModel) -> None:
        super().__init__()
        self.lm = model
        self._wt: torch.Tensor | None = None
        self._wt_key: tuple[int, int, tuple[int, ...]] | None = None

    def project(self, hidden: torch.Tensor) -> torch.Tensor:
        weight = self.lm.get_output_embeddings().weight
        x = hidden.reshape(-1, hidden.shape[-1])
        kernel = self.kernel_for(x.shape[0])
        if kernel == "copy":
            key = (weight.data_ptr(), weight._version, tuple(weight.shape))
            if self._wt is None or self._wt_key != key:
                self._wt = weight.detach().T.contiguous()
                self._wt_key = key
            out = x @ self._wt
        elif kernel == "w_xt":
            out = (weight @ x.T).T.contiguous()
        else:
            out = torch.nn.functional.linear(x, weight)
        return out.view(*hidden.shape[:-1], out.shape[-1])

    def forward(self, input_ids: torch.Tensor, logits_to_keep: int = 0, **kwargs: Any):
        hidden = self.lm.base_model(input_ids=input_ids, **kwargs).last_hidden_state
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        return self.project(hidden)


def head_for(model: PreTrainedModel, mode: str = "auto") -> torch.nn.Module:
    """The module a :class:`ModelRunner` calls for logits: the model itself (``stock``) or a
    :class:`CPUHeadLM` around it (``fast``; ``auto`` picks it for a float32 model on the CPU
    with a large vocabulary and a plain head)."""
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
        and head.weight.dtype == torch.float32
        and head.weight.shape[0] >= FAST_HEAD_MIN_VOCAB
    ):
        return CPUHeadLM(model)
    return model
