"""The comparison intervals (mtad.runs.intervals) on data with a known answer, and the claims'
verdicts as the renderer writes them (mtad.paper.render.claims_table) counted for W&B."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from mtad.paper.recipes import load_recipe
from mtad.paper.render import claims_table
from mtad.paper.wandb_run import claims_summary
from mtad.runs import intervals
from mtad.runs.comparison import (
    COMPARISONS,
    add_comparisons,
    comparison_interval,
    paired_runs,
)
from mtad.runs.frame import load_runs
from mtad.runs.intervals import (
    DOES_NOT_HOLD,
    HOLDS,
    MIN_PROMPTS,
    SEED_METHOD,
    UNRESOLVED,
    PairedValues,
    paired_bootstrap,
    perplexity,
    seed_interval,
    seed_mean,
    verdict,
)

SEEDS, PROMPTS = 3, 24
BY_COLUMN = {c.column: c for c in COMPARISONS}


def _times(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-prompt tokens, seconds per token of each prompt (prompts differ ten-fold, the same
    under every seed and method) and a baseline's seconds (10% noise per run)."""
    tokens = rng.integers(20, 60, (SEEDS, PROMPTS)).astype(float)
    prompt_speed = rng.lognormal(np.log(0.05), 1.0, PROMPTS)
    return tokens, prompt_speed, tokens * prompt_speed * rng.lognormal(0.0, 0.1, (SEEDS, PROMPTS))


def test_a_fixed_speed_ratio_is_inside_a_narrow_interval() -> None:
    rng = np.random.default_rng(0)
    tokens, _, base = _times(rng)
    run = base / 1.5 * rng.lognormal(0.0, 0.05, (SEEDS, PROMPTS))  # 1.5x faster, 5% noise
    iv = paired_bootstrap(PairedValues(run, tokens, base, tokens), "factor")
    assert iv.lo < 1.5 < iv.hi
    assert iv.hi - iv.lo < 0.05 * 1.5, iv  # pairing removes the ten-fold prompt spread
    assert (iv.n_prompts, iv.n_seeds) == (PROMPTS, SEEDS)
    assert verdict(iv.lo, iv.hi, "above", 1.0) == HOLDS
    assert verdict(iv.lo, iv.hi, "below", 1.0) == DOES_NOT_HOLD


def test_a_repeated_interval_is_served_and_any_other_input_is_computed() -> None:
    """A render asks for one comparison from several tables: the same inputs give the first
    interval back; another value, kind, transform or resample count is computed anew (and
    equals what a fresh computation gives)."""
    rng = np.random.default_rng(5)
    tokens, _, base = _times(rng)
    run = base / 1.2 * rng.lognormal(0.0, 0.05, (SEEDS, PROMPTS))
    values = PairedValues(run, tokens, base, tokens)
    first = paired_bootstrap(values, "factor", n_resamples=999)
    again = paired_bootstrap(
        PairedValues(*(a.copy() for a in (run, tokens, base, tokens))), "factor", n_resamples=999
    )
    assert again is first
    changed = run.copy()
    changed[0, 0] *= 1.5
    other = paired_bootstrap(PairedValues(changed, tokens, base, tokens), "factor", n_resamples=999)
    assert other is not first and other.mean != first.mean
    assert paired_bootstrap(values, "change", n_resamples=999).mean == pytest.approx(
        first.mean**-1 - 1.0, rel=0.05
    )
    assert paired_bootstrap(values, "factor", perplexity, n_resamples=999) is not first
    assert paired_bootstrap(values, "factor", n_resamples=499) is not first
    fresh = intervals._paired_bootstrap(
        values, "factor", intervals.identity, 999, intervals.RNG_SEED
    )
    assert fresh == first


def test_a_fixed_logprob_shift_gives_the_known_ppl_change() -> None:
    rng = np.random.default_rng(1)
    ones = np.ones((SEEDS, PROMPTS))
    base = rng.normal(-2.0, 0.5, (SEEDS, PROMPTS))
    run = base + 0.1 + rng.normal(0.0, 0.01, (SEEDS, PROMPTS))
    iv = paired_bootstrap(PairedValues(run, ones, base, ones), "change", perplexity)
    expected = math.exp(-0.1) - 1.0  # -9.5%
    assert iv.lo < expected < iv.hi and iv.hi - iv.lo < 0.01, iv
    assert verdict(iv.lo, iv.hi, "below", 0.0) == HOLDS


