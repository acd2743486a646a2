"""Block verification (Sun et al., arXiv 2403.10444): its rule is exact by enumeration, its
sampler draws the accepted length the rule says, and on the same drafts it accepts at least as
much as SpS in expectation (paired). The chi-square tests through the decoder (fp32, bf16,
sub-vocabulary draft, dense rows) and greedy == AR live with SpS's in ``test_engine.py`` and
``test_exact_bf16_subvocab.py``."""

from __future__ import annotations

import itertools
import math
from statistics import NormalDist, fmean, stdev

import pytest
import torch
from stats import chi2_critical

from mtad.engine import Candidates, WarpConfig, warp_candidates
from mtad.engine.runner import ModelRunner
from mtad.methods.blockverify import (
    accepted_length,
    block_log_weights,
    next_token_distribution,
    verification_plan,
)
from mtad.methods.common import leading_true_count
from mtad.methods.sps import draft_tokens, speculative_accept

ALPHA = 1e-3


class TreeModel:
    """Random next-token distributions for every prefix over a small vocabulary (a model that
    can be enumerated exactly); some entries are zero, as top-k / top-p leave them."""

    def __init__(self, vocab: int, seed: int, zeros: bool) -> None:
        self.vocab, self.zeros = vocab, zeros
        self.gen = torch.Generator().manual_seed(seed)
        self.table: dict[tuple[int, ...], torch.Tensor] = {}

    def __call__(self, prefix: tuple[int, ...]) -> torch.Tensor:
        if prefix not in self.table:
            a = torch._standard_gamma(torch.full((self.vocab,), 0.5), generator=self.gen)
            if self.zeros and torch.rand((), generator=self.gen) < 0.5:
                a[torch.randint(self.vocab, (), generator=self.gen)] = 0.0
            self.table[prefix] = a / a.sum()
        return self.table[prefix]


def as_candidates(rows: torch.Tensor, dense: bool, gen: torch.Generator) -> Candidates:
    """Probability rows ``[n, V]`` as either layout (sparse: candidates in a shuffled order)."""
    logp = rows.log()
    if dense:
        return Candidates.from_logprobs(logp)
    order = torch.stack([torch.randperm(rows.shape[-1], generator=gen) for _ in rows])
    return Candidates(order, logp.gather(-1, order), dense=False)


def stop_distribution(h: torch.Tensor) -> torch.Tensor:
    """``P(k = i)``, ``i = 0..g``, of the longest ``i`` with ``eta_i < h_i``."""
    g = h.shape[0]
    h1 = torch.cat([torch.ones(1), h])  # k = 0 needs no draw of its own
    return torch.stack([h1[i] * torch.prod(1 - h1[i + 1 :]) for i in range(g + 1)])


def sps_expected(p_x: torch.Tensor, q_x: torch.Tensor) -> float:
    """SpS's expected accepted length on one draft: ``sum_i prod_{j <= i} min(1, p/q)``."""
    return float(torch.cumprod((p_x / q_x).clamp(max=1.0), dim=0).sum())


def enumerate_block(target: TreeModel, draft: TreeModel, g: int, layouts: tuple[bool, bool]):
    """Exact output law of one block-verification step followed by plain target sampling up to
    ``g + 1`` tokens, and both verifiers' expected accepted lengths over the draft."""
    vocab, gen = target.vocab, torch.Generator().manual_seed(0)
    law: dict[tuple[int, ...], float] = {}
    e_bv = e_sps = 0.0
    for x in itertools.product(range(vocab), repeat=g):
        q_rows = torch.stack([draft(x[:i]) for i in range(g)])
        xt = torch.tensor(x)
        q_x = q_rows.gather(1, xt[:, None]).squeeze(1)
        if (q_x == 0).any():
            continue  # the draft never proposes it
        p_rows = torch.stack([target(x[:i]) for i in range(g + 1)])
        p = as_candidates(p_rows, layouts[0], gen)
        q = as_candidates(q_rows, layouts[1], gen)
        h, resid, mass = verification_plan(p, q, xt)
        stops = stop_distribution(h)
        weight = float(q_x.prod())
        e_bv += weight * float((torch.arange(g + 1) * stops).sum())
        e_sps += weight * sps_expected(p_rows[:g].gather(1, xt[:, None]).squeeze(1), q_x)
        for k in range(g + 1):
            if stops[k] == 0:
                continue
            nxt = next_token_distribution(p, resid, mass, k).to_dense(vocab).exp()
            for y in range(vocab):
                head = x[:k] + (y,)
                for tail in itertools.product(range(vocab), repeat=g - k):
                    z = head + tail
                    rest = math.prod(float(target(z[:i])[z[i]]) for i in range(k + 1, g + 1))
                    law[z] = law.get(z, 0.0) + weight * float(stops[k] * nxt[y]) * rest
    return law, e_bv, e_sps


