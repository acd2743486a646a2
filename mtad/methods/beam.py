"""Beam sampling of a block of tokens: MTAD's draft procedure, shared with MTJD.

Qin et al., "Optimized Multi-Token Joint Decoding with Auxiliary Model for LLM Inference"
(ICLR 2025, arXiv 2407.09722), Sec. 4: step 1 draws ``B`` distinct tokens from the warped
``q(.|s)``; each later step scores every (beam, token) pair by ``w_b * q(v | s, beam_b)``, draws
``B`` pairs, and renormalises the weights as ``w / sum(w)``. The authors' non-tree code
(ZongyueQin/MTAD, ``BatchMTADStrategy``) applies ``log_softmax`` to probabilities at that point,
which their tree variant replaces; we renormalise in log space, ``log w - logsumexp(log w)``.

All beams run as one batched forward per step and the cache is reordered by parent beam.
Dead beams (picked only when warping leaves fewer than ``B`` non-zero-probability candidates)
stay in the batch with weight 0 so shapes are static and no host sync is needed; they can never
win, and a zero-probability token is never part of a live beam.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mtad.engine import (
    NEG_INF,
    ModelRunner,
    WarpConfig,
    sample_with_replacement,
    sample_without_replacement,
)


@dataclass
class BeamDraft:
    tokens: torch.Tensor  # [B, gamma] drafted ids per beam
    logq: torch.Tensor  # [B, gamma] per-token warped log q(x_j | ...) of each beam
    logw: torch.Tensor  # [B] normalised log beam weights (-inf for dead beams)
    parents: torch.Tensor  # [gamma, B] parent beam index chosen at each step (step 0: zeros)
    picks: torch.Tensor  # [gamma, B] token chosen at each step, paired with ``parents``
    joint_logq: torch.Tensor  # [gamma, B] draft joint log q of the prefix chosen at each step

    @property
    def alive(self) -> torch.Tensor:
        return torch.isfinite(self.logw)

    @property
    def best(self) -> torch.Tensor:
        """Index of the max-weight beam (0-d tensor)."""
        return self.logw.argmax()


def renormalise(logw: torch.Tensor) -> torch.Tensor:
    """``log(w / sum(w))`` with ``-inf`` (dead) entries kept at ``-inf``."""
    return logw - torch.logsumexp(logw, dim=-1, keepdim=True)


def beam_sample(
    runner: ModelRunner,
    ids: torch.Tensor,
    gamma: int,
    beam_width: int,
    warp: WarpConfig,
    generator: torch.Generator,
    replacement: bool = False,
) -> BeamDraft:
    """Draft ``gamma`` tokens on ``beam_width`` beams; the runner's cache ends with B rows
    holding ``ids + beam[:-1]`` (reordered by parent), ready for :meth:`ModelRunner.select_rows`.
    """
    greedy = warp.greedy
    pick = sample_with_replacement if replacement else sample_without_replacement
    # Each step's warped q as candidates (a few dozen per row on the CPU with top-k, else the
    # whole vocabulary): pairs are scored, drawn and looked up among candidates only.
    # compact rows for an FR-Spec draft head: warped without widening them (runner.candidates)
    first = runner.candidates(runner.feed(ids, compact=True)[0, -1], warp)  # [m]
    j, valid = pick(first.logp, beam_width, generator, greedy)  # [B']
    width = j.shape[0]  # min(B, m)
    tok = first.tokens[j]
    logq = first.logp[j].unsqueeze(1)  # [B, 1]
    logw = renormalise(torch.where(valid, first.logp[j], NEG_INF))
    tokens = tok.unsqueeze(1)
    parents = [torch.zeros(width, dtype=torch.long, device=tok.device)]
    picks = [tok]
    joints = [logq.sum(dim=1)]
    runner.repeat_rows(width)
    for _ in range(1, gamma):
        step = runner.candidates(runner.forward(tokens[:, -1:], compact=True)[:, -1], warp)
        m = step.logp.shape[-1]
        scores = (logw[:, None] + step.logp).flatten()
        flat, valid = pick(scores, width, generator, greedy)
        parent, slot = flat // m, flat % m
        tok = step.tokens[parent, slot]
        tokens = torch.cat([tokens[parent], tok[:, None]], dim=1)
        logq = torch.cat([logq[parent], step.logp[parent, slot][:, None]], dim=1)
        logw = renormalise(torch.where(valid, scores[flat], NEG_INF))
        parents.append(parent)
        picks.append(tok)
        joints.append(logq.sum(dim=1))
        runner.select_rows(parent)
    return BeamDraft(
        tokens, logq, logw, torch.stack(parents), torch.stack(picks), torch.stack(joints)
    )
