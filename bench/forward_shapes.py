"""Forward cost by shape and dtype: what a verification block or a beam batch costs.

Times one cached forward of the target with ``n`` new tokens (n = 1 is an AR step, n = gamma+1
a verification block) and of the draft with ``rows`` beams, in float32 and bfloat16, after a
chat-length context; shapes and dtypes interleaved, medians of ``--reps``. Reported as
milliseconds (process CPU time, robust to other jobs on the box; wall time alongside) and as a
ratio to n = 1 of the same dtype. This is the measurement behind two engine choices: the dtype
(bfloat16 halves the bytes a memory-bound forward reads, but a CPU without native bfloat16
matmuls, e.g. AVX2 only, pays for every extra row) and whether padding verification blocks to
another size would pay.

    python -m bench.forward_shapes [--context 120] [--reps 7] [--draft PATH] [--head PATH]

``--head`` also times a feature-level draft head (:mod:`mtad.engine.feature_head`): one drafted
position on ``rows`` beams, each reading its own previous output, in each dtype, as a fraction of
the target's one-token forward of the same dtype (the draft's step cost ``c`` of
``bench.cost_model``).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from bench import common
from mtad.engine.feature_head import load_head
from mtad.engine.head_runner import HeadRunner
from mtad.engine.loading import ModelSpec, load_model
from mtad.engine.runner import ModelRunner
from mtad.engine.subvocab import read_vocab

TOKENS = (1, 2, 3, 4, 5, 6, 8)
BEAMS = (1, 2, 4, 8)


def time_forward(
    runner: ModelRunner, n: int, rows: int, gen: torch.Generator
) -> tuple[float, float]:
    ids = torch.randint(0, runner.vocab_size, (rows, n), generator=gen)
    c0, w0 = time.process_time(), time.perf_counter()
    runner.forward(ids, keep=n)
    c, w = time.process_time() - c0, time.perf_counter() - w0
    runner.crop(runner.cache_len - n)
    return 1e3 * c, 1e3 * w


def head_rows(args, prompt: torch.Tensor, target_ms: dict[str, float], gen) -> list[list[str]]:
    """Median cost of a head's drafted position x rows, per dtype, vs the target's 1 token."""
    out = []
    for dtype in ("float32", "bfloat16"):
        t, _ = load_model(ModelSpec(loader="smollm2_gguf", dtype=dtype))
        head = load_head(args.head, t, read_vocab(args.head))
        target = ModelRunner(t, "target", feature_taps=head.spec.taps)
        runner = HeadRunner(head, target)
        target.feed(prompt[0])
        runner.feed(prompt[0], compact=True)
        for rows in BEAMS:
            if runner.rows != rows:
                runner.select_rows(torch.zeros(1, dtype=torch.long))
                runner.repeat_rows(rows)
            times = [common.time_head_step(runner, rows, gen) for _ in range(args.reps + 1)]
            times = times[1:]  # the first warms the shape up
            cpu = statistics.median(x[0] for x in times)
            wall = statistics.median(x[1] for x in times)
            out.append(
                [
                    "head",
                    f"1 tok x {rows}",
                    dtype,
                    f"{cpu:.2f}",
                    f"{cpu / target_ms[dtype]:.3f}",
                    f"{wall:.2f}",
                ]
            )
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draft", default=common.DEFAULT_DRAFT)
    ap.add_argument("--context", type=int, default=120, help="cached tokens before timing")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--head", default=None, help="a feature-level head folder to time as well")
    args = ap.parse_args(argv)
    common.setup(args)
    draft_path, standin = common.resolve_draft(args.draft)
    gen = torch.Generator().manual_seed(0)
    runners: dict[tuple[str, str], ModelRunner] = {}
    for dtype in ("float32", "bfloat16"):
        t, _ = load_model(ModelSpec(loader="smollm2_gguf", dtype=dtype))
        d, _ = load_model(ModelSpec(loader="local", path=str(draft_path), dtype=dtype))
        runners[("target", dtype)] = ModelRunner(t, "target")
        runners[("draft", dtype)] = ModelRunner(d, "draft")
    prompt = torch.randint(0, 49152, (1, args.context), generator=gen)
    cases = [
        (m, dt, n, 1) for m in ("target", "draft") for dt in ("float32", "bfloat16") for n in TOKENS
    ]
    cases += [
        (m, dt, 1, b) for m in ("draft",) for dt in ("float32", "bfloat16") for b in BEAMS if b > 1
    ]
    res: dict[tuple, list[tuple[float, float]]] = {c: [] for c in cases}
    for rep in range(args.reps + 1):
        for case in cases:
            m, dt, n, rows = case
            r = runners[(m, dt)]
            if r.cache_len == 0 or r.rows != rows:
                r.reset()
                r.forward(prompt, keep=1)
                r.repeat_rows(rows)
            out = time_forward(r, n, rows, gen)
            if rep:  # rep 0 warms every shape up
                res[case].append(out)
    print(common.environment_line())
    draft_name = "stand-in (target layers 0-1)" if standin else draft_path
    print(
        f"target SmolLM2-135M-Instruct; draft {draft_name}; "
        f"context {args.context} tokens; median of {args.reps}"
    )
    med = {
        c: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v))
        for c, v in res.items()
    }
    rows = []
    for m in ("target", "draft"):
        for n in TOKENS:
            f, b = med[(m, "float32", n, 1)], med[(m, "bfloat16", n, 1)]
            f1, b1 = med[(m, "float32", 1, 1)], med[(m, "bfloat16", 1, 1)]
            rows.append(
                [
                    m,
                    f"{n} tok x 1",
                    f"{f[0]:.1f}",
                    f"{f[0] / f1[0]:.2f}",
                    f"{b[0]:.1f}",
                    f"{b[0] / b1[0]:.2f}",
                    f"{b[0] / f[0]:.2f}",
                    f"{f[1]:.1f}",
                    f"{b[1]:.1f}",
                ]
            )
    for b in BEAMS[1:]:
        f, h = med[("draft", "float32", 1, b)], med[("draft", "bfloat16", 1, b)]
        f1, h1 = med[("draft", "float32", 1, 1)], med[("draft", "bfloat16", 1, 1)]
        rows.append(
            [
                "draft",
                f"1 tok x {b}",
                f"{f[0]:.1f}",
                f"{f[0] / f1[0]:.2f}",
                f"{h[0]:.1f}",
                f"{h[0] / h1[0]:.2f}",
                f"{h[0] / f[0]:.2f}",
                f"{f[1]:.1f}",
                f"{h[1]:.1f}",
            ]
        )
    common.print_table(
        "one cached forward (ms; CPU time unless noted)",
        [
            "model",
            "shape",
            "fp32 ms",
            "fp32 x n=1",
            "bf16 ms",
            "bf16 x n=1",
            "bf16 / fp32",
            "fp32 wall ms",
            "bf16 wall ms",
        ],
        rows,
    )
    if args.head:
        t1 = {dt: med[("target", dt, 1, 1)][0] for dt in ("float32", "bfloat16")}
        common.print_table(
            f"feature-level head {args.head}: one drafted position (ms, CPU time)",
            ["model", "shape", "dtype", "ms", "x target 1 tok", "wall ms"],
            head_rows(args, prompt, t1, gen),
        )


if __name__ == "__main__":
    main()
