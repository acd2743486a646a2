"""Tensor helpers shared by several methods, and the shared parameters (defined, free of torch,
in :mod:`mtad.methods.params`)."""

from __future__ import annotations

import torch

from mtad.methods.params import (
    BeamParams,
    SamplingParams,
    check_beam_width,
    check_gamma,
    check_tau,
)

__all__ = [
    "BeamParams",
    "SamplingParams",
    "check_beam_width",
    "check_gamma",
    "check_tau",
    "leading_true_count",
    "read_block",
]


def leading_true_count(mask: torch.Tensor) -> torch.Tensor:
    """Length of the all-True prefix of a 1-D bool mask, as a 0-d tensor (no host sync)."""
    return mask.to(torch.long).cumprod(dim=0).sum()


def read_block(
    k: torch.Tensor, x: torch.Tensor, next_token: torch.Tensor
) -> tuple[int, torch.Tensor, list[int]]:
    """The iteration's one host read, for a block ``x`` ``[g]`` of which ``k`` (0-d tensor) were
    accepted and the target's ``next_token`` (one token, computed from ``k`` on the device):
    ``(k, tokens, token_ids)``, the committed ``x[:k] + next_token`` on the device and as host
    ints (:attr:`mtad.engine.loop.StepResult.token_ids`)."""
    nxt = next_token.reshape(1)
    vals = torch.cat([k.reshape(1).to(x.dtype), x, nxt.to(x.dtype)]).tolist()
    n = int(vals[0])
    return n, torch.cat([x[:n], nxt]), [*vals[1 : 1 + n], vals[-1]]
