"""The CPU fast paths the benchmarks rely on equal their generic versions.

* warping: the top-k/top-p fast path returns the generic path's log-probabilities bit for bit,
  ties included (bfloat16 logits tie often);
* sampling: noise drawn only on the support gives the same distributions and never picks a
  zero-probability entry.
"""

from __future__ import annotations

import pytest
import torch
from stats import chi2_critical

from mtad.engine.warping import (
    NEG_INF,
    Candidates,
    WarpConfig,
    _top_k_mask,
    _top_p_drop,
    sample_from_logprobs,
    sample_with_replacement,
    sample_without_replacement,
    warp_candidates,
    warp_logprobs,
)


def generic_warp(logits: torch.Tensor, warp: WarpConfig) -> torch.Tensor:
    """The device-independent path: full-vocabulary top-k mask and sort-based top-p."""
    warp = warp.scoring()
    logits = logits.float()
    if warp.temperature != 1.0:
        logits = logits / warp.temperature
    if 0 < warp.top_k < logits.shape[-1]:
        logits = _top_k_mask(logits, warp.top_k)
    if warp.top_p < 1.0:
        logits = logits.masked_fill(_top_p_drop(logits, warp.top_p), NEG_INF)
    return torch.log_softmax(logits, dim=-1)


@pytest.mark.parametrize(
    "warp",
    [
        WarpConfig(1.0, 10, 0.9),
        WarpConfig(0.0, 10, 0.9),
        WarpConfig(0.7, 4, 0.5),
        WarpConfig(1.0, 40, 0.95),
        WarpConfig(1.0, 1, 0.9),
        WarpConfig(1.0, 10, 1.0),
    ],
)
def test_fast_warp_equals_generic_bit_for_bit(warp: WarpConfig) -> None:
    g = torch.Generator().manual_seed(0)
    for trial in range(40):
        scale = [0.5, 2.0, 6.0][trial % 3]
        x = torch.randn(3, 2000, generator=g) * scale
        if trial % 2:
            x = x.bfloat16()  # coarse values: many ties, also at the top-p cut
        if trial % 5 == 0:
            x = (x.float() * 2).round() / 2  # heavy ties, also at the k-th value
        assert torch.equal(warp_logprobs(x, warp), generic_warp(x, warp)), trial


def test_fast_warp_handles_shapes_and_extreme_rows() -> None:
    warp = WarpConfig(1.0, 5, 0.8)
    x = torch.randn(2, 3, 500)
    assert torch.equal(warp_logprobs(x, warp), generic_warp(x, warp))
    flat = torch.zeros(2, 500)  # every entry tied: the tie window overflows
    assert torch.equal(warp_logprobs(flat, warp), generic_warp(flat, warp))


def test_sparse_noise_samples_the_support_with_the_right_frequencies() -> None:
    vocab, n = 4000, 40_000
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    support = torch.tensor([7, 1999, 3000, 3999])
    logp = torch.full((vocab,), NEG_INF)
    logp[support] = probs.log()
    g = torch.Generator().manual_seed(1)
    rows = logp.expand(n, vocab)  # one draw per row, sparse path (4 of 4000 finite)
    draws = sample_from_logprobs(rows, g)
    assert torch.isin(draws, support).all()
    freq = torch.stack([(draws == s).float().mean() for s in support])
    assert torch.allclose(freq, probs, atol=0.01)


def test_sparse_gumbel_top_k_is_without_replacement_and_unbiased() -> None:
    vocab = 4000
    probs = torch.tensor([0.4, 0.3, 0.2, 0.1])
    support = torch.tensor([3, 500, 2500, 3998])
    logp = torch.full((vocab,), NEG_INF)
    logp[support] = probs.log()
    g = torch.Generator().manual_seed(2)
    first = []
    for _ in range(6000):
        idx, valid = sample_without_replacement(logp, 3, g)
        assert valid.all() and idx.unique().numel() == 3 and torch.isin(idx, support).all()
        first.append(int(idx[0]))
    first_t = torch.tensor(first)
    freq = torch.stack([(first_t == s).float().mean() for s in support])
    assert torch.allclose(freq, probs, atol=0.02)  # the first Gumbel-top-k pick ~ p
    # fewer live entries than picks: the extra picks are flagged dead, never live duplicates
    idx, valid = sample_without_replacement(logp, 6, g)
    assert valid.sum() == 4 and torch.isin(idx[valid], support).all()
    idx, valid = sample_with_replacement(logp, 5, g)
    assert valid.all() and torch.isin(idx, support).all()


