"""The CPU form of MTAD's beam draft (host-side bookkeeping, issue 39) against the tensor form
it replaces: the same draws, weights, beams and cache, bit for bit, with fixed seeds, on model
drafts and on feature heads (full vocabulary and FR-Spec sub-vocabulary), sampled and greedy,
sparse (top-k) and dense warping; and the CPU top-k candidates against their tensor path."""

from __future__ import annotations

import itertools

import pytest
import torch

import mtad.engine._warping_cpu as warping_cpu
from mtad.engine import Decoder
from mtad.engine.feature_head import FeatureHead, HeadSpec
from mtad.engine.head_runner import HeadRunner
from mtad.engine.runner import ModelRunner
from mtad.engine.tiny import build_tiny_model
from mtad.engine.warping import WarpConfig, warp_candidates
from mtad.methods import build_method
from mtad.methods.beam import BeamSpec, _beam_sample_host, _beam_sample_tensors

VOCAB = 320
WARPS = {
    "top-k top-p": WarpConfig(1.0, 10, 0.9),
    "top-k 3": WarpConfig(1.0, 3, 1.0),  # fewer candidates than beams at width 4: dead beams
    "T 0.7, no top-k": WarpConfig(0.7, 0, 0.9),  # dense rows
    "greedy": WarpConfig(0.0, 10, 0.9),
}


@pytest.fixture(scope="module")
def target():
    return build_tiny_model("llama", "target", vocab_size=VOCAB, seed=3).eval()


def head_runner(target, vocab_ids=None, dtype=torch.float32):
    torch.manual_seed(0)
    model = target.to(dtype)
    head = FeatureHead(
        model.config,
        HeadSpec(taps=[1, 2, 3]),
        model.get_input_embeddings(),
        model.get_output_embeddings().weight.detach(),
        vocab_ids,
    )
    with torch.no_grad():
        for p in head.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 1.2 / p.shape[1] ** 0.5)
    head = head.to(dtype).eval()
    t = ModelRunner(model, "target", feature_taps=head.spec.taps)
    return t, HeadRunner(head, t)


def cache_state(runner) -> list[torch.Tensor]:
    layers = runner.cache.layers
    out = [runner.cached_ids.clone()]
    for layer in layers:
        out += [layer.keys.clone(), layer.values.clone()]
    if getattr(runner, "last", None) is not None:
        out.append(runner.last.clone())
    return out


def run_both(make, ids, gamma, width, warp, seed, reorder_last):
    """The tensor form and the host form from equal starting points: results, generator
    states afterwards and the draft caches."""
    out = []
    for fn in (_beam_sample_tensors, _beam_sample_host):
        runner, prepare = make()
        prepare()
        g = torch.Generator().manual_seed(seed)
        beams = fn(runner, ids, BeamSpec(gamma, width, warp), g, reorder_last)
        out.append((beams, g.get_state(), cache_state(runner)))
    return out


def assert_same(a, b):
    (ba, ga, ca), (bb, gb, cb) = a, b
    for name in ("tokens", "logq", "logw", "parents", "picks", "joint_logq"):
        x, y = getattr(ba, name), getattr(bb, name)
        assert x.dtype == y.dtype and x.shape == y.shape, name
        assert torch.equal(x, y), f"{name}: {x} != {y}"
    assert torch.equal(ga, gb), "the generators were consumed differently"
    assert len(ca) == len(cb) and all(torch.equal(x, y) for x, y in zip(ca, cb, strict=True))


@pytest.mark.parametrize("warp", list(WARPS), ids=list(WARPS))
@pytest.mark.parametrize("reorder_last", [True, False])
def test_host_beam_draft_equals_tensor_form_on_a_model_draft(target, warp, reorder_last):
    ids = torch.tensor([5, 9, 2, 77, 31, 4])
    runner = ModelRunner(target, "draft")

    def make():
        return runner, runner.reset

    for seed in range(6):
        for gamma, width in ((1, 4), (3, 4), (4, 3)):
            assert_same(*run_both(make, ids, gamma, width, WARPS[warp], seed, reorder_last))


