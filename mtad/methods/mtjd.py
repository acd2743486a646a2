"""Target beam sampling, "exact-ish" MTJD [`mtjd`].

Every iteration draws ``gamma`` tokens from the target's joint distribution, approximated by the
same beam sampling MTAD's draft uses (:func:`mtad.methods.beam.beam_sample`) but run on the
target itself, and commits the max-weight beam whole. Slow by design (``gamma`` batched target
forwards per block): it is the quality MTAD approximates (Qin et al., ICLR 2025, Sec. 3).
Counters: a block of ``gamma`` tokens counts as ``gamma - 1`` accepted plus one, so
``new_tokens == sum(accepted + 1)`` holds for every method.
"""

from __future__ import annotations

from mtad.engine import DecodeContext, DecodingMethod, DraftDepth, StepResult
from mtad.methods.beam import beam_sample
from mtad.methods.params import MTJDParams
from mtad.methods.registry import register_method


@register_method(MTJDParams)
class TargetBeamSampling(DecodingMethod):
    name = "mtjd"
    tokens_after_draft = 0  # the beam is the target's own block, committed whole

    def __init__(self, params: MTJDParams) -> None:
        self.params = params

    def draft_depth(self) -> DraftDepth:
        return DraftDepth("gamma", self.params.gamma)  # beam-sampled on the target itself

    def step(self, ctx: DecodeContext) -> StepResult:
        prm = self.params
        with ctx.timed("verify"):
            beams = beam_sample(ctx.target, ctx.ids, prm.beam, ctx.generator)
            best = beams.best
            ctx.target.select_rows(best.view(1))
            tokens = beams.tokens[best]
        return StepResult(tokens, drafted=prm.gamma - 1, accepted=prm.gamma - 1)
