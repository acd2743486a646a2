"""How far MTAD's output is from MTJD's: total variation distance of the first ``gamma`` tokens.

The paper (Qin et al., ICLR 2025, arXiv 2407.09722) proves MTAD's output within a bounded
distance of exact MTJD. Here the distance is measured, on a tiny random pair whose vocabulary
is small enough to count every block (``--vocab 16``, ``--gamma 2``: 256 outcomes): from one
fixed prompt, ``--samples`` blocks come from MTJD (``mtjd``: the target's own beam sampling)
and as many from MTAD (``mtad``, the same beam procedure on the draft, then its joint test) per
``tau`` and draft, each block the first ``gamma`` tokens the engine's :class:`Decoder` generates
with a fixed seed (seeds never shared between samples, so the samples are independent).

    python -m bench.mtjd_distance                       # tau 0.1,0.5,0.9; 3000 blocks each
    python -m bench.mtjd_distance --taus 0.1,0.3,0.5,0.7,0.9 --samples 8000 --gamma 3

Three drafts: ``self`` (the target as its own draft: every joint ratio is 1, MTAD accepts the
whole beam-sampled block, which is MTJD's procedure, so the distance is 0: the control whose
band must contain 0; the bench also regenerates its first blocks with MTJD's own seeds, and
they are MTJD's blocks, token for token: TV exactly 0, whatever a band says), ``draft`` (the
tiny pair's draft, the target cut to its first layer) and ``perturbed`` (the target with noise
added to its output head: a deliberately wrong draft, the control that must come out clearly
above 0). A last row, ``ar``, is AR sampling's own distance to MTJD: where MTAD tends as it
rejects more (its next token is then the target's plain sample).

**The estimator** (:func:`witness_tv`). A plug-in TV between two empirical distributions over
many outcomes is biased upward: with equal distributions it is ``~sum_x sqrt(p_x / N)``, not 0
(~0.14 for 2000 blocks from a Dirichlet(0.3) law over 256 outcomes in the simulation of
``tests/test_bench_mtjd_distance.py``, which prints its figures). We use instead the variational
form ``TV(P, Q) = max_A P(A) - Q(A)`` with a held-out *witness set*: split each sample into
``folds`` parts; on all but one part estimate ``A = {x : P^(x) > Q^(x)}``, on the held-out part
estimate ``P(A) - Q(A)`` by two sample proportions, and average over the folds (cross-fitting).
For a set chosen without the held-out blocks, the held-out difference is unbiased for
``P(A) - Q(A) <= TV``: no upward bias, exactly unbiased (mean 0) when the laws are equal, and a
downward bias (``A`` misclassifies outcomes whose difference is within the noise) that shrinks
as ``--samples`` grows. The band is ``estimate +- z se`` with ``se`` the *mean* of the folds'
binomial standard errors, an upper bound on the standard error of the fold average whatever
the folds' correlation (Cauchy-Schwarz): ~97% coverage of 0 for a 95% band at equal laws in that
simulation (``sqrt(sum var) / folds``, which ignores the folds' positive correlation, gave
~87%). The band's lower end is a valid lower confidence bound on the TV itself (one-sided
97.5% for a 95% band, since ``TV >= P(A) - Q(A)``); its upper end bounds the witness value, not
the TV. The plug-in is printed beside it: in expectation the TV lies between the two. Each row's
band is 95% on its own: over the three ``self`` rows of the default run, one band missing 0
has a probability of roughly 1 - 0.97^3 ~ 9%. (Witness
sets as in the classifier two-sample tests of Lopez-Paz and Oquab, ICLR 2017.)
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist

import numpy as np
import torch

from mtad.engine import Decoder, ModelRunner
from mtad.engine.tiny import build_tiny_model
from mtad.methods import build_method

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / ".dev" / "mtjd_distance.png"  # .dev/ is git-ignored
PROMPT = [3, 1, 4, 1, 5]
DRAFTS = ("self", "draft", "perturbed")
SAME_SEED_CHECKS = 300  # self-draft blocks regenerated with MTJD's own seeds
PERTURB_SCALE = 1.5  # noise on the head, in units of the head weights' standard deviation


@dataclass(frozen=True)
class TVEstimate:
    """Witness-set TV estimate with its 95% band, and the plug-in TV (biased upward)."""

    estimate: float
    lo: float
    hi: float
    plug_in: float
    n_a: int
    n_b: int

    def contains_zero(self) -> bool:
        return self.lo <= 0.0 <= self.hi


@dataclass(frozen=True)
class Row:
    """One draft at one tau: the TV estimate and, for the ``self`` draft, how many of its blocks
    equal MTJD's under the same seed (``(equal, checked)``: the exact form of the control)."""

    tv: TVEstimate
    same_seed: tuple[int, int] | None = None


