"""A head that fuses tapped target layers (EAGLE-3), warm-started from one that reads the final
normed state alone (issue 39 item 3): the teacher keeps the head's layers, its cache is its own,
stored shards give any tap in the head's order, the warm-started head computes exactly what its
source does (training unroll and decoding), and a cumulative session trains it.

Tiny random target (byte vocabulary), heads built from it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from test_head_teacher_cache import _ids

from mtad.engine import Decoder
from mtad.engine.feature_head import FeatureHead, HeadSpec, load_head, rms_normalised_taps
from mtad.engine.features import FINAL_NORM_TAP, FeatureTap
from mtad.engine.head_runner import HeadRunner
from mtad.engine.runner import ModelRunner
from mtad.methods import build_method
from mtad_train.cumulative import (
    STATE_FILE,
    TRAINING_DIR,
    WEIGHTS_FILE,
    CumulativeConfig,
    Source,
    _digest,
    fuse_warm_start,
    head_for_training,
    load_head_weights,
    read_state,
    run_session,
)
from mtad_train.features import teacher_pass
from mtad_train.head_train import HeadTrainConfig, ShardData, column_map, step_loss
from mtad_train.teacher import FINAL_ONLY, TeacherCache, assemble_batch, cache_key, teacher_sequence
from mtad_train.unroll import unrolled

FUSED = [1, FINAL_NORM_TAP]


@pytest.fixture(scope="module")
def target():
    from mtad.engine.tiny import build_tiny_model

    torch.set_num_threads(1)
    return build_tiny_model("llama", "target", vocab_size=320, seed=3).eval()


def _plain_head_folder(target, folder: Path, seed: int = 0) -> FeatureHead:
    """A head reading the final normed state alone, moved off its identity start (random
    weights, as a trained one's), saved with a state of record."""
    head = FeatureHead.from_target(target, HeadSpec(taps=[-1], fuse=False, final_norm=False))
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in head.parameters():
            if p.dim() > 1:
                p.add_(torch.randn_like(p) * 0.3 / p.shape[1] ** 0.5)
    head.save(folder, extra={"trained_positions": 1234, "step": 7})
    (folder / TRAINING_DIR).mkdir()
    state = {"steps": 7, "positions": 1234, "seconds": 1.0, "cursor": {}, "sessions": []}
    (folder / TRAINING_DIR / STATE_FILE).write_text(json.dumps(state))
    (folder / TRAINING_DIR / "curve.jsonl").write_text('{"steps": 7}\n')
    return head


def test_the_teacher_keeps_the_layers_a_head_reads(target):
    seq = (np.arange(23) * 7 % 256).astype(np.uint16)
    hooks = sum(len(m._forward_hooks) for m in target.modules())
    final = teacher_sequence(target, seq, 20)
    fused = teacher_sequence(target, seq, 20, FUSED)
    assert sum(len(m._forward_hooks) for m in target.modules()) == hooks  # its taps removed
    assert final.feats.shape == (23, 1, target.config.hidden_size)
    assert fused.feats.shape == (23, 2, target.config.hidden_size)
    assert torch.equal(fused.feats[:, 1], final.feats[:, 0])  # tap -1: the final normed state
    assert torch.equal(fused.ids, final.ids) and torch.equal(fused.logp, final.logp)
    with torch.no_grad():
        states = target(
            input_ids=torch.from_numpy(seq.astype(np.int64))[None], **{"output_hidden_states": True}
        ).hidden_states
    assert torch.equal(fused.feats[:, 0], states[2][0].to(torch.bfloat16))  # layer 1's output


def test_a_fused_heads_teacher_cache_is_its_own_and_round_trips(tmp_path, target):
    dtype = next(target.parameters()).dtype
    assert cache_key(target, dtype, 20, 32) == cache_key(target, dtype, 20, 32, FINAL_ONLY)
    assert cache_key(target, dtype, 20, 32, FUSED) != cache_key(target, dtype, 20, 32)
    seqs = [np.arange(n, dtype=np.uint16) % 256 for n in (5, 17, 9)]
    _ids(tmp_path / "f.npz", 3, 1)
    for taps in (FINAL_ONLY, FUSED):
        cache = TeacherCache(tmp_path, target, topk=20, max_len=32, taps=taps)
        file = cache.file(str(tmp_path / "f.npz"), [len(s) for s in seqs])
        first = [cache.signal(file, i, s) for i, s in enumerate(seqs)]
        again = TeacherCache(tmp_path, target, topk=20, max_len=32, taps=taps)
        file = again.file(str(tmp_path / "f.npz"), [len(s) for s in seqs])
        for i, s in enumerate(seqs):
            sig = again.signal(file, i, s)
            assert torch.equal(sig.feats, first[i].feats)
            assert torch.equal(sig.feats, teacher_sequence(target, s, 20, taps).feats)
        assert (again.hits, again.misses) == (3, 0)
        batch = assemble_batch(seqs, [2, 3, 4], first, prompt_weight=0.1)
        assert batch["feats"].shape[2] == len(taps)
    assert len(list(tmp_path.glob("*/*/meta.json"))) == 2  # one cache per layout


def test_stored_shards_give_the_heads_taps_in_its_order(tmp_path, target):
    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, 256, size=n).tolist() for n in (9, 14)]
    teacher_pass(target, seqs, [3, 4], tmp_path, taps=[0, 1], progress=False)
    folders = sorted(tmp_path.glob("shard*"))
    stored = ShardData(folders).shards[0]
    data = ShardData(folders, taps=[FINAL_NORM_TAP, 1])
    ref = data.refs()[1]
    got = data.sequence(ref)["feats"]
    s = int(data.starts[0][1])
    assert got.shape == (14, 2, target.config.hidden_size)
    assert np.array_equal(got[:, 0], stored.final[s : s + 14])
    assert np.array_equal(got[:, 1], stored.feats[s : s + 14, 1])
    assert ShardData(folders).sequence(ref)["feats"].shape[1] == 2  # None: as stored
    with pytest.raises(ValueError, match="tap 3 not stored"):
        ShardData(folders, taps=[3, FINAL_NORM_TAP]).sequence(ref)