def test_two_draws_of_one_distribution_are_unresolved() -> None:
    """Coverage, not one lucky draw: over 40 data sets of two methods with the same speed, the
    interval contains 1 (the verdict is unresolved) in about 95% of them."""
    unresolved = 0
    for replicate in range(40):
        rng = np.random.default_rng(100 + replicate)
        tokens, prompt_speed, base = _times(rng)
        run = tokens * prompt_speed * rng.lognormal(0.0, 0.1, (SEEDS, PROMPTS))  # as base
        iv = paired_bootstrap(PairedValues(run, tokens, base, tokens), "factor", n_resamples=999)
        unresolved += verdict(iv.lo, iv.hi, "above", 1.0) == UNRESOLVED
    assert unresolved >= 34, unresolved  # P(<= 33 of 40 | p = 0.95) < 0.01


def test_too_few_prompts_or_seeds_give_no_interval() -> None:
    few = np.ones((2, MIN_PROMPTS - 1))
    iv = paired_bootstrap(PairedValues(few, few, 2 * few, few), "factor")
    assert iv.mean == pytest.approx(2.0) and not iv.has_interval
    assert verdict(iv.lo, iv.hi, "above", 1.0) == UNRESOLVED
    assert not seed_interval([1.2]).has_interval
    two = seed_interval([1.0, 3.0])
    assert two.mean == 2.0 and two.lo < 1.0 and two.hi > 3.0  # t(1 df): wide
    two = seed_interval([1.0, 4.0], kind="factor")
    assert two.mean == pytest.approx(2.0) and 0 < two.lo < 1.0 and two.hi > 4.0
    assert not seed_interval([1.2, -0.5], kind="factor").has_interval  # no ratio of positives
    with pytest.raises(ValueError, match="direction"):
        verdict(0.0, 1.0, "sideways", 0.0)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# ratios on the log scale


def test_a_ratio_interval_is_the_t_interval_of_the_logs_and_stays_positive() -> None:
    """Three per-seed energy ratios shaped like the CPU reference's (mean 1.38x): on the
    ratio's own scale the Student-t interval is ``[-0.10x, 2.87x]``; on the log scale it is
    ``exp`` of the t-interval of the logs, around the geometric mean, and positive."""
    ratios = [0.55, 1.1, 2.5]
    change = seed_interval(ratios)  # the same numbers as a change: its own scale
    assert change.lo < 0, change  # what a ratio's interval must never show
    iv = seed_interval(ratios, kind="factor")
    logs = np.log(ratios)
    lo, hi = stats.t.interval(0.95, len(ratios) - 1, loc=logs.mean(), scale=stats.sem(logs))
    assert (iv.lo, iv.hi) == pytest.approx((math.exp(lo), math.exp(hi)), rel=1e-12)
    assert iv.mean == pytest.approx(math.exp(logs.mean()), rel=1e-12) == seed_mean(ratios, "factor")
    assert 0 < iv.lo < iv.mean < iv.hi
    # a factor and its inverse get mirrored intervals: 1/x of each
    inverse = seed_interval([1 / r for r in ratios], kind="factor")
    assert (inverse.lo, inverse.mean, inverse.hi) == pytest.approx(
        (1 / iv.hi, 1 / iv.mean, 1 / iv.lo), rel=1e-9
    )


def test_log_normal_ratios_cover_their_geometric_mean_95_percent_of_the_time() -> None:
    """Per-seed ratios drawn log-normal (geometric mean 1.3, log-sd 0.6, 3 seeds: wide, as a
    few energy runs are): over 2000 fixed-seed repetitions the log-scale interval contains the
    true geometric mean 95% of the time (tolerance 0.015: three binomial standard deviations,
    sqrt(0.95 * 0.05 / 2000) = 0.0049), and no bound is <= 0."""
    rng = np.random.default_rng(2024)
    truth, repetitions = 1.3, 2000
    draws = rng.lognormal(math.log(truth), 0.6, (repetitions, 3))
    intervals = [seed_interval(list(row), kind="factor") for row in draws]
    covered = np.mean([iv.lo < truth < iv.hi for iv in intervals])
    assert abs(covered - 0.95) < 0.015, covered
    assert min(iv.lo for iv in intervals) > 0
    # the ratio's own scale on the same draws: negative bounds (the bug this rule removes)
    assert min(seed_interval(list(row)).lo for row in draws) < 0


