"""Our MTAD against the authors' reference implementation on identical settings.

(c) of issue 6. The authors' ``BatchMTADStrategy`` (ZongyueQin/MTAD, ``src/inference/
strategies.py``, through ``MTADGenerator(tree_attn=False)``) runs from a checkout given on the
command line, in a separate interpreter (``--authors-python``: a venv with
``torch==2.13.0 transformers==4.44.2``) driven by ``bench/authors_worker.py``; prompts go in
and tokens come out as JSON, so the two transformers versions never meet. Nothing of theirs
is committed here: fetch it at benchmark time, e.g.

    git clone https://github.com/ZongyueQin/MTAD /tmp/mtad-authors
    python3 -m venv /tmp/authors-venv
    /tmp/authors-venv/bin/pip install torch==2.13.0 transformers==4.44.2
    python -m bench.vs_authors --authors-repo /tmp/mtad-authors \\
        --authors-python /tmp/authors-venv/bin/python

Both sides load the same model folders in the same dtype, use the same settings (B, gamma,
tau, top-k, top-p, temperature) and one torch thread each, and alternate prompt by prompt.
Their RNG is the global torch one, ours a seeded generator: outputs differ sample by sample,
so block efficiency is compared as mean +- standard error over generations. Their
``generate()`` overshoots ``max_new_tokens`` by up to gamma and stops only when EOS is among
the last gamma tokens, so tokens are counted up to the first EOS on both sides. Their beam
weights go through ``log_softmax`` of probabilities (a normalisation slip their tree variant
fixes), which changes their acceptance a little: both are reported as they are.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench import common
from mtad.engine import Decoder
from mtad.methods import build_method
from mtad.methods.mtad import MTADParams

WORKER = common.REPO / "bench" / "authors_worker.py"


class AuthorsWorker:
    def __init__(self, python: str, init: dict) -> None:
        self.proc = subprocess.Popen(
            [python, str(WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self.info = self.call({"cmd": "init", **init})

    def call(self, msg: dict) -> dict:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"authors worker exited (code {self.proc.wait()}); see its stderr")
        return json.loads(line)

    def close(self) -> None:
        try:
            self.call({"cmd": "quit"})
        finally:
            self.proc.wait(timeout=60)


def mean_se(xs: list[float]) -> tuple[float, float]:
    n = len(xs)
    m = sum(xs) / n
    if n < 2:
        return m, float("nan")
    var = sum((x - m) ** 2 for x in xs) / (n - 1)
    return m, math.sqrt(var / n)


def model_folders(bp, tmp: Path) -> tuple[str, str]:
    """Folders the worker loads: the cached SmolLM2 target and the draft folder; the tiny
    pair is saved to a temporary folder first."""
    if bp.name == "tiny":
        bp.target.model.save_pretrained(tmp / "target")
        bp.draft.model.save_pretrained(tmp / "draft")
        return str(tmp / "target"), str(tmp / "draft")
    from mtad.engine.smollm2 import convert_gguf

    return str(convert_gguf(verbose=False)), str(bp.draft_path)


def run(args: argparse.Namespace) -> dict:
    common.setup(args)
    src = Path(args.authors_repo).expanduser().resolve() / "src"
    if not (src / "inference" / "strategies.py").is_file():
        raise SystemExit(
            f"--authors-repo: {src}/inference/strategies.py not found "
            "(a checkout of github.com/ZongyueQin/MTAD)"
        )
    bp = common.load_bench_pair(args)
    prompts = common.load_prompts(args, bp.tokenizer)
    eos = common.eos_ids(bp)
    settings = {
        "gamma": args.gamma,
        "beam_width": args.beam_width,
        "tau": args.tau,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "temperature": args.temperature,
    }
    ours = Decoder(
        build_method("mtad", **settings),
        bp.target,
        bp.draft,
        eos,
        args.seed,
    )
    with tempfile.TemporaryDirectory() as tmp:
        target_dir, draft_dir = model_folders(bp, Path(tmp))
        worker = AuthorsWorker(
            args.authors_python,
            {
                "src": str(src),
                "target": target_dir,
                "draft": draft_dir,
                "dtype": bp.dtype,
                "draft_dtype": bp.draft_dtype,
                "eos": int(bp.tokenizer.eos_token_id),
                "threads": args.threads,
                "max_new": args.max_new,
                "settings": settings,
            },
        )
        try:
            results = compare(args, bp, prompts, eos, ours, worker)
        finally:
            worker.close()
    return results


SIDES = ("ours", "authors")


def compare(args, bp, prompts, eos, ours, worker) -> dict:
    """Both implementations on every prompt and seed, alternating which goes first, then the
    table."""
    sides = measure(args, bp, prompts, eos, ours, worker)
    report(args, bp, len(prompts), worker.info, sides)
    return sides


def measure(args, bp, prompts, eos, ours, worker) -> dict[str, dict[str, Any]]:
    """Totals per side (tokens, wall, forward, draft and verify seconds, iterations, accepted)
    and each generation's block efficiency."""
    clock = common.pair_clock(bp)
    # warm-up both sides
    ours.generate(prompts[0].ids, 4, seed=args.seed)
    worker.call({"cmd": "gen", "ids": prompts[0].ids, "seed": args.seed, "max_new": 4})
    sides: dict[str, dict[str, Any]] = {
        s: {"tokens": 0, "wall": 0.0, "fwd": 0.0, "iters": 0, "accepted": 0}
        | {"draft": 0.0, "verify": 0.0, "be": []}
        for s in SIDES
    }
    for i, prompt in enumerate(prompts):
        for r in range(args.repeats):
            seed = args.seed + i * args.repeats + r
            order = SIDES if (i + r) % 2 == 0 else SIDES[::-1]
            for side in order:
                if side == "ours":
                    clock.reset()
                    one = _ours_once(ours, prompt.ids, args.max_new, seed, clock)
                else:
                    one = _authors_once(worker, prompt.ids, args.max_new, seed, eos)
                s = sides[side]
                for key in ("tokens", "wall", "fwd", "iters", "accepted", "draft", "verify"):
                    s[key] += one[key]
                s["be"].append(one["be"])
        if args.verbose:
            print(f"[bench] prompt {i + 1}/{len(prompts)} done", file=sys.stderr)
    clock.remove()
    return sides


