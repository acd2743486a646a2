"""The feature head's calls inside MTAD's loop, by kind and part, for two caches side by side.

MTAD's draft phase calls the head once to *feed* it (the accepted tokens and the next one, one
row, several positions read from the target's features) and then ``gamma - 1`` times *forward*
(one drafted position on every beam). This times each call and the attention inside it, in
MTAD's loop over the same prompts, with the head's cache of the engine (``bucketed``:
:class:`mtad.engine.head_runner.BucketedKV`, key lengths in buckets of 64 positions) and with
transformers' ``DynamicCache`` (``dynamic``: the key length exactly the cached one, the code
before the buckets), the two alternating prompt by prompt in one process.

    python -m bench.head_calls --prompts 8 --dtype bfloat16 [--draft assets/drafts/smollm2-head]

Wall milliseconds per call, medians (and means: a call that meets a new matmul shape is an
outlier the median hides), and all the head's calls per iteration (their sum over the feeds:
an iteration feeds once); "same tokens": prompts whose generated tokens the two caches agree
on (the buckets mask their padding, so the numbers differ at most by float rounding).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
from transformers import DynamicCache

from bench import common
from mtad.engine import Decoder
from mtad.engine.head_runner import BucketedKV, HeadRunner
from mtad.methods import build_method


class DynamicRows(DynamicCache):
    """transformers' ``DynamicCache`` with the one call :class:`HeadRunner` adds to a cache:
    ``expand_rows`` (a broadcast view, as the runner made before the buckets)."""

    def expand_rows(self, n: int) -> None:
        for layer in self.layers:
            if layer.get_seq_length() > 0:
                layer.keys = layer.keys.expand(n, *layer.keys.shape[1:])
                layer.values = layer.values.expand(n, *layer.values.shape[1:])


CACHES: dict[str, type] = {"bucketed": BucketedKV, "dynamic": DynamicRows}


def timed(record: list[float], fn: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        record.append(time.perf_counter() - start)
        return out

    return call


def main(argv: list[str] | None = None) -> tuple[list[list[Any]], int]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_common_args(ap, prompts=8)
    ap.add_argument("--gamma", type=int, default=0, help="MTAD's block depth (0: its default)")
    args = ap.parse_args(argv)
    common.setup(args)
    bp = common.load_bench_pair(args)
    runner = bp.draft
    if not isinstance(runner, HeadRunner):
        raise SystemExit(f"--draft {args.draft}: not a feature head (this times a head's calls)")
    prompts = common.load_prompts(args, bp.tokenizer)
    params = {"gamma": args.gamma} if args.gamma else {}
    dec = Decoder(
        build_method("mtad", **params), bp.target, runner, eos_token_ids=common.eos_ids(bp)
    )
    times: dict[tuple[str, str], list[float]] = defaultdict(list)
    where = {"call": ""}
    feed, forward, attention = runner._feed, runner._forward, runner.model._grouped_attention

    def in_call(name: str, fn: Callable[..., Any], kind: str) -> Callable[..., Any]:
        def call(*a: Any) -> Any:
            where["call"] = name
            try:
                return timed(times[(kind, name)], fn)(*a)
            finally:
                where["call"] = ""

        return call

    tokens: dict[str, list[list[int]]] = {kind: [] for kind in CACHES}
    for cache in CACHES.values():  # a warm-up generation each
        runner.cache_class = cache
        dec.generate(prompts[0].ids, 4, seed=args.seed)
    for i, prompt in enumerate(prompts):
        for kind, cache in CACHES.items():
            runner.cache_class = cache
            runner._feed = in_call("feed", feed, kind)
            runner._forward = in_call("forward", forward, kind)
            runner.model._grouped_attention = lambda *a, _k=kind: timed(  # noqa: E731
                times[(_k, f"attention in {where['call']}")], attention
            )(*a)
            out = dec.generate(prompt.ids, args.max_new, seed=args.seed + i)
            tokens[kind].append(out.token_ids)
    same = sum(a == b for a, b in zip(*tokens.values(), strict=True))
    print(common.environment_line(args))
    print(f"draft {args.draft}, {len(prompts)} prompts x {args.max_new} new tokens, MTAD")
    rows = []
    for part in ("feed", "attention in feed", "forward", "attention in forward"):
        cells = []
        for kind in CACHES:
            t = times[(kind, part)]
            cells.append(f"{1e3 * statistics.median(t):.3f} / {1e3 * statistics.fmean(t):.3f}")
        ratio = statistics.median(times[("dynamic", part)]) / statistics.median(
            times[("bucketed", part)]
        )
        rows.append([part, len(times[("bucketed", part)]), *cells, f"{ratio:.2f}"])
    per_iteration = {
        kind: sum(times[(kind, "feed")]) + sum(times[(kind, "forward")]) for kind in CACHES
    }
    feeds = len(times[("bucketed", "feed")])
    rows.append(
        [
            "all calls per iteration",
            feeds,
            *(f"{1e3 * per_iteration[kind] / feeds:.3f}" for kind in CACHES),
            f"{per_iteration['dynamic'] / per_iteration['bucketed']:.2f} (sums)",
        ]
    )
    common.print_table(
        "the head's calls in MTAD's loop (wall ms per call, median / mean)",
        ["call", "calls", *CACHES, "dynamic / bucketed (medians)"],
        rows,
    )
    print(f"same tokens: {same} of {len(prompts)} prompts")
    return rows, same


if __name__ == "__main__":
    with torch.inference_mode():
        main()
