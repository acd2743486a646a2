"""One optimiser step of every draft on a sample of the buffer, its learning-rate schedule,
and the resumable checkpoint."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from mtad.cpu import native_bf16
from mtad.runs.atomic import writing
from mtad_train import objectives as O
from mtad_train.data import Buffer, collate, make_batches

if TYPE_CHECKING:
    from mtad_train.config import DistillConfig


def autocast_ctx(cfg: DistillConfig):
    """bfloat16 autocast: ``bf16`` always, ``auto`` on CUDA and on CPUs with native bfloat16
    (AMX / AVX-512 BF16, :func:`mtad.cpu.native_bf16`), where it is 2-3x faster than float32."""
    cuda = cfg.device.startswith("cuda")
    use = cfg.autocast == "bf16" or (cfg.autocast == "auto" and (cuda or native_bf16()))
    return torch.autocast("cuda" if cuda else "cpu", dtype=torch.bfloat16, enabled=bool(use))


def lr_at(cfg: DistillConfig, progress: float, step: int) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = min(max(progress, 0.0), 1.0)
    m = cfg.min_lr_frac
    return cfg.lr * (m + (1 - m) * 0.5 * (1 + math.cos(math.pi * progress)))


def train_step(
    cfg: DistillConfig, target, drafts, opts, specs, buf: Buffer, rng: random.Random, lr: float
):
    """One optimiser step per draft on ~tokens_per_step tokens sampled from the buffer."""
    n = len(buf.seqs)
    mean_len = max(1.0, sum(len(s) for s in buf.seqs[-512:]) / min(n, 512))
    k = max(1, min(n, int(cfg.tokens_per_step / mean_len)))
    idx = rng.sample(range(n), k)
    batches = make_batches(buf, idx, cfg.micro_tokens)
    total_w = 0.0
    for opt in opts:
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad(set_to_none=True)
    cells = []
    for rows in batches:
        x, w = collate(buf, rows, target.config.pad_token_id or 0, cfg.prompt_weight, cfg.device)
        sel = w > 0
        ws = w[sel]
        cells.append((x, sel, ws, cached_teacher(buf, rows, cfg)))
        total_w += float(ws.sum())
    acc = {
        s.name: {k: torch.zeros((), device=cfg.device) for k in ("kl", "tv", "agree")}
        for s in specs
    }
    need_tv = any(s.tv_weight > 0 for s in specs)
    for x, sel, ws, cached in cells:
        t = _teacher(cfg, target, x, sel, cached, need_tv)  # once, shared by every draft
        for spec, d in zip(specs, drafts, strict=True):
            with autocast_ctx(cfg):
                dh = d.model(input_ids=x).last_hidden_state[sel]
                d_logits = d.lm_head(dh).float()
            if cached is not None:
                kl = O.topk_kl(*cached, d_logits)
            else:
                kl = O.forward_kl(t["logp"], d_logits, t["negent"], t["p"])
            loss = (kl * ws).sum() / total_w
            a = acc[spec.name]
            if spec.tv_weight > 0:
                ov = O.warped_overlap(None, d_logits, target_warped=t["warped"])
                loss = loss + spec.tv_weight * ((1 - ov) * ws).sum() / total_w
                a["tv"] += ((1 - ov.detach()) * ws).sum() / total_w
            loss.backward()
            a["kl"] += (kl.detach() * ws).sum() / total_w
            a["agree"] += ((d_logits.detach().argmax(-1) == t["arg"]).float() * ws).sum() / total_w
            del d_logits, dh, kl, loss
        del t
    for d, opt in zip(drafts, opts, strict=True):
        if cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(d.parameters(), cfg.grad_clip)
        opt.step()
    stats = {name: {k: float(v) for k, v in a.items()} for name, a in acc.items()}
    tokens = int(sum(int(sel.sum()) for _, sel, _, _ in cells))
    return stats, tokens


@torch.no_grad()
def _teacher(cfg: DistillConfig, target, x, sel, cached, need_tv: bool) -> dict:
    """The target's side of a micro-batch's trained cells ``sel``: its stored top-k when the
    data carry it (``cached``), else a target forward's log-probabilities; its greedy token and
    (``need_tv``) its warped distribution."""
    if cached is not None:  # the target's top-k, stored when it generated the data
        t_ids, t_topk = cached
        arg = t_ids[:, 0]
        return {"arg": arg, "warped": O.target_sparse_from_topk(t_ids, t_topk) if need_tv else None}
    with autocast_ctx(cfg):
        th = target.model(input_ids=x).last_hidden_state[sel]
        t_logits = target.lm_head(th).float()
    t_logp = torch.log_softmax(t_logits, -1)
    t_p = t_logp.exp()
    negent = (t_p * t_logp).sum(-1)
    arg = t_logits.argmax(-1)
    warped = O.target_sparse(t_logits) if need_tv else None
    return {"logp": t_logp, "p": t_p, "negent": negent, "arg": arg, "warped": warped}


def cached_teacher(
    buf: Buffer, rows: list[int], cfg: DistillConfig
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The stored target top-k of a micro-batch's trained positions (prompt positions first
    when ``--prompt-weight`` > 0, then response positions: each row's ``w > 0`` cells), in the
    row-major order of those cells; None (compute the target on the fly) when a row lacks
    them."""
    parts = [buf.teach]
    if cfg.prompt_weight > 0:
        parts.insert(0, buf.teach_prompt)  # positions 0..p-2 come before p-1..
    if any(part[i] is None for part in parts for i in rows):
        return None
    per_row = [part[i] for i in rows for part in parts]
    ids = torch.from_numpy(np.concatenate([t[0] for t in per_row])).long()
    logp = torch.from_numpy(np.concatenate([t[1] for t in per_row])).float()
    return ids.to(cfg.device), logp.to(cfg.device)


def save_ckpt(path: Path, state: dict):
    """The distillation's state, replacing the last one only when complete."""
    with writing(path / "state.pt") as f:
        torch.save(state, f)


def load_ckpt(path: Path):
    f = path / "state.pt"
    return torch.load(f, map_location="cpu", weights_only=False) if f.is_file() else None
