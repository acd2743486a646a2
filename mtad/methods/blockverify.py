"""Block verification [`blockverify`] (Sun, Mendlovic, Leviathan, Aharoni, Ro, Beirami and
Suresh, "Block Verification Accelerates Speculative Decoding", ICLR 2025, arXiv 2403.10444,
Algorithm 2).

Drafting and the target forward are SpS's (:func:`mtad.methods.sps.draft_tokens`, one target
forward over the block); only the verification differs: the block is verified jointly. With
``p_i`` / ``q_i`` the warped target / draft distributions of position ``i`` (given the drafted
prefix ``x_1..x_{i-1}``, rows ``0..gamma`` of the forward):

* the acceptance weight of each prefix, ``w_0 = 1``, ``w_i = min(1, w_{i-1} p_i(x_i) / q_i(x_i))``
  (:func:`block_log_weights`);
* the weighted residual of each row, ``max(0, w_i p_{i+1} - q_{i+1})`` with mass ``S_i``
  (:func:`mtad.methods.sps.residual_mass`);
* stop probabilities ``h_i = S_i / (S_i + 1 - w_i)`` for ``i < gamma`` and ``h_gamma = w_gamma``
  (:func:`stop_probabilities`); with independent ``eta_i ~ U(0, 1)`` the accepted length is the
  LONGEST ``i`` with ``eta_i < h_i`` (0 if none), not the first failure (:func:`accepted_length`);
* the next token comes from the normalised weighted residual of row ``k`` when ``k < gamma``, and
  from ``p_{gamma+1}`` (the bonus token) when the whole block passes.

The output follows the target's distribution exactly (the paper's Theorem 1; here the
chi-square tests of ``tests/test_engine.py`` and an exact enumeration in
``tests/test_blockverify.py``), and the expected accepted length over the draft is at least
SpS's on the same draft (Theorem 2): at ``gamma = 1`` the two rules coincide. At temperature 0
it is SpS's greedy verification (:func:`mtad.methods.sps.greedy_accept`). All of it is a few
``[gamma, candidates]`` tensors read with one host sync (the accepted length and the tokens),
as in SpS.
"""

from __future__ import annotations

import torch

from mtad.engine import (
    NEG_INF,
    Candidates,
    DecodeContext,
    DecodingMethod,
    DraftDepth,
    StepResult,
    warp_candidates,
)
from mtad.methods.common import read_block
from mtad.methods.params import BlockVerifyParams
from mtad.methods.registry import register_method
from mtad.methods.sps import (
    draft_tokens,
    greedy_accept,
    normalized_residual,
    residual_mass,
)


def block_log_weights(logp_x: torch.Tensor, logq_x: torch.Tensor) -> torch.Tensor:
    """``log w_i`` for ``i = 0..gamma`` (``[gamma + 1]``), ``w_0 = 1`` and
    ``w_i = min(1, w_{i-1} p_i(x_i) / q_i(x_i))``.

    Unrolled, ``log w_i = C_i - max_{j <= i} C_j`` with ``C`` the cumulative log-ratio
    (``C_0 = 0``): one cumsum and one cummax instead of a loop. A drafted token the target
    gives probability 0 makes that weight and every later one 0 (``-inf``).
    """
    c = torch.cat([logp_x.new_zeros(1), torch.cumsum(logp_x - logq_x, dim=0)])
    return c - torch.cummax(c, dim=0).values


def logq_at(p: Candidates, q: Candidates) -> torch.Tensor:
    """The draft's log-probabilities at the target's candidates, row by row (``p`` and ``q``
    with the same rows, either layout; ``-inf`` where the draft gives 0)."""
    if q.dense:
        return q.logp if p.dense else q.logp.gather(-1, p.tokens)
    if p.dense:
        return q.to_dense(p.logp.shape[-1])
    hit = q.tokens[:, None, :] == p.tokens[:, :, None]  # [rows, m_p, m_q]
    return torch.where(hit, q.logp[:, None, :], NEG_INF).amax(dim=-1)


