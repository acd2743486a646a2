"""MMTAD [`mmtad`]: MTAD that verifies the draft's whole beam tree in one target forward.

Later version of Qin et al. (arXiv 2407.09722, multi-candidate MTAD). The draft beam-samples as in
MTAD; every (depth, beam) node of the beam tree goes to the target at once under a tree attention
mask built from the beam parents (:meth:`mtad.engine.runner.ModelRunner.feed_tree`). At each depth a
node passes when its target joint log-prob minus the largest draft joint log-prob at that depth
exceeds ``log tau``; the deepest passing depth is accepted, at it the node with the highest target
joint probability, and one token is sampled from the target at that node.
"""

from __future__ import annotations

import math

import torch

from mtad.engine import (
    NEG_INF,
    Candidates,
    DecodeContext,
    DecodingMethod,
    DraftDepth,
    DraftRunner,
    ModelRunner,
    StepResult,
    warp_candidates,
)
from mtad.methods.beam import BeamDraft, beam_sample
from mtad.methods.params import MMTADParams
from mtad.methods.registry import register_method


def beam_tree(beams: BeamDraft) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Flatten the beam tree into BFS node arrays ``(tokens, parents, depths)``, node
    ``(d, b)`` at index ``d * B + b``."""
    gamma, width = beams.picks.shape
    dev = beams.picks.device
    offsets = (torch.arange(gamma, device=dev) - 1) * width
    parents = (beams.parents + offsets[:, None]).flatten()
    parents[:width] = -1
    depths = torch.arange(1, gamma + 1, device=dev).repeat_interleave(width)
    return beams.picks.flatten(), parents, depths


def select_tree_node(
    p: Candidates | torch.Tensor, beams: BeamDraft, tau: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Accepted depth ``k`` (0 = none) and the flat index of the accepted node (-1 = root).

    ``p``: the warped target at the root and at every node, ``1 + gamma * B`` rows
    (:class:`~mtad.engine.warping.Candidates`, or vocabulary-wide log-prob rows).
    """
    if isinstance(p, torch.Tensor):
        p = Candidates.from_logprobs(p)
    gamma, width = beams.picks.shape
    tokens, parents, _ = beam_tree(beams)
    token_logp = p[parents + 1].logp_of(tokens).view(gamma, width)  # the parent's row predicts it
    joint_p = [token_logp[0]]
    for d in range(1, gamma):
        joint_p.append(joint_p[-1][beams.parents[d]] + token_logp[d])
    jp = torch.stack(joint_p)  # [gamma, B] target joint log-prob of every node
    alive = torch.isfinite(beams.joint_logq)
    best_q = beams.joint_logq.max(dim=1, keepdim=True).values
    passing = alive & (jp - best_q > math.log(tau))
    depth_passes = passing.any(dim=1)
    depths = torch.arange(1, gamma + 1, device=jp.device)
    k = torch.where(depth_passes, depths, 0).max()
    row = torch.where(passing, jp, NEG_INF)[(k - 1).clamp_min(0)]
    node = torch.where(k > 0, (k - 1) * width + row.argmax(), -1)
    return k, node


@register_method(MMTADParams)
class MMTAD(DecodingMethod):
    name = "mmtad"
    uses_draft = True

    def __init__(self, params: MMTADParams) -> None:
        self.params = params

    def draft_depth(self) -> DraftDepth:
        return DraftDepth("gamma", self.params.gamma)

    def check_models(self, target: ModelRunner, draft: DraftRunner | None) -> None:
        """Also refuse, before decoding, a target whose attention would ignore the tree mask."""
        super().check_models(target, draft)
        target.check_tree_attention()

    def step(self, ctx: DecodeContext) -> StepResult:
        prm = self.params
        assert ctx.draft is not None
        with ctx.timed("draft"):
            beams = beam_sample(ctx.draft, ctx.ids, prm.beam, ctx.generator)
            tokens, parents, depths = beam_tree(beams)
            # the draft re-reads accepted tokens next iteration (one cheap catch-up forward)
            ctx.draft.select_rows(torch.zeros(1, dtype=torch.long, device=tokens.device))
            ctx.draft.crop(ctx.n)
        with ctx.timed("verify"):
            p = warp_candidates(ctx.target.feed_tree(ctx.ids, tokens, parents, depths), prm.warp)
            k_t, node_t = select_tree_node(p, beams, prm.tau)
            next_tokens = p.sample(ctx.generator, prm.greedy)  # one per node; one is used
            k, node = int(k_t), int(node_t)  # the iteration's host sync
            path: list[int] = []
            parent_list = parents.tolist()
            while node >= 0:
                path.append(node)
                node = parent_list[node]
            path.reverse()
            chosen = path[-1] + 1 if path else 0
            out = torch.cat([tokens[path], next_tokens[chosen : chosen + 1]])
            ctx.target.commit_tree_path(ctx.n, path)  # the tree was scratch; accepted ids re-fed
        # accepted depth over the tree depth gamma; every (depth, beam) node for the node rate
        return StepResult(out, drafted=prm.gamma, accepted=k, drafted_nodes=tokens.numel())
