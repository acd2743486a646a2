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
    DraftRunner,
    sample_with_replacement,
    sample_without_replacement,
)
from mtad.engine._warping_cpu import host_tensor
from mtad.engine.warping import gumbel_top_k
from mtad.methods.params import BeamSpec  # torch-free, beside the params that make one


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


# devices whose beam bookkeeping runs on the host (reads are free there); tests/host_syncs.py
# empties it to count the GPU's code path on a CPU
HOST_BOOKKEEPING_DEVICES: frozenset[str] = frozenset({"cpu"})


def beam_sample(
    runner: DraftRunner,
    ids: torch.Tensor,
    beam: BeamSpec,
    generator: torch.Generator,
    reorder_last: bool = True,
) -> BeamDraft:
    """Draft ``beam.gamma`` tokens on ``beam.beam_width`` beams; the runner's cache ends with B
    rows holding ``ids + beam[:-1]`` (reordered by parent), ready for ``runner.select_rows``.

    ``reorder_last=False`` skips the last step's reorder (the cache's row ``parents[-1][b]``
    holds beam ``b``'s context): a caller that keeps one beam selects that row once, instead
    of reordering all of them first (MTAD).

    On the CPU, sampling without replacement, the bookkeeping between the draft's forwards
    runs on the host (:func:`_beam_sample_host`): the same draws, weights and beams bit for bit
    as the tensor form (:func:`_beam_sample_tensors`, every other device and with replacement)
    with a fraction of its small tensor ops.
    """
    if beam.replacement or ids.device.type not in HOST_BOOKKEEPING_DEVICES:
        return _beam_sample_tensors(runner, ids, beam, generator, reorder_last)
    return _beam_sample_host(runner, ids, beam, generator, reorder_last)


def _beam_sample_tensors(
    runner: DraftRunner,
    ids: torch.Tensor,
    beam: BeamSpec,
    generator: torch.Generator,
    reorder_last: bool = True,
) -> BeamDraft:
    """:func:`beam_sample` on tensors only: no host sync."""
    gamma, beam_width, warp = beam.gamma, beam.beam_width, beam.warp
    greedy = warp.greedy
    pick = sample_with_replacement if beam.replacement else sample_without_replacement
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
    for step in range(1, gamma):
        cand = runner.candidates(runner.forward(tokens[:, -1:], compact=True)[:, -1], warp)
        m = cand.logp.shape[-1]
        scores = (logw[:, None] + cand.logp).flatten()
        flat, valid = pick(scores, width, generator, greedy)
        parent, slot = flat // m, flat % m
        tok = cand.tokens[parent, slot]
        tokens = torch.cat([tokens[parent], tok[:, None]], dim=1)
        logq = torch.cat([logq[parent], cand.logp[parent, slot][:, None]], dim=1)
        logw = renormalise(torch.where(valid, scores[flat], NEG_INF))
        parents.append(parent)
        picks.append(tok)
        joints.append(logq.sum(dim=1))
        if reorder_last or step < gamma - 1:
            runner.select_rows(parent)
    return BeamDraft(
        tokens, logq, logw, torch.stack(parents), torch.stack(picks), torch.stack(joints)
    )


def _beam_sample_host(
    runner: DraftRunner,
    ids: torch.Tensor,
    beam: BeamSpec,
    generator: torch.Generator,
    reorder_last: bool = True,
) -> BeamDraft:
    """:func:`_beam_sample_tensors` without replacement on the CPU, where host reads are
    free: the scores, the Gumbel keys, the top-B pick and the weights are the same tensor ops
    (so the same draws from the same generator and the same float32 values), and what only
    moves values around -- beam paths, parents, picked tokens and their log-probabilities,
    the validity of picks -- is kept in Python lists and turned into tensors once at the end.
    Each of the small tensor ops this saves costs several times more between the draft's
    forwards than in a tight loop (its code and data evicted by the forward)."""
    gamma, beam_width, warp = beam.gamma, beam.beam_width, beam.warp
    greedy = warp.greedy
    first = runner.candidates(runner.feed(ids, compact=True)[0, -1], warp)  # [m]
    flat, raw = _pick(first.logp, beam_width, generator, greedy)
    width = flat.shape[0]  # min(B, m)
    tok = flat if first.dense else first.tokens.index_select(0, flat)
    tok_l, raw_l = tok.tolist(), raw.tolist()
    logw = _renormalise(raw, raw_l)
    paths = [[t] for t in tok_l]
    path_q = [[q] for q in raw_l]
    history = [path_q]  # every step's per-beam log q of the path, for the joints
    parents = [[0] * width]
    picks = [tok_l]
    runner.repeat_rows(width)
    for step in range(1, gamma):
        cand = runner.candidates(runner.forward(tok.view(-1, 1), compact=True)[:, -1], warp)
        m = cand.logp.shape[-1]
        logp = cand.logp.reshape(-1)
        scores = (logw[:, None] + cand.logp).flatten()
        flat, raw = _pick(scores, width, generator, greedy)
        flat_l, raw_l = flat.tolist(), raw.tolist()
        parent_l = [f // m for f in flat_l]
        tok = flat % m if cand.dense else cand.tokens.reshape(-1).index_select(0, flat)
        tok_l, q_l = tok.tolist(), logp.index_select(0, flat).tolist()
        logw = _renormalise(raw, raw_l)
        paths = [paths[p] + [t] for p, t in zip(parent_l, tok_l, strict=True)]
        path_q = [path_q[p] + [q] for p, q in zip(parent_l, q_l, strict=True)]
        history.append(path_q)
        parents.append(parent_l)
        picks.append(tok_l)
        if (reorder_last or step < gamma - 1) and parent_l != list(range(width)):
            runner.select_rows(host_tensor(parent_l, torch.long))
    joints = [host_tensor(q, torch.float32).sum(dim=1) for q in history]
    return BeamDraft(
        host_tensor(paths, torch.long),
        host_tensor(path_q, torch.float32),
        logw,
        host_tensor(parents, torch.long),
        host_tensor(picks, torch.long),
        torch.stack(joints),
    )


def _pick(
    scores: torch.Tensor, k: int, generator: torch.Generator, greedy: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """``sample_without_replacement(scores, k, ...)``'s indices and the picked scores."""
    flat, _ = gumbel_top_k(scores, k, generator, greedy)
    return flat, scores.index_select(0, flat)


def _renormalise(raw: torch.Tensor, values: list[float]) -> torch.Tensor:
    """``renormalise(torch.where(isfinite(raw), raw, -inf))`` for the picked scores ``raw``
    (``values`` on the host), bit for bit: picked scores are log-probabilities, finite or
    -inf, so the ``where`` is needed only for NaN or +inf, and with the maximum known finite,
    torch's logsumexp without its guard against infinite maxima."""
    if not all(v < INF for v in values):  # NaN or +inf
        return renormalise(torch.where(torch.isfinite(raw), raw, NEG_INF))
    top = max(range(len(values)), key=values.__getitem__)
    if values[top] == NEG_INF:
        return renormalise(raw)
    mx = raw[top : top + 1]
    return raw - (raw - mx).exp_().sum(dim=-1, keepdim=True).log_().add_(mx)


INF = float("inf")
