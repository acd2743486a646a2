"""Fast checks of the distillation pieces (no real model): warping, objectives, overlap check."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from mtad.engine.warping import WarpConfig, warp_logprobs
from mtad_train import objectives as O
from mtad_train.data import Buffer
from mtad_train.drafts import DraftSpec, build_draft
from mtad_train.overlap import filter_pool, normalise, overlap_report
from mtad_train.train import train_step

REPO = Path(__file__).resolve().parents[1]


def _load_script():
    """The command line (``parse_args``) lives in the script, the run in mtad_train."""
    spec = importlib.util.spec_from_file_location(
        "distill_draft", REPO / "scripts" / "distill_draft.py"
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules["distill_draft"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize(
    "warp", [WarpConfig(1.0, 10, 0.9), WarpConfig(0.7, 5, 0.8), WarpConfig(1.0, 10, 1.0)]
)
def test_sparse_warp_matches_harness_warping(warp):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 300, generator=g) * 3
    idx, vals, keep, logz = O.sparse_warp(logits, warp)
    dense = torch.zeros_like(logits)
    dense.scatter_(-1, idx, torch.where(keep, (vals - logz).exp(), torch.zeros_like(vals)))
    ref = warp_logprobs(logits, warp).exp()
    assert torch.allclose(dense, ref, atol=1e-6)


def test_warped_overlap_is_exact_expected_acceptance_and_differentiable():
    g = torch.Generator().manual_seed(1)
    t = torch.randn(32, 200, generator=g) * 2
    d = (t + torch.randn(32, 200, generator=g)).requires_grad_(True)
    ov = O.warped_overlap(t, d)
    exact = O.heldout_metrics(t, d.detach())["accept"]
    assert torch.allclose(ov.detach(), exact, atol=1e-5)
    (1 - ov).sum().backward()
    assert d.grad is not None and torch.isfinite(d.grad).all() and d.grad.abs().sum() > 0
    same = O.warped_overlap(t, t.clone())
    assert torch.allclose(same, torch.ones_like(same), atol=1e-5)


def test_forward_kl_matches_definition():
    g = torch.Generator().manual_seed(2)
    t, d = torch.randn(8, 50, generator=g), torch.randn(8, 50, generator=g)
    tl = torch.log_softmax(t, -1)
    ref = (tl.exp() * (tl - torch.log_softmax(d, -1))).sum(-1)
    assert torch.allclose(O.forward_kl(tl, d), ref, atol=1e-6)
    assert torch.allclose(O.forward_kl(tl, t), torch.zeros(8), atol=1e-6)


def test_overlap_check_finds_and_filters_shared_ngrams():
    evals = {
        "humaneval": [
            'def add(a, b):\n    """Add two numbers a and b together and return the sum"""'
        ]
    }
    pool = [
        {"text": "Please add two numbers a and b together and return the sum quickly."},
        {"text": "Write a story about a lighthouse."},
        {"text": "DEF add(a,b): add two numbers"},
    ]
    texts = [p["text"] for p in pool]
    rep = overlap_report(texts, evals, n=8)
    assert rep["overlapping_items"]["humaneval"] == 1 and not rep["disjoint"]
    kept, dropped = filter_pool(pool, texts, evals, n=8)
    assert len(kept) == 2 and dropped == {"humaneval": 1}
    assert normalise("Hello, World_1!") == ["hello", "world_1"]
    # an exact (normalised) prompt match counts even when shorter than n words
    assert (
        overlap_report(["def  ADD(a, b)"], {"x": ["def add(a,b)"]}, n=8)["overlapping_items"]["x"]
        == 1
    )


def test_pool_items_have_text_and_no_sql():
    import random

    from mtad_train.pool import SQL_RE, item_text
    from mtad_train.templates import templated_chats

    items = list(templated_chats(random.Random(0), 200))
    assert all(item_text(it) and not SQL_RE.search(item_text(it)) for it in items)
    assert SQL_RE.search("SELECT name FROM singer") and SQL_RE.search("create table t (a int)")


def test_draft_spec_and_tiny_training_step():
    mod = _load_script()
    spec = DraftSpec.parse("X:layers=1,hidden=32,intermediate=64,heads=2,kv_heads=1,tv_weight=0.5")
    assert (spec.layers, spec.hidden, spec.tv_weight) == (1, 32, 0.5)
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=True,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    target = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # a peaked target, so that the draft has something to learn
        target.model.norm.weight.mul_(30.0)
    args = mod.parse_args(
        [
            "--out",
            "/tmp/unused",
            "--max-steps",
            "1",
            "--device",
            "cpu",
            "--tokens-per-step",
            "256",
            "--micro-tokens",
            "128",
            "--autocast",
            "off",
        ]
    )
    draft = build_draft(spec, target, args)
    buf = Buffer()
    g = torch.Generator().manual_seed(0)
    for _ in range(8):
        seq = torch.randint(3, 97, (20,), generator=g).tolist()
        buf.add(seq[:8], seq[8:], "chat", False)
    opt = torch.optim.AdamW(draft.parameters(), lr=3e-3)
    import random

    losses = []
    for _ in range(8):
        stats, ntok = train_step(args, target, [draft], [opt], [spec], buf, random.Random(0), 3e-3)
        losses.append(stats["X"]["kl"])
    assert ntok > 0 and losses[-1] < losses[0]


def test_command_options_are_the_dataclasses_fields():
    """Every training command's options come from its dataclass: the defaults parsed from an
    empty command line are the dataclass's own (one place: HeadTrainConfig's reg_weight is what
    ``train_head.py train`` gets), and lists of numbers take commas as before."""
    import argparse
    from dataclasses import asdict

    from mtad_train.cli import subcommands
    from mtad_train.config import DistillConfig, HeadTrainCommand
    from mtad_train.head_commands import COMMANDS
    from mtad_train.head_train import HeadTrainConfig

    got = asdict(_load_script().parse_args(["--out", "o", "--max-steps", "1"]))
    assert got == asdict(DistillConfig(out="o", max_steps=1))
    with pytest.raises(ValueError, match="--init-from"):
        DistillConfig(out="o", eval_only=True)
    assert COMMANDS["train"][0] is HeadTrainCommand

    def parse(*argv):  # the train command's config, not run
        commands = {**COMMANDS, "train": (HeadTrainCommand, lambda c: c, "")}
        return subcommands(argparse.ArgumentParser(), commands, ["train", *argv])

    cfg = parse("--features", "f", "--out", "o", "--ckpt-dir", "c")
    assert cfg.train == HeadTrainConfig() and cfg.train.reg_weight == 1.0
    cfg = parse("--features", "f", "--out", "o", "--ckpt-dir", "c", "--depth-weights", "1,0.5")
    assert cfg.train.depth_weights == [1.0, 0.5, 1.0, 1.0]  # padded to the depths


def test_ids_file_round_trip_and_micro_batches(tmp_path):
    """The data.npz layout written and read back (extras kept, responses after the prompt),
    and the one micro-batcher: sorted by length (stable), padded cells within the budget."""
    from mtad_train.batches import micro_batches
    from mtad_train.ids import read_ids, read_kinds, write_ids

    seqs, plens, kinds = [[1, 2, 3, 4], [5, 6], [7, 8, 9]], [2, 1, 1], ["a", "b", "a"]
    for compress in (True, False):
        path = tmp_path / f"d{int(compress)}.npz"
        write_ids(path, seqs, plens, kinds, compress=compress, gen_tokens=4)
        ids = read_ids(path)
        assert ids.lists() == seqs and ids.plens == plens and ids.kinds == kinds
        assert [r.tolist() for r in ids.responses()] == [[3, 4], [6], [8, 9]]
        assert int(ids.extra["gen_tokens"]) == 4 and read_kinds(path) == kinds
    lengths = [5, 3, 5, 1, 3]
    batches = micro_batches(range(5), 10, length=lambda i: lengths[i])
    assert batches == [[3, 1, 4], [0, 2]]
    assert all(len(b) * max(lengths[i] for i in b) <= 10 for b in batches)


def test_generation_samples_rows_from_the_engines_warped_distribution() -> None:
    """``generate``'s logits processor draws each row's token from the engine's warped
    distribution (top-k 10, then top-p 0.9 over them) and returns a one-hot row (its argmax is
    the draw): over 4,000 draws per row the counts fit the warped probabilities (Pearson's
    chi-square, p > 0.001 at a fixed seed), no token off the support is ever drawn, and ties
    at the top are kept together as the engine keeps them."""
    import torch
    from scipy import stats

    from mtad.engine.warping import warp_logprobs
    from mtad_train import objectives as O
    from mtad_train.data import AuthorsSample

    gen = torch.Generator().manual_seed(0)
    scores = 3 * torch.randn(4, 500, generator=gen)
    scores[1, :12] = 9.0  # twelve tied at the top
    want = warp_logprobs(scores, O.AUTHORS_WARP).exp()
    draws = 4000
    sampler = AuthorsSample(O.AUTHORS_WARP, torch.Generator().manual_seed(1))
    out = sampler(torch.zeros(4 * draws, 1, dtype=torch.long), scores.repeat(draws, 1))
    assert torch.equal((out == 0).sum(-1), torch.ones(4 * draws, dtype=torch.long))
    assert torch.isinf(out).sum() == out.numel() - 4 * draws
    picked = out.argmax(-1).view(draws, 4)
    for row in range(4):
        counts = torch.bincount(picked[:, row], minlength=500).double()
        support = want[row] > 0
        assert counts[~support].sum() == 0
        probs = want[row][support].double()
        _, p = stats.chisquare(counts[support].numpy(), (probs / probs.sum() * draws).numpy())
        assert p > 1e-3, (row, p)
    kept = (want > 0).sum(-1)
    assert kept[1] >= 12 and all(1 <= int(kept[r]) <= 10 for r in (0, 2, 3))
    # drawn from its own generator: the same seed draws the same tokens
    again = AuthorsSample(O.AUTHORS_WARP, torch.Generator().manual_seed(1))
    assert torch.equal(again(torch.zeros(8, 1, dtype=torch.long), scores.repeat(2, 1)), out[:8])
