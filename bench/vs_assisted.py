"""Our greedy SpS against transformers' assisted generation on the same pair, same outputs.

(b) of issue 6. Both sides run the *same* model objects (same weights, dtype and kernels) on
the same chat-templated prompts, interleaved prompt by prompt:

* ``ours ar`` / ``ours sps``: :class:`mtad.engine.Decoder` with ``ar`` / ``sps`` at
  temperature 0, gamma 4;
* ``hf greedy``: ``target.generate(do_sample=False)``;
* ``hf assisted``: ``target.generate(assistant_model=draft, do_sample=False)`` with the draft
  length pinned to gamma 4 (``num_assistant_tokens=4``, ``"constant"`` schedule, confidence
  early-stop off), so both sides verify the same blocks;
* ``hf assisted (defaults)`` with ``--hf-defaults``: transformers' own defaults (20 draft
  tokens, confidence early-stop 0.4) -- a peer at its defaults, not the like-for-like row.

Greedy outputs must be identical: every row is compared token by token with ``ours ar``
(tokens counted up to the first EOS, capped at ``--max-new`` for everyone). Engine overhead
(wall time outside model forwards, forward hooks) is shown for every row.

    python -m bench.vs_assisted                  # smollm2 pair, 6 prompts x 64 tokens
    python -m bench.vs_assisted --prompts 12 --max-new 128 --hf-defaults
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from bench import common
from mtad.engine import Decoder
from mtad.methods import build_method

GAMMA = 4


def hf_generate(model, prompt_ids, max_new, eos, pad, assistant=None, assistant_cfg=None):
    """One ``generate`` call; returns the new tokens (up to the first EOS)."""
    kwargs = dict(
        do_sample=False,
        max_new_tokens=max_new,
        eos_token_id=eos,
        pad_token_id=pad,
        temperature=None,
        top_k=None,
        top_p=None,
    )
    if assistant is not None:
        kwargs["assistant_model"] = assistant
    ids = torch.tensor([prompt_ids], device=model.device)
    saved = copy.deepcopy(assistant.generation_config) if assistant is not None else None
    try:
        if assistant is not None and assistant_cfg:
            for k, v in assistant_cfg.items():
                setattr(assistant.generation_config, k, v)
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
    finally:
        if saved is not None:
            assistant.generation_config = saved
    return common.truncate_at_eos(out[0, len(prompt_ids) :].tolist(), eos)[:max_new]


def run(args: argparse.Namespace) -> dict[str, dict]:
    common.setup(args)
    bp = common.load_bench_pair(args)
    prompts = common.load_prompts(args, bp.tokenizer)
    impls = implementations(args, bp)
    acc = measure(args, bp, prompts, impls)
    report(args, bp, len(prompts), acc)
    return acc


Generate = Callable[[list[int], int, int], list[int]]  # (prompt ids, seed, max new) -> ids


def implementations(args: argparse.Namespace, bp: Any) -> dict[str, Generate]:
    """``name -> generate(prompt ids, seed, max new)``: ours (AR, SpS) and transformers' (greedy,
    assisted with the draft length pinned to ours, and optionally at its own defaults)."""
    eos = common.eos_ids(bp)
    pad = bp.tokenizer.pad_token_id if bp.tokenizer.pad_token_id is not None else eos[0]
    target, draft = bp.target.model, bp.draft.model
    ar = Decoder(build_method("ar", temperature=0.0), bp.target, None, eos, args.seed)
    sps = Decoder(
        build_method("sps", gamma=GAMMA, temperature=0.0), bp.target, bp.draft, eos, args.seed
    )
    pinned = {
        "num_assistant_tokens": GAMMA,
        "num_assistant_tokens_schedule": "constant",
        "assistant_confidence_threshold": 0.0,
    }
    impls: dict[str, Generate] = {
        "ours ar": lambda p, seed, n: ar.generate(p, n, seed=seed).token_ids,
        "ours sps": lambda p, seed, n: sps.generate(p, n, seed=seed).token_ids,
        "hf greedy": lambda p, seed, n: hf_generate(target, p, n, eos, pad),
        "hf assisted": lambda p, seed, n: hf_generate(target, p, n, eos, pad, draft, pinned),
    }
    if args.hf_defaults:
        impls["hf assisted (defaults)"] = lambda p, seed, n: hf_generate(
            target, p, n, eos, pad, draft, None
        )
    return impls


def measure(
    args: argparse.Namespace,
    bp: Any,
    prompts: list[Any],
    impls: dict[str, Generate],
) -> dict[str, dict]:
    """Every implementation on every prompt, side by side: tokens, wall and forward times,
    target calls, and whether the output equals the first implementation's (ours ar)."""
    acc: dict[str, dict[str, Any]] = {
        n: {"tokens": 0, "wall": 0.0, "target_fwd": 0.0, "draft_fwd": 0.0, "target_calls": 0}
        | {"same": 0, "outputs": []}
        for n in impls
    }
    for generate in impls.values():  # warm-up every path (lazy inits, first-call allocations)
        generate(prompts[0].ids, args.seed, 4)
    clock = common.pair_clock(bp)
    for i, prompt in enumerate(prompts):
        reference = None
        for n, generate in impls.items():
            clock.reset()
            start = time.perf_counter()
            toks = generate(prompt.ids, args.seed + i, args.max_new)
            a = acc[n]
            a["wall"] += time.perf_counter() - start
            a["tokens"] += len(toks)
            a["target_fwd"] += clock.seconds.get("target", 0.0)
            a["draft_fwd"] += clock.seconds.get("draft", 0.0)
            a["target_calls"] += clock.calls.get("target", 0)
            a["outputs"].append(toks)
            reference = toks if reference is None else reference
            a["same"] += int(toks == reference)
        if args.verbose:
            print(f"[bench] prompt {i + 1}/{len(prompts)} done", file=sys.stderr)
    clock.remove()
    return acc


