"""Tree speculative sampling [`specinfer`]: SpecInfer (Miao et al., ASPLOS 2024) / MCSD
(Yang et al., 2024) multi-candidate verification of a draft token tree.

The draft expands a tree with ``branching[d]`` children per node at depth ``d`` (children drawn
i.i.d. from the draft, one batched draft forward per depth); the target scores every node in one
forward under a tree attention mask. Verification walks down from the root: each child ``x`` of
the current node is accepted with probability ``min(1, p(x) / q(x))``; after a rejection the
target distribution becomes the residual ``norm(max(0, p - q))`` for the next sibling. If every
child is rejected, the next token comes from the residual; at a leaf, from ``p``. With i.i.d.
children this reproduces the target distribution exactly (SpecInfer, Theorem 4.2). The walk is
sequential by nature: it reads one acceptance per candidate it tests.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mtad.engine import (
    Candidates,
    DecodeContext,
    DecodingMethod,
    DraftDepth,
    DraftRunner,
    ModelRunner,
    StepResult,
    WarpConfig,
    warp_candidates,
)
from mtad.methods.params import SpecInferParams
from mtad.methods.registry import register_method
from mtad.methods.sps import residual_candidates


@dataclass
class TreeLayout:
    """Static shape of a full tree with ``branching[d]`` children per node at depth ``d``."""

    parents: list[int]  # per node, BFS order; -1 under the root
    depths: list[int]
    children: dict[int, list[int]]  # node (-1 = root) -> its children
    level_start: list[int]  # first node index of each depth

    @classmethod
    def build(cls, branching: list[int]) -> TreeLayout:
        parents, depths, starts = [], [], []
        children: dict[int, list[int]] = {-1: []}
        level = [-1]
        for d, b in enumerate(branching):
            starts.append(len(parents))
            nxt = []
            for par in level:
                for _ in range(b):
                    node = len(parents)
                    parents.append(par)
                    depths.append(d + 1)
                    children.setdefault(par, []).append(node)
                    children[node] = []
                    nxt.append(node)
            level = nxt
        return cls(parents, depths, children, starts)


def expand_tree(
    draft: DraftRunner,
    ids: torch.Tensor,
    branching: list[int],
    warp: WarpConfig,
    generator: torch.Generator,
) -> tuple[torch.Tensor, Candidates]:
    """Sample the tree's tokens ``[N]`` and return them with the warped draft distribution each
    internal node's children came from (``1 + internal`` rows; row 0: root). One draft forward
    per depth; the cache ends with one row per deepest internal node."""
    vocab = draft.vocab_size
    q = draft.candidates(draft.feed(ids, compact=True)[0, -1:], warp)  # [1, m]
    dists, tokens = [q], []
    for d, b in enumerate(branching):
        toks = q.draw(b, generator, warp.greedy)  # [rows, b] i.i.d. children per node
        tokens.append(toks.flatten())
        if d + 1 == len(branching):
            break
        draft.select_rows(torch.arange(toks.shape[0], device=toks.device).repeat_interleave(b))
        q = draft.candidates(draft.forward(toks.reshape(-1, 1), compact=True)[:, -1], warp)
        dists.append(q)
    return torch.cat(tokens), Candidates.cat(dists, vocab)


@register_method(SpecInferParams)
class TreeSpeculativeSampling(DecodingMethod):
    name = "specinfer"
    uses_draft = True

    def __init__(self, params: SpecInferParams) -> None:
        self.params = params
        self.layout = TreeLayout.build(params.branching)

    def draft_depth(self) -> DraftDepth:
        return DraftDepth("branching", len(self.params.branching))  # the tree's depth

    def check_models(self, target: ModelRunner, draft: DraftRunner | None) -> None:
        """Also refuse, before decoding, a target whose attention would ignore the tree mask."""
        super().check_models(target, draft)
        target.check_tree_attention()

    def step(self, ctx: DecodeContext) -> StepResult:
        prm, lay = self.params, self.layout
        assert ctx.draft is not None
        with ctx.timed("draft"):
            tokens, q_all = expand_tree(ctx.draft, ctx.ids, prm.branching, prm.warp, ctx.generator)
            ctx.draft.select_rows(torch.zeros(1, dtype=torch.long, device=tokens.device))
            ctx.draft.crop(ctx.n)  # accepted tokens are re-read next iteration
        with ctx.timed("verify"):
            dev = tokens.device
            p_all = warp_candidates(
                ctx.target.feed_tree(
                    ctx.ids,
                    tokens,
                    torch.tensor(lay.parents, device=dev),
                    torch.tensor(lay.depths, device=dev),
                ),
                prm.warp,
            )
            path, next_token = self.walk(p_all, q_all, tokens, ctx.generator)
            ctx.target.commit_tree_path(ctx.n, path)  # the tree was scratch; accepted ids re-fed
        out = torch.cat([tokens[path], next_token.view(1)])
        # depth along the accepted path over the tree depth; every node for the per-node rate
        return StepResult(
            out, drafted=len(prm.branching), accepted=len(path), drafted_nodes=tokens.numel()
        )

    def walk(
        self,
        p_all: Candidates,
        q_all: Candidates,
        tokens: torch.Tensor,
        generator: torch.Generator,
    ) -> tuple[list[int], torch.Tensor]:
        """Multi-candidate speculative sampling down the tree: accepted nodes, next token.

        ``p_all``: the warped target at the root and at every node (BFS order); ``q_all``: the
        draft distribution of the root's and of each internal node's children."""
        lay, greedy = self.layout, self.params.greedy
        internal_row = {-1: 0}
        for i, node in enumerate(n for n in range(len(lay.parents)) if lay.children[n]):
            internal_row[node] = i + 1
        token_list = tokens.tolist()
        node, path = -1, []
        while True:
            p = p_all[node + 1]
            kids = lay.children[node]
            if not kids:
                return path, p.sample(generator, greedy)
            accepted = None
            if greedy:
                best = int(p.sample(generator, greedy=True))
                accepted = next((c for c in kids if token_list[c] == best), None)
            else:
                q = q_all[internal_row[node]]
                for c in kids:
                    x = tokens[c]
                    u = torch.rand((), generator=generator, device=x.device)
                    if bool(torch.log(u) < p.logp_of(x) - q.logp_of(x)):
                        accepted = c
                        break
                    p = residual_candidates(p, q)  # the next sibling is tested against it
            if accepted is None:
                return path, p.sample(generator, greedy)
            path.append(accepted)
            node = accepted
