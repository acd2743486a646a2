"""The cumulative training's teacher cache (mtad_train.teacher) is a pure speed-up: a cached
signal has the bits of a computed one, training with the cache reaches the weights training
without it reaches, a second process filling it ahead leaves the training nothing to compute,
and a sequence whose flag was never set is computed again.

Tiny random target (byte vocabulary), a head built from it, ids written by the test."""

from __future__ import annotations

import dataclasses
import itertools
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from mtad_train.cumulative import (
    TEACHER_DIR,
    CumulativeConfig,
    Source,
    fill_ahead,
    head_for_training,
    read_state,
    run_session,
)
from mtad_train.head_train import bucketed
from mtad_train.teacher import FileCache, TeacherCache, assemble_batch, teacher_sequence


def _ids(path: Path, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    lens = rng.integers(12, 40, size=n).astype(np.int32)
    toks = rng.integers(0, 256, size=int(lens.sum())).astype(np.uint16)
    plens = np.minimum(lens - 2, 4).astype(np.int32)
    np.savez(path, tokens=toks, lens=lens, plens=plens, kinds=np.array(["x"] * n))


@pytest.fixture(scope="module")
def target():
    from mtad.engine.tiny import build_tiny_model

    torch.set_num_threads(1)
    return build_tiny_model("llama", "target", vocab_size=320, seed=3).eval()


@pytest.fixture()
def repo(tmp_path, target):
    from mtad.engine.feature_head import FeatureHead, HeadSpec

    head = FeatureHead.from_target(target, HeadSpec(taps=[-1], fuse=False, final_norm=False))
    head.save(tmp_path / "head")
    _ids(tmp_path / "ids.npz", 24, 5)  # ~600 positions: the 10 steps below wrap its epochs
    return tmp_path


def _cfg(repo: Path, ckpt: str, **kw) -> CumulativeConfig:
    return CumulativeConfig(
        head=str(repo / "head"),
        sources=[f"{repo / 'ids.npz'}=1"],
        ckpt_dir=str(repo / ckpt),
        depths=2,
        tokens_per_step=160,
        micro_tokens=160,
        max_len=32,
        topk=20,
        export_every_s=0,
        ckpt_every_s=0,
        warmup_steps=2,
        **kw,
    )


def _train(cfg: CumulativeConfig, target) -> tuple[dict[str, torch.Tensor], list[str]]:
    torch.manual_seed(0)
    head = head_for_training(target, Path(cfg.head))
    sources = [Source.load(s, cfg.max_len) for s in cfg.sources]
    lines: list[str] = []
    run_session(cfg, head, target, sources, host={"cpu_model": "test"}, log=lines.append)
    return {k: v.detach().clone() for k, v in head.state_dict().items()}, lines


def test_a_cached_signal_has_the_bits_of_a_computed_one(tmp_path, target) -> None:
    seqs = [np.arange(n, dtype=np.uint16) % 256 for n in (5, 17, 9)]
    cache = TeacherCache(tmp_path, target, topk=20, max_len=32)
    _ids(tmp_path / "f.npz", 3, 1)
    file = cache.file(str(tmp_path / "f.npz"), [len(s) for s in seqs])
    first = [cache.signal(file, i, s) for i, s in enumerate(seqs)]
    assert (cache.hits, cache.misses) == (0, 3)
    # a new process: the same files, read back
    again = TeacherCache(tmp_path, target, topk=20, max_len=32)
    file = again.file(str(tmp_path / "f.npz"), [len(s) for s in seqs])
    for i, s in enumerate(seqs):
        sig, fresh = again.signal(file, i, s), teacher_sequence(target, s, 20)
        for name in ("feats", "ids", "logp"):
            assert torch.equal(getattr(sig, name), getattr(fresh, name)), name
            assert torch.equal(getattr(sig, name), getattr(first[i], name)), name
    assert (again.hits, again.misses) == (3, 0)
    batch = assemble_batch(seqs, [2, 3, 4], first, prompt_weight=0.1)
    # widths rounded up to a shape bucket (one matmul primitive per bucket): padding weighs 0
    assert batch["feats"].shape == (3, bucketed(17), 1, target.config.hidden_size)
    assert batch["w"][:, 16:].sum() == 0 and batch["w"][1, :16].min() > 0
    assert batch["w"][0, :1].tolist() == [pytest.approx(0.1)] and batch["w"][0, 4:].sum() == 0


def test_a_sequence_without_its_flag_is_computed_again(tmp_path, target) -> None:
    seq = np.arange(11, dtype=np.uint16)
    file = FileCache(tmp_path / "c", [11], d=target.config.hidden_size, k=20)
    sig = teacher_sequence(target, seq, 20)
    file.put(0, sig)
    file.arrays["done"][0] = 0  # a kill after the arrays were written, before the flag
    file.arrays["done"].flush()
    assert FileCache(tmp_path / "c", [11], d=target.config.hidden_size, k=20).get(0) is None
    # other lengths (the file changed): a fresh cache, nothing flagged
    file.arrays["done"][0] = 1
    file.arrays["done"].flush()
    assert FileCache(tmp_path / "c", [11], d=target.config.hidden_size, k=20).get(0) is not None
    assert FileCache(tmp_path / "c", [12], d=target.config.hidden_size, k=20).get(0) is None


def test_training_with_the_cache_reaches_the_weights_of_training_without_it(repo, target):
    shutil.copytree(repo / "head", repo / "head2")
    with_cache, lines = _train(_cfg(repo, "ck_a", max_steps=10), target)
    cfg_b = _cfg(repo, "ck_b", max_steps=10, teacher_cache=False)
    without, _ = _train(dataclasses.replace(cfg_b, head=str(repo / "head2")), target)
    assert with_cache.keys() == without.keys()
    for k in with_cache:
        assert torch.equal(with_cache[k], without[k]), k
    hits = int(re.search(r"(\d+) hits", lines[-1]).group(1))
    assert hits > 0, f"the epochs wrapped: later steps must hit the cache ({lines[-1]})"
    assert not (repo / "ck_b" / TEACHER_DIR).exists()


def test_a_second_process_filling_ahead_leaves_the_training_nothing_to_compute(repo, target):
    cfg = _cfg(repo, "ck", max_steps=3)
    teacher = TeacherCache(Path(cfg.ckpt_dir) / TEACHER_DIR, target, cfg.topk, cfg.max_len)
    sources = [Source.load(s, cfg.max_len) for s in cfg.sources]
    calls = itertools.count()
    fill_ahead(cfg, teacher, sources, ahead_steps=3, stop=lambda: next(calls) >= 3, poll_s=0)
    assert teacher.misses == 0 and read_state(repo / "head").steps == 0
    _, lines = _train(cfg, target)
    assert lines[-1].endswith("0 computed"), lines[-1]
