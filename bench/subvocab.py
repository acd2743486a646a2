"""What a draft step saves when an FR-Spec head hands warping its compact rows.

A draft folder with ``draft_vocab.json`` projects onto its kept tokens only
(:class:`mtad.engine.subvocab.SubVocabHead`, after FR-Spec, Zhao et al. 2025). Widening those
logits back to the vocabulary (``-inf`` elsewhere) and warping the wide row costs a 49k-entry
fill, scatter, conversion and top-k per row; :meth:`mtad.engine.runner.ModelRunner.candidates`
warps the compact rows and names the candidates by vocabulary id instead. This times both, side
by side, on the shipped draft's head (or a random one of the same shape), each call after
evicting the caches as a decoding forward does (:func:`mtad.engine.kernels.cache_evictor`):

    python -m bench.subvocab                 # bf16, rows 1 and 4 (a draft step's shapes)
    python -m bench.subvocab --dtype float32 --rows 1,4,8
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from bench import common
from mtad.engine.kernels import cache_evictor
from mtad.engine.subvocab import SubVocabHead, read_vocab
from mtad.engine.warping import WarpConfig, compact_candidates, warp_candidates

DRAFT = Path(__file__).resolve().parents[1] / "assets" / "drafts" / "smollm2-draft"


def median_ms(fn: Callable[[], object], reps: int, evict: Callable[[], None]) -> float:
    fn()  # first-call allocations, kernel choices
    times = []
    for _ in range(reps):
        evict()
        t0 = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def head_weights(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, str]:
    """(vocabulary x hidden) head, kept ids, and where they came from."""
    ids = read_vocab(DRAFT) if DRAFT.is_dir() else None
    weights = DRAFT / "model.safetensors"
    if ids and weights.is_file():
        from safetensors.torch import load_file

        w = load_file(str(weights))["model.embed_tokens.weight"]
        return w.to(dtype), torch.tensor(ids), f"{DRAFT.name} ({len(ids)} kept ids)"
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(49152, 256, generator=gen).to(dtype)
    kept = torch.randperm(49152, generator=gen)[:16384]
    return w, kept, "random 49152 x 256 head, 16384 kept ids"


def run(args: argparse.Namespace) -> list[list[str]]:
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    weight, ids, source = head_weights(dtype)
    head = SubVocabHead(weight, ids)
    warp = WarpConfig(1.0, 10, 0.9)
    evict = cache_evictor()
    gen = torch.Generator().manual_seed(1)
    rows_out = []
    with torch.inference_mode():
        for rows in (int(r) for r in args.rows.split(",")):
            hidden = torch.randn(rows, weight.shape[1], generator=gen).to(dtype)
            sub = head.compact(hidden)
            wide = head.widen(sub)
            times = {
                "head wide": median_ms(lambda h=hidden: head(h), args.reps, evict),
                "head compact": median_ms(lambda h=hidden: head.compact(h), args.reps, evict),
                "warp wide": median_ms(lambda w=wide: warp_candidates(w, warp), args.reps, evict),
                "warp compact": median_ms(
                    lambda s=sub: compact_candidates(s, warp, head.ids), args.reps, evict
                ),
            }
            wide_total = times["head wide"] + times["warp wide"]
            compact_total = times["head compact"] + times["warp compact"]
            rows_out.append(
                [str(rows)]
                + [f"{times[k]:.3f}" for k in times]
                + [f"{wide_total:.3f}", f"{compact_total:.3f}", f"{wide_total / compact_total:.2f}"]
            )
    print(common.cpu_line())
    print(
        f"head: {source}, {args.dtype}, {args.threads} thread(s), median of {args.reps}, "
        "caches evicted before each call"
    )
    common.print_table(
        "milliseconds per call: the head's projection, then warping its rows",
        [
            "rows",
            "head wide",
            "head compact",
            "warp wide",
            "warp compact",
            "wide total",
            "compact total",
            "wide / compact",
        ],
        rows_out,
    )
    return rows_out


def main(argv: list[str] | None = None) -> list[list[str]]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    ap.add_argument("--rows", default="1,4", help="comma-separated row counts")
    ap.add_argument("--reps", type=int, default=60)
    ap.add_argument("--threads", type=int, default=1)
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    main()
