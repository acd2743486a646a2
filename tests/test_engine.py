"""Engine correctness: SpS / SpecInfer / block verification exactness, greedy equivalence,
KV-cache fidelity, counters, errors."""

from __future__ import annotations

import itertools

import pytest
import torch
from method_params import METHOD_PARAMS
from stats import chi2_critical
from tracing import traced, untraced

import mtad.engine.warping as warping
from mtad.engine import Decoder
from mtad.engine.runner import ModelRunner
from mtad.engine.tiny import build_tiny_model, build_tiny_pair
from mtad.engine.warping import WarpConfig, warp_candidates, warp_logprobs
from mtad.methods import blockverify as blockverify_module
from mtad.methods import build_method
from mtad.methods import sps as sps_module
from mtad.methods.sps import SpeculativeSampling

ALL_METHODS = METHOD_PARAMS


def make_decoder(pair, name: str, seed: int = 0, eos=(), head="auto", **overrides) -> Decoder:
    target, draft = pair
    params = {**ALL_METHODS[name], **overrides}
    return Decoder(
        build_method(name, **params),
        ModelRunner(target, lm_head=head),
        ModelRunner(draft, lm_head=head),
        eos,
        seed,
    )


# ---------------------------------------------------------------- 1. SpS is exact


def exact_two_token_dist(model, prompt: list[int], warp: WarpConfig) -> torch.Tensor:
    """P(x1, x2 | prompt) under the warped model, by enumeration: ``[V, V]``."""
    with torch.no_grad():
        p1 = warp_logprobs(model(torch.tensor([prompt])).logits[0, -1], warp).exp()
        vocab = p1.shape[0]
        seqs = torch.tensor([prompt + [v] for v in range(vocab)])
        p2 = warp_logprobs(model(seqs).logits[:, -1], warp).exp()
    return p1[:, None] * p2


def chi2_statistic(counts: torch.Tensor, expected_p: torch.Tensor, n: int) -> tuple[float, int]:
    """Pearson chi-square over cells, pooling cells with expected count < 5 into one."""
    expected = expected_p.flatten() * n
    observed = counts.flatten().double()
    big = expected >= 5
    obs = torch.cat([observed[big], observed[~big].sum().view(1)])
    exp = torch.cat([expected[big], expected[~big].sum().view(1)])
    keep = exp > 0
    stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    return stat, int(keep.sum()) - 1


def sample_two_tokens(decoder: Decoder, vocab: int, runs: int) -> torch.Tensor:
    counts = torch.zeros(vocab, vocab)
    for seed in range(runs):
        a, b = decoder.generate([3, 1, 4], 2, seed=seed).token_ids
        counts[a, b] += 1
    return counts


VOCAB = 8
RUNS = 1000
BROKEN_RUNS = 400
ALPHA = 1e-3  # false-alarm rate of the exactness test


@pytest.fixture(scope="module")
def stat_pair():
    target = build_tiny_model("llama", "target", vocab_size=VOCAB, seed=11)
    # an unrelated draft (another seed's), of one layer: what the draft proposes is all these
    # tests need of it, and its forwards are most of a step's
    draft = build_tiny_model("llama", "draft", vocab_size=VOCAB, seed=12)
    return target, draft


def test_sps_reproduces_target_distribution(stat_pair):
    """Chi-square goodness of fit of (x1, x2) from SpS against the target's exact joint.

    Tolerance: reject at alpha = 1e-3. The same test must reject a broken acceptance rule
    (always accept), whose output follows the draft instead; the draft is chosen far enough
    from the target (checked) for the test to have power.
    """
    target, draft = stat_pair
    warp = WarpConfig(1.0, 6, 0.95)
    exact = exact_two_token_dist(target, [3, 1, 4], warp)
    draft_exact = exact_two_token_dist(draft, [3, 1, 4], warp)
    assert 0.5 * (exact - draft_exact).abs().sum() > 0.2  # the draft really differs

    def run(runs: int, rule=None) -> tuple[float, float]:
        decoder = Decoder(
            build_method("sps", gamma=2, temperature=1.0, top_k=6, top_p=0.95),
            ModelRunner(target),
            ModelRunner(draft),
        )
        assert isinstance(decoder.method, SpeculativeSampling)
        with pytest.MonkeyPatch.context() as mp:
            if rule is not None:  # the module-level rule step() calls
                mp.setattr(sps_module, "speculative_accept", rule)
            counts = sample_two_tokens(decoder, VOCAB, runs)
        stat, df = chi2_statistic(counts, exact, runs)
        return stat, chi2_critical(df, ALPHA)

    stat, critical = run(RUNS)
    assert stat < critical, f"SpS output deviates from the target: chi2={stat:.1f} > {critical:.1f}"
    broken_stat, critical_b = run(
        BROKEN_RUNS, lambda lp, lq, g: torch.ones_like(lp, dtype=torch.bool)
    )
    print(f"sps chi2 {stat:.1f} < {critical:.1f}; broken rule chi2 {broken_stat:.1f}")
    assert broken_stat > critical_b, "the test cannot tell a broken acceptance rule apart"


