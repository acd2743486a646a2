"""Held-out quality of a feature-level head, at every draft depth, on committed responses.

Expected acceptance at depth ``k`` = mean over response positions of ``sum_v min(p_w(v), q_w(v))``
with both distributions warped as the authors warp (temperature 1, top-k 10, top-p 0.9, by
:func:`mtad.engine.warping.warp_logprobs`), where ``q`` is what the head gives at that position
after drafting ``k - 1`` positions on its own features (the target has verified up to ``k - 1``
positions before; the drafted tokens are the response's own): depth 1 reads only true features
and flatters; depths ``2..gamma`` are what MTAD's later block positions see. A chain starts no
earlier than the prompt's last token, as in decoding.

Both sides are exact from the stored teacher-forced shards (:mod:`mtad_train.features`): the
warped target keeps only its top ``top_k = 10`` tokens and renormalises over them, so warping the
stored top-20 log-probabilities gives ``p_w`` exactly; ``q_w`` warps the head's own (compact)
logits, and tokens outside the head's sub-vocabulary have ``q_w = 0``.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch

from mtad.engine.feature_head import FeatureHead
from mtad.engine.warping import warp_logprobs
from mtad_train import objectives as O
from mtad_train.head_train import ShardData, collate, column_map, ref_batches
from mtad_train.unroll import unrolled


@torch.no_grad()
def depth_acceptance(
    head: FeatureHead,
    data: ShardData,
    kinds: list[str],
    depths: int,
    micro_tokens: int = 4096,
    autocast: bool = True,
) -> dict[str, dict[str, float]]:
    """``{kind: {"d1": acc, ..., "dK": acc, "positions": n, "prompts": m}}`` over the
    sequences of ``data`` (``kinds[i]``: the kind of the corpus sequence ``i``), and ``all``
    (position-weighted over every kind)."""
    was_training = head.training
    head.eval()
    cols = column_map(head.vocab_ids, head.vocab_size)
    sums: dict[str, np.ndarray] = defaultdict(lambda: np.zeros(depths))
    counts: dict[str, np.ndarray] = defaultdict(lambda: np.zeros(depths))
    prompts: dict[str, int] = defaultdict(int)
    for refs_b in ref_batches(data.refs(), micro_tokens):
        b = collate(data, refs_b, 0.0)
        seq_kind = [kinds[int(data.shards[r.shard].seq_index[r.index])] for r in refs_b]
        for kind in seq_kind:
            prompts[kind] += 1
        plens = torch.tensor([int(data.shards[r.shard].plens[r.index]) for r in refs_b])
        L = b["tokens"].shape[1]
        pos = torch.arange(L)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            outs = unrolled(head, b["tokens"], head.fused(b["feats"]), depths)
        for k, a in enumerate(outs, start=1):
            # response positions whose chain starts at or after the prompt's last token
            sel = (b["w"] > 0) & (pos[None] - (k - 1) >= (plens[:, None] - 1))
            if not bool(sel.any()):
                continue
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                logits = head.logits(a[sel]).float()
            acc = warped_acceptance(logits, b["ids"][sel], b["logp"][sel], cols)
            row_of = sel.nonzero()[:, 0]
            for r, kind in enumerate(seq_kind):
                m = row_of == r
                sums[kind][k - 1] += float(acc[m].sum())
                counts[kind][k - 1] += int(m.sum())
    if was_training:
        head.train()
    out: dict[str, dict[str, float]] = {}
    for kind in sorted(sums):
        out[kind] = _row(sums[kind], counts[kind], prompts[kind])
    tot_s = sum(sums.values())
    tot_c = sum(counts.values())
    out["all"] = _row(tot_s, tot_c, sum(prompts.values()))
    return out


def _row(s: np.ndarray, c: np.ndarray, prompts: int) -> dict[str, float]:
    row = {f"d{k + 1}": float(s[k] / c[k]) if c[k] else float("nan") for k in range(len(s))}
    row["positions"] = int(c[0])
    row["prompts"] = prompts
    return row


def warped_acceptance(
    logits: torch.Tensor, t_ids: torch.Tensor, t_logp: torch.Tensor, cols: torch.Tensor | None
) -> torch.Tensor:
    """Per row ``sum_v min(p_w, q_w)``: ``p_w`` from the target's stored top-k (exact, see the
    module docstring), ``q_w`` from the head's compact ``logits``."""
    p_w = warp_logprobs(t_logp, O.AUTHORS_WARP).exp()  # [n, K] over t_ids
    q_w = warp_logprobs(logits, O.AUTHORS_WARP).exp()  # [n, V'] compact columns
    c = t_ids if cols is None else cols[t_ids]
    q_at = torch.where(c >= 0, q_w.gather(-1, c.clamp_min(0)), 0.0)
    return torch.minimum(p_w, q_at).sum(-1)


@torch.no_grad()
def model_draft_acceptance(
    draft: torch.nn.Module,
    data: ShardData,
    kinds: list[str],
    micro_tokens: int = 4096,
) -> dict[str, dict[str, float]]:
    """The same held-out figure for an independent draft model, on the same responses and
    positions as :func:`depth_acceptance`'s depth 1. A draft restricted to a sub-vocabulary
    (:func:`mtad.engine.subvocab.restrict_vocab`, as it decodes) already gives full-width
    logits, -inf off its sub-vocabulary. Teacher-forced on the response, a model draft's
    distribution at a position does not depend on how many positions it drafted before (it
    reads tokens, not features), so its acceptance is the same at every depth."""
    sums: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    prompts: dict[str, int] = defaultdict(int)
    for refs_b in ref_batches(data.refs(), micro_tokens):
        b = collate(data, refs_b, 0.0)
        seq_kind = [kinds[int(data.shards[r.shard].seq_index[r.index])] for r in refs_b]
        for kind in seq_kind:
            prompts[kind] += 1
        logits = draft(input_ids=b["tokens"]).logits.float()
        sel = b["w"] > 0  # response positions (prompt weight 0), as depth 1 of the head
        acc = warped_acceptance(logits[sel], b["ids"][sel], b["logp"][sel], None)
        row_of = sel.nonzero()[:, 0]
        for r, kind in enumerate(seq_kind):
            m = row_of == r
            sums[kind] += float(acc[m].sum())
            counts[kind] += int(m.sum())
    out = {k: _row(np.array([sums[k]]), np.array([counts[k]]), prompts[k]) for k in sorted(sums)}
    out["all"] = _row(
        np.array([sum(sums.values())]), np.array([sum(counts.values())]), sum(prompts.values())
    )
    return out
