"""MTAD [`mtad`]: beam-sampled draft block + joint verification of the longest passing prefix.

Qin et al., ICLR 2025 (arXiv 2407.09722). One iteration:

1. the draft beam-samples ``gamma`` tokens on ``B`` beams (:func:`mtad.methods.beam.beam_sample`)
   and keeps the max-weight beam ``x_1..x_gamma`` with its per-token ``log q_j(x_j)``;
2. one target forward over ``s + x`` gives warped ``p_j`` for ``j = 1..gamma+1``;
3. ``r_i = sum_{j<=i} log p_j(x_j) - log q_j(x_j)``; accept ``k = max{i : r_i > log tau}``
   (the LONGEST passing prefix, 0 if none) -- not the first failure;
4. commit ``x_1..x_k`` plus one token sampled from the plain target ``p_{k+1}`` (no residual).
"""

from __future__ import annotations

import math

import torch

from mtad.engine import (
    Candidates,
    DecodeContext,
    DecodingMethod,
    DraftDepth,
    StepResult,
    warp_candidates,
)
from mtad.methods.beam import beam_sample
from mtad.methods.common import read_block
from mtad.methods.params import MTADParams
from mtad.methods.registry import register_method


def joint_log_ratios(logp_x: torch.Tensor, logq_x: torch.Tensor) -> torch.Tensor:
    """``r_i = sum_{j<=i} (log p_j(x_j) - log q_j(x_j))`` for ``i = 1..gamma``."""
    return torch.cumsum(logp_x - logq_x, dim=-1)


def accept_longest_prefix(log_ratios: torch.Tensor, tau: float) -> torch.Tensor:
    """``k = max{i : r_i > log tau}`` (1-based; 0 when no prefix passes), as a 0-d tensor.

    Strict inequality, as in the paper. ``r_i`` may be ``-inf`` (target gives a drafted token
    zero probability after warping): that prefix fails, later ones may not be reached.
    """
    positions = torch.arange(1, log_ratios.shape[-1] + 1, device=log_ratios.device)
    passing = log_ratios > math.log(tau)
    return torch.where(passing, positions, 0).max()


def verify_block(
    logp: torch.Tensor | Candidates, x: torch.Tensor, logq_x: torch.Tensor, tau: float
) -> torch.Tensor:
    """Accepted length ``k`` (0-d tensor) for drafted ``x`` ``[g]`` given the warped target
    ``logp`` (``[g (+1), V]`` log-probs, or :class:`~mtad.engine.warping.Candidates` rows) and the
    draft's per-token ``logq_x`` ``[g]``."""
    g = x.shape[0]
    if isinstance(logp, Candidates):
        logp_x = logp[:g].logp_of(x)
    else:
        logp_x = logp[:g].gather(1, x[:, None]).squeeze(1)
    return accept_longest_prefix(joint_log_ratios(logp_x, logq_x), tau)


@register_method(MTADParams)
class MTAD(DecodingMethod):
    name = "mtad"
    uses_draft = True

    def __init__(self, params: MTADParams) -> None:
        self.params = params

    def draft_depth(self) -> DraftDepth:
        return DraftDepth("gamma", self.params.gamma)

    def step(self, ctx: DecodeContext) -> StepResult:
        prm = self.params
        g = prm.gamma
        assert ctx.draft is not None
        with ctx.timed("draft"):
            beams = beam_sample(ctx.draft, ctx.ids, prm.beam, ctx.generator, reorder_last=False)
            best = beams.best
            x, logq_x = beams.tokens[best], beams.logq[best]
            # the cache's rows are in their order before the last step: the best beam's
            # context is its parent's row (one row selected, no reorder of all rows first)
            ctx.draft.select_rows(beams.parents[-1][best].view(1))
        with ctx.timed("verify"):
            logits = ctx.target.feed(ctx.ids, extra=x)[0, -(g + 1) :]
            logp = warp_candidates(logits, prm.warp)  # g + 1 rows
            k = verify_block(logp, x, logq_x, prm.tau)
            next_token = logp[k.reshape(1)][0].sample(ctx.generator, prm.greedy)
            k, tokens, ids = read_block(k, x, next_token)  # the one host sync of the iteration
            ctx.target.crop(ctx.n + k)
            ctx.draft.crop(ctx.n + k)
        return StepResult(tokens, drafted=g, accepted=k, token_ids=ids)