def test_specinfer_reproduces_target_distribution(stat_pair):
    """Tree speculative sampling with i.i.d. children is exact too (SpecInfer, Thm 4.2):
    same chi-square test, alpha = 1e-3; a walk that accepts the first child always must fail."""
    target, draft = stat_pair
    warp = WarpConfig(1.0, 6, 0.95)
    exact = exact_two_token_dist(target, [3, 1, 4], warp)

    def run(runs: int, broken: bool) -> tuple[float, float]:
        method = build_method("specinfer", branching=[2, 2], top_k=6, top_p=0.95)
        if broken:
            method.walk = lambda p_all, q_all, tokens, g: ([0, 2], p_all[3].sample(g))
        decoder = Decoder(method, ModelRunner(target), ModelRunner(draft))
        counts = sample_two_tokens(decoder, VOCAB, runs)
        stat, df = chi2_statistic(counts, exact, runs)
        return stat, chi2_critical(df, ALPHA)

    stat, critical = run(RUNS, broken=False)
    assert stat < critical, f"SpecInfer deviates from the target: chi2={stat:.1f} > {critical:.1f}"
    broken_stat, critical_b = run(BROKEN_RUNS, broken=True)
    print(f"specinfer chi2 {stat:.1f} < {critical:.1f}; broken walk chi2 {broken_stat:.1f}")
    assert broken_stat > critical_b


def test_blockverify_reproduces_target_distribution(stat_pair):
    """Block verification (Sun et al., arXiv 2403.10444) is exact: same chi-square test,
    alpha = 1e-3; a rule that accepts the whole block always must fail."""
    target, draft = stat_pair
    exact = exact_two_token_dist(target, [3, 1, 4], WarpConfig(1.0, 6, 0.95))

    def run(runs: int, broken: bool) -> tuple[float, float]:
        method = build_method("blockverify", gamma=2, top_k=6, top_p=0.95)
        decoder = Decoder(method, ModelRunner(target), ModelRunner(draft))
        with pytest.MonkeyPatch.context() as mp:
            if broken:  # the module-level rule step() calls
                mp.setattr(
                    blockverify_module,
                    "block_verify",
                    lambda p, q, x, g: (torch.tensor(x.shape[0]), p[x.shape[0]].sample(g).view(1)),
                )
            counts = sample_two_tokens(decoder, VOCAB, runs)
        stat, df = chi2_statistic(counts, exact, runs)
        return stat, chi2_critical(df, ALPHA)

    stat, critical = run(RUNS, broken=False)
    assert stat < critical, f"blockverify deviates: chi2={stat:.1f} > {critical:.1f}"
    broken_stat, critical_b = run(BROKEN_RUNS, broken=True)
    print(f"blockverify chi2 {stat:.1f} < {critical:.1f}; broken rule chi2 {broken_stat:.1f}")
    assert broken_stat > critical_b


@pytest.mark.parametrize("name", ["sps", "specinfer", "blockverify"])
def test_exact_methods_reproduce_the_target_on_dense_rows(name, stat_pair, monkeypatch):
    """The same chi-square test with the CPU's sparse candidates switched off: the
    vocabulary-wide layout of the distribution type (what GPUs take) is exact too."""
    monkeypatch.setattr(warping, "top_k_top_p_candidates", lambda *a: None)
    warp = WarpConfig(1.0, 6, 0.95)
    assert warp_candidates(torch.randn(VOCAB), warp).dense
    target, draft = stat_pair
    exact = exact_two_token_dist(target, [3, 1, 4], warp)
    params = {"branching": [2, 2]} if name == "specinfer" else {"gamma": 2}
    method = build_method(name, top_k=6, top_p=0.95, **params)
    decoder = Decoder(method, ModelRunner(target), ModelRunner(draft))
    stat, df = chi2_statistic(sample_two_tokens(decoder, VOCAB, RUNS), exact, RUNS)
    critical = chi2_critical(df, ALPHA)
    print(f"{name} on dense rows chi2 {stat:.1f} < {critical:.1f}")
    assert stat < critical