@dataclass(frozen=True)
class Report:
    """Every draft x tau row, and AR sampling's own distance to MTJD (where MTAD goes when it
    rejects everything: its next token is the target's plain sample)."""

    rows: dict[tuple[str, float], Row]
    ar: TVEstimate


def plug_in_tv(a: np.ndarray, b: np.ndarray, cells: int) -> float:
    """``0.5 * sum_x |P^(x) - Q^(x)|`` of two samples of outcome indices."""
    pa = np.bincount(a, minlength=cells) / a.size
    pb = np.bincount(b, minlength=cells) / b.size
    return 0.5 * float(np.abs(pa - pb).sum())


def witness_tv(
    a: np.ndarray, b: np.ndarray, cells: int, folds: int = 2, confidence: float = 0.95
) -> TVEstimate:
    """Cross-fitted witness-set estimate of ``TV(law(a), law(b))`` (see the module docstring).

    ``a``, ``b``: i.i.d. samples of outcome indices in ``[0, cells)``; fold ``k`` holds the
    blocks whose position is ``k`` modulo ``folds`` (the samples are i.i.d., so any fixed split
    is a random one)."""
    if folds < 2:
        raise ValueError(
            f"folds must be >= 2 (one part picks the set, another scores it), got {folds}"
        )
    if min(a.size, b.size) < 2 * folds:
        raise ValueError(f"need at least {2 * folds} blocks per sample for {folds} folds")
    fold_a, fold_b = np.arange(a.size) % folds, np.arange(b.size) % folds
    estimates, ses = [], []
    for k in range(folds):
        fit_a, fit_b = a[fold_a != k], b[fold_b != k]
        witness = np.bincount(fit_a, minlength=cells) / fit_a.size > (
            np.bincount(fit_b, minlength=cells) / fit_b.size
        )
        held_a, held_b = a[fold_a == k], b[fold_b == k]
        pa, pb = witness[held_a].mean(), witness[held_b].mean()
        estimates.append(pa - pb)
        ses.append(math.sqrt(pa * (1 - pa) / held_a.size + pb * (1 - pb) / held_b.size))
    est, se = float(np.mean(estimates)), float(np.mean(ses))
    half = z_value(confidence) * se
    return TVEstimate(est, est - half, est + half, plug_in_tv(a, b, cells), a.size, b.size)


def z_value(confidence: float) -> float:
    """Two-sided normal quantile of a ``confidence`` band."""
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def encode(tokens: list[int], vocab: int) -> int:
    """A block of tokens as one outcome index (base ``vocab``)."""
    index = 0
    for t in tokens:
        index = index * vocab + t
    return index


def sample_blocks(decoder: Decoder, gamma: int, vocab: int, seeds: range) -> np.ndarray:
    """Outcome indices of the first ``gamma`` tokens the decoder generates from
    :data:`PROMPT`, one block per seed."""
    out = np.empty(len(seeds), dtype=np.int64)
    with torch.no_grad():
        for i, seed in enumerate(seeds):
            tokens = decoder.generate(PROMPT, gamma, seed=seed).token_ids
            assert len(tokens) == gamma, tokens  # tiny vocabularies have no EOS
            out[i] = encode(tokens, vocab)
    return out


