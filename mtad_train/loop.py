"""A whole distillation run (``scripts/distill_draft.py`` is its command line).

Set-up: the prompt pool checked disjoint from every evaluation prompt, the target and the
drafts, a checkpoint to resume from, the held-out sets. Then generation and training
interleave (generate a target batch whenever the drafts have trained on ``--replay-ratio`` x the
generated tokens) until ``--gen-frac`` of the budget (time or steps), then training alone while
the learning rate decays; the drafts and their reports are exported every ``--export-every-s``
seconds and at the end, the training state checkpointed every ``--ckpt-every-s``.
"""

from __future__ import annotations

import json
import random
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from tqdm import tqdm

from mtad.harness.results import environment
from mtad_train import objectives as O
from mtad_train import report
from mtad_train.data import (
    Buffer,
    encode_item,
    fill_teacher,
    generate,
    load_data,
    save_data,
)
from mtad_train.drafts import build_draft, build_optimisers, init_from, load_target
from mtad_train.evaluate import HeldoutPlan, build_eval_sets, evaluate
from mtad_train.prompts import FOLLOW_UPS, prepare_pool
from mtad_train.train import load_ckpt, lr_at, save_ckpt, train_step

if TYPE_CHECKING:
    from mtad_train.config import DistillConfig


class Distillation:
    """The state of one run and its two kinds of iteration (a generation batch, a training
    step); :meth:`run` drives them and returns the last held-out metrics."""

    def __init__(self, cfg: DistillConfig) -> None:
        self.cfg = cfg
        self.t_start = time.perf_counter()
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        self.rng = random.Random(cfg.seed)
        self.out = Path(cfg.out)
        self.log = log = tqdm.write

        self.pool = prepare_pool(cfg, log)
        self.load_models()
        self.buf = Buffer()
        self.history: list[dict] = []
        self.step = self.cursor = self.gen_batches = self.train_tokens = 0
        self.finished_chats: list[tuple[dict, list[int]]] = []
        self.elapsed_before = 0.0
        resumed_loop_start = None
        self.ckpt_dir = Path(cfg.ckpt_dir) if cfg.ckpt_dir else None
        if self.ckpt_dir and (st := load_ckpt(self.ckpt_dir)):
            resumed_loop_start = self.resume(st)
        self.load_data_in()

        # held-out sets (target responses generated once)
        t0 = time.perf_counter()
        self.eval_sets = build_eval_sets(
            HeldoutPlan.of(cfg), self.target, self.tok, self.pool["heldout"]
        )
        log(
            f"held-out sets: {[(e.kind, len(e.seqs)) for e in self.eval_sets]} "
            f"({time.perf_counter() - t0:.1f} s)"
        )
        # prompts whose responses are already in the buffer (loaded with --data-in, or
        # generated before a resume) are not generated again: a continued run draws new ones
        self.seen_prompts = {
            tuple(q[:n])
            for q, n, k in zip(self.buf.seqs, self.buf.plens, self.buf.kinds, strict=True)
            if k != "followup"
        }
        self.recipe = self.make_recipe()
        # the schedule (gen phase, lr decay) spans the loop, not the set-up
        self.loop_start = resumed_loop_start if resumed_loop_start is not None else self.elapsed()
        self.metrics: dict = {}

    def load_models(self) -> None:
        """The frozen target, the drafts (from ``--init-from`` when given), their optimisers."""
        cfg, log = self.cfg, self.log
        self.target, self.tok = load_target(cfg)
        log(
            f"target loaded ({time.perf_counter() - self.t_start:.1f} s): "
            f"{sum(p.numel() for p in self.target.parameters()) / 1e6:.1f}M params on "
            f"{cfg.device}"
        )
        self.specs = cfg.drafts
        torch.manual_seed(cfg.seed)
        self.drafts = [build_draft(s, self.target, cfg) for s in self.specs]
        self.opts = build_optimisers(cfg, self.drafts)
        if cfg.init_from:
            init_from(cfg.init_from, self.specs, self.drafts, log, restrict=cfg.eval_only)
        for s, d in zip(self.specs, self.drafts, strict=True):
            log(f"draft {s.name}: {sum(p.numel() for p in d.parameters()) / 1e6:.2f}M params")

    def load_data_in(self) -> None:
        """``--data-in`` into an empty buffer, and the target's top-k where data lack it."""
        cfg, log = self.cfg, self.log
        if cfg.data_in and not self.buf.seqs:
            for f in cfg.data_in:
                n0 = len(self.buf.seqs)
                load_data(f, self.buf)
                log(
                    f"loaded {len(self.buf.seqs) - n0} sequences from {f}: "
                    f"{self.buf.gen_tokens} tokens"
                )
        if cfg.teacher_topk:  # loaded data, or a state saved before teach_prompt existed
            filled = fill_teacher(
                self.buf,
                self.target,
                cfg.teacher_topk,
                cfg.device,
                cfg.micro_tokens,
                log,
                prompts=cfg.prompt_weight > 0,
                progress=True,
            )
            if filled and self.ckpt_dir:
                # the pass over loaded data can take an hour on a CPU: a kill after it loses
                # nothing (the loop has not started: a resume starts its schedule afresh)
                self.loop_start = None
                self.checkpoint()

    def resume(self, st: dict) -> float | None:
        for d, sd in zip(self.drafts, st["drafts"], strict=True):
            d.load_state_dict(sd)
        for o, sd in zip(self.opts, st["opts"], strict=True):
            o.load_state_dict(sd)
        self.buf = Buffer(**st["buf"])
        self.history, self.step, self.cursor = st["history"], st["step"], st["cursor"]
        self.gen_batches, self.train_tokens = st["gen_batches"], st["train_tokens"]
        self.finished_chats = st["finished_chats"]
        self.elapsed_before = st["elapsed"]
        self.rng.setstate(st["rng"])
        torch.set_rng_state(st["torch_rng"])
        self.log(
            f"resumed from {self.ckpt_dir}: step {self.step}, "
            f"{self.buf.gen_tokens} generated tokens"
        )
        return st.get("loop_start")

    def checkpoint(self) -> None:
        save_ckpt(
            self.ckpt_dir,
            {
                "drafts": [d.state_dict() for d in self.drafts],
                "opts": [o.state_dict() for o in self.opts],
                "buf": asdict(self.buf),
                "history": self.history,
                "step": self.step,
                "cursor": self.cursor,
                "gen_batches": self.gen_batches,
                "train_tokens": self.train_tokens,
                "finished_chats": self.finished_chats,
                "elapsed": self.elapsed(),
                "loop_start": self.loop_start,
                "rng": self.rng.getstate(),
                "torch_rng": torch.get_rng_state(),
            },
        )

    def make_recipe(self) -> dict:
        cfg, env = self.cfg, environment()
        return {
            "target": cfg.target,
            "target_dtype": cfg.target_dtype,
            "seed": cfg.seed,
            "vocab_size": self.target.config.vocab_size,
            "args": asdict(cfg),  # every option (the drafts' specs as dicts)
            "warp": asdict(O.AUTHORS_WARP),
            "pool": self.pool["recipe"],
            "env": env,
            "git_commit": env["git"]["commit"] or "unknown",
            "cmd": " ".join([sys.executable] + sys.argv),
        }

    # ---- schedule: a time budget or a number of steps

    def elapsed(self) -> float:
        return self.elapsed_before + time.perf_counter() - self.t_start

    def progress(self) -> float:
        a = self.cfg
        if a.time_budget:
            return (self.elapsed() - self.loop_start) / max(
                1.0, a.time_budget - a.final_reserve_s - self.loop_start
            )
        return self.step / max(1, a.max_steps)

    def gen_phase(self) -> bool:
        a = self.cfg
        if a.time_budget:
            return self.progress() < a.gen_frac
        return self.step < a.gen_frac * a.max_steps

    def done(self) -> bool:
        a = self.cfg
        if a.time_budget:
            return self.elapsed() >= a.time_budget - a.final_reserve_s
        return self.step >= a.max_steps

    def plan(self) -> dict:
        return {
            "steps": self.step,
            "gen_batches": self.gen_batches,
            "gen_sequences": len(self.buf.seqs),
            "gen_tokens": self.buf.gen_tokens,
            "gen_tokens_greedy": self.buf.gen_tokens_greedy,
            "train_tokens": self.train_tokens,
            "pool_cursor": self.cursor,
            "wall_s": self.elapsed(),
        }

    # ---- the two iterations

    def generation_batch(self) -> None:
        """Target continuations of the next pool prompts (plus follow-up turns of finished
        chats) into the buffer; on CUDA out-of-memory, halve the batch and give the prompts back."""
        cfg, tok, rng = self.cfg, self.tok, self.rng
        greedy = rng.random() < cfg.gen_greedy_frac
        cursor_at_start = self.cursor
        batch_items, prompts = self.draw_prompts()
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        tg = time.perf_counter()
        try:
            out = generate(
                self.target,
                tok,
                [prompts[i] for i in order],
                cfg.gen_max_new,
                greedy,
                cfg.device,
                cfg.seed * 1_000_003 + self.gen_batches,
                teacher_topk=cfg.teacher_topk,
            )
            resps, teach = out if cfg.teacher_topk else (out, [None] * len(out))
        except torch.OutOfMemoryError:
            cfg.gen_batch_size = max(8, cfg.gen_batch_size // 2)
            # give the prompts back: the retry draws the same ones
            self.cursor = cursor_at_start
            self.seen_prompts.difference_update(tuple(p) for p in prompts)
            torch.cuda.empty_cache()
            self.log(f"out of memory while generating: gen batch size -> {cfg.gen_batch_size}")
            return
        new = 0
        for j, i in enumerate(order):
            r = resps[j]
            self.buf.add(prompts[i], r, batch_items[i]["kind"], greedy, teach[j])
            new += len(r)
            self.keep_finished(batch_items[i], r)
        if cfg.teacher_topk and cfg.prompt_weight > 0:
            # generation computed no logits at the prompt positions: one teacher-forced pass
            fill_teacher(
                self.buf,
                self.target,
                cfg.teacher_topk,
                cfg.device,
                cfg.micro_tokens,
                prompts=True,
            )
        self.gen_batches += 1
        dt = time.perf_counter() - tg
        self.log(
            f"gen batch {self.gen_batches} ({'greedy' if greedy else 'sampled'}): "
            f"{len(prompts)} prompts, {new} tokens in {dt:.1f} s ({new / dt:.0f} tok/s); "
            f"total {self.buf.gen_tokens} tokens"
        )

    def draw_prompts(self) -> tuple[list[dict], list[list[int]]]:
        """The next pool prompts not seen before (advancing the cursor), plus follow-up turns
        of finished chats: ``(items, prompt ids)``."""
        cfg, tok, rng = self.cfg, self.tok, self.rng
        batch_items, prompts = [], []
        n_follow = int(cfg.gen_batch_size * cfg.followup_frac) if self.finished_chats else 0
        while len(prompts) < cfg.gen_batch_size - n_follow:
            it = self.pool["train"][self.cursor % len(self.pool["train"])]
            self.cursor += 1
            p = encode_item(tok, it)
            if len(p) <= cfg.max_prompt_tokens and tuple(p) not in self.seen_prompts:
                self.seen_prompts.add(tuple(p))
                batch_items.append(it)
                prompts.append(p)
        for _ in range(n_follow):
            it, resp = self.finished_chats[rng.randrange(len(self.finished_chats))]
            msgs = it["messages"] + [
                {"role": "assistant", "content": tok.decode(resp, skip_special_tokens=True)},
                {"role": "user", "content": rng.choice(FOLLOW_UPS)},
            ]
            p = encode_item(tok, {"messages": msgs})
            if len(p) <= cfg.max_seq_tokens - cfg.gen_max_new:
                batch_items.append({"kind": "followup", "messages": msgs})
                prompts.append(p)
        return batch_items, prompts

    def keep_finished(self, it: dict, r: list[int]) -> None:
        """A single-turn chat the target finished (EOS, under 300 tokens) may get a follow-up
        turn later (at most 4096 kept, a random one dropped beyond)."""
        tok, rng = self.tok, self.rng
        if (
            "messages" in it
            and it["kind"] != "followup"
            and "assistant_prefix" not in it
            and r
            and r[-1] == tok.eos_token_id
            and len(r) < 300
        ):
            self.finished_chats.append((it, r))
            if len(self.finished_chats) > 4096:
                self.finished_chats.pop(rng.randrange(len(self.finished_chats)))

    def training_step(self) -> dict | None:
        """One step of every draft; None when CUDA ran out of memory (micro-batches halved)."""
        cfg = self.cfg
        lr = lr_at(cfg, self.progress(), self.step)
        try:
            stats, ntok = train_step(
                cfg, self.target, self.drafts, self.opts, self.specs, self.buf, self.rng, lr
            )
        except torch.OutOfMemoryError:
            cfg.micro_tokens = max(1024, cfg.micro_tokens // 2)
            torch.cuda.empty_cache()
            self.log(f"out of memory while training: micro-batch tokens -> {cfg.micro_tokens}")
            return None
        self.step += 1
        self.train_tokens += ntok
        self.history.append(
            {
                "step": self.step,
                "tokens": self.train_tokens,
                "gen_tokens": self.buf.gen_tokens,
                "lr": lr,
                "t": self.elapsed(),
                **stats,
            }
        )
        if self.step % 25 == 0:
            self.log(
                f"step {self.step} tok {self.train_tokens} lr {lr:.2e} "
                + json.dumps(
                    {k: {kk: round(vv, 4) for kk, vv in v.items()} for k, v in stats.items()}
                )
            )
        return stats

    def export(self, final: bool) -> None:
        cfg = self.cfg
        self.metrics = evaluate(cfg, self.target, self.drafts, self.specs, self.eval_sets, self.buf)
        self.recipe["plan"] = self.plan()
        report.export(
            cfg,
            self.out,
            self.specs,
            self.drafts,
            self.recipe,
            self.history,
            self.metrics,
            self.pool["overlap"],
            final,
        )
        if cfg.save_data:
            save_data(self.buf, self.out / "data.npz", cfg.transport_dir, cfg.transport_chunk_mib)
        summary = {
            s.name: {
                k: (round(v["agree"], 4), round(v["accept"], 4))
                for k, v in self.metrics[s.name].items()
            }
            for s in self.specs
        }
        self.log(f"[export step {self.step}] (agree, accept): {json.dumps(summary)}")

    def run(self) -> dict:
        cfg, budget = self.cfg, self.cfg.time_budget
        bar = tqdm(
            total=int(budget) if budget else cfg.max_steps,
            unit="s" if budget else "step",
            desc="distil",
            dynamic_ncols=True,
            mininterval=2.0,
        )
        last_export = last_ckpt = time.perf_counter()
        last_bar = 0
        while not self.done():
            need_gen = self.gen_phase() and (
                not self.buf.seqs or self.train_tokens >= cfg.replay_ratio * self.buf.gen_tokens
            )
            if need_gen or not self.buf.seqs:
                self.generation_batch()
                continue
            stats = self.training_step()
            if stats is None:
                continue
            if budget:
                now = int(min(budget, self.elapsed()))
                bar.update(now - last_bar)
                last_bar = now
            else:
                bar.update(1)
            bar.set_postfix(
                {
                    s.name: f"kl {stats[s.name]['kl']:.3f} ag {stats[s.name]['agree']:.2f}"
                    for s in self.specs
                },
                refresh=False,
            )
            now = time.perf_counter()
            if cfg.export_every_s and now - last_export >= cfg.export_every_s:
                self.export(final=False)
                last_export = time.perf_counter()
            if self.ckpt_dir and now - last_ckpt >= cfg.ckpt_every_s:
                self.checkpoint()
                last_ckpt = time.perf_counter()
        bar.close()
        self.export(final=True)
        self.log(
            f"done: {self.step} steps, {self.train_tokens} trained token-positions, "
            f"{self.buf.gen_tokens} generated tokens, "
            f"{time.perf_counter() - self.t_start:.0f} s; outputs in {self.out}"
        )
        return self.metrics


def distil(cfg: DistillConfig) -> dict:
    """Run a distillation (the options of ``scripts/distill_draft.py``); returns the final
    held-out metrics ``{draft: {kind: metrics}}``."""
    return Distillation(cfg).run()