def test_tap_norm_scales_each_layer_to_unit_rms_and_leaves_the_final_state():
    x = torch.randn(5, 3, 16) * torch.tensor([100.0, 0.1, 3.0])[:, None]
    out = rms_normalised_taps(x, [4, 9, FINAL_NORM_TAP], eps=1e-6)
    rms = out[:, :2].pow(2).mean(-1).sqrt()
    assert torch.allclose(rms, torch.ones_like(rms), atol=1e-3)
    assert torch.equal(out[:, 2], x[:, 2])


def test_a_warm_started_fused_head_computes_what_its_source_does(tmp_path, target):
    _plain_head_folder(target, tmp_path / "plain")
    fuse_warm_start(tmp_path / "plain", tmp_path / "fused", FUSED)
    plain, fused = load_head(tmp_path / "plain", target), load_head(tmp_path / "fused", target)
    assert fused.spec.taps == FUSED and fused.spec.fuse and fused.spec.tap_norm
    # the committed state goes on: positions, steps and curve, naming the new weights
    state = read_state(tmp_path / "fused")
    assert (state.steps, state.positions) == (7, 1234)
    assert state.export == _digest((tmp_path / "fused" / WEIGHTS_FILE).read_bytes())
    assert (tmp_path / "fused" / TRAINING_DIR / "curve.jsonl").read_text() == '{"steps": 7}\n'
    # the training unroll: the same outputs at every depth
    toks = torch.randint(3, 300, (1, 13), generator=torch.Generator().manual_seed(1))
    taps = FeatureTap(target, FUSED)
    with torch.no_grad():
        target(input_ids=toks)
        both = taps.take()
        a = unrolled(plain, toks, plain.fused(both[:, :, 1:]), 3)
        b = unrolled(fused, toks, fused.fused(both), 3)
    taps.remove()
    for x, y in zip(a, b, strict=True):
        assert torch.allclose(x, y, atol=1e-6, rtol=0)
    # decoding: MTAD with either head drafts, accepts and emits the same
    outs = []
    for head in (plain, fused):
        t = ModelRunner(target, "target", feature_taps=head.spec.taps)
        dec = Decoder(build_method("mtad", gamma=3, beam_width=3), t, HeadRunner(head, t))
        outs.append(dec.generate(list(range(5, 25)), 24, seed=3))
    assert outs[0].token_ids == outs[1].token_ids
    assert outs[0].stats.accepted == outs[1].stats.accepted