def _ours_once(ours, ids: list[int], max_new: int, seed: int, clock) -> dict[str, Any]:
    out = ours.generate(ids, max_new, seed=seed)
    st = out.stats
    return {
        "tokens": len(out.token_ids),
        "wall": st.wall_time,
        "fwd": clock.total,
        "iters": st.iterations,
        "accepted": st.accepted,
        "draft": st.time_draft,
        "verify": st.time_verify,
        "be": st.block_efficiency,
    }


def _authors_once(worker, ids: list[int], max_new: int, seed: int, eos) -> dict[str, Any]:
    res = worker.call({"cmd": "gen", "ids": ids, "seed": seed, "max_new": max_new})
    return {
        "tokens": len(common.truncate_at_eos(res["tokens"], eos)),
        "wall": res["wall"],
        "fwd": res["forward_s"],
        "iters": res["iterations"],
        "accepted": res["accepted"],
        "draft": res["draft_s"],
        "verify": res["verify_s"],
        "be": (res["accepted"] + res["iterations"]) / res["iterations"],
    }


def report(args, bp, n_prompts: int, info: dict[str, Any], sides: dict[str, dict]) -> None:
    """The settings, the table (tokens/s against the authors') and the block-efficiency test."""
    print(common.environment_line(args))
    print(f"pair: {bp.describe()}")
    print(
        f"authors: {info['strategy']} from {args.authors_repo} (transformers "
        f"{info['transformers']}, torch {info['torch']}, rope_theta {info['rope_theta']})"
    )
    print(
        f"settings: B={args.beam_width} gamma={args.gamma} tau={args.tau} top-k={args.top_k} "
        f"top-p={args.top_p} T={args.temperature}; {n_prompts} prompts x {args.repeats} "
        f"seeds x max {args.max_new} new tokens"
    )
    tps = {k: v["tokens"] / v["wall"] for k, v in sides.items()}
    rows = []
    for side, s in sides.items():
        be, se = mean_se(s["be"])
        rows.append(
            [
                side,
                s["tokens"],
                f"{tps[side]:.2f}",
                f"{common.ratio(tps[side], tps['authors']):.2f}",
                f"{be:.3f} +- {se:.3f}",
                f"{(s['accepted'] + s['iters']) / s['iters']:.3f}",
                f"{common.pct(s['draft'], s['wall']):.1f}",
                f"{common.pct(s['verify'], s['wall']):.1f}",
                f"{common.pct(s['wall'] - s['fwd'], s['wall']):.1f}",
            ]
        )
    common.print_table(
        "MTAD: ours vs the authors' BatchMTADStrategy (same pair, settings, prompts)",
        [
            "impl",
            "tokens",
            "tok/s",
            "x authors",
            "block eff (mean +- s.e.)",
            "block eff (pooled)",
            "draft %",
            "verify %",
            "overhead %",
        ],
        rows,
    )
    (bo, so), (ba, sa) = mean_se(sides["ours"]["be"]), mean_se(sides["authors"]["be"])
    z = (bo - ba) / math.sqrt(so**2 + sa**2) if so == so and sa == sa and (so or sa) else 0.0
    print(
        f"\nours / authors tokens/s: {common.ratio(tps['ours'], tps['authors']):.2f}; "
        f"block efficiency difference {bo - ba:+.3f} (z = {z:+.2f}; |z| < 2: within noise)"
    )


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_common_args(ap, prompts=6, max_new=64)
    ap.add_argument("--authors-repo", required=True, help="checkout of ZongyueQin/MTAD")
    ap.add_argument(
        "--authors-python",
        required=True,
        help="python of a venv with torch==2.13.0 transformers==4.44.2",
    )
    ap.add_argument("--repeats", type=int, default=1, help="seeds per prompt")
    d = MTADParams  # the defaults live in the params dataclass
    ap.add_argument("--gamma", type=int, default=d.gamma)
    ap.add_argument("--beam-width", type=int, default=d.beam_width)
    ap.add_argument("--tau", type=float, default=d.tau)
    ap.add_argument("--top-k", type=int, default=d.top_k)
    ap.add_argument("--top-p", type=float, default=d.top_p)
    ap.add_argument("--temperature", type=float, default=d.temperature)
    ap.add_argument("--verbose", action="store_true")
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    main()