@pytest.mark.parametrize("sub", [False, True], ids=["full vocab", "sub-vocab"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("warp", list(WARPS), ids=list(WARPS))
def test_host_beam_draft_equals_tensor_form_on_a_feature_head(target, sub, dtype, warp):
    vocab_ids = torch.arange(0, VOCAB, 3) if sub else None
    t, draft = head_runner(target, vocab_ids, dtype)
    ids = torch.tensor([5, 9, 2, 77, 31, 4, 18, 250])

    def make():
        def prepare():
            t.reset()
            draft.reset()
            t.feed(ids[:-1])  # the target's features of the context, as MTAD's loop has them

        return draft, prepare

    try:
        for seed in range(6):
            for reorder_last in (True, False):
                assert_same(*run_both(make, ids, 3, 4, WARPS[warp], seed, reorder_last))
    finally:
        target.float()


@pytest.mark.parametrize("draft_kind", ["model", "head"])
def test_mtad_generation_unchanged_by_the_host_form(target, draft_kind, monkeypatch):
    """Whole MTAD generations: the host form, with the best beam's row selected before the
    last reorder, commits the same tokens as the tensor form with its full reorder (the code
    before). A model draft keeps accepted drafted positions in its cache, so a wrong row
    there changes later drafts; a head recomputes them from the target's features."""
    import mtad.methods.beam as beam
    import mtad.methods.mtad as mtad_module

    if draft_kind == "head":
        t, draft = head_runner(target, torch.arange(0, VOCAB, 2))
    else:
        t = ModelRunner(target, "target")
        draft = ModelRunner(build_tiny_model("llama", "draft", vocab_size=VOCAB, seed=3), "draft")
    prompt = list(range(11, 30))

    def generate():
        dec = Decoder(build_method("mtad", gamma=3, beam_width=4), t, draft)
        return [dec.generate(prompt, 40, seed=s).token_ids for s in range(6)]

    got = generate()

    # the reference: the tensor form with its full reorder after the last step, where row
    # ``b`` holds beam ``b``: MTAD's row choice parents[-1][best] is then ``best`` itself when
    # the last parents read as the identity
    def old(runner, ids, spec, gen, reorder_last=True):
        return _reordered(beam._beam_sample_tensors(runner, ids, spec, gen))

    monkeypatch.setattr(mtad_module, "beam_sample", old)
    assert generate() == got


def _reordered(beams):
    """The same beams with the last parents read as the identity."""
    from dataclasses import replace

    parents = beams.parents.clone()
    parents[-1] = torch.arange(parents.shape[1])
    return replace(beams, parents=parents)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_host_top_k_candidates_equal_the_tensor_path(dtype, monkeypatch):
    gen = torch.Generator().manual_seed(0)
    checked = 0
    for trial in range(300):
        rows, vocab = (1, 2, 4, 5)[trial % 4], (12289, 320, 40, 26)[trial % 4]
        x = torch.randn(rows, vocab, generator=gen) * (0.1, 1.0, 3.0, 30.0)[trial % 4]
        if trial % 3 == 0:
            x = x.round()  # many equal values
        if trial % 11 == 0:
            x[0, :5] = float("-inf")
        if trial % 13 == 0:
            x[-1, 3] = float("inf")
        if trial % 17 == 0:
            x[0, 1] = float("nan")
        if trial % 19 == 0:
            x[:] = x[:, :1]  # a whole row of one value: the window overflows
        x = x.to(dtype)
        for (top_k, top_p), normalise in itertools.product(
            ((10, 0.9), (1, 0.5), (5, 1.0), (20, 0.95)), (False, True)
        ):
            if top_k >= vocab:
                continue
            got = warping_cpu.top_k_top_p_candidates(x, top_k, top_p, normalise)
            monkeypatch.setattr(warping_cpu, "_HOST_MAX", 0)  # the tensor path
            ref = warping_cpu.top_k_top_p_candidates(x, top_k, top_p, normalise)
            monkeypatch.undo()
            assert (got is None) == (ref is None)
            if got is not None:
                assert torch.equal(got[0], ref[0])
                assert got[1].dtype == ref[1].dtype
                assert torch.equal(got[1].nan_to_num(7.0), ref[1].nan_to_num(7.0))
                assert torch.equal(got[1].signbit(), ref[1].signbit())
                checked += 1
    assert checked > 1000
    # and through the public warping, on the rows a draft step warps
    logits = (torch.randn(4, 12289, generator=gen) * 3).to(dtype)
    a = warp_candidates(logits, WarpConfig(1.0, 10, 0.9))
    monkeypatch.setattr(warping_cpu, "_HOST_MAX", 0)
    b = warp_candidates(logits, WarpConfig(1.0, 10, 0.9))
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.logp, b.logp)


def test_host_top_p_cut_equals_float32_at_the_boundary(monkeypatch):
    """Top-p decided in float64 on the host equals float32's cut, also for rows whose
    exclusive sums land on ``top_p`` (equal values: k values of 1/k each), where the host
    hands the cut back to the tensor ops; with no margin it would not (checked)."""
    rng = torch.Generator().manual_seed(1)

    def cases():
        tail = -6.0 - 0.05 * torch.arange(320)  # distinct: no overflow of the window
        for k in range(1, 13):
            for top_p in (0.2, 0.3, 1 / 3, 0.4, 0.5, 0.6, 2 / 3, 0.75, 0.8, 0.9, 0.95):
                x = tail.repeat(2, 1)
                x[:, :k] = 0.0
                x[1, k : k + 3] = -0.5
                yield x, min(10, k + 3), top_p
        for i in range(200):
            x = tail.repeat(4, 1)
            x[:, :12] = torch.randint(-3, 3, (4, 12), generator=rng) * (0.25, 0.5, 1.0)[i % 3]
            yield x.to(torch.bfloat16), 10, (0.5, 0.8, 0.9, 0.95)[i % 4]

    def both(x, top_k, top_p):
        got = warping_cpu.top_k_top_p_candidates(x, top_k, top_p, True)
        with monkeypatch.context() as m:
            m.setattr(warping_cpu, "_HOST_MAX", 0)
            ref = warping_cpu.top_k_top_p_candidates(x, top_k, top_p, True)
        return got, ref

    checked = 0
    for x, top_k, top_p in cases():
        got, ref = both(x, top_k, top_p)
        assert (got is None) == (ref is None)
        if got is not None:
            assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1]), (top_k, top_p)
            checked += 1
    assert checked > 250
    monkeypatch.setattr(warping_cpu, "_TOP_P_MARGIN", 0.0)
    differs = 0
    for x, top_k, top_p in cases():
        got, ref = both(x, top_k, top_p)
        differs += got is not None and not torch.equal(got[1], ref[1])
    assert differs, "the boundary cases no longer reach the margin: the test tests nothing"
