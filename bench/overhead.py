"""Engine overhead and speed of every method on one pair, side by side, with the time split.

(a) of issue 6: engine overhead = wall time minus time inside model forwards (forward hooks on
both models), as a fraction of wall time, for every method; and where the time goes: target
forwards, draft forwards, overhead inside the draft/verify phases (warping, sampling, cache
bookkeeping), and overhead outside them (the decode loop). Speed ratios are against ``ar``
and ``sps`` on the same prompts and seeds; methods run interleaved prompt by prompt.

    python -m bench.overhead                       # smollm2 pair, ar/sps/mtad, 6 prompts x 64
    python -m bench.overhead --methods all --prompts 12 --max-new 128
    python -m bench.overhead --greedy              # temperature 0 for every method
    python -m bench.overhead --pair tiny           # seconds; the random test pair
    python -m bench.overhead --reorder copy,inplace  # beam cache reorder before/after (#18)
    python -m bench.overhead --prompts 8 --methods ar,sps,blockverify,mtad

With ``sps`` among the methods, a second table sets every other drafting method's mean accepted
length per iteration beside SpS's on the same prompts and seeds (so block verification's first
draft of each prompt is SpS's own; later drafts follow each method's output), with the paired
difference and its 95% Student-t interval over prompts (:func:`accepted_vs_sps`).

A speed table gives every method's speed-up over AR and over SpS with its 95% paired bootstrap
interval over prompts (:func:`speed_intervals`: the same rule as the paper tables',
``mtad.runs.intervals.paired_bootstrap`` on per-prompt wall times and new tokens), and whether
``--claim-ar`` / ``--claim-sps`` (a speed-up floor, e.g. issue 39's 1.2 and 1.05) holds, does
not hold, or is unresolved on these prompts: the ratio of one run is noisy (a handful of
prompts leave it +-0.1), its interval says how far it can be trusted.

A third table sets the draft step in the loop beside its forward alone (issue 39), for every
method drafting a chain with a separate draft (SpS, block verification: one row; MTAD: its
``B`` beams): CPU time of the draft phase per drafted position (the draft's forwards plus
warping, sampling, beam and cache bookkeeping), the part inside the draft's forwards, and the
same rows' forward alone (``bench.forward_shapes``'s head figure: one drafted position on
those rows) timed in the same run right after each prompt; ``step / alone`` is the median over
prompts of the per-prompt ratio.

``--beam-draft N`` times only the beam draft (``mtad.methods.beam.beam_sample``, B=4, gamma=4,
on the draft and, as MTJD drafts, on the target) after an N-token context, ``copy`` and
``inplace`` alternating, and prints the median of the paired per-repeat time ratios: the
cache bookkeeping the reorder changes, without the noise of whole generations.

``--reorder`` runs every method once per cache-reorder mode of :class:`mtad.engine.ModelRunner`
(``copy``: transformers' ``reorder_cache`` / ``batch_repeat_interleave``, the code before issue
18; ``inplace``: only the drafted positions move), interleaved like the methods.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from scipy import stats as scipy_stats

from bench import common
from mtad.engine import Decoder, DecodeStats
from mtad.engine.loop import DecodeContext, Phase
from mtad.methods import METHODS, build_method
from mtad.runs import intervals

# Every method runs at its params dataclass's defaults (mtad/methods/params.py: the authors'
# B=4, gamma=4, tau=0.5; sampling T=1, top-k 10, top-p 0.9), which conf/method/*.yaml compose.
DEFAULT_METHODS = "ar,sps,mtad"
# The speed table's columns (:func:`print_time_split`).
TIME_SPLIT_COLUMNS = [
    "method",
    "tokens",
    "tok/s",
    "x ar",
    "x sps",
    "block eff",
    "accept",
    "target fwd %",
    "draft fwd %",
    "overhead %",
    "in phases %",
    "loop %",
    "overhead ms/iter",
]

# label -> its results: stats, tokens/s, the time split, the rows of the later tables
Results = dict[str, dict[str, Any]]


def parse_methods(spec: str) -> list[str]:
    names = list(METHODS) if spec == "all" else [m.strip() for m in spec.split(",") if m.strip()]
    unknown = [m for m in names if m not in METHODS]
    if unknown:
        raise SystemExit(f"--methods: unknown {unknown}; choose from {sorted(METHODS)} or 'all'")
    return names


def run(args: argparse.Namespace) -> Results:
    """Every method on the same prompts, interleaved prompt by prompt, then the tables."""
    common.setup(args)
    methods = parse_methods(args.methods)
    bp = common.load_bench_pair(args, need_draft=any(METHODS[m][1].uses_draft for m in methods))
    prompts = common.load_prompts(args, bp.tokenizer)
    labels = method_labels(methods, args.reorder)
    decoders = build_decoders(args, bp, labels)
    measured = measure(args, bp, prompts, decoders, labels)
    results = time_split(measured)
    print_setting(args, bp, prompts)
    print_time_split(results, labels)
    print_draft_depths(results)
    print_draft_steps(results, measured)
    prompt_ids = [p.id for p in prompts]  # a cycled prompt file repeats ids: one cluster each
    print_accepted_vs_sps(results, measured, labels, prompt_ids)
    claims = {"ar": args.claim_ar, "sps": args.claim_sps}
    print_speed_intervals(results, measured, labels, claims, prompt_ids)
    return results


def method_labels(methods: list[str], reorder: str) -> dict[str, tuple[str, str]]:
    """``label -> (method, reorder mode)``: ``mtad``, or ``mtad/copy`` with several modes."""
    reorders = [r.strip() for r in reorder.split(",") if r.strip()]
    return {(f"{m}/{r}" if len(reorders) > 1 else m): (m, r) for m in methods for r in reorders}


def method_params(method: str, args: argparse.Namespace) -> dict[str, Any]:
    """The sampling of ``--greedy``; ``--gamma`` reaches every method that drafts a block of
    that depth."""
    sampling = {"temperature": 0.0} if args.greedy else {}
    fields = METHODS[method][0].__dataclass_fields__
    return {**sampling, **({"gamma": args.gamma} if args.gamma and "gamma" in fields else {})}


def build_decoders(
    args: argparse.Namespace, bp: common.BenchPair, labels: dict[str, tuple[str, str]]
) -> dict[str, Decoder]:
    """One decoder per label, every one on the same pair of runners."""
    return {
        label: Decoder(
            build_method(m, **method_params(m, args)),
            bp.target,
            bp.draft,
            eos_token_ids=common.eos_ids(bp),
            seed=args.seed,
        )
        for label, (m, _) in labels.items()
    }


def use_reorder(bp: common.BenchPair, mode: str) -> None:
    """Set the cache reorder mode of both runners of the pair."""
    for runner in (bp.target, bp.draft):
        if runner is not None:
            runner.reorder = mode


@dataclass
class Measured:
    """What the interleaved runs measured, per label: every prompt's stats, the seconds inside
    each model's forwards, and, for the chain-drafting labels (``stepping``: label -> rows),
    the CPU seconds of each prompt's draft phase and of the draft's forwards in it, and the
    same rows' forward alone timed right after the prompt."""

    stats: dict[str, list[DecodeStats]]
    fwd: dict[str, dict[str, float]]
    draft_cpu: dict[str, list[tuple[float, float]]]
    alone: dict[str, list[float]]
    stepping: dict[str, int]


