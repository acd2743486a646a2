"""Autoregressive sampling [`ar`]: one target forward per token; the speed / perplexity baseline."""

from __future__ import annotations

from mtad.engine import DecodeContext, DecodingMethod, DraftDepth, StepResult, warp_candidates
from mtad.methods.params import ARParams
from mtad.methods.registry import register_method


@register_method(ARParams)
class AutoregressiveSampling(DecodingMethod):
    name = "ar"

    def __init__(self, params: ARParams) -> None:
        self.params = params

    def draft_depth(self) -> DraftDepth | None:
        return None  # one target token per step, nothing drafted

    def step(self, ctx: DecodeContext) -> StepResult:
        with ctx.timed("verify"):
            logits = ctx.target.feed(ctx.ids)[0, -1]
            if self.params.greedy:  # warping keeps the argmax
                token = logits.argmax(dim=-1)
            else:
                token = warp_candidates(logits, self.params.warp).sample(ctx.generator)
        return StepResult(token.view(1), drafted=0, accepted=0)
