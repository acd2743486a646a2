"""Big Little Decoder [`bild`] (Kim et al., "Speculative Decoding with Big Little Decoder",
NeurIPS 2023).

The small (draft) model decodes on its own while it is confident: it falls back to the large
(target) model as soon as its top probability drops below ``fallback_threshold`` (or after
``max_draft`` tokens). The target then scores the drafted tokens in one forward and *rolls back*
from the first token whose distance to the target's prediction, the cross-entropy
``-log p(x_i)``, exceeds ``rollback_threshold``; the target supplies the token at that position
(or the next one when nothing is rolled back). Not distribution-preserving by design.

Both decisions read the models' *raw* softmax (temperature 1, no top-k / top-p), as BiLD
defines them: on the warped distributions a drafted token outside the target's top-k would get
``-log p = inf`` and always be rolled back whatever the threshold, and renormalising after
top-k / top-p lifts the draft's top probability so fallback would happen less often than the
threshold says. Tokens are still *sampled* from the warped distributions shared by every method.
(The MTAD authors' v1 code, ZongyueQin/MJSD ``sampling/speculative_sampling.py``
``BiLD_sampling``, reads its warped ``KVCacheModel`` probabilities for both tests and keeps the
low-confidence draft token for the target to check; we follow Kim et al. here.)
The fallback test reads the draft's confidence once per drafted token.
"""

from __future__ import annotations

import torch

from mtad.engine import (
    DecodeContext,
    DecodingMethod,
    DraftDepth,
    StepResult,
    warp_candidates,
)
from mtad.methods.common import leading_true_count
from mtad.methods.params import BiLDParams
from mtad.methods.registry import register_method


def raw_confidence(logits: torch.Tensor) -> torch.Tensor:
    """The draft's top probability under its raw softmax (BiLD's fallback statistic)."""
    return torch.softmax(logits.float(), dim=-1).max(dim=-1).values


def raw_cross_entropy(logits: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``-log p(x_i)`` under the target's raw softmax, per drafted position (BiLD's rollback
    distance); ``logits`` ``[g, V]``, ``x`` ``[g]``. Finite for every token."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -logp.gather(1, x[:, None]).squeeze(1)


@register_method(BiLDParams)
class BigLittleDecoder(DecodingMethod):
    name = "bild"
    uses_draft = True

    def __init__(self, params: BiLDParams) -> None:
        self.params = params

    def draft_depth(self) -> DraftDepth:
        return DraftDepth("max_draft", self.params.max_draft)  # at most, while confident

    def step(self, ctx: DecodeContext) -> StepResult:
        prm = self.params
        assert ctx.draft is not None
        drafted: list[torch.Tensor] = []
        with ctx.timed("draft"):
            # compact rows for an FR-Spec draft head (the max probability is the same)
            logits = ctx.draft.feed(ctx.ids, compact=True)[0, -1]
            for i in range(prm.max_draft):
                if float(raw_confidence(logits)) < prm.fallback_threshold:
                    break  # not confident: hand over to the target
                tok = ctx.draft.candidates(logits, prm.warp).sample(ctx.generator, prm.greedy)
                drafted.append(tok)
                if i + 1 < prm.max_draft:
                    logits = ctx.draft.forward(tok.view(1, 1), compact=True)[0, -1]
        with ctx.timed("verify"):
            x = torch.stack(drafted) if drafted else None
            g = 0 if x is None else x.numel()
            logits = ctx.target.feed(ctx.ids, extra=x)[0, -(g + 1) :]
            p = warp_candidates(logits, prm.warp)  # g + 1 rows
            if x is None:
                k = 0
                tokens = p[0].sample(ctx.generator, prm.greedy).view(1)
            else:
                distance = raw_cross_entropy(logits[:g], x)
                keep = leading_true_count(distance <= prm.rollback_threshold)
                next_tokens = p.sample(ctx.generator, prm.greedy)
                k = int(keep)
                tokens = torch.cat([x[:k], next_tokens[k : k + 1]])
            ctx.target.crop(ctx.n + k)
            ctx.draft.crop(ctx.n + k)
        return StepResult(tokens, drafted=g, accepted=k)
