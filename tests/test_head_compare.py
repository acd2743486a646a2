"""Held-out acceptance kept per response, its standard error and the paired comparison of two
heads (``scripts/train_head.py compare``): the bookkeeping against a plain per-kind count, the
statistics against independent computations and by their coverage on data with a known gain."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from mtad_train.head_commands import head_folder
from mtad_train.head_eval import (
    ALL,
    SequenceAcceptance,
    _SequenceSums,
    paired_gain,
)

KINDS = ("humaneval", "mtbench", "default")


def _scored(n: int, depths: int, seed: int, shift: float = 0.0) -> SequenceAcceptance:
    """Synthetic per-response sums: each response has its own acceptance level (responses
    differ far more than positions within one), ``shift`` added to every position's value."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(5, 80, size=(n, 1)).repeat(depths, 1) - np.arange(depths)
    level = rng.beta(4, 3, size=(n, 1)) - 0.03 * np.arange(depths)
    sums = counts * np.clip(level + shift, 0, 1)
    kinds = [KINDS[i % len(KINDS)] for i in range(n)]
    return SequenceAcceptance(sums.astype(float), counts.astype(float), list(range(n)), kinds)


def _paired(base: SequenceAcceptance, seed: int, gain: float, noise: float) -> SequenceAcceptance:
    """``base`` with every response's mean moved by ``gain`` plus response-level noise."""
    rng = np.random.default_rng(seed)
    moved = base.sums + base.counts * (gain + noise * rng.standard_normal((len(base.keys), 1)))
    return SequenceAcceptance(moved, base.counts.copy(), list(base.keys), list(base.kinds))


def test_sequence_sums_pool_to_the_per_kind_figures_of_a_plain_count():
    # two batches of sequences, their scored positions and acceptance at two depths, in an
    # order other than the ids' (the result is sorted by key)
    data = SimpleNamespace(shards=[SimpleNamespace(seq_index=np.array([4, 0, 3, 1, 2]))])
    kinds = ["a", "b", "a", "b", "a"]
    acc = _SequenceSums(data, kinds, depths=2)
    gen = torch.Generator().manual_seed(0)
    plain: dict[str, np.ndarray] = {k: np.zeros((2, 2)) for k in ("a", "b")}
    for batch in ([0, 1, 2], [3, 4]):
        rows = acc.start([SimpleNamespace(shard=0, index=i) for i in batch])
        for depth in (1, 2):
            sel = torch.rand(len(batch), 7, generator=gen) < 0.6
            got = torch.rand(int(sel.sum()), generator=gen)
            acc.add(rows, depth, sel, got)
            row_of = sel.nonzero()[:, 0]
            for r, i in enumerate(batch):
                kind = kinds[int(data.shards[0].seq_index[i])]
                plain[kind][depth - 1] += [float(got[row_of == r].sum()), int((row_of == r).sum())]
    result = acc.result()
    assert result.keys == [0, 1, 2, 3, 4]
    assert result.kinds == kinds
    table = result.table()
    for kind in ("a", "b"):
        for depth in (1, 2):
            s, c = plain[kind][depth - 1]
            assert table[kind][f"d{depth}"] == pytest.approx(s / c, rel=1e-6)
        assert table[kind]["prompts"] == kinds.count(kind)
    every = sum(plain.values())
    assert table[ALL]["d2"] == pytest.approx(every[1, 0] / every[1, 1], rel=1e-6)
    assert table[ALL]["positions"] == int(every[0, 1])


def test_the_standard_error_agrees_with_the_bootstrap_spread_of_the_pooled_figure():
    scored = _scored(240, 2, seed=1)
    rng = np.random.default_rng(2)
    n = len(scored.keys)
    draws = rng.integers(0, n, size=(4000, n))
    s, c = scored.sums[:, 0], scored.counts[:, 0]
    boot = s[draws].sum(1) / c[draws].sum(1)
    se = scored.standard_error(1)
    # the linearised variance against 4,000 resamples: within 8% (the bootstrap's own
    # relative error at 4,000 draws is ~1%; the linearisation's at n = 240 a few %)
    assert se == pytest.approx(boot.std(ddof=1), rel=0.08)
    one_kind = scored.standard_error(1, "mtbench")
    assert one_kind > se  # a third of the responses: a wider figure


def test_the_paired_percentile_interval_matches_an_independent_resampling():
    a = _scored(150, 1, seed=3)
    b = _paired(a, seed=4, gain=-0.01, noise=0.02)
    got = paired_gain(a, b, 1, n_resamples=9999, method="percentile", seed=5)
    rng = np.random.default_rng(6)
    draws = rng.integers(0, 150, size=(20000, 150))
    sa, sb, c = a.sums[:, 0], b.sums[:, 0], a.counts[:, 0]
    diffs = (sa[draws].sum(1) - sb[draws].sum(1)) / c[draws].sum(1)
    low, high = np.quantile(diffs, [0.025, 0.975])
    assert got.gain == pytest.approx((sa.sum() - sb.sum()) / c.sum(), rel=1e-12)
    assert got.a - got.b == pytest.approx(got.gain, abs=1e-12)
    width = high - low
    assert got.low == pytest.approx(low, abs=0.05 * width)
    assert got.high == pytest.approx(high, abs=0.05 * width)


