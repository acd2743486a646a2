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
from pathlib import Path

import torch

from bench import common
from mtad.engine.feature_head import load_head
from mtad.engine.head_runner import HeadRunner
from mtad.engine.loading import ModelSpec, load_model
from mtad.engine.runner import ModelRunner
from mtad.engine.subvocab import read_vocab

TOKENS = (1, 2, 3, 4, 5, 6, 8)
BEAMS = (1, 2, 4, 8)
DTYPES = ("float32", "bfloat16")
# (model, dtype, new tokens, rows): one timed forward shape
Case = tuple[str, str, int, int]
# case -> median (CPU ms, wall ms)
Medians = dict[Case, tuple[float, float]]
FORWARD_COLUMNS = [
    "model",
    "shape",
    "fp32 ms",
    "fp32 x n=1",
    "bf16 ms",
    "bf16 x n=1",
    "bf16 / fp32",
    "fp32 wall ms",
    "bf16 wall ms",
]


def time_forward(
    runner: ModelRunner, n: int, rows: int, gen: torch.Generator
) -> tuple[float, float]:
    ids = torch.randint(0, runner.vocab_size, (rows, n), generator=gen)
    c0, w0 = time.process_time(), time.perf_counter()
    runner.forward(ids, keep=n)
    c, w = time.process_time() - c0, time.perf_counter() - w0
    runner.crop(runner.cache_len - n)
    return 1e3 * c, 1e3 * w


def head_rows(
    args: argparse.Namespace,
    prompt: torch.Tensor,
    target_ms: dict[str, float],
    gen: torch.Generator,
) -> list[list[str]]:
    """Median cost of a head's drafted position x rows, per dtype, vs the target's 1 token."""
    out = []
    for dtype in DTYPES:
        t, _ = load_model(ModelSpec(loader="smollm2_gguf", dtype=dtype))
        head = load_head(args.head, t, read_vocab(args.head))
        target = ModelRunner(t, "target", feature_taps=head.spec.taps, linears=args.linears)
        runner = HeadRunner(head, target, linears=args.linears)
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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draft", default=common.MODEL_DRAFT)
    ap.add_argument("--context", type=int, default=120, help="cached tokens before timing")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--head", default=None, help="a feature-level head folder to time as well")
    ap.add_argument(
        "--linears",
        default="auto",
        choices=["auto", "stock"],
        help="prepacked bfloat16 projections (mtad.engine.packed) or stock F.linear",
    )
    return ap.parse_args(argv)


def load_runners(draft_path: Path, linears: str = "auto") -> dict[tuple[str, str], ModelRunner]:
    """The target (SmolLM2 from its GGUF) and the draft, each in float32 and bfloat16."""
    runners: dict[tuple[str, str], ModelRunner] = {}
    for dtype in DTYPES:
        t, _ = load_model(ModelSpec(loader="smollm2_gguf", dtype=dtype))
        d, _ = load_model(ModelSpec(loader="local", path=str(draft_path), dtype=dtype))
        runners[("target", dtype)] = ModelRunner(t, "target", linears=linears)
        runners[("draft", dtype)] = ModelRunner(d, "draft", linears=linears)
    return runners


def forward_cases() -> list[Case]:
    """Both models at every :data:`TOKENS` count on one row, then the draft's one token on
    every :data:`BEAMS` count of rows above one; each in both dtypes."""
    cases = [(m, dt, n, 1) for m in ("target", "draft") for dt in DTYPES for n in TOKENS]
    cases += [(m, dt, 1, b) for m in ("draft",) for dt in DTYPES for b in BEAMS if b > 1]
    return cases


def time_cases(
    runners: dict[tuple[str, str], ModelRunner],
    prompt: torch.Tensor,
    cases: list[Case],
    reps: int,
    gen: torch.Generator,
) -> Medians:
    """Every case ``reps + 1`` times, the cases interleaved (the first round warms every shape
    up and is dropped); each runner holds ``prompt`` (repeated to the case's rows) before."""
    res: dict[Case, list[tuple[float, float]]] = {c: [] for c in cases}
    for rep in range(reps + 1):
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
    return {
        c: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v))
        for c, v in res.items()
    }


def shape_row(model: str, n: int, rows: int, med: Medians) -> list[str]:
    """One shape of one model: each dtype's CPU ms and its ratio to one token on one row of
    the same dtype, bfloat16 over float32, and the wall ms."""
    f, b = med[(model, "float32", n, rows)], med[(model, "bfloat16", n, rows)]
    f1, b1 = med[(model, "float32", 1, 1)], med[(model, "bfloat16", 1, 1)]
    return [
        model,
        f"{n} tok x {rows}",
        f"{f[0]:.1f}",
        f"{f[0] / f1[0]:.2f}",
        f"{b[0]:.1f}",
        f"{b[0] / b1[0]:.2f}",
        f"{b[0] / f[0]:.2f}",
        f"{f[1]:.1f}",
        f"{b[1]:.1f}",
    ]


def print_forward_table(med: Medians) -> None:
    """Both models at every token count on one row, then the draft's one token on more rows."""
    rows = [shape_row(m, n, 1, med) for m in ("target", "draft") for n in TOKENS]
    rows += [shape_row("draft", 1, b, med) for b in BEAMS[1:]]
    common.print_table("one cached forward (ms; CPU time unless noted)", FORWARD_COLUMNS, rows)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    common.setup(args)
    draft_path, standin = common.resolve_draft(args.draft)
    gen = torch.Generator().manual_seed(0)
    runners = load_runners(draft_path, args.linears)
    prompt = torch.randint(0, 49152, (1, args.context), generator=gen)
    med = time_cases(runners, prompt, forward_cases(), args.reps, gen)
    print(common.environment_line())
    draft_name = "stand-in (target layers 0-1)" if standin else draft_path
    print(
        f"target SmolLM2-135M-Instruct; draft {draft_name}; "
        f"context {args.context} tokens; median of {args.reps}"
    )
    print_forward_table(med)
    if args.head:
        t1 = {dt: med[("target", dt, 1, 1)][0] for dt in DTYPES}
        common.print_table(
            f"feature-level head {args.head}: one drafted position (ms, CPU time)",
            ["model", "shape", "dtype", "ms", "x target 1 tok", "wall ms"],
            head_rows(args, prompt, t1, gen),
        )


if __name__ == "__main__":
    main()
