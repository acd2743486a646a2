"""The exact methods stay exact in bfloat16 and with a frequency-ranked draft vocabulary
(FR-Spec, :mod:`mtad.engine.subvocab`): the chi-square goodness-of-fit test of
``tests/test_engine.py`` (alpha = 1e-3, 1000 runs of two tokens), on bf16 models and on a
draft that can propose only part of the vocabulary (issue #17)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from stats import chi2_critical
from test_engine import ALPHA, RUNS, VOCAB, chi2_statistic, exact_two_token_dist, sample_two_tokens

from mtad.engine import Decoder
from mtad.engine.loading import ModelSpec, load_model
from mtad.engine.runner import ModelRunner, vocab_size_of
from mtad.engine.subvocab import (
    VOCAB_FILE,
    SubVocabHead,
    frequency_ranked_ids,
    read_vocab,
    restrict_vocab,
)
from mtad.engine.tiny import build_tiny_model
from mtad.engine.warping import WarpConfig
from mtad.methods import build_method

WARP = WarpConfig(1.0, 6, 0.95)
PROMPT = [3, 1, 4]
METHOD = {"sps": {"gamma": 2}, "blockverify": {"gamma": 2}, "specinfer": {"branching": [2, 2]}}


def _pair(dtype: torch.dtype):
    target = build_tiny_model("llama", "target", vocab_size=VOCAB, seed=11).to(dtype)
    # tests/test_engine.py's pair: an unrelated one-layer draft
    draft = build_tiny_model("llama", "draft", vocab_size=VOCAB, seed=12).to(dtype)
    return target, draft


def _chi2(target, draft, name: str) -> tuple[float, float]:
    decoder = Decoder(
        build_method(name, temperature=1.0, top_k=6, top_p=0.95, **METHOD[name]),
        ModelRunner(target),
        ModelRunner(draft),
    )
    exact = exact_two_token_dist(target, PROMPT, WARP).float()
    stat, df = chi2_statistic(sample_two_tokens(decoder, VOCAB, RUNS), exact, RUNS)
    return stat, chi2_critical(df, ALPHA)


@pytest.mark.parametrize("name", list(METHOD))
def test_exact_methods_reproduce_the_target_in_bfloat16(name):
    stat, critical = _chi2(*_pair(torch.bfloat16), name)
    print(f"{name} bf16 chi2 {stat:.1f} < {critical:.1f}")
    assert stat < critical, f"{name} in bf16 deviates from the target: {stat:.1f} > {critical:.1f}"


@pytest.mark.parametrize("name", list(METHOD))
def test_exact_with_a_draft_that_proposes_part_of_the_vocabulary(name):
    target, draft = _pair(torch.float32)
    kept = [5, 0, 2, 7]  # the target's text uses the other ids too: only it can produce them
    restrict_vocab(draft, kept)
    with torch.no_grad():
        logits = draft(torch.tensor([PROMPT])).logits[0, -1]
    assert torch.isinf(logits[[1, 3, 4, 6]]).all() and torch.isfinite(logits[kept]).all()
    exact = exact_two_token_dist(target, PROMPT, WARP)
    assert exact[[1, 3, 4, 6]].sum() > 0.1  # mass the draft cannot propose
    stat, critical = _chi2(target, draft, name)
    print(f"{name} sub-vocabulary draft chi2 {stat:.1f} < {critical:.1f}")
    assert stat < critical, f"{name} with a sub-vocabulary draft deviates: {stat:.1f}"


def test_sub_vocabulary_head_keeps_the_kept_logits_and_the_vocabulary_width(tiny_llama):
    _, draft = tiny_llama
    x = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        full = draft(x).logits
    ids = list(range(0, 320, 3))
    head = SubVocabHead(draft.get_output_embeddings().weight, torch.tensor(ids))
    with torch.no_grad():
        hidden = draft.model(input_ids=x).last_hidden_state
        sub = head(hidden)
    assert sub.shape == full.shape
    torch.testing.assert_close(sub[..., ids], full[..., ids], rtol=1e-5, atol=1e-5)
    assert torch.isinf(sub[..., 1]).all()


def test_frequency_ranked_ids_and_the_local_loader(tmp_path):
    ids = frequency_ranked_ids([[4, 4, 4, 2, 2, 9], [2, 7]], vocab_size=12, k=2, always=[11])
    assert ids == [2, 4, 11]  # 2 (x3) before 4 (x3) by id, then the special token
    draft = build_tiny_model("llama", "draft", vocab_size=320, seed=0)
    draft.save_pretrained(tmp_path)
    (tmp_path / VOCAB_FILE).write_text(json.dumps({"ids": [5, 6, 7], "source": "test"}))
    assert read_vocab(tmp_path) == [5, 6, 7]
    model, _ = load_model(ModelSpec(loader="local", path=str(tmp_path)))
    assert isinstance(model.get_output_embeddings(), SubVocabHead)
    assert vocab_size_of(model) == 320
    (tmp_path / VOCAB_FILE).write_text(json.dumps({"ids": [5, 5]}))
    with pytest.raises(ValueError, match="distinct"):
        read_vocab(tmp_path)


def test_draft_vocab_script_ranks_response_tokens_only(tmp_path):
    import importlib.util

    import numpy as np

    spec = importlib.util.spec_from_file_location(
        "draft_vocab", Path(__file__).resolve().parents[1] / "scripts" / "draft_vocab.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    # two sequences: prompt tokens (9s) must not count, responses use 4 (x3) and 6 (x1)
    seqs = [[9, 9, 9, 4, 4, 6], [9, 9, 4]]
    np.savez(
        tmp_path / "data.npz",
        tokens=np.array(sum(seqs, []), dtype=np.uint16),
        lens=np.array([6, 3]),
        plens=np.array([3, 2]),
        kinds=np.array(["a", "b"]),
        gen_tokens=4,
        gen_tokens_greedy=0,
    )
    folder = tmp_path / "draft"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"vocab_size": 12, "eos_token_id": 2}))
    info = mod.main([str(tmp_path / "data.npz"), str(folder), "--k", "1"])
    assert info["ids"] == [4, 2] and info["coverage"] == 0.75
    assert read_vocab(folder) == [4, 2]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compact_rows_give_the_full_width_rows_candidates(dtype):
    """Warping an FR-Spec head's compact rows (ModelRunner.candidates) keeps the candidates of
    the full-width row, ids and values, also with equal values at the top-k / top-p cuts."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randperm(320, generator=gen)[:120].sort().values
    warp = WarpConfig(1.0, 10, 0.9)
    draft = build_tiny_model("llama", "draft", vocab_size=320, seed=0).to(dtype)
    restrict_vocab(draft, ids.tolist())
    runner = ModelRunner(draft)
    assert runner.lm_head == "subvocab"
    head = draft.get_output_embeddings()
    for trial in range(40):
        sub = torch.randn(4, ids.numel(), generator=gen).to(dtype)
        if trial % 2:  # coarse values: many ties, some across the cuts
            sub = (sub * 2).round() / 2
        compact = runner.candidates(sub, warp)
        full = runner.candidates(head.widen(sub), warp)
        assert not compact.dense
        torch.testing.assert_close(compact.logp, full.logp, rtol=0, atol=0)
        # the kept candidates (the distribution); slack candidates past the cuts (logp -inf)
        # may be other tokens of equal value at the window's edge
        kept = torch.isfinite(full.logp)
        assert torch.equal(compact.tokens[kept], full.tokens[kept])


@pytest.mark.parametrize("name", ["sps", "blockverify", "specinfer", "bild", "mtad", "mmtad"])
def test_compact_draft_rows_decode_the_same_tokens_as_full_width_rows(name):
    """Every drafting method samples the same tokens whether the draft's FR-Spec head hands
    it compact rows or full-width ones (same seed): the fast path changes no draw."""
    target = build_tiny_model("llama", "target", vocab_size=320, seed=1)
    draft = build_tiny_model("llama", "draft", vocab_size=320, seed=2)
    restrict_vocab(draft, list(range(0, 320, 2)))
    outs = []
    for compact in (True, False):
        runner = ModelRunner(draft)
        if not compact:
            runner.vocab_ids = None  # the full-width rows of the same head
        decoder = Decoder(build_method(name), ModelRunner(target), runner, seed=0)
        outs.append(decoder.generate(torch.tensor(PROMPT), 24, seed=3).token_ids)
    assert outs[0] == outs[1]
