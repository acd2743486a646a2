"""Peak resident memory per method, and whether anything grows with the number of prompts.

Each method runs in a fresh process (peak RSS is per process): load the pair, run the prompt
set ``--rounds`` times, and record the RSS after loading and after every round, the peak RSS,
and the number of live Python objects. A leak shows as RSS / objects climbing round after
round; a flat line after round 1 means nothing grows with the number of prompts (round 1
includes first-use allocations: allocator pools, lazy inits).

    python -m bench.memory                         # smollm2 pair, ar/sps/mtad, 3 rounds
    python -m bench.memory --methods all --rounds 4 --prompts 6 --max-new 64
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys

from bench import common
from bench.overhead import DEFAULT_METHODS, METHOD_PARAMS, parse_methods


def child(args: argparse.Namespace) -> None:
    from mtad.engine import Decoder
    from mtad.methods import METHODS, build_method

    common.setup(args)
    start = common.rss_mib()
    bp = common.load_bench_pair(args, need_draft=METHODS[args.child][1].uses_draft)
    prompts = common.load_prompts(args, bp.tokenizer)
    dec = Decoder(
        build_method(args.child, **METHOD_PARAMS.get(args.child, {})),
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
    args = ap.parse_args(argv)
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
    return results


if __name__ == "__main__":
    main()