# ---------------------------------------------------------------- sparse candidates


@pytest.mark.parametrize(
    "warp",
    [
        WarpConfig(1.0, 10, 0.9),
        WarpConfig(0.0, 10, 0.9),
        WarpConfig(0.7, 4, 0.5),
        WarpConfig(1.0, 10, 1.0),
        WarpConfig(1.0, 1, 0.9),
    ],
)
def test_warp_candidates_equal_dense_warp(warp: WarpConfig) -> None:
    """Same support as :func:`warp_logprobs` and the same values up to the normaliser's
    rounding, ties included (rows where ties straddle the top-p cut go the dense way)."""
    g = torch.Generator().manual_seed(3)
    sparse_rows = 0
    for trial in range(40):
        x = torch.randn(4, 3000, generator=g) * [0.5, 2.0, 6.0][trial % 3]
        if trial % 2:
            x = x.bfloat16()
        c = warp_candidates(x, warp)
        want = warp_logprobs(x, warp)
        got = c.to_dense(x.shape[-1])
        assert torch.equal(torch.isfinite(got), torch.isfinite(want)), trial
        torch.testing.assert_close(got, want, rtol=0, atol=2e-6)
        sparse_rows += 0 if c.dense else 1
        tok = torch.randint(0, x.shape[-1], (4,), generator=g)
        tok[0] = want[0].argmax()
        torch.testing.assert_close(c.logp_of(tok), want.gather(-1, tok[:, None]).squeeze(-1))
    assert sparse_rows >= 20  # the sparse form is what mostly runs, not the fallback


def test_warp_candidates_fall_back_to_dense() -> None:
    x = torch.randn(2, 300)
    assert warp_candidates(x, WarpConfig(1.0, 0, 0.9)).dense  # no top-k: whole vocabulary
    assert warp_candidates(torch.zeros(1, 300), WarpConfig(1.0, 5, 0.8)).dense  # tie overflow
    one = warp_candidates(x[0], WarpConfig(1.0, 8, 0.95))
    assert not one.dense and one.tokens.shape == one.logp.shape and one.tokens.dim() == 1


def test_candidate_sampling_matches_the_warped_distribution() -> None:
    """Chi-square of 20,000 draws against exp(logp) (fixed seed, alpha 1e-3)."""
    x = torch.randn(1000, generator=torch.Generator().manual_seed(4)) * 2
    c = warp_candidates(x, WarpConfig(1.0, 12, 0.95))
    p = warp_logprobs(x, WarpConfig(1.0, 12, 0.95)).exp()
    g = torch.Generator().manual_seed(5)
    n = 20_000
    draws = torch.stack([c.sample(g) for _ in range(n)])
    counts = torch.bincount(draws, minlength=1000).double()
    assert counts[p == 0].sum() == 0  # never outside the support
    live = p > 0
    expected = p[live].double() * n
    stat = float(((counts[live] - expected) ** 2 / expected).sum())
    df = int(live.sum()) - 1
    crit = chi2_critical(df, 1e-3)
    print(f"candidate sampling chi2 {stat:.1f} < {crit:.1f} (df {df})")
    assert stat < crit


@pytest.mark.parametrize("method", ["mtad", "mtjd"])
def test_beam_draft_same_with_dense_candidates(method, tiny_llama, monkeypatch) -> None:
    """Greedy beam drafting over sparse candidates equals drafting over the whole vocabulary."""
    import mtad.engine.runner as runner_module
    from mtad.engine import Decoder
    from mtad.engine.runner import ModelRunner
    from mtad.methods import build_method

    def dense(logits, warp):
        logp = warp_logprobs(logits, warp)
        return Candidates(torch.arange(logp.shape[-1]).expand(logp.shape), logp, True)

    def run() -> list[int]:
        m = build_method(method, gamma=3, beam_width=4, temperature=0.0, top_k=6, top_p=0.9)
        dec = Decoder(m, ModelRunner(tiny_llama[0]), ModelRunner(tiny_llama[1]))
        return dec.generate([3, 30, 60, 90], 24).token_ids

    sparse_out = run()
    # the beam draft warps through ModelRunner.candidates
    monkeypatch.setattr(runner_module, "warp_candidates", dense)
    assert run() == sparse_out


