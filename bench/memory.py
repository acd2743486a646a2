"""Peak resident memory per method, and whether anything grows with the number of prompts.

Each method runs in a fresh process (peak RSS is per process): load the pair, run the prompt
set ``--rounds`` times, and record the RSS after loading and after every round, the peak RSS,
and the number of live Python objects. A leak shows as RSS / objects climbing round after
round; a flat line after round 1 means nothing grows with the number of prompts (round 1
includes first-use allocations: allocator pools, lazy inits).

    python -m bench.memory                         # smollm2 pair, ar/sps/mtad, 3 rounds
    python -m bench.memory --methods all --rounds 4 --prompts 6 --max-new 64
    python -m bench.memory --cache-bytes --methods sps,mtad,mmtad,mtjd   # KV bytes written (#18)

``--cache-bytes`` counts, in one process, the bytes written into the draft's and target's KV
caches per decoding iteration (cache appends, beam reorders, row repeats: every non-view op in
those calls, counted by a torch dispatch mode), once per cache-reorder mode of
:class:`mtad.engine.ModelRunner` (``copy``: before issue 18, ``inplace``: after). Dividing by
the bytes of one cache row of the context gives "context rows written per iteration", a figure
that does not depend on the model, so it also gives the bytes for a Llama-2-7B draft at 1k
context (printed alongside).
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from bench import common
from bench.overhead import DEFAULT_METHODS, parse_methods


def child(args: argparse.Namespace) -> None:
    from mtad.engine import Decoder
    from mtad.methods import METHODS, build_method

    common.setup(args)
    start = common.rss_mib()
    bp = common.load_bench_pair(args, need_draft=METHODS[args.child][1].uses_draft)
    prompts = common.load_prompts(args, bp.tokenizer)
    dec = Decoder(
        build_method(args.child),
        bp.target,
        bp.draft,
        common.eos_ids(bp),
        args.seed,
    )
    gc.collect()
    loaded = common.rss_mib()
    rounds, objects, tokens = [], [], 0
    for _ in range(args.rounds):
        for i, p in enumerate(prompts):
            tokens += len(dec.generate(p.ids, args.max_new, seed=args.seed + i).token_ids)
        gc.collect()
        rounds.append(common.rss_mib())
        objects.append(len(gc.get_objects()))
    print(
        json.dumps(
            {
                "start": start,
                "loaded": loaded,
                "rounds": rounds,
                "objects": objects,
                "peak": common.peak_rss_mib(),
                "tokens": tokens,
                "pair": bp.describe(),
            }
        )
    )


# Llama-2-7B (the 70B pair's draft): 32 layers x (K, V) x 32 KV heads x 128 dims x 2 bytes (fp16)
LLAMA2_7B_KV_BYTES_PER_TOKEN = 32 * 2 * 32 * 128 * 2


class CacheWrites(TorchDispatchMode):
    """Bytes of floating-point tensors written into KV caches, per model role: the outputs of
    non-view ops (``cat``, ``index_select``, ``repeat_interleave``; the target of ``copy_``)
    inside a cache append (``DynamicLayer.update``) or a :class:`ModelRunner` row / crop call,
    attributed to the runner that made the call."""

    def __init__(self) -> None:
        super().__init__()
        self.roles: list[str] = []  # runner calls in progress
        self.in_cache = 0
        self.bytes: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        if self.in_cache and self.roles and not func.is_view:
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.is_floating_point():
                    role = self.roles[-1]
                    self.bytes[role] = self.bytes.get(role, 0) + t.numel() * t.element_size()
        return out

    @contextmanager
    def counting(self) -> Iterator[None]:
        """Wrap the runners' calls and the cache appends so that only cache writes count."""
        from transformers.cache_utils import DynamicLayer

        from mtad.engine.runner import ModelRunner

        # (class, method, names a runner, is cache bookkeeping)
        targets = [
            (ModelRunner, "_logits", True, False),
            (ModelRunner, "select_rows", True, True),
            (ModelRunner, "repeat_rows", True, True),
            (ModelRunner, "crop", True, True),
            (DynamicLayer, "update", False, True),
        ]
        saved = [(cls, name, getattr(cls, name)) for cls, name, _, _ in targets]

        def wrap(fn, runner: bool, cache: bool):  # noqa: ANN001, ANN202
            @functools.wraps(fn)
            def counted(obj, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
                if runner:
                    self.roles.append(obj.role)
                self.in_cache += cache
                try:
                    return fn(obj, *a, **k)
                finally:
                    self.in_cache -= cache
                    if runner:
                        self.roles.pop()

            return counted

        for (cls, name, runner, cache), (_, _, fn) in zip(targets, saved, strict=True):
            setattr(cls, name, wrap(fn, runner, cache))
        try:
            with self:
                yield
        finally:
            for cls, name, fn in saved:
                setattr(cls, name, fn)


def kv_bytes_per_token(model: torch.nn.Module) -> int:
    """Bytes one token adds to one row of the model's KV cache."""
    cfg = model.config
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return cfg.num_hidden_layers * 2 * kv_heads * head_dim * model.dtype.itemsize


def cache_bytes(args: argparse.Namespace) -> dict[str, dict]:
    """KV bytes written per iteration, per method and cache-reorder mode, side by side."""
    from mtad.engine import Decoder
    from mtad.engine.loop import DecodeContext
    from mtad.methods import METHODS, build_method

    common.setup(args)
    methods = parse_methods(args.methods)
    bp = common.load_bench_pair(args, need_draft=any(METHODS[m][1].uses_draft for m in methods))
    prompts = common.load_prompts(args, bp.tokenizer)
    per_token = {
        r.role: kv_bytes_per_token(r.model) for r in (bp.target, bp.draft) if r is not None
    }
    results: dict[str, dict] = {}
    for m in methods:
        for reorder in ("copy", "inplace"):
            for runner in (bp.target, bp.draft):
                if runner is not None:
                    runner.reorder = reorder
            dec = Decoder(build_method(m), bp.target, bp.draft, common.eos_ids(bp), args.seed)
            contexts: list[int] = []  # committed length at each iteration's start
            step = dec.method.step

            def timed_step(ctx: DecodeContext, step=step, contexts=contexts):  # noqa: ANN202
                contexts.append(ctx.n)
                return step(ctx)

            dec.method.step = timed_step  # type: ignore[method-assign]
            counter, tokens = CacheWrites(), []
            with counter.counting():
                for i, p in enumerate(prompts):
                    tokens.append(dec.generate(p.ids, args.max_new, seed=args.seed + i).token_ids)
            iters = max(len(contexts), 1)
            results[f"{m}/{reorder}"] = {
                "mean_context": sum(contexts) / iters,
                "tokens": tokens,
                **{
                    f"{role}_rows_per_iter": counter.bytes.get(role, 0)
                    / (sum(contexts) * per_token[role])
                    for role in per_token
                },
            }
    print(common.environment_line(args))
    print(f"pair: {bp.describe()}")
    print_cache_bytes(args, results)
    return results


def print_cache_bytes(args: argparse.Namespace, results: dict[str, dict]) -> None:
    """The table of :func:`cache_bytes`: rows per iteration, and whether the tokens match."""
    print(f"{args.prompts} prompts x max {args.max_new} new tokens, method defaults")
    rows = []
    for label, r in results.items():
        m, reorder = label.split("/")
        same = r["tokens"] == results[f"{m}/copy"]["tokens"]
        draft_rows = r.get("draft_rows_per_iter", 0.0)
        gib_7b = draft_rows * LLAMA2_7B_KV_BYTES_PER_TOKEN * 1024 / 2**30
        rows.append(
            [
                m,
                reorder,
                f"{r['mean_context']:.0f}",
                f"{r['target_rows_per_iter']:.2f}",
                f"{draft_rows:.2f}",
                f"{gib_7b:.2f}",
                "yes" if same else "NO",
            ]
        )
    common.print_table(
        "KV-cache writes per iteration, in context rows (copy = before #18, inplace = after)",
        [
            "method",
            "reorder",
            "mean context",
            "target rows/iter",
            "draft rows/iter",
            "draft GiB/iter as Llama-2-7B fp16 at 1k ctx",
            "tokens = copy",
        ],
        rows,
    )


def main(argv: list[str] | None = None) -> dict[str, dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_common_args(ap, prompts=4, max_new=48)
    ap.add_argument(
        "--methods",
        default=DEFAULT_METHODS,
        help=f"comma-separated method names or 'all' (default {DEFAULT_METHODS})",
    )
    ap.add_argument("--rounds", type=int, default=3, help="passes over the prompt set")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument(
        "--cache-bytes",
        action="store_true",
        help="count KV-cache bytes written per iteration, before (copy) and after (inplace) #18",
    )
    args = ap.parse_args(argv)
    if args.cache_bytes:
        return cache_bytes(args)
    if args.child:
        child(args)
        return {}
    common.setup(args)
    passthrough = [a for a in (argv if argv is not None else sys.argv[1:])]
    results = {}
    for m in parse_methods(args.methods):
        # same interpreter, working folder and environment: `-m bench.memory` resolves as ours did
        cmd = [sys.executable, "-m", "bench.memory", *passthrough, "--child", m]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True)
        results[m] = json.loads(out.stdout.strip().splitlines()[-1])
    print(common.environment_line(args))
    print(f"pair: {next(iter(results.values()))['pair']}")
    print_memory(args, results)
    return results


def print_memory(args: argparse.Namespace, results: dict[str, dict]) -> None:
    """The table of :func:`main`: resident memory per method and its growth per round."""
    print(
        f"{args.prompts} prompts x max {args.max_new} new tokens, {args.rounds} rounds, "
        "one fresh process per method"
    )
    rows = []
    for m, r in results.items():
        rr, ob = r["rounds"], r["objects"]
        growth = (rr[-1] - rr[0]) / (len(rr) - 1) if len(rr) > 1 else float("nan")
        obj_growth = (ob[-1] - ob[0]) / (len(ob) - 1) if len(ob) > 1 else float("nan")
        rows.append(
            [
                m,
                f"{r['loaded']:.0f}",
                f"{r['peak']:.0f}",
                f"{r['peak'] - r['loaded']:.0f}",
                " ".join(f"{x:.0f}" for x in rr),
                f"{growth:+.1f}",
                f"{obj_growth:+.0f}",
            ]
        )
    common.print_table(
        "resident memory (MiB)",
        [
            "method",
            "after load",
            "peak",
            "peak - load",
            "after each round",
            "growth/round (MiB)",
            "objects growth/round",
        ],
        rows,
    )


if __name__ == "__main__":
    main()
