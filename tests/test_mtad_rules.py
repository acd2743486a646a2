"""MTAD's verification rule and beam drafting, on hand-built tables and tiny models."""

from __future__ import annotations

import math

import pytest
import torch

from mtad.engine.runner import ModelRunner
from mtad.engine.tiny import build_tiny_model
from mtad.engine.warping import WarpConfig, warp_logprobs
from mtad.methods.beam import BeamSpec, beam_sample, renormalise
from mtad.methods.mtad import accept_longest_prefix, joint_log_ratios, verify_block


def table(rows: list[list[float]]) -> torch.Tensor:
    """Log of a hand-written probability table (rows need not sum to one for these checks)."""
    return torch.tensor(rows, dtype=torch.float64).log()


# ---------------------------------------------------------------- verification on hand tables


def test_longest_prefix_not_first_failure():
    # x = [0, 1, 2]. Position 1: p/q = 0.2/0.5 -> r1 = log 0.4 < log 0.5 (fails);
    # position 2: p/q = 0.9/0.6 -> r2 = log 0.6 > log 0.5 (passes); position 3: 0.1/0.8 fails.
    logp = table([[0.2, 0.3, 0.5], [0.05, 0.9, 0.05], [0.1, 0.1, 0.1], [0.3, 0.3, 0.4]])
    x = torch.tensor([0, 1, 2])
    logq_x = torch.tensor([0.5, 0.6, 0.8], dtype=torch.float64).log()
    r = joint_log_ratios(logp[:3].gather(1, x[:, None]).squeeze(1), logq_x)
    assert r[0] < math.log(0.5) < r[1] and r[2] < math.log(0.5)
    assert int(verify_block(logp, x, logq_x, tau=0.5)) == 2  # a first-failure rule would say 0


def test_none_and_all_pass():
    x = torch.tensor([1, 1])
    logp = table([[0.5, 0.5], [0.5, 0.5], [0.5, 0.5]])
    low_q = torch.tensor([0.1, 0.1], dtype=torch.float64).log()  # p/q = 5 each: all pass
    high_q = torch.tensor([1.0, 1.0], dtype=torch.float64).log()  # p/q = 0.5, then 0.25
    assert int(verify_block(logp, x, low_q, tau=1.0)) == 2
    assert int(verify_block(logp, x, high_q, tau=0.6)) == 0
    assert int(verify_block(logp, x, high_q, tau=0.5 - 1e-9)) == 1  # 0.5 > 0.5 - eps passes


@pytest.mark.parametrize(
    ("ratios", "tau", "expected"),
    [
        ([1.0, 1.0, 1.0], 1.0, 0),  # r_i == log tau: strict inequality, nothing passes
        ([1.0, 1.0, 1.0 + 1e-6], 1.0, 3),  # only the full block edges above 1
        ([0.5, 0.5, 0.5], 1.0, 0),
        ([0.5, 0.5, 0.5], 0.125, 2),  # r3 = 0.125 == tau fails, r2 = 0.25 passes
        ([1e-30, 1.0, 1.0], 1e-20, 0),
        ([0.0, 2.0, 2.0], 1e-9, 0),  # a zero-probability target token: -inf, never passes
        ([0.9, 0.0, 1.0], 0.5, 1),
    ],
)
def test_tau_edges(ratios: list[float], tau: float, expected: int):
    log_ratios = torch.tensor(ratios, dtype=torch.float64).log().cumsum(0)
    assert int(accept_longest_prefix(log_ratios, tau)) == expected


# ---------------------------------------------------------------- beam drafting


def small_runner(vocab: int = 12, seed: int = 3) -> ModelRunner:
    return ModelRunner(build_tiny_model("llama", "target", vocab_size=vocab, seed=seed))


def test_without_replacement_never_repeats_a_pair():
    runner = small_runner()
    warp = WarpConfig(1.0, 0, 1.0)
    for seed in range(25):
        runner.reset()
        g = torch.Generator().manual_seed(seed)
        beams = beam_sample(runner, torch.tensor([1, 2, 3]), BeamSpec(4, 4, warp), g)
        for parent, tok in zip(beams.parents, beams.picks, strict=True):
            pairs = {(int(p), int(t)) for p, t in zip(parent, tok, strict=True)}
            assert len(pairs) == parent.numel()
        assert len({tuple(row.tolist()) for row in beams.tokens}) == 4


def brute_force_beam_search(model, prefix: list[int], gamma: int, width: int, warp: WarpConfig):
    """Reference top-B beam search: full no-cache forwards, joint warped log-probs."""
    beams: list[tuple[list[int], float]] = [([], 0.0)]
    for _ in range(gamma):
        candidates = []
        for seq, score in beams:
            with torch.no_grad():
                logits = model(torch.tensor([prefix + seq])).logits[0, -1]
            logq = warp_logprobs(logits, warp)
            for v in range(logq.shape[0]):
                if math.isfinite(float(logq[v])):
                    candidates.append((seq + [v], score + float(logq[v])))
        candidates.sort(key=lambda c: -c[1])
        beams = candidates[:width]
    return beams


