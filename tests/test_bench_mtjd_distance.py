"""The MTJD-distance bench (bench/mtjd_distance.py): its TV estimator has no upward bias and a
band that covers 0 when the laws are equal (simulation with known laws), and on the tiny pair
its controls come out right: MTAD with the target as its own draft is MTJD (band contains 0),
a perturbed draft is not (band above 0)."""

from __future__ import annotations

import numpy as np

from bench import mtjd_distance
from bench.mtjd_distance import plug_in_tv, witness_tv

CELLS, N, REPEATS = 256, 2000, 300


def simulate(p: np.ndarray, q: np.ndarray, rng: np.random.Generator, folds: int = 2):
    """Witness estimates, band ends and plug-ins over independent repeats of two samples."""
    rows = []
    for _ in range(REPEATS):
        a, b = rng.choice(CELLS, N, p=p), rng.choice(CELLS, N, p=q)
        r = witness_tv(a, b, CELLS, folds)
        rows.append((r.estimate, r.lo, r.hi, r.plug_in))
    return np.array(rows).T


def test_witness_estimator_has_no_upward_bias_and_covers_zero():
    """Known laws (Dirichlet(0.3) over 256 outcomes, 2000 blocks a sample, 300 repeats).
    Equal laws: mean estimate 0 (within 4 standard errors), the 95% band covers 0 in >= 93%
    of repeats (binomial sd ~1%), while the plug-in sits far above 0. A 30% mixture: the mean
    estimate does not exceed the TV, the band's lower end stays below the TV in >= 95% of
    repeats (a lower confidence bound), and the plug-in overshoots it."""
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.full(CELLS, 0.3))
    est, lo, hi, plug = simulate(p, p, rng)
    se = est.std() / np.sqrt(REPEATS)
    cover = np.mean((lo <= 0) & (hi >= 0))
    print(
        f"equal laws: witness {est.mean():+.4f} (sd {est.std():.4f}), covers 0 in {cover:.3f},"
        f" plug-in {plug.mean():.3f}"
    )
    assert abs(est.mean()) < 4 * se
    assert cover >= 0.93
    assert plug.mean() > 0.1

    q = 0.7 * p + 0.3 * rng.dirichlet(np.full(CELLS, 0.3))
    tv = 0.5 * np.abs(p - q).sum()
    est, lo, hi, plug = simulate(p, q, rng)
    print(
        f"TV {tv:.3f}: witness {est.mean():.4f}, lower end <= TV in {np.mean(lo <= tv):.3f}, "
        f"plug-in {plug.mean():.3f}"
    )
    assert est.mean() <= tv + 4 * est.std() / np.sqrt(REPEATS)
    assert est.mean() > 0.5 * tv  # and it does see the difference
    assert np.mean(lo <= tv) >= 0.95
    assert plug.mean() > tv


def test_plug_in_of_identical_samples_is_zero_and_of_disjoint_ones_is_one():
    a = np.array([0, 1, 1, 2])
    assert plug_in_tv(a, a, 4) == 0.0
    assert plug_in_tv(a, np.array([3, 3, 3, 3]), 4) == 1.0


def test_controls_on_the_tiny_pair(tmp_path, capsys):
    """300 blocks a sample, tau 0.5, 99.9% bands (alpha 1e-3, as the exactness tests): the
    self-draft row's band contains 0, the perturbed draft's lies above 0; a figure is saved
    where the command says."""
    out = tmp_path / "tv.png"
    report = mtjd_distance.main(
        [
            "--samples",
            "300",
            "--taus",
            "0.5",
            "--drafts",
            "self,perturbed",
            "--confidence",
            "0.999",
            "--out",
            str(out),
        ]
    )
    printed = capsys.readouterr().out
    res = report.rows
    assert set(res) == {("self", 0.5), ("perturbed", 0.5)}
    assert res["self", 0.5].tv.contains_zero(), res["self", 0.5]
    assert res["self", 0.5].same_seed == (300, 300)  # the exact form: MTJD's own blocks
    assert res["perturbed", 0.5].tv.lo > 0, res["perturbed", 0.5]
    assert res["perturbed", 0.5].same_seed is None
    assert out.stat().st_size > 0 and f"figure: {out}" in printed
    assert "99.9% band" in printed and "\nar " in printed
    assert report.ar.lo > 0  # beam-sampled MTJD is not the target's plain sampling