def test_the_paired_interval_covers_a_known_gain_at_its_level():
    # 200 draws of 80 responses each, head A's true gain 0.01 over B (each response's own gain
    # scattered around it): the 95% interval must cover 0.01 in ~95% of them. With 200 trials
    # a correct interval covers fewer than 90% with probability < 0.3%, while one that ignored
    # the pairing or the responses' clustering covers far fewer or all of them.
    covered, widths = 0, []
    for trial in range(200):
        b = _scored(80, 1, seed=1000 + trial)
        a = _paired(b, seed=2000 + trial, gain=0.01, noise=0.03)
        g = paired_gain(a, b, 1, n_resamples=999, seed=trial)
        covered += g.low <= 0.01 <= g.high
        widths.append(g.high - g.low)
    assert 0.90 <= covered / 200 <= 0.99
    assert 0.005 < float(np.median(widths)) < 0.03  # the spread of 80 responses' gains


def test_a_gain_of_one_kind_reads_only_that_kinds_responses():
    a = _scored(90, 2, seed=8)
    b = _paired(a, seed=9, gain=0.0, noise=0.0)
    moved = a.sums.copy()
    mt = np.array([k == "mtbench" for k in a.kinds])
    moved[mt] += 0.05 * a.counts[mt]
    a2 = SequenceAcceptance(moved, a.counts, a.keys, a.kinds)
    assert paired_gain(a2, b, 2, "mtbench").gain == pytest.approx(0.05, abs=1e-9)
    assert paired_gain(a2, b, 2, "humaneval").gain == pytest.approx(0.0, abs=1e-12)
    assert 0.0 < paired_gain(a2, b, 2).gain < 0.05


def test_heads_scored_on_different_positions_are_refused():
    a = _scored(30, 1, seed=10)
    other = SequenceAcceptance(a.sums, a.counts + 1, a.keys, a.kinds)
    with pytest.raises(ValueError, match="same held-out positions"):
        paired_gain(a, other, 1)
    shifted = SequenceAcceptance(a.sums, a.counts, [k + 1 for k in a.keys], a.kinds)
    with pytest.raises(ValueError, match="same held-out positions"):
        paired_gain(a, shifted, 1)


def test_a_head_against_itself_gains_exactly_nothing():
    a = _scored(40, 1, seed=11)
    g = paired_gain(a, a, 1, n_resamples=199)
    assert (g.gain, g.low, g.high) == (0.0, 0.0, 0.0)


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def test_a_committed_head_folder_is_read_from_its_revision(tmp_path):
    repo = tmp_path / "repo"
    folder = repo / "heads" / "h"
    (folder / "sub").mkdir(parents=True)
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "t@t")
    _git(repo, "config", "user.name", "t")
    (folder / "head_config.json").write_text('{"v": 1}')
    (folder / "model.safetensors").write_bytes(b"\x00weights-1")
    (folder / "corpus.npz").write_bytes(b"not read")
    (folder / "sub" / "x.json").write_text("{}")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "one")
    (folder / "model.safetensors").write_bytes(b"\x00weights-2")
    _git(repo, "commit", "-q", "-am", "two")
    cwd = Path.cwd()
    try:
        os.chdir(repo)  # git reads the revision from the working directory's repository
        with head_folder("HEAD~1:heads/h/") as got:
            names = sorted(p.name for p in got.iterdir())
            assert names == ["head_config.json", "model.safetensors"]
            assert (got / "model.safetensors").read_bytes() == b"\x00weights-1"
            kept = got
        assert not kept.exists()
        with head_folder("heads/h") as got:  # a folder on disk is itself
            assert (got / "model.safetensors").read_bytes() == b"\x00weights-2"
        with pytest.raises(ValueError, match="no-such-rev"), head_folder("no-such-rev:heads/h"):
            pass
        with pytest.raises(ValueError, match="no head files"), head_folder("HEAD:heads/none"):
            pass
        with pytest.raises(FileNotFoundError), head_folder("heads/missing"):
            pass
    finally:
        os.chdir(cwd)


def test_the_report_tables_carry_the_standard_errors_and_the_paired_gains():
    from mtad_train.head_commands import paired_gains
    from mtad_train.head_report import gain_table, heldout_table

    b = _scored(60, 2, seed=12)
    a = _paired(b, seed=13, gain=0.02, noise=0.01)
    gains = paired_gains(a, b, 0.95, 999, 0)
    assert set(gains) == {*KINDS, ALL}
    assert gains[ALL]["d1"]["gain"] == pytest.approx(paired_gain(a, b, 1).gain, abs=1e-15)
    lines = gain_table({"head": "HEAD~1:h", "gain": gains}, 2)
    assert "`HEAD~1:h`" in lines[0] and "95% paired bootstrap" in lines[0]
    row = next(line for line in lines if line.startswith("| all four"))
    g = gains[ALL]["d2"]
    assert f"{g['gain']:+.3f} [{g['low']:+.3f}, {g['high']:+.3f}]" in row
    assert g["low"] > 0  # a gain of 0.02 over 60 responses, scattered by 0.01: clearly positive
    table, se = a.table(), {k: {"d1": 0.011, "d2": 0.012} for k in (*KINDS, ALL)}
    plain = heldout_table(table, 2)
    with_se = heldout_table(table, 2, se)
    assert f"{table['mtbench']['d2']:.3f} (0.012)" in next(x for x in with_se if "| mtbench |" in x)
    assert "(0." not in "".join(plain) and "standard error" in with_se[-1]
