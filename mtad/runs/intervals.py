"""Confidence intervals for the cross-run comparisons, and the verdict a claim gets from one.

**The method.** A comparison (speed-up, PPL change, ...) of a run with its baseline is a
statistic of both runs' per-prompt values: each run's metric is ``g(sum(num) / sum(den))``
over its prompts (ms/token: wall time over new tokens; PPL: ``exp(-mean log-prob)``; score: the
mean per-prompt score), the comparison is ``baseline / run`` (a factor) or ``run / baseline - 1``
(a change), taken per seed (each seed's run against that seed's baseline) and averaged over
seeds (:func:`seed_mean`), which is the figure the tables show.

**Ratios live on the log scale.** A factor is averaged over seeds, and gets its interval, on the
log scale, then back (``exp``): its estimate is the geometric mean of the per-seed factors, and
a bound is never <= 0 (a Student-t interval on a ratio's own scale can give ``1.38x [-0.03x,
2.79x]`` from three seeds). A factor and its inverse then get mirrored figures (``1/x`` of each),
which an arithmetic mean of ratios does not give (Fleming and Wallace 1986, "How not to lie with
statistics: the correct way to summarize benchmark results", CACM 29(3)). A change
(``run / baseline - 1``, bounded below by -100%) stays on its own scale: its mean is the mean
relative change the claims quote.

The 95% interval is a **paired bootstrap over prompts, stratified by seed**: a resample draws
prompts with replacement and uses the same draw for the run and the baseline (paired: the same
prompts under both methods) and in every seed (each seed stays a stratum of its own, and a
prompt's outcomes under all seeds travel together, so that a prompt that is hard under every
seed counts as one prompt, not as several independent ones). The interval is the bias-corrected
and accelerated (BCa) one of ``scipy.stats.bootstrap`` (Efron 1987, "Better bootstrap
confidence intervals", JASA 82; the percentile interval where BCa is degenerate), with a fixed
RNG seed, so a re-render gives the same interval.

Figures measured per run only (energy: codecarbon measures a whole run) get a Student-t
interval over the per-seed comparisons instead (:func:`seed_interval`; a factor's over the logs of
its per-seed values, then back).

A claim's verdict (:func:`verdict`): ``holds`` when the interval lies entirely on the claimed
side of "no change", ``does not hold`` when it lies entirely on the other side, ``unresolved``
otherwise (it contains no change, or there is no interval).
"""

from __future__ import annotations

import hashlib
import math
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

import numpy as np

# scipy.stats is imported where an interval is computed: every run imports this module (its
# summary line), most never compute an interval (the lent GPU machine's image has scipy, so
# scripts/gpu_bundle.sh carries none)

CONFIDENCE = 0.95
N_RESAMPLES = 9999
RNG_SEED = 0
# Below this many prompts a bootstrap interval is not worth its name (a resample of 2 prompts
# has 3 distinct values): no interval, so no claim is decided on it.
MIN_PROMPTS = 5

HOLDS = "holds"
DOES_NOT_HOLD = "does not hold"
UNRESOLVED = "unresolved"
VERDICTS: tuple[str, ...] = (HOLDS, DOES_NOT_HOLD, UNRESOLVED)

BOOTSTRAP_METHOD = (
    f"{100 * CONFIDENCE:.0f}% paired bootstrap over prompts, stratified by seed "
    f"(scipy.stats.bootstrap BCa, {N_RESAMPLES} resamples, RNG seed {RNG_SEED})"
)
SEED_METHOD = f"{100 * CONFIDENCE:.0f}% Student-t over seeds (a ratio's on its log scale)"

# factor: ``baseline / run``, a ratio (averaged and given its interval on the log scale);
# change: ``run / baseline - 1`` (on its own scale)
Kind = Literal["factor", "change"]
Direction = Literal["above", "below"]