def measure(
    args: argparse.Namespace,
    bp: common.BenchPair,
    prompts: list[common.Prompt],
    decoders: dict[str, Decoder],
    labels: dict[str, tuple[str, str]],
) -> Measured:
    """A warm-up generation per decoder (first-call allocations, lazy inits), then every
    prompt through every decoder in turn, with the forward clock and the draft-phase CPU clock
    running."""
    clock = common.pair_clock(bp)
    for label, dec in decoders.items():
        use_reorder(bp, labels[label][1])
        dec.generate(prompts[0].ids, 4, seed=args.seed)
    measured = Measured(
        stats={m: [] for m in labels},
        fwd={m: {"target": 0.0, "draft": 0.0} for m in labels},
        draft_cpu={m: [] for m in labels},
        alone={m: [] for m in labels},
        stepping={m: rows for m in labels if (rows := draft_step_rows(decoders[m]))},
    )
    gen = torch.Generator().manual_seed(args.seed)
    phases = DraftPhaseCPU()
    try:
        for i, prompt in enumerate(prompts):
            for m, dec in decoders.items():
                use_reorder(bp, labels[m][1])
                clock.reset()
                phases.take()
                out = dec.generate(prompt.ids, args.max_new, seed=args.seed + i)
                measured.stats[m].append(out.stats)
                for k, v in clock.snapshot().items():
                    measured.fwd[m][k] += v
                if m in measured.stepping:  # the same rows' forward alone, at the mean context
                    cpu = (phases.take(), clock.cpu_seconds.get("draft", 0.0))
                    measured.draft_cpu[m].append(cpu)
                    context = torch.tensor(prompt.ids + out.token_ids[: len(out.token_ids) // 2])
                    measured.alone[m].append(
                        draft_forward_alone(bp, context, measured.stepping[m], gen)
                    )
            if args.verbose:
                print(f"[bench] prompt {i + 1}/{len(prompts)} done", file=sys.stderr)
    finally:
        clock.remove()
        phases.remove()
    return measured


def time_split(measured: Measured) -> Results:
    """Per label: its summed stats, tokens/s, the seconds in target and draft forwards, and the
    overhead (wall time outside forwards) as a share of wall time, split into the part inside
    the draft/verify phases and the decode loop's."""
    results = {}
    for m, stats in measured.stats.items():
        s = DecodeStats.total(stats)
        f_t, f_d = measured.fwd[m]["target"], measured.fwd[m]["draft"]
        overhead = s.wall_time - f_t - f_d
        loop = s.wall_time - s.time_draft - s.time_verify
        results[m] = {
            "stats": s,
            "tokens_per_s": s.tokens_per_s,
            "target_fwd_s": f_t,
            "draft_fwd_s": f_d,
            "overhead_s": overhead,
            "overhead_pct": common.pct(overhead, s.wall_time),
            "phase_overhead_pct": common.pct(overhead - loop, s.wall_time),
            "loop_pct": common.pct(loop, s.wall_time),
            "overhead_ms_per_iter": 1e3 * overhead / s.iterations if s.iterations else 0.0,
        }
    return results


def print_setting(
    args: argparse.Namespace, bp: common.BenchPair, prompts: list[common.Prompt]
) -> None:
    """The environment, pair, prompts and sampling lines above the tables."""
    mode = "greedy" if args.greedy else "T=1, top-k 10, top-p 0.9"
    print(common.environment_line(args))
    print(f"pair: {bp.describe()}")
    print(f"prompts: {len(prompts)} x max {args.max_new} new tokens, seeds {args.seed}.., {mode}")


def print_time_split(results: Results, labels: dict[str, tuple[str, str]]) -> None:
    """The speed table: tokens/s, the ratios to AR and SpS (each method's first label: the
    reorder mode does not touch them), acceptance, and where the wall time goes."""

    def rate_of(method: str) -> float:
        found = [results[k]["tokens_per_s"] for k, (m, _) in labels.items() if m == method]
        return found[0] if found else float("nan")

    ar, sps = rate_of("ar"), rate_of("sps")
    rows = []
    for m, r in results.items():
        s = r["stats"]
        rows.append(
            [
                m,
                s.new_tokens,
                f"{s.tokens_per_s:.2f}",
                f"{common.ratio(s.tokens_per_s, ar):.2f}",
                f"{common.ratio(s.tokens_per_s, sps):.2f}",
                f"{s.block_efficiency:.2f}",
                f"{s.acceptance_rate:.2f}",
                f"{common.pct(r['target_fwd_s'], s.wall_time):.1f}",
                f"{common.pct(r['draft_fwd_s'], s.wall_time):.1f}",
                f"{r['overhead_pct']:.1f}",
                f"{r['phase_overhead_pct']:.1f}",
                f"{r['loop_pct']:.1f}",
                f"{r['overhead_ms_per_iter']:.2f}",
            ]
        )
    common.print_table(
        "speed and where the time goes (percent of wall time)", TIME_SPLIT_COLUMNS, rows
    )


def print_draft_depths(results: Results) -> None:
    """Per drafting label: mean accepted length, acceptance at each depth, and the histogram of
    iterations by accepted depth (no table when no label drafted)."""
    rows = [
        [
            m,
            f"{s.mean_accepted:.2f}",
            " / ".join(f"{a:.2f}" for a in s.depth_acceptance),
            " ".join(str(n) for n in s.accept_histogram),
        ]
        for m, r in results.items()
        if (s := r["stats"]).drafted
    ]
    if rows:
        common.print_table(
            "where drafts fail: acceptance at each depth, iterations by accepted depth 0..gamma",
            ["method", "mean accepted", "acceptance at depth 1 / 2 / ...", "histogram"],
            rows,
        )


def print_draft_steps(results: Results, measured: Measured) -> None:
    """The draft step in the loop beside the same rows' forward alone
    (:func:`draft_step_rows_table`), each row kept as ``results[label]["draft_step"]``."""
    steps = draft_step_rows_table(
        measured.stats, measured.draft_cpu, measured.alone, measured.stepping
    )
    for m, row in steps.items():
        results[m]["draft_step"] = row
    if not steps:
        return
    common.print_table(
        "the draft step in the loop against the same rows' forward alone (CPU ms per "
        "drafted position, medians over prompts; 'alone' timed right after each prompt)",
        [
            "method",
            "rows",
            "step in loop",
            "its forwards",
            "forward alone",
            "step / alone",
            "forwards / alone",
        ],
        [
            [
                m,
                r["rows"],
                f"{r['step_ms']:.2f}",
                f"{r['forward_in_loop_ms']:.2f}",
                f"{r['alone_ms']:.2f}",
                f"{r['ratio']:.2f}",
                f"{r['forward_ratio']:.2f}",
            ]
            for m, r in steps.items()
        ],
    )


def print_accepted_vs_sps(
    results: Results, measured: Measured, labels: dict[str, tuple[str, str]], prompt_ids: list[str]
) -> None:
    """With SpS among the methods, every other drafting label's accepted length beside SpS's
    (:func:`accepted_vs_sps`, SpS's first label), each row kept as
    ``results[label]["accepted_vs_sps"]``."""
    sps_labels = [k for k, (m, _) in labels.items() if m == "sps"]
    if not sps_labels:
        return
    paired = accepted_vs_sps(measured.stats, labels, sps_labels[0], prompt_ids)
    for label, row in paired.items():
        results[label]["accepted_vs_sps"] = row
    common.print_table(
        f"mean accepted length per iteration beside SpS's on the same {len(prompt_ids)} prompts "
        f"({len(set(prompt_ids))} distinct; paired: method - SpS per prompt, 95% Student-t "
        "interval over the distinct prompts)",
        ["method", "accepted", "sps accepted", "difference", "95% interval"],
        [
            [
                label,
                f"{r['mean']:.3f}",
                f"{r['sps_mean']:.3f}",
                f"{r['difference']:+.3f}",
                f"[{r['lo']:+.3f}, {r['hi']:+.3f}]",
            ]
            for label, r in paired.items()
        ],
    )


def speed_intervals(
    stats: dict[str, list[DecodeStats]], baseline: str, prompt_ids: list[str]
) -> dict[str, intervals.Interval]:
    """Per label other than ``baseline``: its speed-up over ``baseline`` (the baseline's wall
    time per new token over the label's, each summed over the prompts), with the 95% paired
    bootstrap interval over prompts (:func:`mtad.runs.intervals.paired_bootstrap`). A prompt
    run more than once (``--prompts`` beyond the file cycles it, with other seeds) is one
    cluster: its runs' times and tokens are summed and resampled together, so the interval
    rests on the distinct prompts, not on repeats of them."""
    clusters = {p: i for i, p in enumerate(dict.fromkeys(prompt_ids))}  # first-seen order
    column = [clusters[p] for p in prompt_ids]

    def per_prompt(label: str) -> tuple[np.ndarray, np.ndarray]:
        wall, tokens = np.zeros((1, len(clusters))), np.zeros((1, len(clusters)))
        for c, x in zip(column, stats[label], strict=True):
            wall[0, c] += x.wall_time
            tokens[0, c] += x.new_tokens
        return wall, tokens

    base_num, base_den = per_prompt(baseline)
    out = {}
    for label in stats:
        if label != baseline:
            run_num, run_den = per_prompt(label)
            values = intervals.PairedValues(run_num, run_den, base_num, base_den)
            out[label] = intervals.paired_bootstrap(values, "factor")
    return out


def print_speed_intervals(
    results: Results,
    measured: Measured,
    labels: dict[str, tuple[str, str]],
    claims: dict[str, float],
    prompt_ids: list[str],
) -> None:
    """Each label's speed-up over AR and SpS (their first labels) with its interval and the
    verdict of the speed-up floor claimed against each (0: no claim), kept as
    ``results[label]["speedup_vs_<method>"]``."""
    rows: dict[str, list[str]] = {label: [label] for label in labels}
    columns = ["method"]
    for method, floor in claims.items():
        found = [k for k, (m, _) in labels.items() if m == method]
        if not found:
            continue
        columns += [f"x {method}", "95% interval"] + ([f">= {floor:g}x"] if floor else [])
        found_intervals = speed_intervals(measured.stats, found[0], prompt_ids)
        for label, row in rows.items():
            iv = found_intervals.get(label)
            if iv is None:  # the baseline itself
                row += ["1.00", ""] + ([""] if floor else [])
                continue
            results[label][f"speedup_vs_{method}"] = iv
            row += [f"{iv.mean:.2f}", f"[{iv.lo:.2f}, {iv.hi:.2f}]"]
            if floor:
                row.append(intervals.verdict(iv.lo, iv.hi, "above", floor))
    if len(columns) == 1:
        return
    runs, distinct = len(prompt_ids), len(set(prompt_ids))
    common.print_table(
        f"speed-up on the same {runs} prompts ({distinct} distinct; {intervals.BOOTSTRAP_METHOD})",
        columns,
        list(rows.values()),
    )


def draft_step_rows(dec: Decoder) -> int:
    """Rows of a method's drafted positions when it drafts a chain with a separate draft, one
    position per step (SpS, block verification: 1; MTAD: its beams); 0 otherwise (no draft,
    trees, MTJD drafting on the target)."""
    method = dec.method
    params = getattr(method, "params", None)
    if dec.draft is None or dec.draft is dec.target or method.name not in CHAIN_DRAFTS:
        return 0
    return int(getattr(params, "beam_width", 1))


CHAIN_DRAFTS = ("sps", "blockverify", "mtad")


class DraftPhaseCPU:
    """Process CPU time inside every method's ``draft`` phase (``DecodeContext.timed``, which
    records wall time only): CPU time of a one-thread run is robust to other jobs sharing the
    core, as ``bench.forward_shapes``'s figures are. Patched on the class until :meth:`remove`."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._original = DecodeContext.timed
        original, clock = self._original, self

        @contextlib.contextmanager
        def timed(ctx, phase: Phase):
            start = time.process_time()
            try:
                with original(ctx, phase):
                    yield
            finally:
                if phase == "draft":
                    clock.seconds += time.process_time() - start

        DecodeContext.timed = timed

    def take(self) -> float:
        """CPU seconds since the last call."""
        out, self.seconds = self.seconds, 0.0
        return out

    def remove(self) -> None:
        DecodeContext.timed = self._original


def draft_forward_alone(
    bp: common.BenchPair, context: torch.Tensor, rows: int, gen: torch.Generator, reps: int = 5
) -> float:
    """Median CPU seconds of the draft's forward alone for one drafted position on ``rows``
    rows after ``context`` (``bench.forward_shapes``'s figure for a head: compact rows, each
    row reading its own previous output), the first of ``reps + 1`` calls a warm-up."""
    draft = bp.draft
    if draft.reads_target_features:
        common.head_after_context(bp, context, rows)
        times = [common.time_head_step(draft, rows, gen)[0] for _ in range(reps + 1)]
    else:
        draft.reset()
        draft.feed(context)
        draft.repeat_rows(rows)
        times = []
        for _ in range(reps + 1):
            ids = torch.randint(0, draft.vocab_size, (rows, 1), generator=gen)
            start = time.process_time()
            draft.forward(ids, keep=1, compact=True)
            times.append(1e3 * (time.process_time() - start))
            draft.crop(draft.cache_len - 1)
    bp.target.reset()
    draft.reset()
    return 1e-3 * statistics.median(times[1:])


def draft_step_rows_table(
    stats: dict[str, list[DecodeStats]],
    draft_cpu: dict[str, list[tuple[float, float]]],
    alone: dict[str, list[float]],
    stepping: dict[str, int],
) -> dict[str, dict[str, float]]:
    """Per chain-drafting method, in CPU time per drafted position: its draft phase in the loop
    (warping, sampling, beam and cache bookkeeping included), the part of it inside the
    draft's forwards, and the same rows' forward alone timed right after each prompt in this
    run; ``ratio``: the median over prompts of in-loop step / forward alone."""
    out = {}
    for m, rows in stepping.items():
        per_prompt = []
        for s, (phase, fwd), a in zip(stats[m], draft_cpu[m], alone[m], strict=True):
            steps = sum(s.draft_depths)
            if steps and a > 0:
                per_prompt.append((phase / steps, fwd / steps, a))
        if not per_prompt:
            continue
        out[m] = {
            "rows": rows,
            "step_ms": 1e3 * statistics.median(x[0] for x in per_prompt),
            "forward_in_loop_ms": 1e3 * statistics.median(x[1] for x in per_prompt),
            "alone_ms": 1e3 * statistics.median(x[2] for x in per_prompt),
            "ratio": statistics.median(x[0] / x[2] for x in per_prompt),
            "forward_ratio": statistics.median(x[1] / x[2] for x in per_prompt),
        }
    return out


def paired_t_interval(diffs: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """Student-t interval of the mean of paired differences (NaN below two pairs)."""
    if len(diffs) < 2:
        return math.nan, math.nan
    mean = statistics.fmean(diffs)
    half = scipy_stats.t.ppf(0.5 + confidence / 2, len(diffs) - 1) * statistics.stdev(diffs)
    half /= math.sqrt(len(diffs))
    return mean - half, mean + half


def accepted_vs_sps(
    stats: dict[str, list[DecodeStats]],
    labels: dict[str, tuple[str, str]],
    sps: str,
    prompt_ids: list[str],
) -> dict[str, dict[str, float]]:
    """Per drafting method other than SpS: the mean over prompts of its accepted length per
    iteration (:attr:`DecodeStats.mean_accepted`), SpS's on the same prompts, and the mean
    paired difference with its Student-t interval. A prompt run more than once (the file
    cycled) counts once, with its runs' mean, as in :func:`speed_intervals`; runs where either
    method ran no iteration drop."""
    out = {}
    for label, (method, _) in labels.items():
        if method == "sps" or not METHODS[method][1].uses_draft:
            continue
        by_prompt: dict[str, list[tuple[float, float]]] = {}
        for pid, s, b in zip(prompt_ids, stats[label], stats[sps], strict=True):
            if s.iterations and b.iterations:
                by_prompt.setdefault(pid, []).append((s.mean_accepted, b.mean_accepted))
        if not by_prompt:
            continue
        pairs = [
            (statistics.fmean(a for a, _ in runs), statistics.fmean(b for _, b in runs))
            for runs in by_prompt.values()
        ]
        diffs = [a - b for a, b in pairs]
        lo, hi = paired_t_interval(diffs)
        out[label] = {
            "mean": statistics.fmean(a for a, _ in pairs),
            "sps_mean": statistics.fmean(b for _, b in pairs),
            "difference": statistics.fmean(diffs),
            "lo": lo,
            "hi": hi,
            "n_prompts": len(pairs),
        }
    return out


def beam_draft(args: argparse.Namespace) -> dict[str, list[float]]:
    """Paired timing of one beam-sampled block per reorder mode, on each model of the pair."""
    import statistics
    import time

    from mtad.engine import WarpConfig
    from mtad.methods.beam import BeamSpec, beam_sample

    common.setup(args)
    bp = common.load_bench_pair(args, need_draft=True)
    prompts = common.load_prompts(args, bp.tokenizer)
    ids = torch.tensor(sum((p.ids for p in prompts), [])[: args.beam_draft])
    ids = torch.cat([ids] * (args.beam_draft // max(len(ids), 1) + 1))[: args.beam_draft]
    warp = WarpConfig(1.0, 10, 0.9)
    ratios: dict[str, list[float]] = {}
    seconds: dict[str, dict[str, list[float]]] = {}
    for runner in (bp.draft, bp.target):
        times: dict[str, list[float]] = {"copy": [], "inplace": []}
        for rep in range(args.repeats + 1):  # the first pair is a warm-up
            for reorder in ("copy", "inplace") if rep % 2 else ("inplace", "copy"):
                runner.reorder = reorder
                runner.reset()
                runner.feed(ids[:-1])  # the context, outside the clock
                gen = torch.Generator().manual_seed(rep)
                start = time.perf_counter()
                beam_sample(runner, ids, BeamSpec(4, 4, warp), gen)
                if rep:
                    times[reorder].append(time.perf_counter() - start)
        runner.reset()
        ratios[runner.role] = [c / i for c, i in zip(times["copy"], times["inplace"], strict=True)]
        seconds[runner.role] = times
    print(common.environment_line(args))
    print(f"pair: {bp.describe()}")
    print(f"beam draft B=4, gamma=4 after {len(ids)} context tokens, {args.repeats} paired repeats")
    rows = []
    for role, r in ratios.items():
        q = statistics.quantiles(r, n=4)
        rows.append(
            [
                role,
                f"{1e3 * statistics.median(seconds[role]['copy']):.1f}",
                f"{1e3 * statistics.median(seconds[role]['inplace']):.1f}",
                f"{statistics.median(r):.3f}",
                f"{q[0]:.3f} - {q[2]:.3f}",
            ]
        )
    common.print_table(
        "beam draft time, copy (before #18) vs inplace (after)",
        ["model", "copy ms", "inplace ms", "median copy/inplace", "quartiles"],
        rows,
    )
    return ratios


def main(argv: list[str] | None = None) -> dict[str, dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_common_args(ap)
    ap.add_argument(
        "--methods",
        default=DEFAULT_METHODS,
        help=f"comma-separated method names or 'all' (default {DEFAULT_METHODS})",
    )
    ap.add_argument("--greedy", action="store_true", help="temperature 0 for every method")
    ap.add_argument("--gamma", type=int, default=0, help="block depth of every gamma method")
    ap.add_argument(
        "--reorder",
        default="inplace",
        help="comma-separated cache reorder modes to compare: copy (before #18), inplace",
    )
    ap.add_argument(
        "--claim-ar",
        type=float,
        default=0.0,
        help="speed-up floor over AR to give a verdict on (e.g. 1.2; 0: none)",
    )
    ap.add_argument(
        "--claim-sps",
        type=float,
        default=0.0,
        help="speed-up floor over SpS to give a verdict on (e.g. 1.05; 0: none)",
    )
    ap.add_argument("--beam-draft", type=int, default=0, help="time only the beam draft")
    ap.add_argument("--repeats", type=int, default=20, help="paired repeats for --beam-draft")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    return beam_draft(args) if args.beam_draft else run(args)


if __name__ == "__main__":
    main()
