"""Tokens/s and block efficiency of every method on the tiny random pair, side by side.

A baseline for later performance work: same prompts, same seeds, one process, methods
interleaved prompt by prompt so machine noise hits them alike. Ratios are against ``ar``.

    python -m bench.tiny_baseline [--family llama|opt] [--prompts 8] [--max-new 64]
"""

from __future__ import annotations

import argparse

import torch
from rich.console import Console
from rich.table import Table

from mtad.engine import Decoder, DecodeStats
from mtad.engine.runner import ModelRunner
from mtad.engine.tiny import build_tiny_pair
from mtad.methods import build_method

ORDER = ("ar", "sps", "blockverify", "mtad", "mtjd", "specinfer", "bild", "mmtad")
# Each method at its params dataclass's defaults, except BiLD: the random tiny models are
# rarely confident, so its fallback threshold is lowered to let it draft at all.
OVERRIDES = {"bild": {"fallback_threshold": 0.1, "rollback_threshold": 3.0, "max_draft": 4}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default="llama", choices=["llama", "opt"])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target, draft = build_tiny_pair(args.family)
    t, d = ModelRunner(target, "target"), ModelRunner(draft, "draft")
    decoders = {n: Decoder(build_method(n, **OVERRIDES.get(n, {})), t, d, seed=0) for n in ORDER}
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 256, (16,), generator=gen).tolist() for _ in range(args.prompts)]
    for dec in decoders.values():  # warm-up
        dec.generate(prompts[0], 8)
    stats: dict[str, list[DecodeStats]] = {n: [] for n in decoders}
    for i, prompt in enumerate(prompts):
        for name, dec in decoders.items():
            stats[name].append(dec.generate(prompt, args.max_new, seed=i).stats)
    totals = {n: DecodeStats.total(s) for n, s in stats.items()}
    ar = totals["ar"]
    table = Table(title=f"tiny {args.family} pair: {args.prompts} prompts x {args.max_new} tokens")
    for col in ("method", "tokens/s", "x ar", "block eff.", "accept", "draft %", "verify %"):
        table.add_column(col, justify="right")
    for name, s in totals.items():
        table.add_row(
            name,
            f"{s.tokens_per_s:.1f}",
            f"{s.tokens_per_s / ar.tokens_per_s:.2f}",
            f"{s.block_efficiency:.2f}",
            f"{s.acceptance_rate:.2f}",
            f"{100 * s.time_draft / s.wall_time:.0f}",
            f"{100 * s.time_verify / s.wall_time:.0f}",
        )
    Console().print(table)


if __name__ == "__main__":
    main()