def report(args: argparse.Namespace, bp: Any, n_prompts: int, acc: dict[str, dict]) -> None:
    """The table (tokens/s against transformers' assisted generation) and the SpS check."""
    print(common.environment_line(args))
    print(f"pair: {bp.describe()}")
    print(f"prompts: {n_prompts} x max {args.max_new} new tokens, greedy, gamma {GAMMA}")
    base = acc["hf assisted"]["tokens"] / acc["hf assisted"]["wall"]
    rows = []
    for n, a in acc.items():
        tps = a["tokens"] / a["wall"]
        overhead = a["wall"] - a["target_fwd"] - a["draft_fwd"]
        rows.append(
            [
                n,
                a["tokens"],
                f"{tps:.2f}",
                f"{common.ratio(tps, base):.2f}",
                a["target_calls"],
                f"{common.ratio(a['tokens'], a['target_calls']):.2f}",
                f"{a['same']}/{n_prompts}",
                f"{common.pct(overhead, a['wall']):.1f}",
            ]
        )
    common.print_table(
        "greedy: ours vs transformers (same model objects)",
        [
            "impl",
            "tokens",
            "tok/s",
            "x hf assisted",
            "target fwds",
            "tokens/target fwd",
            "same as ours ar",
            "overhead %",
        ],
        rows,
    )
    sps, hfa = acc["ours sps"], acc["hf assisted"]
    same = sum(a == b for a, b in zip(sps["outputs"], hfa["outputs"], strict=False))
    print(
        f"\nours sps vs hf assisted: identical outputs {same}/{n_prompts}, "
        f"tokens/s ratio {common.ratio(sps['tokens'] / sps['wall'], base):.2f}"
    )


def main(argv: list[str] | None = None) -> dict[str, dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_common_args(ap)
    ap.add_argument(
        "--hf-defaults",
        action="store_true",
        help="also run assisted generation with transformers' default draft settings",
    )
    ap.add_argument("--verbose", action="store_true")
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    main()
