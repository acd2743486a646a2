"""Distillation objectives and draft-quality metrics.

* :func:`forward_kl` -- KL(p || q) over the full vocabulary at temperature 1 (the standard
  knowledge-distillation loss; target ``p``, draft ``q``).
* :func:`sparse_warp` -- the authors' warping (temperature, top-k, then top-p) as a sparse
  distribution over the top-k slots; equal to :func:`mtad.engine.warping.warp_logprobs` whenever
  ``top_k > 0`` (ties at the k-th logit aside), and cheap enough to use in the training loss.
* :func:`warped_overlap` -- ``sum_v min(p_w(v), q_w(v))``, the expected acceptance of one drafted
  token under the warping (1 - total variation), differentiable in the draft's logits given
  the draft's kept set; ``1 - overlap`` is the optional TV term of the loss.
* :func:`heldout_metrics` -- greedy top-1 agreement and expected acceptance computed exactly with
  the harness's own :func:`mtad.engine.warping.warp_logprobs` over the full vocabulary
  (report numbers).
"""

from __future__ import annotations

import torch

from mtad.engine.warping import WarpConfig, warp_logprobs

AUTHORS_WARP = WarpConfig(temperature=1.0, top_k=10, top_p=0.9)


def forward_kl(
    target_logp: torch.Tensor,
    draft_logits: torch.Tensor,
    target_negentropy: torch.Tensor | None = None,
    target_p: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-row KL(p || q); ``target_logp`` are log-probabilities, ``draft_logits`` raw logits.

    ``target_negentropy`` (sum p log p) and ``target_p`` (exp of ``target_logp``) may be passed
    precomputed when several drafts share one target batch."""
    d_logp = torch.log_softmax(draft_logits.float(), dim=-1)
    p = target_logp.exp() if target_p is None else target_p
    if target_negentropy is None:
        target_negentropy = (p * target_logp).sum(-1)
    return target_negentropy - (p * d_logp).sum(-1)


def topk_kl(t_ids: torch.Tensor, t_logp: torch.Tensor, draft_logits: torch.Tensor) -> torch.Tensor:
    """Per-row KL(p || q) between the two distributions coarsened to the target's top-k tokens
    plus one bin for the rest of the vocabulary (``t_ids``/``t_logp``: the target's top-k ids and
    log-probabilities, most likely first). A lower bound of the full KL that is exact on the
    tokens the authors' warping (top-k 10) can ever keep, and needs only the stored top-k of the
    target instead of its full distribution (distilling on the teacher's top-k, as in sparse
    knowledge distillation; the rest bin keeps the draft's tail mass in check)."""
    d_logp = torch.log_softmax(draft_logits.float(), dim=-1)
    q_top = d_logp.gather(-1, t_ids)
    p = t_logp.exp()
    p_rest = (1.0 - p.sum(-1)).clamp_min(1e-6)
    q_rest = torch.log((1.0 - q_top.exp().sum(-1)).clamp_min(1e-6))
    return (p * (t_logp - q_top)).sum(-1) + p_rest * (p_rest.log() - q_rest)


@torch.no_grad()
def target_sparse_from_topk(
    t_ids: torch.Tensor, t_logp: torch.Tensor, warp: WarpConfig = AUTHORS_WARP
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`target_sparse` from the target's stored top-k (k >= ``warp.top_k``): the warped
    distribution only ever keeps tokens of the top ``warp.top_k``, which the top-k holds."""
    idx, p_w = target_sparse(t_logp, warp)
    return t_ids.gather(-1, idx), p_w


def sparse_warp(
    logits: torch.Tensor, warp: WarpConfig = AUTHORS_WARP
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sparse warped distribution over the top-k slots.

    Returns ``(idx, vals, keep, logz)``: the top-k token ids and (tempered) logits, the mask of
    slots that survive top-p, and the log-normaliser over the kept slots, so that
    ``p_w(idx[j]) = keep[j] * exp(vals[j] - logz)``. Gradients flow through ``vals``/``logz``.
    """
    if warp.top_k <= 0:
        raise ValueError("sparse_warp needs top_k > 0")
    t = warp.temperature if warp.temperature > 0 else 1.0
    vals, idx = torch.topk(logits.float() / t, warp.top_k, dim=-1)
    keep = torch.ones_like(vals, dtype=torch.bool)
    if warp.top_p < 1.0:
        probs = torch.softmax(vals.detach(), dim=-1)
        before = probs.cumsum(-1) - probs
        keep = before < warp.top_p
    logz = torch.logsumexp(vals.masked_fill(~keep, float("-inf")), dim=-1, keepdim=True)
    return idx, vals, keep, logz


@torch.no_grad()
def target_sparse(
    target_logits: torch.Tensor, warp: WarpConfig = AUTHORS_WARP
) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's warped distribution as (top-k ids, probabilities; 0 where top-p drops)."""
    p_idx, p_vals, p_keep, p_logz = sparse_warp(target_logits, warp)
    return p_idx, torch.where(p_keep, (p_vals - p_logz).exp(), torch.zeros_like(p_vals))


def warped_overlap(
    target_logits: torch.Tensor | None,
    draft_logits: torch.Tensor,
    warp: WarpConfig = AUTHORS_WARP,
    target_warped: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Per-row ``sum_v min(p_w, q_w)`` with sparse warping (differentiable in ``draft_logits``).

    ``target_warped`` (from :func:`target_sparse`) replaces ``target_logits`` when shared."""
    p_idx, p_w = target_warped if target_warped is not None else target_sparse(target_logits, warp)
    _, q_vals, q_keep, q_logz = sparse_warp(draft_logits, warp)
    t = warp.temperature if warp.temperature > 0 else 1.0
    # the draft's threshold: its smallest kept (tempered) logit
    thr = q_vals.detach().masked_fill(~q_keep, float("inf")).min(-1, keepdim=True).values
    q_at = draft_logits.float().gather(-1, p_idx) / t
    q_w = torch.where(q_at >= thr, (q_at - q_logz).exp(), torch.zeros_like(q_at))
    return torch.minimum(p_w, q_w).sum(-1)


@torch.no_grad()
def heldout_metrics(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor,
    warp: WarpConfig = AUTHORS_WARP,
    chunk: int = 4096,
) -> dict[str, torch.Tensor]:
    """Per-row exact metrics: greedy agreement, warped expected acceptance, raw overlap, KL."""
    agree, acc, raw, kl = [], [], [], []
    for s in range(0, target_logits.shape[0], chunk):
        t = target_logits[s : s + chunk].float()
        d = draft_logits[s : s + chunk].float()
        agree.append((t.argmax(-1) == d.argmax(-1)).float())
        pw = warp_logprobs(t, warp).exp()
        qw = warp_logprobs(d, warp).exp()
        acc.append(torch.minimum(pw, qw).sum(-1))
        tl, dl = torch.log_softmax(t, -1), torch.log_softmax(d, -1)
        raw.append(torch.minimum(tl.exp(), dl.exp()).sum(-1))
        kl.append((tl.exp() * (tl - dl)).sum(-1))
    return {
        "agree": torch.cat(agree),
        "accept": torch.cat(acc),
        "overlap_raw": torch.cat(raw),
        "kl": torch.cat(kl),
    }