def build_models(family: str, vocab: int, seed: int) -> dict[str, torch.nn.Module]:
    """The target and the three drafts, built in code (:mod:`mtad.engine.tiny`)."""
    target = build_tiny_model(family, "target", vocab_size=vocab, seed=seed)
    perturbed = build_tiny_model(family, "target", vocab_size=vocab, seed=seed)
    with torch.no_grad():
        head = perturbed.get_output_embeddings().weight
        gen = torch.Generator().manual_seed(seed + 1)
        head.add_(torch.randn(head.shape, generator=gen) * head.std() * PERTURB_SCALE)
    return {
        "target": target,
        "self": target,
        "draft": build_tiny_model(family, "draft", vocab_size=vocab, seed=seed),
        "perturbed": perturbed,
    }


def run(args: argparse.Namespace) -> Report:
    """Sample every block, print the table, draw the figure."""
    torch.set_num_threads(args.threads)
    report = measure(args, parse_taus(args.taus), parse_drafts(args.drafts))
    print_report(report, args)
    figure(report, Path(args.out), args)
    print(f"figure: {args.out}")
    return report


def parse_taus(spec: str) -> list[float]:
    return [float(t) for t in spec.split(",") if t.strip()]


def parse_drafts(spec: str) -> list[str]:
    """``--drafts``: a comma-separated subset of :data:`DRAFTS`."""
    drafts = [d.strip() for d in spec.split(",") if d.strip()]
    unknown = sorted(set(drafts) - set(DRAFTS))
    if unknown:
        raise SystemExit(f"--drafts: unknown {unknown}; choose from {list(DRAFTS)}")
    return drafts


def measure(args: argparse.Namespace, taus: list[float], drafts: list[str]) -> Report:
    """MTJD's reference blocks, then each draft x tau's MTAD blocks and AR's, every sample on
    its own range of seeds; the ``self`` draft's first blocks again on MTJD's seeds."""
    models = build_models(args.family, args.vocab, args.seed)
    beams = {"gamma": args.gamma, "beam_width": args.beam_width}
    target = ModelRunner(models["target"], "target")
    cells = args.vocab**args.gamma
    n = args.samples

    def seeds(block: int) -> range:  # disjoint seed ranges: independent samples
        return range(args.seed + block * n, args.seed + (block + 1) * n)

    reference = sample_blocks(
        Decoder(build_method("mtjd", **beams), target), args.gamma, args.vocab, seeds(0)
    )
    results: dict[tuple[str, float], Row] = {}
    for j, (name, tau) in enumerate((d, t) for d in drafts for t in taus):
        decoder = Decoder(
            build_method("mtad", tau=tau, **beams), target, ModelRunner(models[name], "draft")
        )
        blocks = sample_blocks(decoder, args.gamma, args.vocab, seeds(j + 1))
        tv = witness_tv(blocks, reference, cells, args.folds, args.confidence)
        same = None
        if name == "self":  # MTAD's draft then runs MTJD's procedure on the same stream
            m = min(n, SAME_SEED_CHECKS)
            again = sample_blocks(decoder, args.gamma, args.vocab, seeds(0)[:m])
            same = (int((again == reference[:m]).sum()), m)
        results[name, tau] = Row(tv, same)
        if args.verbose:
            print(f"[bench] {name} tau {tau} done", file=sys.stderr)
    ar_blocks = sample_blocks(
        Decoder(build_method("ar"), target), args.gamma, args.vocab, seeds(len(results) + 1)
    )
    return Report(results, witness_tv(ar_blocks, reference, cells, args.folds, args.confidence))