@dataclass(frozen=True)
class Interval:
    """A comparison's estimate (``mean``: the mean over seeds of the per-seed figure), its
    interval ``[lo, hi]`` (NaN where there is none), and what it rests on."""

    mean: float
    lo: float
    hi: float
    n_prompts: int
    n_seeds: int
    method: str

    @property
    def has_interval(self) -> bool:
        return math.isfinite(self.lo) and math.isfinite(self.hi)


@dataclass(frozen=True)
class PairedValues:
    """Per-prompt values of a run and of its baseline, one row per seed and one column per
    prompt (the same prompt in the same column of all four arrays). A run's metric over its
    prompts is ``transform(sum(num) / sum(den))``; NaN cells (a prompt without a log-prob) are
    left out of both sums."""

    run_num: np.ndarray
    run_den: np.ndarray
    base_num: np.ndarray
    base_den: np.ndarray

    def __post_init__(self) -> None:
        shapes = {a.shape for a in (self.run_num, self.run_den, self.base_num, self.base_den)}
        if len(shapes) != 1 or len(next(iter(shapes))) != 2:
            raise ValueError(
                f"paired values: four arrays of one (seeds, prompts) shape, not {shapes}"
            )

    @property
    def n_seeds(self) -> int:
        return int(self.run_num.shape[0])

    @property
    def n_prompts(self) -> int:
        return int(self.run_num.shape[1])