# ---------------------------------------------------------------- the CPU logits head


@pytest.fixture(scope="module")
def wide_llama():
    """A tiny Llama with a vocabulary large enough for ``head="auto"`` to pick the CPU head."""
    from mtad.engine.tiny import build_tiny_model

    return build_tiny_model("llama", "target", vocab_size=8192, seed=3)


def test_auto_head_choice(wide_llama, tiny_llama):
    from mtad.engine.heads import CPUHeadLM, head_for
    from mtad.engine.runner import ModelRunner

    assert isinstance(head_for(wide_llama, "auto"), CPUHeadLM)
    assert head_for(wide_llama, "stock") is wide_llama
    assert ModelRunner(tiny_llama[0]).lm_head == "stock"  # vocabulary 320: not worth a copy
    assert ModelRunner(tiny_llama[0], lm_head="fast").lm_head == "fast"
    with pytest.raises(ValueError, match="head"):
        head_for(wide_llama, "quick")


def test_auto_head_measures_bf16_too():
    """bfloat16 heads get the measured kernel choice as float32 ones do (issue 22: the old rule
    kept bf16 on the stock head unmeasured); float16 keeps the stock head."""
    from mtad.engine.runner import ModelRunner
    from mtad.engine.tiny import build_tiny_model

    model = build_tiny_model("llama", "target", vocab_size=8192, seed=3)
    assert ModelRunner(model.to(torch.bfloat16)).lm_head == "fast"
    assert ModelRunner(model.to(torch.float16)).lm_head == "stock"


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 9, 40])
def test_cpu_head_projection_matches_linear(wide_llama, rows):
    """Both kernels (1 row: transposed copy; more: W @ x.T) give F.linear's logits up to
    summation order, with the same shape and a contiguous result."""
    from mtad.engine.heads import CPUHeadLM

    head = CPUHeadLM(wide_llama)
    hidden = torch.randn(1, rows, wide_llama.config.hidden_size)
    got = head.project(hidden)
    want = wide_llama.lm_head(hidden)
    assert got.shape == want.shape and got.is_contiguous()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_cpu_head_greedy_tokens_equal_stock(wide_llama):
    """Greedy AR and SpS give the same tokens through the CPU head as through the stock one."""
    from mtad.engine import Decoder
    from mtad.engine.runner import ModelRunner
    from mtad.engine.tiny import build_tiny_model
    from mtad.methods import build_method

    draft = build_tiny_model("llama", "draft", vocab_size=8192, seed=3)
    outs = {}
    for head in ("stock", "fast"):
        for name, params in (("ar", {}), ("sps", {"gamma": 3})):
            dec = Decoder(
                build_method(name, temperature=0.0, **params),
                ModelRunner(wide_llama, lm_head=head),
                ModelRunner(draft, lm_head=head) if name == "sps" else None,
            )
            outs[head, name] = dec.generate([5, 17, 300, 4000], 24).token_ids
    assert outs["fast", "ar"] == outs["stock", "ar"] == outs["fast", "sps"] == outs["stock", "sps"]


def test_residual_on_candidates_equals_dense_residual() -> None:
    """SpS's residual norm(max(0, p - q)) computed on p's candidates equals the dense one,
    for sparse and dense q, and the SpS exactness test's setting does take the sparse path."""
    from mtad.methods.sps import residual_candidates, residual_logprobs

    warp = WarpConfig(1.0, 10, 0.9)
    g = torch.Generator().manual_seed(6)
    for _ in range(20):
        lp, lq = torch.randn(2, 500, generator=g) * 2
        p, q = warp_candidates(lp, warp), warp_candidates(lq, warp)
        assert not p.dense and not q.dense
        want = residual_logprobs(warp_logprobs(lp, warp), warp_logprobs(lq, warp))
        for qq in (q, Candidates(torch.arange(500), warp_logprobs(lq, warp), True)):
            got = residual_candidates(p, qq).to_dense(500)
            assert torch.equal(torch.isfinite(got), torch.isfinite(want))
            torch.testing.assert_close(got, want, rtol=0, atol=2e-6)
    assert not warp_candidates(torch.randn(8), WarpConfig(1.0, 6, 0.95)).dense
