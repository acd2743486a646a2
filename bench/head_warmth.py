"""Why the head's step costs more inside the decoding loop than alone (issue 39, item 4).

``bench.overhead`` finds the head's forwards inside MTAD's loop ~1.4x its forward timed alone
(``bench.forward_shapes``: the same rows, called back to back). This times the head's drafted
position (one token on ``--rows`` rows, :func:`bench.common.time_head_step`) warm, back to back,
and then on each of the ``gamma`` steps that follow something else: a target forward of
``gamma + 1`` tokens (what precedes a draft in the loop), a sleep of the same length, a busy
loop of the same length that touches next to no memory (the core stays busy, its clocks up),
and a pass over ``--churn-mb`` of memory. If the steps after a sleep or the busy loop are as
slow as after a forward, the cost is the time away from the head's weights (caches shared with
whatever else runs on the host), not the loop's code nor the target's eviction of them.

    python -m bench.head_warmth [--head assets/drafts/smollm2-head] [--rows 4] [--reps 25]

Wall milliseconds, medians over ``--reps`` rounds; ``x warm`` is against the warm step of the
same round. One torch thread (``--threads``); run it on a quiet core.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from bench import common
from mtad.engine.feature_head import load_head
from mtad.engine.head_runner import HeadRunner
from mtad.engine.loading import ModelSpec, load_model
from mtad.engine.runner import ModelRunner
from mtad.engine.subvocab import read_vocab

CONTEXT = 120


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--head", default="assets/drafts/smollm2-head")
    ap.add_argument("--rows", type=int, default=4, help="beams: MTAD's B")
    ap.add_argument("--gamma", type=int, default=4, help="drafted positions per iteration")
    ap.add_argument("--reps", type=int, default=25)
    ap.add_argument("--churn-mb", type=int, default=300, help="the memory pass, in MiB")
    ap.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    ap.add_argument("--threads", type=int, default=1)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    model, _ = load_model(ModelSpec(loader="smollm2_gguf", dtype=args.dtype))
    head = load_head(args.head, model, read_vocab(args.head))
    target = ModelRunner(model, "target", feature_taps=head.spec.taps)
    runner = HeadRunner(head, target)
    prompt = torch.randint(0, runner.vocab_size, (CONTEXT,), generator=gen)
    target.feed(prompt)
    runner.feed(prompt, compact=True)
    runner.repeat_rows(args.rows)
    verifier = ModelRunner(model, "verifier")  # its own cache: the head's stays as it is
    verifier.feed(prompt)
    block = args.gamma + 1

    def target_forward() -> None:
        ids = torch.randint(0, runner.vocab_size, (1, block), generator=gen)
        verifier.forward(ids, keep=block)
        verifier.crop(verifier.cache_len - block)

    start = time.perf_counter()
    target_forward()
    forward_s = time.perf_counter() - start
    churn = torch.zeros(args.churn_mb * 2**20 // 4)

    def spin() -> None:
        end = time.perf_counter() + forward_s
        while time.perf_counter() < end:
            pass

    pauses: dict[str, Callable[[], None]] = {
        f"target forward ({block} tokens)": target_forward,
        f"sleep {1e3 * forward_s:.0f} ms": lambda: time.sleep(forward_s),
        f"busy loop {1e3 * forward_s:.0f} ms": spin,
        f"memory pass ({args.churn_mb} MiB)": lambda: churn.add_(1.0),
    }
    step = lambda: common.time_head_step(runner, args.rows, gen)[1]  # noqa: E731
    for _ in range(3):
        step()
    rows = []
    for name, pause in pauses.items():
        warm, after = [], [[] for _ in range(args.gamma)]
        for _ in range(args.reps):
            warm.append(statistics.median(step() for _ in range(5)))
            pause()
            for k in range(args.gamma):
                after[k].append(step())
        base = statistics.median(warm)
        cells = [f"{statistics.median(a):.2f} ({statistics.median(a) / base:.2f}x)" for a in after]
        mean = statistics.mean(statistics.median(a) for a in after) / base
        rows.append([name, f"{base:.2f}", *cells, f"{mean:.2f}"])
    print(common.environment_line(args))
    print(f"head {args.head}, {args.rows} rows, {args.dtype}, context {CONTEXT}")
    common.print_table(
        "the head's drafted position: warm, and on each step after a pause (wall ms, x warm)",
        ["after", "warm", *[f"step {k + 1}" for k in range(args.gamma)], f"mean of {args.gamma}"],
        rows,
    )


if __name__ == "__main__":
    main()
