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

This file is the command line: its options are the fields of
:class:`mtad_train.config.DistillConfig`; the run is :mod:`mtad_train.loop` (models in
:mod:`~mtad_train.drafts`, data in :mod:`~mtad_train.data`, training in :mod:`~mtad_train.train`,
evaluation in :mod:`~mtad_train.evaluate`, outputs in :mod:`~mtad_train.report`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file from a checkout that need not be installed
    sys.path.insert(0, str(REPO))  # (scripts/device_distill.sh on a bare device machine)

from mtad_train.cli import parse_config  # noqa: E402
from mtad_train.config import DistillConfig  # noqa: E402


def parse_args(argv=None) -> DistillConfig:
    """The options are :class:`~mtad_train.config.DistillConfig`'s fields."""
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    return parse_config(DistillConfig, argv, ap)


def main(argv=None):
    from mtad_train.loop import distil

    return distil(parse_args(argv))


if __name__ == "__main__":
    main()