@pytest.mark.parametrize(
    "layouts", [(True, True), (False, False), (True, False), (False, True)], ids=str
)
@pytest.mark.parametrize(("vocab", "g"), [(3, 3), (4, 2)])
def test_block_verification_is_exact_by_enumeration(layouts, vocab, g):
    """Every output sequence of one step (plus target sampling to ``g + 1`` tokens) has exactly
    the target's probability (float32 tolerance), on both candidate layouts and with zeros in
    the target's and the draft's rows; and the expected accepted length is at least SpS's."""
    for seed in range(4):
        target, draft = TreeModel(vocab, seed, zeros=True), TreeModel(vocab, 100 + seed, True)
        law, e_bv, e_sps = enumerate_block(target, draft, g, layouts)
        for z in itertools.product(range(vocab), repeat=g + 1):
            exact = math.prod(float(target(z[:i])[z[i]]) for i in range(g + 1))
            assert law.get(z, 0.0) == pytest.approx(exact, abs=2e-6), (seed, z)
        assert e_bv >= e_sps - 1e-6, (seed, e_bv, e_sps)


def test_expected_accepted_length_beats_sps_and_equals_it_where_it_must():
    """Theorem 2 on enumerable models: never below SpS, above it on a generic pair, equal to
    it at gamma = 1 (the two rules coincide) and gamma when the draft is the target."""
    gains = []
    for seed in range(6):
        target, draft = TreeModel(3, seed, zeros=False), TreeModel(3, 50 + seed, zeros=False)
        _, e_bv, e_sps = enumerate_block(target, draft, 3, (True, True))
        assert e_bv >= e_sps - 1e-6
        gains.append(e_bv - e_sps)
        _, e_bv1, e_sps1 = enumerate_block(target, draft, 1, (True, True))
        assert e_bv1 == pytest.approx(e_sps1, abs=1e-6)
        _, e_self, _ = enumerate_block(target, target, 3, (True, True))
        assert e_self == pytest.approx(3.0, abs=1e-6)
    print("block verification - SpS expected accepted length:", [f"{x:.3f}" for x in gains])
    assert min(gains) > 1e-3


def test_the_papers_two_token_example():
    """Sun et al., Sec. 1: context-free target (1/3, 2/3), draft (2/3, 1/3), gamma 2: SpS
    accepts 10/9 tokens per block in expectation, block verification 11/9."""
    p1, q1 = torch.tensor([1 / 3, 2 / 3]), torch.tensor([2 / 3, 1 / 3])
    e_bv = e_sps = 0.0
    for x in itertools.product(range(2), repeat=2):
        xt = torch.tensor(x)
        p = Candidates.from_logprobs(p1.log().expand(3, 2))
        q = Candidates.from_logprobs(q1.log().expand(2, 2))
        h, _, _ = verification_plan(p, q, xt)
        weight = float(q1[xt].prod())
        e_bv += weight * float((torch.arange(3) * stop_distribution(h)).sum())
        e_sps += weight * sps_expected(p1[xt], q1[xt])
    assert e_sps == pytest.approx(10 / 9, abs=1e-6)
    assert e_bv == pytest.approx(11 / 9, abs=1e-6)