def test_the_bootstrap_averages_ratios_over_seeds_on_the_log_scale() -> None:
    """Two seeds, each a constant ratio over its prompts (2x and 8x): the estimate is their
    geometric mean (4x), not the arithmetic one (5x), and its interval lies in [2x, 8x]."""
    ones = np.ones((2, PROMPTS))
    base = np.vstack([np.full(PROMPTS, 2.0), np.full(PROMPTS, 8.0)])
    rng = np.random.default_rng(3)
    tokens = rng.integers(20, 60, (2, PROMPTS)).astype(float)
    iv = paired_bootstrap(PairedValues(tokens * ones, tokens, tokens * base, tokens), "factor")
    assert iv.mean == pytest.approx(4.0, rel=1e-12)
    assert 2.0 <= iv.lo <= 4.0 <= iv.hi <= 8.0 + 1e-9, iv


# --------------------------------------------------------------------------------------------
# result folders with a known answer, through the comparison module and the renderer


def _write_run(
    root: Path,
    method: str,
    seed: int,
    lp: np.ndarray,
    tok: np.ndarray,
    sec: np.ndarray,
    j_per_token: float,
) -> None:
    folder = root / f"{method}-fake-prompts-{seed}"
    folder.mkdir(parents=True)
    ids = [f"p{i}" for i in range(len(lp))]
    samples = [
        {"id": i, "mean_logprob": float(x), "new_tokens": int(n)}
        for i, x, n in zip(ids, lp, tok, strict=True)
    ]
    timings = [{"id": i, "wall_time": float(s)} for i, s in zip(ids, sec, strict=True)]
    (folder / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in samples))
    (folder / "timings.jsonl").write_text("".join(json.dumps(r) + "\n" for r in timings))
    metrics = {
        "study": "fake",
        "pair": "fake",
        "task": "prompts",
        "method": method,
        "seed": seed,
        "params": {},
        "device": "cpu",
        "cpu_model": "test CPU",
        "n_samples": len(lp),
        "new_tokens": int(tok.sum()),
        "ms_per_token": 1000.0 * float(sec.sum()) / float(tok.sum()),
        "ppl": float(np.exp(-lp.mean())),
        "energy": {"tracker": "test", "j_per_token": j_per_token},
    }
    (folder / "metrics.json").write_text(json.dumps(metrics))


@pytest.fixture(scope="module")
def fake_study(tmp_path_factory: pytest.TempPathFactory) -> pd.DataFrame:
    """ar, sps, mtad at 3 seeds x 24 prompts. mtad: log-probs +0.1 over ar (PPL -9.5%), 1.3x
    slower than sps; energy per run: sps x (0.9, 1.1, 1.0) (no clear difference)."""
    root = tmp_path_factory.mktemp("fake")
    rng = np.random.default_rng(7)
    tokens, _, sps_time = _times(rng)
    for seed in range(SEEDS):
        lp = rng.normal(-2.0, 0.5, PROMPTS)
        tok, sec = tokens[seed], sps_time[seed]
        noise = rng.lognormal(0.0, 0.03, PROMPTS)
        _write_run(root, "ar", seed, lp, tok, 2.0 * sec, 2.0)
        _write_run(root, "sps", seed, lp + rng.normal(0, 0.05, PROMPTS), tok, sec, 1.0)
        _write_run(root, "mtad", seed, lp + 0.1, tok, 1.3 * sec * noise, (0.9, 1.1, 1.0)[seed])
    runs = load_runs(root.glob("*/metrics.json"))
    runs["state"] = "done"
    return add_comparisons(runs)


def test_result_folders_pair_by_prompt_and_seed(fake_study: pd.DataFrame) -> None:
    mtad = fake_study[fake_study["method"] == "mtad"]
    speed = comparison_interval(paired_runs(mtad, BY_COLUMN["speedup_vs_sps"], fake_study))
    assert speed.lo < 1 / 1.3 < speed.hi and speed.hi - speed.lo < 0.03, speed
    assert (speed.n_prompts, speed.n_seeds) == (PROMPTS, SEEDS)
    # the estimate is the tables' figure: the per-seed ratio of the runs' ms/token, averaged
    # over seeds on the log scale (the geometric mean)
    geometric = math.exp(np.log(mtad["speedup_vs_sps"]).mean())
    assert speed.mean == pytest.approx(geometric, rel=1e-9)
    energy = comparison_interval(paired_runs(mtad, BY_COLUMN["energy_ratio_vs_sps"], fake_study))
    assert energy.method == SEED_METHOD and energy.lo < 1.0 < energy.hi
    # energy per seed (0.9, 1.1, 1.0): the t-interval of the logs, then back
    logs = np.log([1 / 0.9, 1 / 1.1, 1 / 1.0])
    lo, hi = stats.t.interval(0.95, 2, loc=logs.mean(), scale=stats.sem(logs))
    assert (energy.lo, energy.hi) == pytest.approx((math.exp(lo), math.exp(hi)), rel=1e-9)


