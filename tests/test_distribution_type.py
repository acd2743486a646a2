"""One warped-distribution type (:class:`~mtad.engine.warping.Candidates`) for every method.

Its two layouts (sparse top-k candidates on the CPU, the whole vocabulary otherwise) must make
the same decisions: the same greedy outputs for all seven methods, the same SpecInfer walk and
MMTAD node for the same random draws, and draws from the same distribution (chi-square).
"""

from __future__ import annotations

import pytest
import torch
from method_params import METHOD_PARAMS
from stats import chi2_critical

import mtad.engine.warping as warping
from mtad.engine import Decoder, WarpConfig, warp_candidates
from mtad.engine.runner import ModelRunner
from mtad.engine.warping import Candidates, warp_logprobs
from mtad.methods import METHODS, build_method
from mtad.methods.beam import BeamDraft
from mtad.methods.mmtad import select_tree_node

WARP = WarpConfig(1.0, 8, 0.95)
ALPHA = 1e-3


def as_dense(c: Candidates, vocab: int) -> Candidates:
    return Candidates.from_logprobs(c.to_dense(vocab))


@pytest.mark.parametrize("name", sorted(METHODS))
def test_greedy_outputs_equal_on_sparse_and_dense_candidates(name, tiny_llama, monkeypatch):
    """Every method, greedy, gives the same tokens whether warping keeps sparse candidates
    (the CPU fast path) or whole-vocabulary rows (the path GPUs take)."""

    def run() -> list[int]:
        method = build_method(name, temperature=0.0, top_k=6, top_p=0.9, **METHOD_PARAMS[name])
        dec = Decoder(method, ModelRunner(tiny_llama[0]), ModelRunner(tiny_llama[1]))
        return dec.generate([3, 30, 60, 90], 24).token_ids

    assert not warp_candidates(torch.randn(300), WarpConfig(1.0, 6, 0.9)).dense
    sparse_out = run()
    monkeypatch.setattr(warping, "top_k_top_p_candidates", lambda *a: None)  # dense everywhere
    assert warp_candidates(torch.randn(300), WarpConfig(1.0, 6, 0.9)).dense
    assert run() == sparse_out


def test_specinfer_walk_takes_the_same_path_on_both_layouts():
    """Same draws, same accepted path: acceptance tests and residuals agree between layouts."""
    vocab = 200
    method = build_method("specinfer", branching=[3, 2], top_k=8, top_p=0.95)
    g = torch.Generator().manual_seed(0)
    paths = set()
    for trial in range(200):
        # 1 root + 3 + 6 nodes for the target; root + 3 internal nodes for the draft
        p_logits = torch.randn(10, vocab, generator=g) * 3
        q_logits = p_logits[:4] + torch.randn(4, vocab, generator=g)
        p_all, q_all = warp_candidates(p_logits, WARP), warp_candidates(q_logits, WARP)
        assert not p_all.dense and not q_all.dense
        tokens = torch.cat([q_all[0].draw(3, g), q_all[1:].draw(2, g).flatten()])
        runs = []
        for p, q in ((p_all, q_all), (as_dense(p_all, vocab), as_dense(q_all, vocab))):
            path, nxt = method.walk(p, q, tokens, torch.Generator().manual_seed(trial))
            runs.append(path)
        assert runs[0] == runs[1], trial
        paths.add(len(runs[0]))
    assert paths == {0, 1, 2}  # the trials reach every depth


def test_mmtad_selects_the_same_node_on_both_layouts():
    gamma, width, vocab = 3, 3, 150
    g = torch.Generator().manual_seed(1)
    depths_seen = set()
    for trial in range(200):
        logits = torch.randn(1 + gamma * width, vocab, generator=g) * 3
        sparse = warp_candidates(logits, WARP)
        parents = torch.randint(0, width, (gamma, width), generator=g)
        parents[0] = 0
        # drafted tokens: mostly among the parent row's candidates, sometimes off the support
        picks = torch.randint(0, vocab, (gamma, width), generator=g)
        rows = torch.cat(
            [torch.zeros(width, dtype=torch.long)]
            + [1 + (d - 1) * width + parents[d] for d in range(1, gamma)]
        )
        on_support = sparse.tokens[rows, torch.randint(0, 4, (gamma * width,), generator=g)]
        picks = torch.where(
            torch.rand(gamma, width, generator=g) < 0.8, on_support.view(gamma, width), picks
        )
        joint_logq = -torch.rand(gamma, width, generator=g).cumsum(0) * 2
        beams = BeamDraft(picks.T, joint_logq.T, joint_logq[-1], parents, picks, joint_logq)
        k_s, node_s = select_tree_node(sparse, beams, 0.3)
        k_d, node_d = select_tree_node(warp_logprobs(logits, WARP), beams, 0.3)
        assert (int(k_s), int(node_s)) == (int(k_d), int(node_d)), trial
        depths_seen.add(int(k_s))
    assert depths_seen == {0, 1, 2, 3}


@pytest.mark.parametrize("dense", [False, True])
def test_draw_is_iid_from_the_distribution(dense):
    """``draw(k)``: k i.i.d. tokens per row; chi-square of every column against exp(logp)."""
    vocab, k, n = 300, 4, 5000
    x = torch.randn(vocab, generator=torch.Generator().manual_seed(2)) * 2
    c = warp_candidates(x, WarpConfig(1.0, 12, 0.95))
    if dense:
        c = as_dense(c, vocab)
    assert c.dense == dense
    p = warp_logprobs(x, WarpConfig(1.0, 12, 0.95)).exp()
    g = torch.Generator().manual_seed(3)
    draws = torch.stack([c.draw(k, g) for _ in range(n)])  # [n, k]
    live = p > 0
    for col in range(k):
        counts = torch.bincount(draws[:, col], minlength=vocab).double()
        assert counts[~live].sum() == 0
        expected = p[live].double() * n
        stat = float(((counts[live] - expected) ** 2 / expected).sum())
        assert stat < chi2_critical(int(live.sum()) - 1, ALPHA), (col, stat)
    # independence across columns: the same token twice as often as sum(p^2) says
    same = (draws[:, 0] == draws[:, 1]).double().mean()
    assert abs(float(same) - float((p**2).sum())) < 4 * (float((p**2).sum()) / n) ** 0.5
    greedy = c.draw(k, None, greedy=True)
    assert greedy.tolist() == torch.topk(p, k).indices.tolist()


def test_greedy_tree_wider_than_the_candidate_window(tiny_llama):
    """Greedy SpecInfer whose first level has more children than sparse candidates exist
    (top-k 10 keeps 26) still builds its full tree and equals greedy AR."""
    c = warp_candidates(torch.randn(300), WarpConfig(0.0, 10, 0.9))
    assert not c.dense and c.logp.shape[-1] < 30
    picks = c.draw(30, None, greedy=True)
    live = int(torch.isfinite(c.logp).sum())  # the most likely first, as the candidates are
    assert picks.shape == (30,) and picks[:live].tolist() == c.tokens[:live].tolist()
    target, draft = tiny_llama

    def run(name: str, **params) -> list[int]:
        method = build_method(name, temperature=0.0, **params)
        return (
            Decoder(method, ModelRunner(target), ModelRunner(draft)).generate([3, 30], 12).token_ids
        )

    assert run("specinfer", branching=[30, 2]) == run("ar")
