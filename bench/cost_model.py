"""Predicted against measured speed-up: a cost model of the decoding methods on one pair.

Per method, the time of one iteration is predicted from forward costs measured here (the
target's 1-token step ``t1``, its verification block of ``gamma + 1`` tokens ``tv``, the
draft's 1-token step on 1 row and on ``B`` rows) and divided by the method's measured block
efficiency (tokens per target forward):

* ``ar``:   ``t1`` per token;
* ``sps``:  ``(gamma * t_draft(1 row) + tv) / BE``;
* ``mtad``: ``(t_draft(1 row) + (gamma - 1) * t_draft(B rows) + tv) / BE`` (beam search runs the
  first draft step on the committed context, the others on ``B`` beams);
* ``mmtad``: as ``mtad`` but verifying the whole beam tree, ``gamma * B + 1`` tokens.

The gap between the prediction and the measured speed-up (the same prompts and seeds, methods
interleaved prompt by prompt) is the engine's overhead (warping, sampling, cache bookkeeping)
plus what the model leaves out. Both dtypes run in one process, so their figures are side by
side. After the speculative-decoding cost analysis of Leviathan et al. (2023, section 3.4).

    python -m bench.cost_model                           # smollm2, fp32 and bf16, 8 prompts
    python -m bench.cost_model --dtypes bfloat16 --prompts 4 --max-new 48
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from bench import common
from mtad.cpu import native_bf16
from mtad.engine import Decoder, DecodeStats
from mtad.engine.runner import ModelRunner
from mtad.methods import build_method

METHODS = ("ar", "sps", "mtad", "mmtad")


def forward_ms(runner: ModelRunner, n: int, rows: int, reps: int, context: int, pair=None) -> float:
    """Median wall milliseconds of one cached forward of ``n`` tokens on ``rows`` rows, as the
    methods call it (``compact``: an FR-Spec draft head's compact rows, as drafting reads them).
    A feature-level head (``pair`` given): one drafted position after the target and the head
    read the context."""
    gen = torch.Generator().manual_seed(0)
    if getattr(runner, "head", None) == "feature":
        ctx = torch.randint(0, runner.vocab_size, (context,), generator=gen)
        head = common.head_after_context(pair, ctx, rows)
        times = [common.time_head_step(head, rows, gen)[1] for _ in range(reps + 1)][1:]
        pair.target.reset()
        head.reset()
        return statistics.median(times)
    runner.reset()
    runner.forward(torch.randint(0, runner.vocab_size, (1, context), generator=gen), keep=1)
    if rows > 1:
        runner.repeat_rows(rows)
    times = []
    for rep in range(reps + 1):
        ids = torch.randint(0, runner.vocab_size, (rows, n), generator=gen)
        t0 = time.perf_counter()
        runner.forward(ids, keep=n, compact=True)
        if rep:  # the first one warms the shape up
            times.append(1e3 * (time.perf_counter() - t0))
        runner.crop(runner.cache_len - n)
    runner.reset()
    return statistics.median(times)


def predicted_ms_per_token(
    method: str, cost: dict[str, float], gamma: int, beams: int, be: float
) -> float:
    if method == "ar":
        return cost["t1"]
    if method == "sps":
        return (gamma * cost["d1"] + cost["tv"]) / be
    draft = cost["d1"] + (gamma - 1) * cost["dB"]
    verify = cost["tv"] if method == "mtad" else cost["tree"]
    return (draft + verify) / be


def measure(args: argparse.Namespace, dtype: str) -> list[list[str]]:
    args.dtype = dtype
    bp = common.load_bench_pair(args)
    prompts = common.load_prompts(args, bp.tokenizer)
    gamma, beams = args.gamma, args.beams
    cost = {
        "t1": forward_ms(bp.target, 1, 1, args.reps, args.context),
        "tv": forward_ms(bp.target, gamma + 1, 1, args.reps, args.context),
        "tree": forward_ms(bp.target, gamma * beams + 1, 1, args.reps, args.context),
        "d1": forward_ms(bp.draft, 1, 1, args.reps, args.context, bp),
        "dB": forward_ms(bp.draft, 1, beams, args.reps, args.context, bp),
    }
    params = {"gamma": gamma, "beam_width": beams}
    decoders = {
        m: Decoder(
            build_method(m, **({} if m == "ar" else params))
            if m != "sps"
            else build_method(m, gamma=gamma),
            bp.target,
            bp.draft,
            eos_token_ids=common.eos_ids(bp),
            seed=args.seed,
        )
        for m in args.methods
    }
    for dec in decoders.values():
        dec.generate(prompts[0].ids, 4, seed=args.seed)
    stats: dict[str, list[DecodeStats]] = {m: [] for m in args.methods}
    for i, prompt in enumerate(prompts):
        for m, dec in decoders.items():
            stats[m].append(dec.generate(prompt.ids, args.max_new, seed=args.seed + i).stats)
    total = {m: DecodeStats.total(s) for m, s in stats.items()}
    ar_ms = 1e3 / total["ar"].tokens_per_s if "ar" in total else cost["t1"]
    print(f"[{dtype}] pair: {bp.describe()}")
    print(
        f"[{dtype}] forward ms (median of {args.reps}, context {args.context}): "
        f"target 1 tok {cost['t1']:.1f}, {gamma + 1} tok {cost['tv']:.1f} "
        f"({cost['tv'] / cost['t1']:.2f}x), tree {gamma * beams + 1} tok {cost['tree']:.1f}; "
        f"draft 1 row {cost['d1']:.1f} ({cost['d1'] / cost['t1']:.3f} t1), {beams} rows "
        f"{cost['dB']:.1f} ({cost['dB'] / cost['t1']:.3f} t1)"
    )
    rows = []
    for m, s in total.items():
        be = s.block_efficiency
        pred = predicted_ms_per_token(m, cost, gamma, beams, be)
        meas = 1e3 / s.tokens_per_s
        rows.append(
            [
                dtype,
                m,
                s.new_tokens,
                f"{be:.2f}",
                f"{pred:.1f}",
                f"{meas:.1f}",
                f"{cost['t1'] / pred:.2f}",
                f"{ar_ms / meas:.2f}",
                f"{100 * (meas - pred) / meas:.1f}",
            ]
        )
    return rows


def main(argv: list[str] | None = None) -> list[list[str]]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_common_args(ap, prompts=8, max_new=64)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--beams", type=int, default=4)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--context", type=int, default=120)
    args = ap.parse_args(argv)
    args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    common.setup(args)
    print(common.environment_line(args))
    print(
        f"native bf16: {native_bf16() or 'none'}; gamma {args.gamma}, B {args.beams}; "
        f"{args.prompts} prompts x max {args.max_new} new tokens, T=1, top-k 10, top-p 0.9"
    )
    rows = [r for dt in args.dtypes.split(",") for r in measure(args, dt.strip())]
    common.print_table(
        "predicted vs measured (ms per token; speed-up vs ar: predicted from forward costs and "
        "measured block efficiency, measured side by side)",
        [
            "dtype",
            "method",
            "tokens",
            "block eff",
            "pred ms/tok",
            "meas ms/tok",
            "pred x ar",
            "meas x ar",
            "unmodelled %",
        ],
        rows,
    )
    return rows


if __name__ == "__main__":
    main()