# ---------------------------------------------------------------- 2. greedy SpS == greedy AR


@pytest.mark.parametrize("family", ["llama", "opt"])
def test_greedy_sps_and_specinfer_equal_greedy_ar(family: str, tiny_llama, tiny_opt):
    """Greedy SpS, block verification and SpecInfer all give greedy AR's tokens."""
    pair = tiny_llama if family == "llama" else tiny_opt
    ar = make_decoder(pair, "ar", temperature=0.0)
    for gamma, name in itertools.product((1, 3, 5), ("sps", "blockverify")):
        exact = make_decoder(pair, name, temperature=0.0, gamma=gamma)
        for prompt in ([1, 2, 3], [50, 60, 70, 80, 90], [7]):
            ref = ar.generate(prompt, 40).token_ids
            got = exact.generate(prompt, 40)
            assert got.token_ids == ref, (name, gamma)
    tree = make_decoder(pair, "specinfer", temperature=0.0)
    for prompt in ([1, 2, 3], [50, 60, 70, 80, 90]):
        assert tree.generate(prompt, 40).token_ids == ar.generate(prompt, 40).token_ids
    # and the draft did real work: some tokens were accepted
    assert got.stats.accepted > 0 or family == "opt"


# ---------------------------------------------------------------- 5. KV cache == no-cache forward


@pytest.mark.parametrize(("name", "temperature"), list(itertools.product(ALL_METHODS, (1.0, 0.0))))
@pytest.mark.parametrize("family", ["llama", "opt"])
def test_cached_logits_equal_fresh_forward(name, temperature, family, tiny_llama, tiny_opt):
    """Every logit the engine used equals a no-cache forward over the same context (fp32,
    atol 1e-4), through rollbacks (partial acceptance) and beam reorders."""
    check_cached_logits(name, temperature, family, "stock", tiny_llama, tiny_opt)


@pytest.mark.parametrize("name", list(ALL_METHODS))
@pytest.mark.parametrize("family", ["llama", "opt"])
def test_fast_head_logits_equal_fresh_forward(name, family, tiny_llama, tiny_opt):
    """The same with the CPU head forced on (mtad.engine.heads.CPUHeadLM): tree forwards, beam rows
    and single rows all go through its two projection kernels."""
    check_cached_logits(name, 1.0, family, "fast", tiny_llama, tiny_opt)


def check_cached_logits(name, temperature, family, head, tiny_llama, tiny_opt) -> None:
    pair = tiny_llama if family == "llama" else tiny_opt
    decoder = make_decoder(
        pair, name, seed=5, head=head, temperature=temperature, top_k=0, top_p=1.0
    )
    assert decoder.target.lm_head == head
    runners = [r for r in (decoder.target, decoder.draft) if r is not None]
    traces = {id(r): traced(r) for r in runners}
    out = decoder.generate([10, 20, 30, 40], 30)
    rolled_back = any(0 < a < decoder.method.max_step_tokens - 1 for a in out.stats.accept_lengths)
    if name in ("sps", "blockverify", "mtad"):
        assert rolled_back or out.stats.accepted == 0  # exercised a partial acceptance
    for runner in runners:
        trace = traces[id(runner)]
        assert trace
        for rec in trace:
            keep = rec.logits.shape[1]
            with torch.no_grad():
                if rec.paths is None:
                    fresh = runner.model(rec.context_ids).logits[:, -keep:]
                else:  # tree forward: each kept position against its own root-to-node path
                    fresh = torch.stack(
                        [runner.model(path[None]).logits[0, -1] for path in rec.paths]
                    )[None]
            torch.testing.assert_close(rec.logits, fresh, atol=1e-4, rtol=1e-4)
        untraced(runner)


def test_rollback_and_reorder_are_exercised(tiny_llama):
    """Guard for the test above: the tiny pair does produce partial acceptances."""
    for name in ("sps", "blockverify", "mtad"):
        out = make_decoder(tiny_llama, name, seed=5, top_k=0, top_p=1.0).generate([10, 20], 60)
        assert any(0 < a < 3 for a in out.stats.accept_lengths), name


# ---------------------------------------------------------------- 6. counters


