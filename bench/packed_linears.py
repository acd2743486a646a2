"""Prepacked bfloat16 projections against stock ``F.linear``, side by side in one run.

Times, on the same loaded models switched between ``runtime.linears`` modes
(:func:`mtad.engine.packed.set_linears`) round by round: the target's cached forward of 1 token
(an AR step) and of 5 (a verification block of gamma 4), the independent draft's 1 token, and
the feature head's drafted position on 4 rows (MTAD's beams), after a chat-length context; and
checks that both modes give the same logits (bit for bit, or the largest difference).

    python -m bench.packed_linears [--reps 15] [--head assets/drafts/smollm2-head]

Milliseconds of process CPU time, medians over ``--reps`` interleaved rounds (each mode's
round after one untimed call of every case: switching to packed weights reorders them on their
first call, which a decoding run pays once at its start); ``stock /
packed`` is the speed-up. One torch thread; run it on a quiet core. bfloat16 only: float32
keeps the stock path (:mod:`mtad.engine.packed`).
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
from mtad.engine.packed import LINEARS_MODES, bf16_packing_supported, set_linears
from mtad.engine.runner import ModelRunner
from mtad.engine.subvocab import read_vocab

CONTEXT = 120


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draft", default=common.MODEL_DRAFT)
    ap.add_argument("--head", default="assets/drafts/smollm2-head")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--threads", type=int, default=1)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> list[list[str]]:
    args = parse_args(argv)
    common.setup(args)
    if not bf16_packing_supported():
        raise SystemExit("this CPU's oneDNN has no bfloat16: nothing would be packed")
    gen = torch.Generator().manual_seed(0)
    target_model, _ = load_model(ModelSpec(loader="smollm2_gguf", dtype="bfloat16"))
    draft_path, _ = common.resolve_draft(args.draft)
    draft_model, _ = load_model(ModelSpec(loader="local", path=str(draft_path), dtype="bfloat16"))
    head = load_head(args.head, target_model, read_vocab(args.head))
    target = ModelRunner(target_model, "target", feature_taps=head.spec.taps)
    draft = ModelRunner(draft_model, "draft")
    runner = HeadRunner(head, target)
    prompt = torch.randint(0, target.vocab_size, (CONTEXT,), generator=gen)
    for r in (target, draft):
        r.feed(prompt)
    runner.feed(prompt, compact=True)
    runner.repeat_rows(4)
    models = (target_model, draft_model, head)

    def forward(r: ModelRunner, n: int) -> Callable[[], torch.Tensor]:
        return lambda: forward_undone(r, torch.randint(0, r.vocab_size, (1, n), generator=gen))

    def head_step() -> None:
        common.time_head_step(runner, 4, gen)

    cases: dict[str, Callable[[], object]] = {
        "target 1 token": forward(target, 1),
        "target 5 tokens": forward(target, 5),
        "draft 1 token": forward(draft, 1),
        "head 1 token x 4 rows": head_step,
    }
    ms: dict[tuple[str, str], list[float]] = {(c, m): [] for c in cases for m in LINEARS_MODES}
    for _ in range(args.reps + 1):  # the first round warms every shape up
        for mode in LINEARS_MODES:
            for model in models:
                set_linears(model, mode)
            for fn in cases.values():  # untimed: a switch to packed reorders on first calls
                fn()
            for name, fn in cases.items():
                start = time.process_time()
                fn()
                ms[(name, mode)].append(1e3 * (time.process_time() - start))
    diffs = logits_differences(target, draft, runner, models, gen)
    rows = []
    for name in cases:
        stock = statistics.median(ms[(name, "stock")][1:])
        packed = statistics.median(ms[(name, "auto")][1:])
        rows.append([name, f"{stock:.2f}", f"{packed:.2f}", f"{stock / packed:.2f}", diffs[name]])
    print(common.environment_line(args))
    common.print_table(
        f"stock F.linear against prepacked weights, bfloat16, context {CONTEXT} "
        f"(ms, process CPU time, medians of {args.reps} interleaved rounds)",
        ["forward", "stock ms", "packed ms", "stock / packed", "logits"],
        rows,
    )
    return rows


def forward_undone(runner: ModelRunner, ids: torch.Tensor) -> torch.Tensor:
    """The logits of ``ids`` ``[1, n]`` after the cache, which is then cropped back."""
    out = runner.forward(ids, keep=ids.shape[1])
    runner.crop(runner.cache_len - ids.shape[1])
    return out


def logits_differences(
    target: ModelRunner,
    draft: ModelRunner,
    runner: HeadRunner,
    models: tuple[torch.nn.Module, ...],
    gen: torch.Generator,
) -> dict[str, str]:
    """Each case's logits in both modes on the same input: 'equal' or the largest gap."""
    ids = torch.randint(0, target.vocab_size, (1, 5), generator=gen)
    outs: dict[str, dict[str, torch.Tensor]] = {}
    for mode in LINEARS_MODES:
        for model in models:
            set_linears(model, mode)
        got = outs[mode] = {}
        for name, r, n in (
            ("target 1 token", target, 1),
            ("target 5 tokens", target, 5),
            ("draft 1 token", draft, 1),
        ):
            got[name] = forward_undone(r, ids[:, :n])
        with common.one_position_undone(runner):
            got["head 1 token x 4 rows"] = runner.forward(ids[:, :1].expand(4, 1), compact=True)
    return {
        name: "equal"
        if torch.equal(outs["auto"][name], outs["stock"][name])
        else f"max |diff| {float((outs['auto'][name] - outs['stock'][name]).abs().max()):.3g}"
        for name in outs["auto"]
    }


if __name__ == "__main__":
    main()
