"""Held-out evaluation of the drafts: greedy agreement and expected acceptance against the
target on prompts never trained on (and a sample of training sequences)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from mtad_train import objectives as O
from mtad_train.data import Buffer, collate, encode_item, generate, make_batches
from mtad_train.evalsets import heldout_items
from mtad_train.train import autocast_ctx

if TYPE_CHECKING:
    from mtad_train.config import DistillConfig


@dataclass
class EvalSet:
    kind: str
    seqs: list
    plens: list


@dataclass
class HeldoutPlan:
    """What the held-out sets are: how many prompts of each evaluation kind, the target's
    responses to them (greedy, ``max_new`` tokens, batches of ``batch_size``) and MT-Bench's
    second turns within ``max_seq_tokens``."""

    n_humaneval: int
    n_mtbench: int
    n_default: int
    default_prompts: str | None
    max_prompt_tokens: int
    max_seq_tokens: int
    max_new: int
    batch_size: int
    seed: int
    device: str
    mtbench_turn2: bool = True

    @classmethod
    def of(cls, cfg: DistillConfig) -> HeldoutPlan:
        return cls(
            n_humaneval=cfg.eval_n_humaneval,
            n_mtbench=cfg.eval_n_mtbench,
            n_default=cfg.eval_n_default,
            default_prompts=cfg.default_prompts,
            max_prompt_tokens=cfg.max_prompt_tokens,
            max_seq_tokens=cfg.max_seq_tokens,
            max_new=cfg.eval_max_new,
            batch_size=cfg.eval_batch_size,
            seed=cfg.seed,
            device=cfg.device,
            mtbench_turn2=cfg.eval_mtbench_turn2,
        )


def build_eval_sets(plan: HeldoutPlan, target, tok, heldout_pool: list[dict]) -> list[EvalSet]:
    items = heldout_items(plan.n_humaneval, plan.n_mtbench, plan.n_default, plan.default_prompts)
    for it in heldout_pool:
        items.append({**it, "kind": "pool-heldout"})
    by_kind: dict[str, EvalSet] = {}
    enc = [(it, encode_item(tok, it)) for it in items]
    enc = [(it, p) for it, p in enc if len(p) <= plan.max_prompt_tokens]
    seed = plan.seed + 10_000
    turn2 = []
    for s in range(0, len(enc), plan.batch_size):
        chunk = enc[s : s + plan.batch_size]
        resps = generate(
            target, tok, [p for _, p in chunk], plan.max_new, False, plan.device, seed + s
        )
        for (it, p), r in zip(chunk, resps, strict=True):
            by_kind.setdefault(it["kind"], EvalSet(it["kind"], [], []))
            by_kind[it["kind"]].seqs.append(p + r)
            by_kind[it["kind"]].plens.append(len(p))
            if plan.mtbench_turn2 and it.get("second_turn"):
                text = tok.decode(r, skip_special_tokens=True)
                msgs = it["messages"] + [
                    {"role": "assistant", "content": text},
                    {"role": "user", "content": it["second_turn"]},
                ]
                turn2.append({"kind": "mtbench-turn2", "messages": msgs})
    enc2 = [(it, encode_item(tok, it)) for it in turn2]
    enc2 = [(it, p) for it, p in enc2 if len(p) <= plan.max_seq_tokens - plan.max_new]
    if enc2:
        resps = generate(
            target, tok, [p for _, p in enc2], plan.max_new, False, plan.device, seed + 99_999
        )
        for (it, p), r in zip(enc2, resps, strict=True):
            by_kind.setdefault(it["kind"], EvalSet(it["kind"], [], []))
            by_kind[it["kind"]].seqs.append(p + r)
            by_kind[it["kind"]].plens.append(len(p))
    return list(by_kind.values())


@torch.no_grad()
def evaluate(
    cfg: DistillConfig,
    target,
    drafts,
    specs,
    sets: list[EvalSet],
    train_buf: Buffer | None = None,
):
    """{draft: {kind: metrics}} on held-out sets (+ a sample of training sequences)."""
    sets = list(sets)
    if train_buf is not None and train_buf.seqs:
        r = random.Random(7)
        pick = r.sample(range(len(train_buf.seqs)), min(128, len(train_buf.seqs)))
        sets.append(
            EvalSet(
                "train-sample",
                [train_buf.seqs[i] for i in pick],
                [train_buf.plens[i] for i in pick],
            )
        )
    for d in drafts:
        d.eval()
    res: dict = {s.name: {} for s in specs}
    for es in sets:
        b = Buffer(seqs=es.seqs, plens=es.plens)
        acc: dict = {s.name: {} for s in specs}
        for rows in make_batches(b, list(range(len(b.seqs))), cfg.micro_tokens):
            x, w = collate(b, rows, target.config.pad_token_id or 0, 0.0, cfg.device)
            sel = w > 0
            with autocast_ctx(cfg):
                t_logits = target.lm_head(target.model(input_ids=x).last_hidden_state[sel]).float()
            for spec, d in zip(specs, drafts, strict=True):
                with autocast_ctx(cfg):
                    d_logits = d.lm_head(d.model(input_ids=x).last_hidden_state[sel]).float()
                m = O.heldout_metrics(t_logits, d_logits)
                for k, v in m.items():
                    acc[spec.name].setdefault(k, []).append(v.cpu())
        for name in acc:
            cat = {k: torch.cat(v) for k, v in acc[name].items()}
            res[name][es.kind] = {k: float(v.mean()) for k, v in cat.items()}
            res[name][es.kind]["positions"] = int(next(iter(cat.values())).numel())
            res[name][es.kind]["prompts"] = len(es.seqs)
    for d in drafts:
        d.train()
    return res