def test_weights_are_the_clipped_running_ratio():
    """``w_i = min(1, w_{i-1} p/q)`` by the loop, against the cumsum / cummax form."""
    gen = torch.Generator().manual_seed(3)
    for _ in range(50):
        d = torch.randn(6, generator=gen) * 2
        d[torch.randint(6, (), generator=gen)] = float("-inf") if torch.rand(()) < 0.3 else 0.0
        w, expect = 1.0, [1.0]
        for v in d.exp().tolist():
            w = min(1.0, w * v)
            expect.append(w)
        got = block_log_weights(d, torch.zeros(6)).exp()
        torch.testing.assert_close(got, torch.tensor(expect), rtol=1e-5, atol=1e-7)


def test_accepted_length_draws_the_longest_passing_prefix():
    """The sampler's accepted lengths follow ``P(k = i) = h_i prod_{j>i} (1 - h_j)``
    (chi-square, alpha 1e-3); a first-failure sampler on the same ``h`` is rejected."""
    h = torch.tensor([0.5, 0.2, 0.7, 0.4])
    expected = stop_distribution(h)
    gen = torch.Generator().manual_seed(0)
    n = 4000
    counts = torch.bincount(
        torch.stack([accepted_length(h, gen) for _ in range(n)]), minlength=5
    ).double()
    stat = float(((counts - n * expected) ** 2 / (n * expected)).sum())
    assert stat < chi2_critical(4, ALPHA), (counts, expected)
    first_failure = torch.bincount(
        torch.stack([leading_true_count(torch.rand(4, generator=gen) < h) for _ in range(n)]),
        minlength=5,
    ).double()
    broken = float(((first_failure - n * expected) ** 2 / (n * expected)).sum())
    assert broken > chi2_critical(4, ALPHA)


def test_accepts_at_least_as_much_as_sps_on_the_same_drafts(tiny_llama):
    """Paired, on the tiny pair's real drafts: per seed one block drafted by SpS's helper
    (same seed, same draft), one target forward, then both verifiers' expected accepted lengths
    on that draft (exact given the draft) and one sampled length each. Over 300 drafts the 95%
    interval of the mean paired difference lies above 0, and each sampled mean agrees with
    its exact conditional mean (z-test, alpha 1e-3)."""
    target_model, draft_model = tiny_llama
    target, draft = ModelRunner(target_model), ModelRunner(draft_model)
    warp, g, n = WarpConfig(1.0, 0, 1.0), 4, 300
    ids = torch.tensor([10, 20, 30, 40])
    e_bv, e_sps, k_bv, k_sps = [], [], [], []
    with torch.no_grad():
        for seed in range(n):
            target.reset()
            draft.reset()
            gen = torch.Generator().manual_seed(seed)
            x, q = draft_tokens(draft, ids, g, warp, gen)
            p = warp_candidates(target.feed(ids, extra=x)[0, -(g + 1) :], warp)
            logp_x, logq_x = p[:g].logp_of(x), q.logp_of(x)
            h, _, _ = verification_plan(p, q, x)
            e_bv.append(float((torch.arange(g + 1) * stop_distribution(h)).sum()))
            e_sps.append(sps_expected(logp_x.exp(), logq_x.exp()))
            k_bv.append(int(accepted_length(h, gen)))
            k_sps.append(int(leading_true_count(speculative_accept(logp_x, logq_x, gen))))
    diffs = [b - s for b, s in zip(e_bv, e_sps, strict=True)]
    half = NormalDist().inv_cdf(0.975) * stdev(diffs) / math.sqrt(n)
    print(
        f"mean accepted of {g}: SpS {fmean(e_sps):.3f}, block verification {fmean(e_bv):.3f}, "
        f"paired difference {fmean(diffs):.3f} [{fmean(diffs) - half:.3f}, "
        f"{fmean(diffs) + half:.3f}]; sampled {fmean(k_sps):.3f} / {fmean(k_bv):.3f}"
    )
    assert fmean(diffs) - half > 0
    z = NormalDist().inv_cdf(1 - ALPHA / 2)
    for sampled, exact in ((k_bv, e_bv), (k_sps, e_sps)):
        resid = [s - e for s, e in zip(sampled, exact, strict=True)]
        assert abs(fmean(resid)) < z * stdev(resid) / math.sqrt(n)
