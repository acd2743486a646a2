"""Training a feature-level draft head on stored teacher-forced features, resumably.

The data are the shards of :mod:`mtad_train.features` (the target's tapped hidden states and
top-k next-token log-probabilities at every position of a token corpus). One step:

1. fuse the target's features of every position (``g_i``) and unroll the head over the sequence
   at draft depths ``1..depths`` (:func:`mtad_train.unroll.unrolled`: depth 1
   reads true features, depth ``k`` its own outputs of the ``k - 1`` positions before, with the
   attention the draft has then -- EAGLE-3's "training-time test", HASS's harmonised context);
2. at every depth and position, the loss against the target's next-token distribution there:
   KL(p || q) over the target's stored top-k plus one bin for the rest (a lower bound of the full
   KL, exact on every token the authors' top-k-10 warping can keep), plus ``overlap_weight`` x
   (1 - sum_v min(p_w, q_w)) under the authors' warping (temperature 1, top-k 10, top-p 0.9),
   the expected acceptance the draft is judged by (:mod:`mtad_train.objectives`);
3. an AdamW step with warm-up and cosine decay.

The sequence order is a function of the seed and the epoch, and a checkpoint holds the weights,
the optimiser, the step and the data cursor, written atomically every ``ckpt_every_s`` seconds:
a killed run resumes to the weights the uninterrupted run reaches (``tests/test_feature_head.py``).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from mtad.engine.feature_head import FeatureHead
from mtad.engine.features import FINAL_NORM_TAP
from mtad.runs.atomic import write_atomic, writing
from mtad_train import objectives as O
from mtad_train.batches import micro_batches
from mtad_train.cli import opt
from mtad_train.features import Shard, from_bf16_bits, load_shard
from mtad_train.unroll import unrolled


@dataclass
class HeadTrainConfig:
    """How a head is optimised (its fields are also ``scripts/train_head.py train``'s options)."""

    depths: int = opt(4, help="draft depths trained (the decoding gamma the head serves)")
    depth_weights: list[float] = field(default_factory=lambda: [1.0, 1.0, 1.0, 1.0])
    epochs: float = 2.0
    lr: float = 1e-3
    warmup_steps: int = 20
    min_lr_frac: float = 0.05
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    tokens_per_step: int = 8192
    micro_tokens: int = 2048
    prompt_weight: float = 0.1  # loss weight of prompt positions (responses: 1)
    # score each prompt position with probability prompt_weight at weight 1 instead of all of
    # them at prompt_weight: the same expected loss and gradient in a fraction of the logits'
    # rows (the prompts are 46% of the on-policy positions; rows that are not scored cost the
    # unrolled layer only, not the logits head over the sub-vocabulary and its loss)
    prompt_sampled: bool = opt(False, help="prompt positions scored at rate prompt_weight")
    overlap_weight: float = 1.0
    kl_weight: float = 1.0
    # smooth-L1 regression of the head's output on the target's final normed state at the same
    # position (EAGLE-1/2, HASS), in units of that state's RMS; only for heads that read it (tap
    # -1 among their taps), ignored for heads over other layers only
    reg_weight: float = opt(1.0, help="heads reading tap -1")
    feature_rms: float = 1.0
    deep_fraction: float = opt(1.0, help="share of positions scored at depths >= 2")
    seed: int = 0
    # shard dir -> passes per epoch (``--repeat FOLDER=N`` at the command line)
    source_repeats: dict[str, int] = opt(default_factory=dict, cli=False)
    ckpt_every_s: float = 300.0
    # bfloat16 matmuls (CPUs with native bfloat16, GPUs); ``--autocast auto|bf16|off`` resolves it
    autocast: bool = opt(True, cli=False)

    def __post_init__(self) -> None:
        if len(self.depth_weights) < self.depths:
            self.depth_weights = list(self.depth_weights) + [1.0] * (
                self.depths - len(self.depth_weights)
            )


@dataclass
class SeqRef:
    shard: int
    index: int  # sequence index inside the shard
    length: int


class ShardData:
    """Every sequence of a list of shard folders, addressable as (shard, sequence)."""

    def __init__(
        self,
        folders: Sequence[Path],
        repeats: dict[str, int] | None = None,
        taps: Sequence[int] | None = None,
    ) -> None:
        self.shards: list[Shard] = [load_shard(Path(f)) for f in folders]
        # the layers a head reads, in its order (tap -1: the final normed state); None: the
        # shards' stored taps as they are
        self.taps = None if taps is None else [int(t) for t in taps]
        self.starts = [s.starts for s in self.shards]
        self.repeats = [int((repeats or {}).get(str(Path(f).parent), 1)) for f in folders]

    def refs(self) -> list[SeqRef]:
        out = []
        for si, sh in enumerate(self.shards):
            for _ in range(self.repeats[si]):
                out.extend(SeqRef(si, j, int(n)) for j, n in enumerate(sh.lens))
        return out

    def sequence(self, ref: SeqRef) -> dict[str, np.ndarray]:
        sh = self.shards[ref.shard]
        s = int(self.starts[ref.shard][ref.index])
        e = s + ref.length
        return {
            "tokens": sh.tokens[s:e].astype(np.int64),
            "feats": sh.tapped(s, e, self.taps),  # [n, taps, d] bfloat16 bits
            "ids": np.asarray(sh.topk_ids[s:e]).astype(np.int64),
            "logp": np.asarray(sh.topk_logp[s:e]).astype(np.float32),
            "plen": int(sh.plens[ref.index]),
        }


def epoch_steps(refs: list[SeqRef], cfg: HeadTrainConfig, epoch: int) -> list[list[SeqRef]]:
    """The epoch's steps: a seeded permutation of the sequences cut into ~tokens_per_step."""
    rng = np.random.default_rng([cfg.seed, epoch])
    order = rng.permutation(len(refs))
    steps, cur, acc = [], [], 0
    for i in order:
        cur.append(refs[i])
        acc += refs[i].length
        if acc >= cfg.tokens_per_step:
            steps.append(cur)
            cur, acc = [], 0
    if cur:
        steps.append(cur)
    return steps


def ref_batches(step: list[SeqRef], micro_tokens: int) -> list[list[SeqRef]]:
    """Sequences of one step in micro-batches of <= micro_tokens padded cells (ties in length
    by shard and index: the order does not depend on the step's)."""
    return micro_batches(
        step, micro_tokens, length=lambda r: r.length, order=lambda r: (r.length, r.shard, r.index)
    )


# Batch widths and the rows of the logits matmul are rounded up to a multiple of this: oneDNN
# builds (and caches) a matmul primitive per shape, and new shapes every step grew the training
# process by ~65 MB a step of 2,048 positions (to 9.5 GB in 370 steps); bucketed, ~15 MB.
SHAPE_BUCKET = 64


def bucketed(n: int) -> int:
    """``n`` rounded up to a multiple of :data:`SHAPE_BUCKET`."""
    return -(-n // SHAPE_BUCKET) * SHAPE_BUCKET


PAD_LOGP = -30.0  # the log-probability of padded top-k cells (no token: any finite low value)


def collate(data: ShardData, refs: list[SeqRef], prompt_weight: float) -> dict[str, torch.Tensor]:
    """Right-padded batch: tokens, features, teacher top-k and per-position loss weights
    (position ``i`` predicts token ``i + 1``: the last position has no target)."""
    seqs = [data.sequence(r) for r in refs]
    b, L = len(seqs), bucketed(max(len(s["tokens"]) for s in seqs))
    k = seqs[0]["ids"].shape[1]
    shape = seqs[0]["feats"].shape[1:]
    tokens = torch.zeros(b, L, dtype=torch.long)
    feats = torch.zeros(b, L, *shape, dtype=torch.bfloat16)
    ids = torch.zeros(b, L, k, dtype=torch.long)
    logp = torch.full((b, L, k), PAD_LOGP)
    w = torch.zeros(b, L)
    prompt = torch.zeros(b, L, dtype=torch.bool)
    for r, s in enumerate(seqs):
        n = len(s["tokens"])
        tokens[r, :n] = torch.from_numpy(s["tokens"])
        feats[r, :n] = from_bf16_bits(s["feats"]).view(n, *shape)
        ids[r, :n] = torch.from_numpy(s["ids"])
        logp[r, :n] = torch.from_numpy(s["logp"])
        p = s["plen"]
        w[r, : max(p - 1, 0)] = prompt_weight
        prompt[r, : max(p - 1, 0)] = True
        w[r, max(p - 1, 0) : n - 1] = 1.0
    # feats: [b, L, taps, d], the layers the data was asked for (ShardData.taps)
    return {"tokens": tokens, "feats": feats, "ids": ids, "logp": logp, "w": w, "prompt": prompt}


def column_map(vocab_ids: torch.Tensor | None, vocab_size: int) -> torch.Tensor | None:
    """Full vocabulary id -> column of the head's compact logits (-1 outside them)."""
    if vocab_ids is None:
        return None
    m = torch.full((vocab_size,), -1, dtype=torch.long)
    m[vocab_ids.cpu()] = torch.arange(vocab_ids.numel())
    return m


# Floats of logits one fused pass holds at a time: 32 rows of the head's 12,289 columns, ~1.5 MB
# in float32, what a core's L2 keeps, so the passes over a chunk run from cache, not memory.
CHUNK_FLOATS = 32 * 12289


def chunk_rows(columns: int) -> int:
    """Rows of a ``columns``-wide float32 chunk that fit :data:`CHUNK_FLOATS`."""
    return max(1, CHUNK_FLOATS // max(1, columns))


# Columns of a block whose maximum :func:`blocked_topk` takes first.
TOPK_BLOCK = 64


def blocked_topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.topk(x, k, dim=-1)`` of a contiguous ``[n, W]`` tensor, sorted, in a fraction of
    its time on wide rows (torch's top-k costs ~2 ns a value on a CPU, its sort-free maximum
    ~0.1): an element among a row's k largest lies in one of the k blocks of
    :data:`TOPK_BLOCK` columns with the largest maxima (else k block maxima, k other elements,
    are at least as large) or in the columns after the last whole block; the top-k of those
    candidates is the row's. Among equal values the indices may differ from torch's."""
    n, width = x.shape
    blocks = width // TOPK_BLOCK
    if blocks < 4 * k:
        return torch.topk(x, k, dim=-1)
    whole = blocks * TOPK_BLOCK
    best = x[:, :whole].view(n, blocks, TOPK_BLOCK).amax(-1).topk(k, dim=-1).indices
    offsets = torch.arange(TOPK_BLOCK, device=x.device)
    cand = (best[..., None] * TOPK_BLOCK + offsets).view(n, k * TOPK_BLOCK)
    if whole < width:
        tail = torch.arange(whole, width, device=x.device).expand(n, -1)
        cand = torch.cat([cand, tail], dim=-1)
    values, at = x.gather(-1, cand).topk(k, dim=-1)
    return values, cand.gather(-1, at)


def row_top_lse(
    logits: torch.Tensor, k: int, cols: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Per row of ``logits`` ``[n, V]`` (any float dtype): ``(logsumexp, top-k values, top-k
    indices, values at cols)``, float32, in L2-sized row chunks through one reused buffer (a
    fresh multi-MB tensor per chunk is a fresh mapping whose pages fault in on first touch,
    which cost more than the work on them); ``cols`` ``[n, J]``: non-negative columns or None."""
    n, width = logits.shape
    rows = chunk_rows(width)
    lse = torch.empty(n, dtype=torch.float32)
    top_v = torch.empty(n, k, dtype=torch.float32)
    top_i = torch.empty(n, k, dtype=torch.long)
    picked = None if cols is None else torch.empty(cols.shape, dtype=torch.float32)
    buf = torch.empty(min(n, rows), width, dtype=torch.float32)
    for s in range(0, n, rows):
        e = min(n, s + rows)
        f = buf[: e - s].copy_(logits[s:e])
        if picked is not None:
            torch.gather(f, -1, cols[s:e], out=picked[s:e])
        top_v[s:e], top_i[s:e] = blocked_topk(f, k)
        # logsumexp in place, the chunk read last: log(sum(exp(row - max))) + max
        top = top_v[s:e, :1]  # the row's max
        torch.add(f.sub_(top).exp_().sum(dim=-1).log_(), top[:, 0], out=lse[s:e])
    return lse, top_v, top_i, picked


class _RowStats(torch.autograd.Function):
    """Per row of ``logits`` ``[n, V']``: the log-normaliser, the values at ``cols`` ``[n, J]``
    and the top ``k`` values, each in float32 -- all a head's loss reads of a whole row.

    Autograd over ``logits.float()`` then ``logsumexp``, ``gather`` and ``topk`` makes a
    full-size float32 copy, a full-size zero tensor per gather and top-k, and adds them up: on a
    CPU the row-wide elementwise passes, not the matmul, were ~60% of a training step (torch
    profiler, issue 39). Here the forward (:func:`row_top_lse`) and the backward run over row
    chunks that stay in cache, and the backward writes each chunk's gradient once:
    ``g_lse * softmax(row) + scatter(g_cols) + scatter(g_top)``."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, cols: torch.Tensor, k: int) -> tuple[torch.Tensor, ...]:
        lse, top_v, top_i, picked = row_top_lse(logits, k, cols)
        ctx.save_for_backward(logits, lse, cols, top_i)
        return lse, picked, top_v

    @staticmethod
    def backward(ctx, g_lse, g_picked, g_top) -> tuple[torch.Tensor | None, None, None]:
        logits, lse, cols, top_i = ctx.saved_tensors
        grad = torch.empty_like(logits)
        n, rows = logits.shape[0], chunk_rows(logits.shape[1])
        buf = torch.empty(min(n, rows), logits.shape[1], dtype=torch.float32)
        for s in range(0, n, rows):
            e = min(n, s + rows)
            f = buf[: e - s]
            if g_lse is None:
                f.zero_()
            else:
                f.copy_(logits[s:e]).sub_(lse[s:e, None]).exp_().mul_(g_lse[s:e, None])
            if g_picked is not None:
                f.scatter_add_(-1, cols[s:e], g_picked[s:e])
            if g_top is not None:
                f.scatter_add_(-1, top_i[s:e], g_top[s:e])
            grad[s:e].copy_(f)
        return grad, None, None


def row_stats(
    logits: torch.Tensor, cols: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(logsumexp, values at cols, top-k values)`` of each row of ``logits``, float32,
    differentiable in ``logits`` (:class:`_RowStats`); ``cols``: non-negative column indices."""
    return _RowStats.apply(logits, cols, k)


def head_loss(
    logits: torch.Tensor,
    t_ids: torch.Tensor,
    t_logp: torch.Tensor,
    cols: torch.Tensor | None,
    overlap_weight: float,
    kl_weight: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row ``(loss, kl, overlap)`` of compact draft ``logits`` ``[n, V']`` against the
    target's top-k ``t_ids`` / ``t_logp`` ``[n, K]`` (full-vocabulary ids).

    KL over the target's top-k tokens the head can propose plus one bin for everything else
    (tokens outside the head's sub-vocabulary join the rest bin on both sides), and the warped
    overlap ``sum_v min(p_w, q_w)`` (tokens the head cannot propose have q_w = 0). Only the
    log-normaliser and a top-k touch the whole row (:func:`row_stats`), the rest is ``[n, K]``."""
    c = t_ids if cols is None else cols[t_ids]
    present = c >= 0
    lse, at_c, q_vals = row_stats(logits, c.clamp_min(0), O.AUTHORS_WARP.top_k)
    log_q = at_c - lse[:, None]  # [n, K]
    p = torch.where(present, t_logp.exp(), 0.0)
    q = torch.where(present, log_q.exp(), 0.0)
    p_rest = (1.0 - p.sum(-1)).clamp_min(1e-6)
    q_rest = (1.0 - q.sum(-1)).clamp_min(1e-6)
    kl = (p * (t_logp - torch.where(present, log_q, 0.0))).sum(-1)
    kl = kl + p_rest * (p_rest.log() - q_rest.log())
    overlap = warped_overlap_topk(at_c, q_vals, t_logp, c)
    return kl_weight * kl + overlap_weight * (1.0 - overlap), kl, overlap


def warped_overlap_topk(
    at_c: torch.Tensor, q_vals: torch.Tensor, t_logp: torch.Tensor, c: torch.Tensor
) -> torch.Tensor:
    """``sum_v min(p_w, q_w)`` under the authors' warping (temperature 1), differentiable in the
    draft's float logits at the target's top-k columns ``at_c`` and its own top-k values
    ``q_vals`` (sorted): ``p_w`` from the target's stored top-k log-probabilities ``t_logp``,
    ``q_w`` renormalised over the draft's own top-k-then-top-p set; ``c``: the compact columns
    of the target's top-k ids (-1 = not in the head's rows)."""
    warp = O.AUTHORS_WARP
    idx, p_w = O.target_sparse(t_logp, warp)  # slots of the target's top-k kept, and p_w
    pc = c.gather(-1, idx)
    probs = torch.softmax(q_vals.detach(), dim=-1)
    keep = (probs.cumsum(-1) - probs) < warp.top_p
    q_logz = torch.logsumexp(q_vals.masked_fill(~keep, float("-inf")), dim=-1, keepdim=True)
    thr = q_vals.detach().masked_fill(~keep, float("inf")).min(-1, keepdim=True).values
    q_at = at_c.gather(-1, idx)
    q_w = torch.where((q_at >= thr) & (pc >= 0), (q_at - q_logz).exp(), 0.0)
    return torch.minimum(p_w, q_w).sum(-1)


def lr_at(cfg: HeadTrainConfig, step: int, total: int) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, total - cfg.warmup_steps))
    m = cfg.min_lr_frac
    return cfg.lr * (m + (1 - m) * 0.5 * (1 + math.cos(math.pi * progress)))


def step_loss(
    head: FeatureHead,
    batch: dict[str, torch.Tensor],
    cfg: HeadTrainConfig,
    cols,
    gen: torch.Generator | None = None,
) -> tuple[torch.Tensor, dict[str, list[float]]]:
    """Summed weighted loss of one micro-batch over every depth, and per-depth sums.

    Depths >= 2 score a random ``deep_fraction`` of their positions (weighted up by its
    inverse, so the loss stays unbiased): the logits head over the sub-vocabulary is most of a
    step's cost, and deeper depths then cost a fraction of depth 1. With ``prompt_sampled``,
    prompt positions likewise: each scored with probability ``prompt_weight`` at weight 1, the
    same positions at every depth."""
    w_all = batch["w"]
    if cfg.prompt_sampled and 0.0 < cfg.prompt_weight < 1.0:
        drawn = torch.rand(w_all.shape, generator=gen) < cfg.prompt_weight
        w_all = torch.where(batch["prompt"], drawn.to(w_all.dtype), w_all)
    L = w_all.shape[1]
    taps = head.spec.taps
    if batch["feats"].shape[2] != len(taps):
        raise ValueError(f"a batch of {batch['feats'].shape[2]} taps for a head reading {taps}")
    # regressed: heads reading the final normed state (EAGLE-1/2, HASS; fused with other layers,
    # EAGLE-3 style, warm-started from one that read it alone), not heads over other layers only
    reg_tap = taps.index(FINAL_NORM_TAP) if FINAL_NORM_TAP in taps else None
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.autocast):
        g = head.fused(batch["feats"])
        outs = unrolled(head, batch["tokens"], g, cfg.depths)
    total = torch.zeros(())
    stats: dict[str, list[float]] = {"w": [], "kl": [], "overlap": []}
    pos = torch.arange(L)
    for k, a in enumerate(outs, start=1):
        w = w_all * (pos >= k - 1)
        if k > 1 and cfg.deep_fraction < 1.0:
            keep = torch.rand(w.shape, generator=gen) < cfg.deep_fraction
            w = w * keep / cfg.deep_fraction
        sel = w > 0
        if not bool(sel.any()):
            for key in stats:
                stats[key].append(0.0)
            continue
        # the logits' rows padded to a bucket, and the padding scored too (rows with no target
        # token; their losses are dropped, so their gradient is zero): slicing the logits back
        # to the real rows made autograd zero-fill and copy a whole [rows, V'] gradient per
        # depth and micro-batch (1.03x a step without it on the Intel Xeon, bf16)
        n = int(sel.sum())
        pad = bucketed(n) - n
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.autocast):
            logits = head.logits(F.pad(a[sel], (0, 0, 0, pad)))
        t_ids = F.pad(batch["ids"][sel], (0, 0, 0, pad))
        t_logp = F.pad(batch["logp"][sel], (0, 0, 0, pad), value=PAD_LOGP)
        loss, kl, ov = (
            x[:n] for x in head_loss(logits, t_ids, t_logp, cols, cfg.overlap_weight, cfg.kl_weight)
        )
        if cfg.reg_weight and reg_tap is not None:
            # the feature the head reads at the next position is its own output: regress it
            # onto the target's final normed state (the tap -1 of the head's taps)
            target = batch["feats"][:, :, reg_tap][sel].float() / cfg.feature_rms
            reg = F.smooth_l1_loss(a[sel].float() / cfg.feature_rms, target, reduction="none")
            loss = loss + cfg.reg_weight * reg.mean(-1)
        ws = w[sel]
        total = total + cfg.depth_weights[k - 1] * (ws * loss).sum()
        stats["w"].append(float(ws.sum()))
        stats["kl"].append(float((ws * kl.detach()).sum()))
        stats["overlap"].append(float((ws * ov.detach()).sum()))
    return total, stats


def optimiser_step(
    head: FeatureHead,
    opt: torch.optim.Optimizer,
    cfg: HeadTrainConfig,
    batches: list[dict[str, torch.Tensor]],
    cols: torch.Tensor | None,
    lr: float,
    gen: torch.Generator | None,
) -> tuple[dict[str, np.ndarray], int]:
    """One AdamW step at ``lr`` over the micro-batches of a step, the loss normalised by their
    total weight: per-depth sums of weight, KL and overlap, and the positions trained."""
    for group in opt.param_groups:
        group["lr"] = lr
    opt.zero_grad(set_to_none=True)
    norm = sum(float(b["w"].sum()) for b in batches)
    sums: dict[str, np.ndarray] = {}
    for b in batches:
        loss, st = step_loss(head, b, cfg, cols, gen)
        (loss / norm).backward()
        for key, vals in st.items():
            sums[key] = sums.get(key, np.zeros(cfg.depths)) + np.array(vals)
    torch.nn.utils.clip_grad_norm_(head.parameters(), cfg.grad_clip)
    opt.step()
    return sums, int(sum(int((b["w"] > 0).sum()) for b in batches))


@dataclass
class TrainState:
    step: int = 0
    epoch: int = 0
    cursor: int = 0  # steps done in the current epoch
    positions: int = 0  # weighted token-positions trained on (depth 1)
    seconds: float = 0.0
    history: list[dict[str, Any]] = field(default_factory=list)

    def record(self, lr: float, sums: dict[str, np.ndarray], positions: int, dt: float):
        """Count one step done (``dt`` seconds, ``positions`` trained) and its history row."""
        self.step += 1
        self.cursor += 1
        self.positions += positions
        self.seconds += dt
        w = np.maximum(sums["w"], 1e-9)
        rec = {
            "step": self.step,
            "positions": self.positions,
            "seconds": self.seconds,
            "lr": lr,
            "kl": (sums["kl"] / w).round(4).tolist(),
            "overlap": (sums["overlap"] / w).round(4).tolist(),
        }
        self.history.append(rec)
        return rec


CKPT_FILE = "ckpt.pt"  # a training folder's checkpoint: weights, optimiser, state


def save_checkpoint(
    folder: Path, head: FeatureHead, opt, state: TrainState, extra: dict[str, Any] | None = None
) -> None:
    """Weights, optimiser, state (and ``extra`` entries) as one file, replacing the last one
    only when complete."""
    ck = {"head": head.state_dict(), "opt": opt.state_dict(), "state": asdict(state)}
    with writing(folder / CKPT_FILE) as f:
        torch.save({**ck, **(extra or {})}, f)


def load_checkpoint(folder: Path, head: FeatureHead, opt) -> TrainState | None:
    path = folder / CKPT_FILE
    if not path.is_file():
        return None
    ck = torch.load(path, map_location="cpu", weights_only=False)
    head.load_state_dict(ck["head"])
    opt.load_state_dict(ck["opt"])
    return TrainState(**ck["state"])


def make_optimizer(head: FeatureHead, cfg: HeadTrainConfig) -> torch.optim.Optimizer:
    decay = [p for n, p in head.named_parameters() if p.requires_grad and p.dim() >= 2]
    rest = [p for n, p in head.named_parameters() if p.requires_grad and p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": rest, "weight_decay": 0}],
        lr=cfg.lr,
        betas=(0.9, 0.95),
    )


def _start(head: FeatureHead, cfg: HeadTrainConfig, folder: Path, log: Callable[[str], None]):
    """The optimiser and the state to go on from (the checkpoint in ``folder``, if any)."""
    folder.mkdir(parents=True, exist_ok=True)
    write_atomic(folder / "config.json", json.dumps(asdict(cfg), indent=2) + "\n")
    head.train()
    opt = make_optimizer(head, cfg)
    state = load_checkpoint(folder, head, opt) or TrainState()
    if state.step:
        log(f"resumed at step {state.step} (epoch {state.epoch}, cursor {state.cursor})")
    return opt, state


def train(
    head: FeatureHead,
    data: ShardData,
    cfg: HeadTrainConfig,
    ckpt_dir: str | os.PathLike[str],
    max_steps: int = 0,
    on_step: Callable[[TrainState, dict[str, Any]], None] | None = None,
    on_export: Callable[[TrainState], None] | None = None,
    export_every_s: float = 0.0,
    time_budget_s: float = 0.0,
    log: Callable[[str], None] = print,
) -> TrainState:
    """Train ``head`` (in place) on ``data``; resume from ``ckpt_dir`` when it holds a
    checkpoint. ``max_steps`` / ``time_budget_s`` stop early (a checkpoint is written first);
    ``on_export`` is called every ``export_every_s`` seconds of training and at the end."""
    folder = Path(ckpt_dir)
    opt, state = _start(head, cfg, folder, log)
    refs = data.refs()
    per_epoch = len(epoch_steps(refs, cfg, 0))
    total = max(1, int(round(cfg.epochs * per_epoch)))
    cols = column_map(head.vocab_ids, head.vocab_size)
    last_ckpt = last_export = time.monotonic()
    started = time.monotonic()
    steps_here = 0
    while state.step < total:
        steps = epoch_steps(refs, cfg, state.epoch)
        while state.cursor < len(steps) and state.step < total:
            t0 = time.perf_counter()
            lr = lr_at(cfg, state.step, total)
            micro = [
                collate(data, mb, cfg.prompt_weight)
                for mb in ref_batches(steps[state.cursor], cfg.micro_tokens)
            ]
            gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + state.step)
            sums, positions = optimiser_step(head, opt, cfg, micro, cols, lr, gen)
            rec = state.record(lr, sums, positions, time.perf_counter() - t0)
            if on_step:
                on_step(state, rec)
            steps_here += 1
            now = time.monotonic()
            done = state.step >= total
            stop = (max_steps and steps_here >= max_steps) or (
                time_budget_s and now - started >= time_budget_s
            )
            if now - last_ckpt >= cfg.ckpt_every_s or done or stop:
                save_checkpoint(folder, head, opt, state)
                last_ckpt = now
            due = export_every_s and now - last_export >= export_every_s
            if on_export and (due or done or (stop and time_budget_s)):  # a budget's end too
                on_export(state)
                last_export = time.monotonic()
            if stop and not done:
                return state
        if state.cursor >= len(steps):
            state.epoch += 1
            state.cursor = 0
    head.eval()
    return state