def stop_probabilities(log_w: torch.Tensor, mass: torch.Tensor) -> torch.Tensor:
    """``h_1..h_gamma`` (``[gamma]``) from the weights ``log w_0..w_gamma`` and the weighted
    residual masses ``S_0..S_{gamma-1}``: ``h_i = S_i / (S_i + 1 - w_i)`` for ``i < gamma``
    (0 when both vanish: ``w_i = 1`` and ``p = q`` at row ``i``, nothing to resample from),
    ``h_gamma = w_gamma``."""
    w = log_w.exp()
    inner_mass, inner_w = mass[1:], w[1:-1]
    den = inner_mass + (1.0 - inner_w)
    inner = inner_mass / torch.where(den > 0, den, 1.0)
    return torch.cat([inner, w[-1:]])


def accepted_length(h: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """``max{i : eta_i < h_i}`` with ``eta_i ~ U(0, 1)`` independent (0 if none), 0-d tensor:
    the longest prefix whose own draw passes, so ``P(k = i) = h_i prod_{j > i} (1 - h_j)``."""
    eta = torch.rand(h.shape, generator=generator, device=h.device)
    positions = torch.arange(1, h.shape[0] + 1, device=h.device)
    return torch.where(eta < h, positions, 0).max()


def verification_plan(
    p: Candidates, q: Candidates, x: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For drafted ``x`` ``[g]``, the warped target ``p`` (``g + 1`` rows) and draft ``q``
    (``g`` rows): the stop probabilities ``h`` ``[g]`` and the weighted residuals ``[g, m]``
    with their masses ``[g]`` (no host sync)."""
    g = x.shape[0]
    log_w = block_log_weights(p[:g].logp_of(x), q.logp_of(x))
    rows = p[:g]
    resid, mass = residual_mass(rows.logp, logq_at(rows, q), log_w[:g].exp())
    return stop_probabilities(log_w, mass), resid, mass


def next_token_distribution(
    p: Candidates, resid: torch.Tensor, mass: torch.Tensor, k: int | torch.Tensor
) -> Candidates:
    """Where the next token comes from after ``k`` (0-d tensor, or int) accepted tokens: the
    normalised weighted residual of row ``k``, or the target's row ``g`` (the bonus token) when
    all ``g`` passed; chosen on the device, like SpS's
    (:func:`mtad.methods.sps.residual_or_bonus`)."""
    g = resid.shape[0]
    k = torch.as_tensor(k, device=resid.device)
    at = k.clamp(max=g - 1).reshape(1)
    row, bonus = p[at][0], p[g]
    stop = k < g
    logp = torch.where(stop, normalized_residual(resid[at][0], mass[at][0], row.logp), bonus.logp)
    if row.dense:
        return Candidates.from_logprobs(logp)
    return Candidates(torch.where(stop, row.tokens, bonus.tokens), logp, False)


def block_verify(
    p: Candidates, q: Candidates, x: torch.Tensor, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Accepted length ``k`` (0-d) and the next token ``[1]``, both on the device (no host
    sync: :func:`~mtad.methods.common.read_block` reads them)."""
    h, resid, mass = verification_plan(p, q, x)
    k = accepted_length(h, generator)
    return k, next_token_distribution(p, resid, mass, k).sample(generator).view(1)


@register_method(BlockVerifyParams)
class BlockVerification(DecodingMethod):
    name = "blockverify"
    uses_draft = True

    def __init__(self, params: BlockVerifyParams) -> None:
        self.params = params

    def draft_depth(self) -> DraftDepth:
        return DraftDepth("gamma", self.params.gamma)

    def step(self, ctx: DecodeContext) -> StepResult:
        g, warp = self.params.gamma, self.params.warp
        assert ctx.draft is not None
        with ctx.timed("draft"):
            x, q = draft_tokens(ctx.draft, ctx.ids, g, warp, ctx.generator)
        with ctx.timed("verify"):
            logits = ctx.target.feed(ctx.ids, extra=x)[0, -(g + 1) :]
            if self.params.greedy:
                k, next_token = greedy_accept(x, logits)
            else:
                assert q is not None
                k, next_token = block_verify(warp_candidates(logits, warp), q, x, ctx.generator)
            k, tokens, ids = read_block(k, x, next_token)  # the one host sync of the iteration
            ctx.target.crop(ctx.n + k)
            ctx.draft.crop(ctx.n + k)
        return StepResult(tokens, drafted=g, accepted=k, token_ids=ids)
