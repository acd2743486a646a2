"""Cost of the output projection by kernel and row count: the measurement behind CPUHeadLM.

A decoding step projects 1 to ~10 hidden rows onto the whole vocabulary. This times, for the
SmolLM2 target's head (49152 x 576) and our draft's (49152 x 256), in float32:

* ``F.linear(x, W)`` -- what ``nn.Linear`` (and so every transformers model) calls;
* ``x @ W.T.contiguous()`` -- a transposed copy made once (CPUHeadLM's one-row kernel);
* ``(W @ x.T).T`` -- the weight as stored, the rows as columns (CPUHeadLM's kernel for 2-10
  rows; from ~16 rows ``F.linear`` wins again and CPUHeadLM uses it);

interleaved, medians of ``--reps`` (process CPU time), with the largest difference to
``F.linear``'s logits. Random weights of the real shapes: no model is loaded.

    python -m bench.lm_head [--rows 1,2,3,4,5,8,16] [--reps 15] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from bench import common
from mtad.models import CPUHeadLM

HEADS = {"target 49152x576": (49152, 576), "draft 49152x256": (49152, 256)}


def cpu_ms(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return 1e3 * statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="1,2,3,4,5,8,16")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(common.environment_line(args))
    rows_list = [int(r) for r in args.rows.split(",")]
    gen = torch.Generator().manual_seed(0)
    table = []
    for name, (vocab, hidden) in HEADS.items():
        weight = torch.randn(vocab, hidden, generator=gen) * hidden**-0.5
        weight_t = weight.T.contiguous()
        for rows in rows_list:
            x = torch.randn(rows, hidden, generator=gen)
            kernels = {
                "linear": lambda x=x, w=weight: F.linear(x, w),
                "copy": lambda x=x, wt=weight_t: x @ wt,
                "w_xt": lambda x=x, w=weight: (w @ x.T).T.contiguous(),
            }
            ms = {k: cpu_ms(f, args.reps) for k, f in kernels.items()}
            want = kernels["linear"]()
            diff = max(float((f() - want).abs().max()) for f in kernels.values())
            best = CPUHeadLM.kernel_for(rows)  # what our runners run
            table.append(
                [
                    name,
                    rows,
                    ms["linear"],
                    ms["copy"],
                    ms["w_xt"],
                    best,
                    ms["linear"] / ms[best],
                    diff,
                ]
            )
    common.print_table(
        "output projection, float32 (ms, process CPU time; median)",
        [
            "head",
            "rows",
            "F.linear",
            "x @ W.T copy",
            "(W @ x.T).T",
            "ours",
            "linear / ours",
            "max |diff|",
        ],
        table,
    )


if __name__ == "__main__":
    main()