@pytest.mark.parametrize(("top_k", "width"), [(0, 3), (5, 4)])
def test_greedy_beam_equals_brute_force(top_k: int, width: int):
    runner = small_runner()
    warp = WarpConfig(0.0, top_k, 1.0)
    prefix = [4, 7, 1]
    beams = beam_sample(runner, torch.tensor(prefix), BeamSpec(3, width, warp), torch.Generator())
    ref = brute_force_beam_search(runner.model, prefix, 3, width, warp.scoring())
    got = sorted(zip(beams.tokens.tolist(), beams.logw.tolist(), strict=True), key=lambda b: -b[1])
    assert [seq for seq, _ in got] == [seq for seq, _ in ref]
    # normalised weights are the joint probabilities renormalised over the beams
    ref_logw = torch.tensor([s for _, s in ref], dtype=torch.float64)
    ref_logw = ref_logw - torch.logsumexp(ref_logw, 0)
    assert torch.allclose(
        torch.tensor([w for _, w in got], dtype=torch.float64), ref_logw, atol=1e-4
    )
    # the chosen beam is the max-weight one, i.e. the brute-force best sequence
    assert beams.tokens[beams.best].tolist() == ref[0][0]


def test_fewer_beams_survive_and_no_zero_probability_token():
    runner = small_runner()
    warp = WarpConfig(1.0, 2, 1.0)  # top-k 2 with B 4: only two first tokens are possible
    for seed in range(30):
        runner.reset()
        g = torch.Generator().manual_seed(seed)
        for replacement in (False, True):
            runner.reset()
            beams = beam_sample(runner, torch.tensor([5, 6]), BeamSpec(1, 4, warp, replacement), g)
            alive = beams.alive
            if not replacement:
                assert int(alive.sum()) == 2  # fewer beams survive
            assert torch.isfinite(beams.logq[alive]).all()
            runner.reset()
            beams = beam_sample(runner, torch.tensor([5, 6]), BeamSpec(3, 4, warp, replacement), g)
            alive = beams.alive
            assert torch.isfinite(beams.logq[alive]).all()  # no zero-probability drafted token
            best = beams.best
            assert bool(alive[best]) and torch.isfinite(beams.logq[best]).all()
            assert torch.allclose(beams.logw[alive].exp().sum(), torch.tensor(1.0))


def test_renormalise_is_w_over_sum_w_and_keeps_dead_beams_dead():
    probs = torch.tensor([0.3, 0.1, 0.0, 0.0])
    logw = renormalise(probs.log())
    assert torch.allclose(logw.exp(), probs / probs.sum())
    assert torch.isinf(logw[2:]).all()
    # The authors' non-tree fault: log_softmax applied to probabilities gives the dead beams
    # weight exp(0)/Z > 0, so a zero-probability token could win later comparisons.
    faulty = torch.log_softmax(probs, dim=0)
    assert torch.isfinite(faulty[2:]).all() and not torch.allclose(faulty.exp(), logw.exp())


def test_mtad_with_topk_below_beam_width_stays_finite(tiny_llama):
    from mtad.engine import Decoder
    from mtad.methods import build_method

    target, draft = tiny_llama
    method = build_method("mtad", gamma=3, beam_width=4, tau=0.5, top_k=2, top_p=1.0)
    decoder = Decoder(method, ModelRunner(target), ModelRunner(draft), seed=0)
    for seed in range(8):
        out = decoder.generate([1, 2, 3], 24, seed=seed)
        assert len(out.token_ids) == 24
        assert out.stats.accepted <= out.stats.drafted


# ---------------------------------------------------------------- MMTAD tree selection


def hand_beams() -> tuple:
    from mtad.methods.beam import BeamDraft

    # depth 1: a0 = token 0, a1 = token 1 (both under the root);
    # depth 2: b0 = token 2 under a1, b1 = token 3 under a0.
    picks = torch.tensor([[0, 1], [2, 3]])
    parents = torch.tensor([[0, 0], [1, 0]])
    joint_logq = torch.tensor([[0.5, 0.3], [0.2, 0.1]]).log()
    beams = BeamDraft(
        tokens=torch.tensor([[1, 2], [0, 3]]),
        logq=torch.zeros(2, 2),
        logw=torch.zeros(2),
        parents=parents,
        picks=picks,
        joint_logq=joint_logq,
    )
    uniform = [0.25, 0.25, 0.25, 0.25]
    logp = table(
        [
            [0.2, 0.3, 0.25, 0.25],  # root: p(a0) = 0.2, p(a1) = 0.3
            [0.05, 0.0, 0.05, 0.9],  # after a0: p(b1 = 3) = 0.9
            [0.25, 0.25, 0.5, 0.0],  # after a1: p(b0 = 2) = 0.5
            uniform,
            uniform,
        ]
    ).float()
    return beams, logp


def test_mmtad_accepts_deepest_depth_and_best_target_node():
    from mtad.methods.mmtad import beam_tree, select_tree_node

    beams, logp = hand_beams()
    tokens, parents, depths = beam_tree(beams)
    assert tokens.tolist() == [0, 1, 2, 3]
    assert parents.tolist() == [-1, -1, 1, 0] and depths.tolist() == [1, 1, 2, 2]
    # depth 1: a0 0.2/0.5 = 0.4 fails, a1 0.3/0.5 = 0.6 passes; depth 2 (max q 0.2):
    # b0 0.3*0.5/0.2 = 0.75 and b1 0.2*0.9/0.2 = 0.9 pass; b1 has the larger target joint.
    k, node = select_tree_node(logp, beams, tau=0.5)
    assert int(k) == 2 and int(node) == 3
    k, node = select_tree_node(logp, beams, tau=0.8)  # only b1 passes at depth 2
    assert int(k) == 2 and int(node) == 3
    k, node = select_tree_node(logp, beams, tau=0.95)  # nothing passes anywhere
    assert int(k) == 0 and int(node) == -1
