"""The head's training step on the cumulative training's own batches, arm beside arm (issue 39).

Two things decide how many positions a session trains, and both are timed here side by side:

* ``allocator``: each round starts one child process per arm, ``stock`` (glibc's defaults) and
  ``lean`` (``scripts/lean_allocator.env``, what ``continue.sh`` exports), in alternating order;
* ``topk``: inside each child, torch's top-k against :func:`mtad_train.head_train.blocked_topk`
  in the loss's row statistics, alternating step by step on the same batches.

Every child builds the head from the committed folder (float32, bf16 autocast where the CPU has
it natively, as the training runs) and takes the next step of data at the committed cursor
(teacher signal from the training's cache, computed where it is missing), warms up one step per
arm, then times ``--steps`` optimiser steps per top-k arm on that same step's batches.

    python -m bench.head_train_step [--rounds 2] [--steps 3] [--tokens-per-step 8192]

Prints seconds per step (median over rounds and steps) for every arm and the ratio to
``stock`` + ``torch``. One torch thread (``--threads``); run it on a quiet core (a training on
the other core shares the memory bandwidth: ratios hold, absolute times do not).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench import common

ALLOCATOR_ENV = Path(__file__).resolve().parents[1] / "scripts" / "lean_allocator.env"
TOPK_ARMS = ("torch", "blocked")


def allocator_env(path: Path = ALLOCATOR_ENV) -> dict[str, str]:
    """``KEY=VALUE`` lines of the lean allocator's file (comments and blanks skipped)."""
    env = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key.strip()] = value.strip()
    return env


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--head", default="assets/drafts/smollm2-head")
    ap.add_argument("--rounds", type=int, default=2, help="child processes per allocator arm")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per top-k arm and child")
    ap.add_argument("--tokens-per-step", type=int, default=8192)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--ckpt-dir", default=None, help="teacher cache's folder (default: the training's)"
    )
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def time_steps(args: argparse.Namespace) -> dict[str, list[float]]:
    """Seconds of each timed optimiser step, per top-k arm (the child's work)."""
    import torch

    from mtad.cpu import choose_dtype
    from mtad.engine.smollm2 import load_smollm2_target
    from mtad_train import head_train
    from mtad_train.cumulative import (
        TEACHER_DIR,
        CumulativeConfig,
        Source,
        _next_batches,
        head_for_training,
        read_state,
    )
    from mtad_train.head_commands import use_autocast
    from mtad_train.teacher import TeacherCache

    torch.set_num_threads(args.threads)
    cfg = CumulativeConfig(
        head=args.head,
        tokens_per_step=args.tokens_per_step,
        micro_tokens=min(CumulativeConfig.micro_tokens, args.tokens_per_step),
        **({"ckpt_dir": args.ckpt_dir} if args.ckpt_dir else {}),
    )
    dtype, _ = choose_dtype(cfg.teacher_dtype, "cpu")
    target32, _ = load_smollm2_target("float32")
    target = target32 if dtype == "float32" else load_smollm2_target(dtype)[0]
    head = head_for_training(target32, Path(cfg.head))
    head.train()
    tcfg = cfg.train_config(use_autocast("auto"))
    opt = head_train.make_optimizer(head, tcfg)
    teacher = TeacherCache(
        Path(cfg.ckpt_dir) / TEACHER_DIR, target, cfg.topk, cfg.max_len, head.spec.taps
    )
    state = read_state(Path(cfg.head))
    sources = [Source.load(s, cfg.max_len) for s in cfg.sources]
    batches = _next_batches(cfg, teacher, sources, state)
    cols = head_train.column_map(head.vocab_ids, head.vocab_size)
    blocked = head_train.blocked_topk
    arms = {"torch": lambda x, k: torch.topk(x, k, dim=-1), "blocked": blocked}
    times: dict[str, list[float]] = {a: [] for a in TOPK_ARMS}
    try:
        for rep in range(args.steps + 1):  # the first step of each arm warms it up
            order = TOPK_ARMS if rep % 2 == 0 else TOPK_ARMS[::-1]
            for arm in order:
                head_train.blocked_topk = arms[arm]
                gen = torch.Generator().manual_seed(0)
                t0 = time.perf_counter()
                # lr 0: the weights stay as they are, every arm times the same step
                head_train.optimiser_step(head, opt, tcfg, batches, cols, 0.0, gen)
                if rep:
                    times[arm].append(time.perf_counter() - t0)
    finally:
        head_train.blocked_topk = blocked
    return times


def run_child(args: argparse.Namespace, lean: bool) -> dict[str, list[float]]:
    env = {k: v for k, v in os.environ.items() if k not in allocator_env()}
    if lean:
        env.update(allocator_env())
    cmd = [sys.executable, "-m", "bench.head_train_step", "--worker", "--head", args.head]
    cmd += ["--steps", str(args.steps), "--tokens-per-step", str(args.tokens_per_step)]
    cmd += ["--threads", str(args.threads)]
    cmd += ["--ckpt-dir", args.ckpt_dir] if args.ckpt_dir else []
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if out.returncode:
        raise SystemExit(f"bench.head_train_step: a child failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(time_steps(args)))
        return
    common.torch.set_num_threads(args.threads)
    print(common.environment_line(args))
    print(
        f"head {args.head}; {args.rounds} rounds x {args.steps} steps of "
        f"{args.tokens_per_step} positions per arm; lean allocator: {allocator_env()}"
    )
    results: dict[tuple[str, str], list[float]] = {}
    for r in range(args.rounds):
        for lean in (False, True) if r % 2 == 0 else (True, False):
            for arm, secs in run_child(args, lean).items():
                results.setdefault(("lean" if lean else "stock", arm), []).extend(secs)
    base = statistics.median(results[("stock", "torch")])
    rows = []
    for (alloc, arm), secs in sorted(results.items(), key=lambda kv: kv[0][0] == "lean"):
        med = statistics.median(secs)
        rows.append([alloc, arm, len(secs), f"{med:.2f}", f"{min(secs):.2f}", f"{base / med:.2f}x"])
    common.print_table(
        "the head's training step (seconds; medians over rounds and steps)",
        ["allocator", "top-k", "steps", "s/step", "fastest", "vs stock+torch"],
        rows,
    )


if __name__ == "__main__":
    main()