def print_report(report: Report, args: argparse.Namespace) -> None:
    """The setting, then one line per draft x tau and AR's: the witness TV, its band, the
    plug-in and, for the ``self`` draft, how many blocks equal MTJD's under the same seed."""
    warp = build_method("mtjd", gamma=args.gamma, beam_width=args.beam_width).params.warp
    print(
        f"tiny {args.family} pair, vocabulary {args.vocab}, gamma {args.gamma} "
        f"({args.vocab**args.gamma} outcomes), B={args.beam_width}, T={warp.temperature:g} / "
        f"top-k {warp.top_k} / top-p {warp.top_p:g}, prompt {PROMPT}"
    )
    print(
        f"{args.samples} blocks per sample (seeds {args.seed}..), MTJD reference: the target's "
        f"beam sampling; witness-set TV, {args.folds} folds, {100 * args.confidence:g}% band"
    )
    band = f"{100 * args.confidence:g}% band"
    header = (
        f"{'draft':<10} {'tau':>5}  {'TV (witness)':>12}  {band:>17}  {'plug-in':>8}  "
        "same seed = MTJD"
    )
    print(header)
    print("-" * len(header))
    for (name, tau), row in report.rows.items():
        same = f"{row.same_seed[0]}/{row.same_seed[1]}" if row.same_seed else "-"
        print(tv_line(name, f"{tau:>5.2f}", row.tv, same))
    print(tv_line("ar", f"{'-':>5}", report.ar, "-"))


def tv_line(name: str, tau: str, r: TVEstimate, same: str) -> str:
    return (
        f"{name:<10} {tau}  {r.estimate:>12.4f}  [{r.lo:>+7.4f}, {r.hi:>+7.4f}]"
        f"  {r.plug_in:>8.4f}  {same:>16}"
    )


def figure(report: Report, path: Path, args: argparse.Namespace) -> None:
    """TV estimate and band against tau, one line per draft, the plug-in as open markers; AR's
    distance as a dashed line with its band shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = {k: row.tv for k, row in report.rows.items()}
    fig, ax = plt.subplots(figsize=(6, 4))
    names = list(dict.fromkeys(name for name, _ in results))
    for i, name in enumerate(names):
        rows = [(tau, r) for (d, tau), r in results.items() if d == name]
        taus = np.array([t for t, _ in rows]) + (i - 1) * 0.008  # side by side
        est = np.array([r.estimate for _, r in rows])
        err = np.array([[r.estimate - r.lo for _, r in rows], [r.hi - r.estimate for _, r in rows]])
        line = ax.errorbar(taus, est, yerr=err, marker="o", capsize=3, label=f"{name} (witness)")
        ax.plot(
            taus,
            [r.plug_in for _, r in rows],
            "o",
            mfc="none",
            color=line[0].get_color(),
            label=f"{name} (plug-in, biased up)",
        )
    ax.axhline(report.ar.estimate, color="black", ls="--", lw=0.8, label="AR sampling (witness)")
    ax.axhspan(report.ar.lo, report.ar.hi, color="black", alpha=0.08)
    ax.axhline(0.0, color="grey", lw=0.8)
    ax.set_xlabel("tau")
    ax.set_ylabel(f"TV(MTAD, MTJD), first {args.gamma} tokens")
    ax.set_title(
        f"MTAD vs MTJD, tiny pair (V={args.vocab}, {args.samples} blocks, "
        f"{100 * args.confidence:g}% band)"
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> Report:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--taus", default="0.1,0.5,0.9", help="comma-separated MTAD tau values")
    ap.add_argument("--drafts", default=",".join(DRAFTS), help=f"subset of {','.join(DRAFTS)}")
    ap.add_argument("--samples", type=int, default=3000, help="blocks per sample")
    ap.add_argument("--vocab", type=int, default=16, help="tiny vocabulary size (16-32)")
    ap.add_argument("--gamma", type=int, default=2, help="block length (2-3)")
    ap.add_argument("--beam-width", type=int, default=4)
    ap.add_argument("--folds", type=int, default=2, help="cross-fitting folds of the estimator")
    ap.add_argument("--confidence", type=float, default=0.95, help="band's confidence level")
    ap.add_argument("--family", default="llama", choices=["llama", "opt"])
    ap.add_argument("--seed", type=int, default=0, help="model seed and first sampling seed")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(DEFAULT_OUT), help="figure path (PNG)")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    if args.vocab**args.gamma > 1_000_000:
        raise SystemExit("--vocab ** --gamma outcomes must stay countable (<= 1e6)")
    return run(args)


if __name__ == "__main__":
    main()
