"""Cost of the output projection by kernel, dtype and row count, and the kernel ours runs.

A decoding step projects 1 to ~10 hidden rows onto the whole vocabulary. This times, for the
pair's target and draft heads (their real weights and shapes, read from the loaded models), in
each dtype of ``--dtypes``:

* ``F.linear(x, W)`` -- what ``nn.Linear`` (and so every transformers model) calls;
* ``x @ W.T.contiguous()`` -- a transposed copy made once;
* ``(W @ x.T).T`` -- the weight as stored, the rows as columns;
* oneDNN on a copy of ``W`` reordered once into its blocked layout
  (:mod:`mtad.engine.packed`; bfloat16 where oneDNN has it, "n/a" elsewhere);

interleaved, medians of ``--reps`` (process CPU time), with the largest difference to
``F.linear``'s logits relative to the largest logit. "ours" is the kernel ``CPUHeadLM`` runs on
this machine (:func:`mtad.engine.heads.head_kernel`: measured once, cached per CPU model and
torch version), and ``ours / fastest`` its median over the fastest median of this table.

    python -m bench.lm_head [--dtypes float32,bfloat16] [--rows 1,2,3,4,5,8,16] [--reps 15]
    python -m bench.lm_head --pair tiny --reps 1     # seconds; the random test pair
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from typing import Any

import torch

from bench import common
from mtad.engine.heads import HEAD_KERNELS, head_kernel, head_kernels, project_rows
from mtad.engine.kernels import kernel_table
from mtad.engine.packed import PackedWeight

LABELS = {
    "linear": "F.linear",
    "copy": "x @ W.T copy",
    "w_xt": "(W @ x.T).T",
    "packed": "packed (oneDNN)",
}


def interleaved_ms(kernels: dict, reps: int) -> dict[str, float]:
    """Median process CPU ms of each kernel, the kernels alternating rep by rep."""
    for fn in kernels.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in kernels}
    for _ in range(reps):
        for k, fn in kernels.items():
            start = time.process_time()
            fn()
            times[k].append(time.process_time() - start)
    return {k: 1e3 * statistics.median(v) for k, v in times.items()}


def head_weights(args: argparse.Namespace) -> dict[str, torch.Tensor]:
    """``{"target VxH": W, "draft VxH": W}``: the loaded pair's head weights (float32); a
    feature-level draft head has none of its own (it projects onto the target's rows)."""
    bp = common.load_bench_pair(args)
    heads = {}
    for role, runner in (("target", bp.target), ("draft", bp.draft)):
        if runner is None or getattr(runner, "reads_target_features", False):
            continue
        weight = runner.model.get_output_embeddings().weight.detach().float()
        heads[f"{role} {weight.shape[0]}x{weight.shape[1]}"] = weight
    return heads


def time_kernels(
    x: torch.Tensor, weight: torch.Tensor, transposed: Any, table: Any, reps: int
) -> list[Any]:
    """One table row: every kernel's time for ``x @ weight.T``, the one the kernel table picks
    for this row count, how far it is from the fastest and from ``linear``, and the largest
    difference between the kernels' results (relative to the largest logit)."""
    rows = x.shape[0]
    pack = PackedWeight()
    kernels = {
        k: (lambda k=k, x=x, w=weight, t=transposed: project_rows(k, x, w, t, pack))
        for k in head_kernels(weight)
    }
    with torch.inference_mode():
        ours = head_kernel(weight, rows, table, transposed, pack)
        ms = interleaved_ms(kernels, reps)
        want = kernels["linear"]().float()
        scale = float(want.abs().max()) or 1.0
        diff = max(float((f().float() - want).abs().max()) for f in kernels.values())
    fastest = min(ms.values())
    return [
        *(ms.get(k, "n/a") for k in HEAD_KERNELS),
        ours,
        f"{ms[ours] / fastest:.3f}",
        f"{ms['linear'] / ms[ours]:.2f}",
        diff / scale,
    ]


def main(argv: list[str] | None = None) -> list[list]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_common_args(ap)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--rows", default="1,2,3,4,5,8,16")
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args(argv)
    args.dtype = "float32"  # the pair loads in float32; each dtype below casts the head
    common.setup(args)
    dtypes = [getattr(torch, d.strip()) for d in args.dtypes.split(",")]
    rows_list = [int(r) for r in args.rows.split(",")]
    heads = head_weights(args)
    table = kernel_table()
    print(common.environment_line(args))
    print(f"kernel table: {table.path}")
    gen = torch.Generator().manual_seed(0)
    all_rows = []
    for dtype in dtypes:
        out = []
        for name, weight32 in heads.items():
            weight = weight32.to(dtype)
            transposed = functools.cache(lambda w=weight: w.T.contiguous())
            for rows in rows_list:
                x = (torch.randn(rows, weight.shape[1], generator=gen)).to(dtype)
                out.append([name, rows, *time_kernels(x, weight, transposed, table, args.reps)])
        common.print_table(
            f"output projection, {str(dtype).removeprefix('torch.')} "
            "(ms, process CPU time; median)",
            [
                "head",
                "rows",
                *(LABELS[k] for k in HEAD_KERNELS),
                "ours",
                "ours / fastest",
                "linear / ours",
                "max rel diff",
            ],
            out,
        )
        all_rows += out
    worst = max(float(r[-3]) for r in all_rows)
    print(f"\nours / fastest, worst over every dtype, head and row count: {worst:.3f}")
    return all_rows


if __name__ == "__main__":
    main()