@pytest.mark.parametrize("name", list(ALL_METHODS))
@pytest.mark.parametrize("max_new", [1, 17, 40])
def test_counters_consistent(name: str, max_new: int, tiny_llama):
    decoder = make_decoder(tiny_llama, name, seed=1)
    out = decoder.generate([1, 2, 3, 4], max_new)
    s = out.stats
    assert len(out.token_ids) == s.new_tokens == max_new
    assert s.new_tokens == sum(a + 1 for a in s.accept_lengths)
    assert s.iterations == len(s.accept_lengths)
    assert s.block_efficiency == pytest.approx(s.new_tokens / s.target_forwards)
    assert s.accepted <= s.drafted
    gamma = ALL_METHODS[name].get("gamma", 1)
    if name in ("ar", "sps", "blockverify", "mtad", "specinfer", "bild", "mmtad"):
        assert s.target_forwards == s.iterations
    if name in ("sps", "blockverify", "mtad"):
        assert s.draft_forwards == gamma * s.iterations
    if name == "mtjd":
        assert s.target_forwards == gamma * s.iterations
    assert s.wall_time >= s.time_draft + s.time_verify - 1e-9


@pytest.mark.parametrize("name", list(ALL_METHODS))
def test_eos_stops_every_method_the_same_way(name: str, tiny_llama):
    # Use a token the method is known to produce as EOS: output must end right there.
    free = make_decoder(tiny_llama, name, seed=2).generate([9, 8, 7], 30).token_ids
    eos = free[5]
    out = make_decoder(tiny_llama, name, seed=2, eos=[eos]).generate([9, 8, 7], 30)
    assert out.stopped_by == "eos"
    assert out.token_ids == free[: free.index(eos) + 1]
    assert out.stats.new_tokens == sum(a + 1 for a in out.stats.accept_lengths)


# ---------------------------------------------------------------- 7. bad arguments


@pytest.mark.parametrize(
    ("name", "params", "key"),
    [
        ("sps", {"gamma": 0}, "gamma"),
        ("mtad", {"gamma": -1}, "gamma"),
        ("mtad", {"tau": 0.0}, "tau"),
        ("mtad", {"tau": 1.5}, "tau"),
        ("mtad", {"beam_width": 0}, "beam_width"),
        ("mtjd", {"beam_width": 0}, "beam_width"),
        ("ar", {"top_p": 0.0}, "top_p"),
        ("ar", {"temperature": -1.0}, "temperature"),
        ("mtad", {"gama": 3}, "gama"),
        ("nope", {}, "method"),
    ],
)
def test_bad_arguments_name_the_argument(name, params, key):
    with pytest.raises(ValueError, match=key):
        build_method(name, **params)


def test_vocab_mismatch_and_empty_prompt(tiny_llama):
    target, _ = tiny_llama
    other_draft = build_tiny_model("llama", "draft", vocab_size=300)
    runner = ModelRunner(target)
    with pytest.raises(ValueError, match="draft"):
        Decoder(build_method("mtad"), runner, ModelRunner(other_draft))
    with pytest.raises(ValueError, match="draft"):
        Decoder(build_method("sps"), runner, None)
    decoder = Decoder(build_method("ar"), runner)
    with pytest.raises(ValueError, match="prompt_ids"):
        decoder.generate([], 5)
    with pytest.raises(ValueError, match="max_new_tokens"):
        decoder.generate([1], 0)
    assert runner.forwards == 0  # nothing ran


def test_bild_thresholds(tiny_llama):
    """Rolling back everything gives the target's own greedy output; never falling back and
    never rolling back commits every drafted token."""
    ar = make_decoder(tiny_llama, "ar", temperature=0.0).generate([4, 5, 6], 30).token_ids
    strict = make_decoder(
        tiny_llama, "bild", temperature=0.0, fallback_threshold=0.0, rollback_threshold=1e-6
    ).generate([4, 5, 6], 30)
    assert strict.token_ids == ar
    lax = make_decoder(
        tiny_llama,
        "bild",
        temperature=0.0,
        fallback_threshold=0.0,
        rollback_threshold=1e9,
        top_k=0,
        top_p=1.0,
    ).generate([4, 5, 6], 30)
    # every iteration but the last (cut at max_new_tokens) commits all max_draft drafted tokens
    assert lax.stats.accept_lengths[:-1] == [4] * (lax.stats.iterations - 1)


def test_same_seed_same_output(tiny_llama):
    for name in ALL_METHODS:
        a = make_decoder(tiny_llama, name).generate([1, 2], 20, seed=3).token_ids
        b = make_decoder(tiny_llama, name).generate([1, 2], 20, seed=3).token_ids
        assert a == b, name


def test_pair_builder_is_deterministic():
    t1, d1 = build_tiny_pair("opt", seed=4)
    t2, d2 = build_tiny_pair("opt", seed=4)
    for a, b in ((t1, t2), (d1, d2)):
        for (n1, p1), (_, p2) in zip(a.named_parameters(), b.named_parameters(), strict=True):
            assert torch.equal(p1, p2), n1
