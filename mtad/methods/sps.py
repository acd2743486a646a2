"""Speculative sampling [`sps`] (Leviathan et al., ICML 2023; Chen et al., 2023).

The draft samples ``gamma`` tokens; one target forward scores them all; token ``i`` is accepted
with probability ``min(1, p_i(x_i) / q_i(x_i))`` up to the first rejection, where the target's
token comes from the residual ``norm(max(0, p - q))``; if all pass, a bonus token comes from ``p``.
The output distribution is exactly the target's. Acceptance, residuals and the next token are
computed for the whole block as tensors and read with one host sync, as in gpt-fast's
``speculative_decode``.
"""

from __future__ import annotations

import torch

from mtad.engine import (
    NEG_INF,
    Candidates,
    DecodeContext,
    DecodingMethod,
    DraftDepth,
    DraftRunner,
    StepResult,
    WarpConfig,
    warp_candidates,
)
from mtad.methods.common import leading_true_count, read_block
from mtad.methods.params import SpSParams
from mtad.methods.registry import register_method


def draft_tokens(
    draft: DraftRunner,
    ids: torch.Tensor,
    gamma: int,
    warp: WarpConfig,
    generator: torch.Generator,
) -> tuple[torch.Tensor, Candidates | None]:
    """Sample ``gamma`` tokens autoregressively from the draft: ``(tokens [g], q)`` with ``q``
    the warped draft distributions, one row per drafted position (:class:`Candidates`).

    Greedy drafting takes the argmax of the raw logits (warping keeps the argmax) and returns
    ``q`` as ``None``: greedy verification never reads it.
    """
    greedy = warp.greedy
    logits = draft.feed(ids, compact=True)[0, -1]  # compact for an FR-Spec draft head
    tokens, qs = [], []
    for i in range(gamma):
        if greedy:
            tok = draft.vocab_token(logits.argmax(dim=-1))
        else:
            q = draft.candidates(logits, warp)
            tok = q.sample(generator)
            qs.append(q)
        tokens.append(tok)
        if i + 1 < gamma:
            logits = draft.forward(tok.view(1, 1), compact=True)[0, -1]
    return torch.stack(tokens), (Candidates.stack(qs, draft.vocab_size) if qs else None)


def speculative_accept(
    logp_x: torch.Tensor, logq_x: torch.Tensor, generator: torch.Generator
) -> torch.Tensor:
    """Per-token acceptance ``u < p(x) / q(x)`` with ``u ~ U(0, 1)``, in log space."""
    u = torch.rand(logp_x.shape, generator=generator, device=logp_x.device)
    return torch.log(u) < logp_x - logq_x


def residual_candidates(p: Candidates, q: Candidates) -> Candidates:
    """The residual ``norm(max(0, p - q))`` of one row as candidates: it lives on p's
    candidates, so only q's log-probabilities at those tokens are needed."""
    logq_at = q.logp if (p.dense and q.dense) else q.lookup(p.tokens)
    return Candidates(p.tokens, residual_logprobs(p.logp, logq_at), p.dense)


def residual_logprobs(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """``log norm(max(0, p - q))`` per row; rows where p == q (never sampled) fall back to p."""
    return normalized_residual(*residual_mass(logp, logq), logp)


def residual_mass(
    logp: torch.Tensor, logq: torch.Tensor, weight: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``max(0, w p - q)`` per row and its total mass ``[rows]``, with ``w`` one weight per row
    (1 when ``weight`` is None: SpS's residual; block verification weighs ``p`` by the
    surviving acceptance weight, :mod:`mtad.methods.blockverify`).

    The residual is zero outside p's support. ``exp(-inf)`` and ``log(0)`` over the rest of a
    49k-entry row take slow special-value paths on some CPUs (~10x a plain ``exp``/``log``), so
    both are kept off those entries; the values are the same.
    """
    live = ~torch.isneginf(logp)
    p = torch.where(live, logp, 0.0).exp()
    if weight is not None:
        p = p * weight[..., None]
    q = torch.where(live, logq, 0.0).exp()
    resid = torch.where(live, (p - q).clamp_min(0.0), 0.0)
    return resid, resid.sum(dim=-1)


def normalized_residual(
    resid: torch.Tensor, mass: torch.Tensor, logp: torch.Tensor
) -> torch.Tensor:
    """``log(resid / mass)`` per row (:func:`residual_mass`); a row of zero mass (never sampled
    from: the verifier stops there with probability 0) falls back to ``logp``."""
    mass = mass[..., None]
    pos = resid > 0
    log_resid = torch.where(pos, torch.where(pos, resid, 1.0).log() - mass.log(), NEG_INF)
    return torch.where(mass > 0, log_resid, logp)


def residual_or_bonus(p: Candidates, q: Candidates, k: torch.Tensor) -> Candidates:
    """Where the target's token comes from after ``k`` (0-d tensor) of ``g`` drafted tokens
    passed: the residual ``norm(max(0, p_k - q_k))`` at a rejection, the plain target row
    ``p_g`` (the bonus token) when all passed. Chosen on the device, so the accepted length is
    read once, with the tokens (:func:`~mtad.methods.common.read_block`); one residual row is
    computed, as when ``k`` is known on the host, and the same values come out."""
    g = q.logp.shape[0]
    at = k.clamp(max=g - 1).reshape(1)
    resid, bonus = residual_candidates(p[at][0], q[at][0]), p[g]
    stop = k < g
    logp = torch.where(stop, resid.logp, bonus.logp)
    if resid.dense:
        return Candidates.from_logprobs(logp)
    return Candidates(torch.where(stop, resid.tokens, bonus.tokens), logp, False)


def greedy_accept(x: torch.Tensor, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy verification of drafted ``x`` ``[g]`` against the target's raw ``logits``
    ``[g + 1, V]`` (warping keeps the argmax): the accepted length (0-d) and the target's next
    token ``[1]``, both on the device (no host sync): SpS and block verification both reduce
    to it at temperature 0."""
    g = x.shape[0]
    target_argmax = logits.argmax(dim=-1)  # [g + 1]
    k = leading_true_count(x == target_argmax[:g])
    return k, target_argmax.gather(0, k.reshape(1))


@register_method(SpSParams)
class SpeculativeSampling(DecodingMethod):
    name = "sps"
    uses_draft = True

    def __init__(self, params: SpSParams) -> None:
        self.params = params

    def draft_depth(self) -> DraftDepth:
        return DraftDepth("gamma", self.params.gamma)

    def step(self, ctx: DecodeContext) -> StepResult:
        g, warp, greedy = self.params.gamma, self.params.warp, self.params.greedy
        assert ctx.draft is not None
        with ctx.timed("draft"):
            x, q = draft_tokens(ctx.draft, ctx.ids, g, warp, ctx.generator)
        with ctx.timed("verify"):
            logits = ctx.target.feed(ctx.ids, extra=x)[0, -(g + 1) :]
            if greedy:
                k, next_token = greedy_accept(x, logits)
            else:
                assert q is not None
                p = warp_candidates(logits, warp)  # g + 1 rows
                k = leading_true_count(
                    speculative_accept(p[:g].logp_of(x), q.logp_of(x), ctx.generator)
                )
                next_token = residual_or_bonus(p, q, k).sample(ctx.generator)
            k, tokens, ids = read_block(k, x, next_token)  # the one host sync of the iteration
            ctx.target.crop(ctx.n + k)
            ctx.draft.crop(ctx.n + k)
        return StepResult(tokens, drafted=g, accepted=k, token_ids=ids)