def test_claims_verdicts_from_the_renderer_are_counted(fake_study: pd.DataFrame) -> None:
    claims = claims_table(load_recipe("claims"), fake_study)
    by_metric = {c["metric"]: c["claim"] for c in load_recipe("claims").claims}
    verdicts = dict(zip(claims["claim"], claims["verdict"], strict=True))
    assert verdicts[by_metric["ppl_change_vs_ar"]] == HOLDS  # -9.5%, claimed below 0
    assert verdicts[by_metric["speedup_vs_sps"]] == DOES_NOT_HOLD  # 0.77x, claimed above 1
    assert verdicts[by_metric["energy_ratio_vs_sps"]] == UNRESOLVED  # 0.9-1.1: spans 1
    ppl_row = claims[claims["claim"] == by_metric["ppl_change_vs_ar"]].iloc[0]
    assert ppl_row["where"] == "fake/prompts" and ppl_row["ours"].endswith(f"({PROMPTS} x {SEEDS})")
    # the CSV's numbers; an exact +0.1 shift under every prompt: the interval is that point
    assert ppl_row["lo"] == pytest.approx(math.exp(-0.1) - 1) == ppl_row["hi"]
    assert (ppl_row["n_prompts"], ppl_row["n_seeds"]) == (PROMPTS, SEEDS)
    expected = {
        "claims_total": len(claims),
        "claims_holding": 1,
        "claims_not_holding": 1,
        "claims_unresolved": len(claims) - 2,  # energy, and the score claims (no score here)
    }
    assert claims_summary(claims) == expected


def test_a_score_claim_over_a_baseline_that_scores_zero_says_why(fake_study: pd.DataFrame) -> None:
    """A target that passes nothing (AR's score 0 in every run) leaves the score claims
    unresolved with that reason, not the generic 'no comparable runs'."""
    runs = fake_study.copy()
    runs["score"] = 0.0
    runs = add_comparisons(runs.drop(columns=["score_change_vs_ar"]))
    claims = claims_table(load_recipe("claims"), runs)
    by_metric = {c["metric"]: c["claim"] for c in load_recipe("claims").claims}
    row = claims[claims["claim"] == by_metric["score_change_vs_ar"]].iloc[0]
    assert row["verdict"] == UNRESOLVED
    reason = "undefined: AR's score is 0 in every run on fake/prompts (3 runs)"
    assert row["ours"].startswith(reason)
    # with no score at all the generic reason stays
    plain = claims_table(load_recipe("claims"), fake_study)
    row = plain[plain["claim"] == by_metric["score_change_vs_ar"]].iloc[0]
    assert row["ours"].startswith("no comparable runs")


def test_frontier_points_are_the_tables_comparisons(
    fake_study: pd.DataFrame, tmp_path: Path
) -> None:
    """A frontier figure's points and error bars (mtad.paper.render.frontier_points) are the
    comparisons the tables show, with the same intervals (group_interval), and it draws."""
    from mtad.paper.figures import draw_figure
    from mtad.paper.render import frontier_points, group_interval

    spec = {
        "kind": "frontier",
        "name": "f",
        "x": "speedup_vs_sps",
        "y": ["ppl_change_vs_ar"],
        "points": ["ar", "sps"],
    }
    points = frontier_points(spec, fake_study).set_index("method")
    assert set(points.index) == {"ar", "sps", "mtad"}
    mtad = fake_study[fake_study["method"] == "mtad"]
    for column in ("speedup_vs_sps", "ppl_change_vs_ar"):
        iv = group_interval(mtad, column, fake_study)
        drawn = points.loc["mtad", [column, f"{column}_lo", f"{column}_hi"]].tolist()
        assert drawn == pytest.approx([iv.mean, iv.lo, iv.hi], rel=1e-12) and iv.has_interval
    lo, hi = points.loc["mtad", ["speedup_vs_sps_lo", "speedup_vs_sps_hi"]]
    assert lo < 1 / 1.3 < hi  # mtad is 1.3x slower than sps
    assert draw_figure(spec, fake_study, tmp_path / "f", "frontier", points.reset_index())
    assert (tmp_path / "f.png").is_file() and (tmp_path / "f.pdf").is_file()
    with pytest.raises(ValueError, match="comparison columns, not 'ppl'"):
        frontier_points({**spec, "y": ["ppl"]}, fake_study)
