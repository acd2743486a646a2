#!/usr/bin/env python
"""Distil a small draft model that shares a target's tokenizer (online knowledge distillation).

The target answers prompts of an offline pool (:mod:`mtad_train.pool`, disjoint from every
evaluation prompt: checked, printed and written into the report); the drafts are trained on the
target's own continuations with full-vocabulary KL(p || q) to the target's next-token distribution
(computed on the fly, temperature 1), optionally plus the total-variation term
``1 - sum_v min(p_w, q_w)`` under the authors' warping (temperature 1, top-k 10, top-p 0.9), which
is exactly one minus the expected acceptance of a drafted token. Generation and training
interleave; a final train-only phase decays the learning rate.

Several drafts (``--drafts``) can be trained side by side on the same target data. Each one is
written as a plain ``LlamaForCausalLM`` folder: ``config.json``, ``model.safetensors`` (bf16),
``recipe.json`` (seed + full recipe + realised plan), ``metrics.json``, ``report.md`` and
``loss_curve.png``. The report measures, on held-out prompts of the evaluation kinds (HumanEval,
MT-Bench, the default prompt set; never trained on), greedy top-1 agreement and expected acceptance
``sum_v min(p, q)`` of the warped distributions, computed with the harness's own warping.

Examples::

    # the default pair's draft (GPU: minutes; CPU: set --time-budget, use --ckpt-dir to resume)
    python scripts/distill_draft.py --target smollm2 --out outputs/distill --time-budget 1800

    # a smoke run on CPU
    python scripts/distill_draft.py --target smollm2 --device cpu --max-steps 20 \
        --gen-batch-size 8 --gen-max-new 16 --eval-max-new 16 --eval-n-humaneval 4 \
        --eval-n-mtbench 4 --out /tmp/distill-smoke

``--target`` is ``smollm2`` (:func:`mtad.engine.smollm2.load_smollm2_target`), a Hugging Face model
path or name, or ``tiny-random:<tokenizer dir>`` (a random two-layer Llama with that tokenizer, for
tests). Resuming: with ``--ckpt-dir`` the full training state (drafts, optimisers, generated data,
RNG, pool cursor, loss history) is saved every ``--ckpt-every-s`` seconds, atomically, and a rerun
with the same arguments resumes from it.

This file is the command line; the run is :mod:`mtad_train.loop` (models in
:mod:`~mtad_train.drafts`, data in :mod:`~mtad_train.data`, training in
:mod:`~mtad_train.train`, evaluation in :mod:`~mtad_train.evaluate`, outputs in
:mod:`~mtad_train.report`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file from a checkout that need not be installed
    sys.path.insert(0, str(REPO))  # (scripts/device_distill.sh on a bare device machine)

from mtad_train.drafts import DraftSpec  # noqa: E402
from mtad_train.loop import distil  # noqa: E402


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--target", default="smollm2")
    ap.add_argument("--target-dtype", default="bfloat16")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = leave)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, help="output folder (one sub-folder per draft)")
    ap.add_argument("--ckpt-dir", default=None, help="resumable training state (atomic)")
    ap.add_argument("--ckpt-every-s", type=float, default=120.0)
    ap.add_argument(
        "--export-every-s",
        type=float,
        default=90.0,
        help="write the drafts + report into --out this often (0 = only at the end)",
    )
    ap.add_argument(
        "--transport-dir",
        default=None,
        help="also write split copies (<draft>.st.partNN + meta.tar) here",
    )
    ap.add_argument("--transport-chunk-mib", type=float, default=15.5)
    ap.add_argument(
        "--save-data",
        action="store_true",
        help="also save the generated sequences (uint16 ids) as data.npz in --out "
        "(and as data.npz.partNN in --transport-dir), to reuse with --data-in",
    )
    ap.add_argument(
        "--data-in",
        nargs="*",
        default=[],
        help="data.npz files of earlier runs, added to the buffer before training",
    )
    ap.add_argument(
        "--init-from",
        default=None,
        help="start the drafts from this draft folder (same architecture)",
    )
    ap.add_argument(
        "--eval-only",
        action="store_true",
        help="no training: evaluate --init-from and write its report into --out",
    )
    # data
    ap.add_argument("--pool", default=str(REPO / ".dev" / "distill_pool.jsonl.gz"))
    ap.add_argument("--pool-seed", type=int, default=0)
    ap.add_argument("--default-prompts", default=None, help="default prompt set (jsonl)")
    ap.add_argument("--ngram", type=int, default=8, help="n of the disjointness check")
    ap.add_argument("--max-prompt-tokens", type=int, default=448)
    ap.add_argument("--max-seq-tokens", type=int, default=704)
    ap.add_argument("--gen-batch-size", type=int, default=512)
    ap.add_argument("--gen-max-new", type=int, default=192)
    ap.add_argument(
        "--gen-greedy-frac",
        type=float,
        default=0.2,
        help="fraction of generation batches decoded greedily (rest: warped sampling)",
    )
    ap.add_argument(
        "--followup-frac",
        type=float,
        default=0.1,
        help="fraction of generated chats that get a second user turn",
    )
    # drafts and optimisation
    ap.add_argument(
        "--drafts",
        nargs="+",
        default=None,
        type=DraftSpec.parse,
        help="draft specs, e.g. L4:layers=4 L2:layers=2,tv_weight=0 (default: L4)",
    )
    ap.add_argument(
        "--teacher-topk",
        type=int,
        default=64,
        help="store the target's top-k log-probs while it generates and train on "
        "them (top-k KL, no second target forward); 0 = full-vocabulary KL "
        "with the target run again at every step",
    )
    ap.add_argument("--init-embed", choices=["pca", "random"], default="pca")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.05)
    ap.add_argument("--warmup-steps", type=int, default=50)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--tokens-per-step", type=int, default=32768)
    ap.add_argument("--micro-tokens", type=int, default=16384)
    ap.add_argument(
        "--prompt-weight",
        type=float,
        default=0.0,
        help="loss weight of prompt positions (response positions weigh 1); with "
        "--teacher-topk the target's top-k there comes from one teacher-forced "
        "pass per sequence, stored like the response positions'",
    )
    ap.add_argument(
        "--replay-ratio",
        type=float,
        default=4.0,
        help="in the interleaved phase, train until trained/generated tokens >= this",
    )
    ap.add_argument("--autocast", choices=["auto", "bf16", "off"], default="auto")
    # schedule: time or steps
    ap.add_argument(
        "--time-budget",
        type=float,
        default=0.0,
        help="seconds for the whole run (0 = use --max-steps)",
    )
    ap.add_argument(
        "--gen-frac",
        type=float,
        default=0.6,
        help="fraction of the budget (time or steps) spent interleaving generation",
    )
    ap.add_argument("--final-reserve-s", type=float, default=20.0)
    ap.add_argument("--max-steps", type=int, default=0)
    # held-out report
    ap.add_argument("--eval-n-humaneval", type=int, default=164)
    ap.add_argument("--eval-n-mtbench", type=int, default=80)
    ap.add_argument("--eval-n-default", type=int, default=10_000)
    ap.add_argument(
        "--eval-n-pool",
        type=int,
        default=128,
        help="held-out pool items (never trained on) to measure the generalisation gap",
    )
    ap.add_argument("--eval-max-new", type=int, default=128)
    ap.add_argument("--eval-mtbench-turn2", action="store_true", default=True)
    ap.add_argument("--no-eval-mtbench-turn2", dest="eval_mtbench_turn2", action="store_false")
    ap.add_argument("--eval-batch-size", type=int, default=256)
    ap.add_argument(
        "--require-eval-kinds",
        default="humaneval,mtbench",
        help="fail early unless these evaluation sets are found (comma list)",
    )
    args = ap.parse_args(argv)
    if args.eval_only:
        if not args.init_from:
            ap.error("--eval-only needs --init-from")
        args.time_budget, args.max_steps = 0.0, 0
    elif not args.time_budget and not args.max_steps:
        ap.error("give --time-budget or --max-steps")
    if not args.drafts:
        args.drafts = [DraftSpec.parse("L4:layers=4")]
    return args


def main(argv=None):
    return distil(parse_args(argv))


if __name__ == "__main__":
    main()