def _metric(num: np.ndarray, den: np.ndarray, transform: Callable[[np.ndarray], np.ndarray]):
    """``transform(sum(num) / sum(den))`` along the last axis, NaN cells left out."""
    ok = np.isfinite(num) & np.isfinite(den)
    total_num = np.where(ok, num, 0.0).sum(axis=-1)
    total_den = np.where(ok, den, 0.0).sum(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return transform(total_num / total_den)


def _compare(run: np.ndarray, base: np.ndarray, kind: Kind) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        if kind == "factor":
            return np.where(run != 0, base / run, np.nan)
        return np.where(base != 0, run / base - 1.0, np.nan)


def identity(x: np.ndarray) -> np.ndarray:
    return x


def _seed_average(per_seed: np.ndarray, kind: Kind) -> np.ndarray:
    """The mean over the last axis (seeds) on the comparison's scale (module docstring): a
    factor's geometric mean (NaN where a factor is <= 0: no ratio of two positive figures)."""
    if kind == "factor":
        with np.errstate(divide="ignore", invalid="ignore"):
            logs = np.where(per_seed > 0, np.log(np.where(per_seed > 0, per_seed, 1.0)), np.nan)
        return np.exp(logs.mean(axis=-1))
    return per_seed.mean(axis=-1)


def seed_mean(per_seed: Iterable[float], kind: Kind) -> float:
    """The mean over seeds of per-seed comparisons, non-finite values left out: a factor's on
    the log scale (the geometric mean), a change's on its own; NaN without a value."""
    xs = np.asarray([x for x in map(float, per_seed) if math.isfinite(x)], dtype=float)
    return float(_seed_average(xs, kind)) if xs.size else math.nan


def perplexity(mean_logprob: np.ndarray) -> np.ndarray:
    """``exp(-mean log-prob)``: the authors' perplexity (mtad.tasks.quality)."""
    return np.exp(-mean_logprob)


# Intervals already computed in this process, by their inputs: a render asks for the same
# comparison from several tables (the main table, the claims, the frontier): ~40% of the
# reference's bootstraps were repeats. An interval is a pure function of its inputs (the RNG
# seed is one of them) and immutable, so a repeat is served the first one.
_MEMO_SIZE = 1024
_memo: dict[tuple[object, ...], Interval] = {}


def _fingerprint(arrays: Iterable[np.ndarray]) -> str:
    digest = hashlib.sha1(usedforsecurity=False)
    for a in arrays:
        a = np.ascontiguousarray(a)
        digest.update(f"{a.dtype.str}{a.shape}".encode())
        digest.update(a.tobytes())
    return digest.hexdigest()


def _memoized(key: tuple[object, ...], compute: Callable[[], Interval]) -> Interval:
    if key not in _memo:
        if len(_memo) >= _MEMO_SIZE:
            _memo.pop(next(iter(_memo)))
        _memo[key] = compute()
    return _memo[key]


def paired_bootstrap(
    values: PairedValues,
    kind: Kind,
    transform: Callable[[np.ndarray], np.ndarray] = identity,
    *,
    n_resamples: int = N_RESAMPLES,
    seed: int = RNG_SEED,
) -> Interval:
    """The comparison of :class:`PairedValues` with its bootstrap interval (module docstring).

    The estimate is the mean over seeds of the per-seed comparison (:func:`seed_mean`: a
    factor's geometric mean); with fewer than
    :data:`MIN_PROMPTS` prompts, or a comparison undefined for some resample (a zero
    baseline), the interval is NaN.
    """
    arrays = (values.run_num, values.run_den, values.base_num, values.base_den)
    key = ("paired", _fingerprint(arrays), kind, transform, n_resamples, seed)
    return _memoized(key, lambda: _paired_bootstrap(values, kind, transform, n_resamples, seed))


def _paired_bootstrap(
    values: PairedValues,
    kind: Kind,
    transform: Callable[[np.ndarray], np.ndarray],
    n_resamples: int,
    seed: int,
) -> Interval:
    seeds, prompts = values.n_seeds, values.n_prompts
    arrays = (values.run_num, values.run_den, values.base_num, values.base_den)

    def statistic(*samples: np.ndarray, axis: int = -1) -> np.ndarray:
        # samples: 4 x seeds arrays of (..., prompts), the same prompt draw in each
        per = [np.stack(samples[i * seeds : (i + 1) * seeds], axis=-2) for i in range(4)]
        run = _metric(per[0], per[1], transform)
        base = _metric(per[2], per[3], transform)
        return _seed_average(_compare(run, base, kind), kind)

    mean = float(statistic(*(row for a in arrays for row in a)))
    nan = Interval(mean, math.nan, math.nan, prompts, seeds, BOOTSTRAP_METHOD)
    if prompts < MIN_PROMPTS or seeds < 1 or not math.isfinite(mean):
        return nan

    samples = [row for a in arrays for row in a]
    lo, hi, result = bootstrap_interval(samples, statistic, n_resamples, seed)
    if not np.all(np.isfinite(result.bootstrap_distribution)):
        return nan  # some resample has no comparison (a zero baseline): no honest interval
    return Interval(mean, lo, hi, prompts, seeds, BOOTSTRAP_METHOD)


def mean_bootstrap(
    values: np.ndarray, *, n_resamples: int = N_RESAMPLES, seed: int = RNG_SEED
) -> Interval:
    """A run's own per-prompt mean (a downstream score: the share of prompts passed), averaged
    over seeds, with the same bootstrap over prompts stratified by seed as the comparisons
    (``values``: one row per seed, one column per prompt; NaN cells left out)."""
    key = ("mean", _fingerprint([np.asarray(values)]), n_resamples, seed)
    return _memoized(key, lambda: _mean_bootstrap(np.asarray(values), n_resamples, seed))


def _mean_bootstrap(values: np.ndarray, n_resamples: int, seed: int) -> Interval:
    seeds, prompts = values.shape

    def statistic(*rows: np.ndarray, axis: int = -1) -> np.ndarray:
        stacked = np.stack(rows, axis=-2)
        ok = np.isfinite(stacked)
        with np.errstate(divide="ignore", invalid="ignore"):
            per_seed = np.where(ok, stacked, 0.0).sum(axis=-1) / ok.sum(axis=-1)
        return per_seed.mean(axis=-1)

    mean = float(statistic(*values))
    if prompts < MIN_PROMPTS or seeds < 1 or not math.isfinite(mean):
        return Interval(mean, math.nan, math.nan, prompts, seeds, BOOTSTRAP_METHOD)

    lo, hi, _ = bootstrap_interval(list(values), statistic, n_resamples, seed)
    return Interval(mean, lo, hi, prompts, seeds, BOOTSTRAP_METHOD)


def bootstrap_interval(
    samples: list,
    statistic,
    n_resamples: int,
    seed: int,
    confidence: float = CONFIDENCE,
    methods: tuple[str, ...] = ("BCa", "percentile"),
):
    """scipy's paired, vectorised bootstrap of ``statistic`` over ``samples``: the first of
    ``methods`` whose bounds are finite (BCa, or the percentile interval where a degenerate
    resample leaves BCa's bounds infinite or NaN); ``(lo, hi, result)``."""
    from scipy import stats

    lo = hi = math.nan
    for method in methods:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # DegenerateDataWarning: handled by the fallback
            result = stats.bootstrap(
                samples,
                statistic,
                n_resamples=n_resamples,
                paired=True,
                vectorized=True,
                confidence_level=confidence,
                method=method,
                rng=np.random.default_rng(seed),
            )
        lo, hi = float(result.confidence_interval.low), float(result.confidence_interval.high)
        if math.isfinite(lo) and math.isfinite(hi):
            break
    return lo, hi, result


def seed_interval(per_seed: list[float], n_prompts: int = 0, kind: Kind = "change") -> Interval:
    """Mean of per-seed figures (:func:`seed_mean`) with a Student-t interval (NaN below two
    seeds). A factor's interval is the t-interval of the logs of its per-seed values, then
    ``exp``: its bounds are positive, around the geometric mean (module docstring); a factor
    <= 0 is no ratio of two positive figures, and gives no estimate."""
    xs = np.asarray([x for x in per_seed if math.isfinite(x)], dtype=float)
    if kind == "factor" and np.any(xs <= 0):
        return Interval(math.nan, math.nan, math.nan, n_prompts, int(xs.size), SEED_METHOD)
    if xs.size == 0:
        return Interval(math.nan, math.nan, math.nan, n_prompts, 0, SEED_METHOD)
    mean = seed_mean(xs, kind)
    if xs.size < 2:
        return Interval(mean, math.nan, math.nan, n_prompts, 1, SEED_METHOD)
    from scipy import stats

    scaled = np.log(xs) if kind == "factor" else xs
    center = float(scaled.mean())
    sem = float(scaled.std(ddof=1)) / math.sqrt(xs.size)
    half = float(stats.t.ppf(0.5 + CONFIDENCE / 2, df=xs.size - 1)) * sem
    lo, hi = center - half, center + half
    if kind == "factor":
        lo, hi = math.exp(lo), math.exp(hi)
    return Interval(mean, lo, hi, n_prompts, int(xs.size), SEED_METHOD)


def verdict(lo: float, hi: float, direction: Direction, threshold: float) -> str:
    """``holds`` when ``[lo, hi]`` lies entirely on the claimed side of ``threshold`` (above or
    below it), ``does not hold`` when entirely on the other side, else ``unresolved``."""
    if direction not in ("above", "below"):
        raise ValueError(f"claim direction must be 'above' or 'below', not {direction!r}")
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return UNRESOLVED
    above, below = lo > threshold, hi < threshold
    if above:
        return HOLDS if direction == "above" else DOES_NOT_HOLD
    if below:
        return HOLDS if direction == "below" else DOES_NOT_HOLD
    return UNRESOLVED


__all__ = [
    "BOOTSTRAP_METHOD",
    "CONFIDENCE",
    "DOES_NOT_HOLD",
    "HOLDS",
    "MIN_PROMPTS",
    "SEED_METHOD",
    "UNRESOLVED",
    "VERDICTS",
    "Interval",
    "PairedValues",
    "bootstrap_interval",
    "mean_bootstrap",
    "paired_bootstrap",
    "perplexity",
    "seed_interval",
    "seed_mean",
    "verdict",
]