@pytest.mark.parametrize(
    "case, match",
    [
        ("exists", "exists"),
        ("no final tap", "-1 .* among them"),
        ("from fused", "final normed state alone"),
    ],
)
def test_the_warm_start_refuses_what_it_cannot_continue(tmp_path, target, case, match):
    _plain_head_folder(target, tmp_path / "plain")
    src, taps = tmp_path / "plain", FUSED
    if case == "exists":
        (tmp_path / "out").mkdir()
    elif case == "no final tap":
        taps = [1, 2]
    else:
        fuse_warm_start(src, tmp_path / "fused", FUSED)
        src = tmp_path / "fused"
    with pytest.raises(ValueError, match=match):
        fuse_warm_start(src, tmp_path / "out", taps)


def test_a_fused_head_trains_cumulatively_regressed_on_its_final_tap(tmp_path, target):
    _plain_head_folder(target, tmp_path / "plain")
    fuse_warm_start(tmp_path / "plain", tmp_path / "fused", FUSED)
    _ids(tmp_path / "ids.npz", 12, 5)
    cfg = CumulativeConfig(
        head=str(tmp_path / "fused"),
        sources=[f"{tmp_path / 'ids.npz'}=1"],
        ckpt_dir=str(tmp_path / "ck"),
        depths=2,
        tokens_per_step=160,
        micro_tokens=160,
        max_len=32,
        export_every_s=0,
        ckpt_every_s=0,
        warmup_steps=1,
        max_steps=3,
    )
    head = head_for_training(target, Path(cfg.head))
    start = head.fuse.weight.detach().clone()
    sources = [Source.load(s, cfg.max_len) for s in cfg.sources]
    run_session(cfg, head, target, sources, log=lambda _m: None)
    assert read_state(tmp_path / "fused").steps == 10
    d = target.config.hidden_size
    moved = (head.fuse.weight.detach() - start).abs()
    assert moved[:, :d].max() > 0  # the other layer's block learns from its zero start
    # the regression reads the final-state slot wherever the head's taps put it: the warm start
    # (before training) scores what its source scores, the final state in any slot
    seqs = [np.arange(n, dtype=np.uint16) % 256 for n in (12, 20)]
    cols = column_map(head.vocab_ids, head.vocab_size)
    tcfg = HeadTrainConfig(depths=2, reg_weight=1.0, feature_rms=2.0, autocast=False)
    losses = []
    for taps, folder in ((FINAL_ONLY, "plain"), (FUSED, "fused0"), ((FINAL_NORM_TAP, 1), "fused1")):
        if folder != "plain":
            fuse_warm_start(tmp_path / "plain", tmp_path / folder, list(taps))
        h = head_for_training(target, tmp_path / folder)
        load_head_weights(h, tmp_path / folder)
        sigs = [teacher_sequence(target, s, 20, taps) for s in seqs]
        with torch.no_grad():
            losses.append(
                float(step_loss(h, assemble_batch(seqs, [3, 4], sigs, 0.1), tcfg, cols)[0])
            )
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)
    assert losses[2] == pytest.approx(losses[0], rel=1e-5)
    batch = assemble_batch(seqs, [3, 4], sigs, 0.1)
    with pytest.raises(ValueError, match="taps"):
        step_loss(h, {**batch, "feats": batch["feats"][:, :, :1]}, tcfg, cols)
