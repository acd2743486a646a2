"""The feature-level draft head (EAGLE-style, :mod:`mtad.engine.feature_head`): its training
unroll equals what the draft computes, every draft method runs with it and the exact ones stay
exact, its cache holds what a fresh recomputation gives, and both checkpoint layouts load."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from stats import chi2_critical
from test_engine import ALPHA, RUNS, VOCAB, chi2_statistic, exact_two_token_dist, sample_two_tokens
from transformers import DynamicCache

from mtad.engine import Decoder
from mtad.engine.feature_head import FeatureHead, HeadSpec, load_head
from mtad.engine.features import FeatureTap
from mtad.engine.head_runner import KV_BUCKET, BucketedKV, HeadRunner
from mtad.engine.loading import ModelSpec, load_pair
from mtad.engine.runner import ModelRunner
from mtad.engine.tiny import build_tiny_model
from mtad.engine.warping import WarpConfig, warp_logprobs
from mtad.methods import build_method
from mtad_train.unroll import unrolled

REPO = Path(__file__).resolve().parents[1]
TAPS = [1, 2, 3]
DRAFT_METHODS = {
    "sps": {"gamma": 3},
    "mtad": {"gamma": 3, "beam_width": 3},
    "specinfer": {"branching": [2, 2]},
    "mmtad": {"gamma": 3, "beam_width": 2},
    "bild": {"max_draft": 3, "fallback_threshold": 0.0},
}


def random_head(target, taps=TAPS, seed=0, scale=0.3, vocab_ids=None, **spec) -> FeatureHead:
    """A head with random weights large enough to give varied, non-trivial distributions."""
    torch.manual_seed(seed)
    head = FeatureHead(
        target.config,
        HeadSpec(taps=list(taps), **spec),
        target.get_input_embeddings(),
        target.get_output_embeddings().weight.detach(),
        vocab_ids,
    )
    with torch.no_grad():
        for p in head.parameters():
            if p.dim() > 1:
                p.normal_(0.0, scale / p.shape[1] ** 0.5 * 4)
    return head.eval()


@pytest.fixture(scope="module")
def tiny_target():
    return build_tiny_model("llama", "target", vocab_size=320, seed=3).eval()


def head_pair(target, head):
    t = ModelRunner(target, "target", feature_taps=head.spec.taps)
    return t, HeadRunner(head, t)


def test_training_unroll_equals_the_drafts_own_cache(tiny_target):
    """Depth k of :func:`mtad_train.unroll.unrolled` at position i is the head after feeding true
    features up to i - k + 1 and drafting the data tokens on its own outputs from there."""
    head = random_head(tiny_target)
    L, K = 11, 3
    toks = torch.randint(3, 300, (1, L), generator=torch.Generator().manual_seed(1))
    tap = FeatureTap(tiny_target, TAPS)
    with torch.no_grad():
        tiny_target(input_ids=toks)
        g = head.fused(tap.take())
        outs = unrolled(head, toks, g, K)
        prev = torch.cat([torch.zeros_like(g[:, :1]), g[:, :-1]], dim=1)
        worst = 0.0
        for k in range(1, K + 1):
            for i in range(k - 1, L):
                s = i - k + 1
                cache = DynamicCache()
                a = head.step(
                    head.layer_input(toks[:, : s + 1], prev[:, : s + 1]), torch.arange(s + 1), cache
                )[:, -1:]
                for j in range(s + 1, i + 1):
                    a = head.step(head.layer_input(toks[:, j : j + 1], a), torch.tensor([j]), cache)
                ref = a[0, -1]
                worst = max(worst, float((ref - outs[k - 1][0, i]).abs().max() / ref.abs().max()))
    tap.remove()
    assert worst < 1e-5, f"unrolled depth differs from the draft's cache by {worst:.2e}"


@pytest.mark.parametrize("name", sorted(DRAFT_METHODS))
def test_greedy_methods_with_a_head_equal_greedy_ar(name, tiny_target):
    head = random_head(tiny_target, seed=2)
    target, draft = head_pair(tiny_target, head)
    ar = Decoder(build_method("ar", temperature=0.0), ModelRunner(tiny_target))
    prompt = list(range(5, 25))
    ref = ar.generate(prompt, 30).token_ids
    dec = Decoder(build_method(name, temperature=0.0, **DRAFT_METHODS[name]), target, draft)
    out = dec.generate(prompt, 30)
    assert out.token_ids == ref
    # one target forward more than iterations: the prompt's prefill before the first draft
    assert out.stats.target_forwards == out.stats.iterations + 1


class FreshCheck:
    """Wraps a HeadRunner so every logits it returns is compared with the head recomputed
    from nothing: the target teacher-forced over the row's committed context for its true
    features, the head fed those and then, position by position, its own outputs."""

    def __init__(self, target_model, runner: HeadRunner):
        self.target_model, self.runner, self.worst, self.checked = target_model, runner, 0.0, 0
        self._forward, self._feed = runner.forward, runner.feed
        runner.forward = self.forward
        runner.feed = self.feed

    def forward(self, input_ids, keep=0, compact=False):
        logits = self._forward(input_ids, keep, compact)
        self.compare(logits[:, -1])
        return logits

    def feed(self, ids, extra=None, compact=False):
        logits = self._feed(ids, extra, compact)
        self.compare(logits[:, -1])
        return logits

    @torch.no_grad()
    def compare(self, logits):
        r = self.runner
        head, true_len = r.model, r.true_len
        for row in range(r.rows):
            ids = r.cached_ids[row]
            tap = FeatureTap(self.target_model, head.spec.taps)
            self.target_model(input_ids=ids[None, : max(true_len - 1, 1)])
            feats = head.fused(tap.take())[0]
            tap.remove()
            prev = torch.cat([torch.zeros_like(feats[:1]), feats])[:true_len]
            cache = DynamicCache()
            a = head.step(
                head.layer_input(ids[None, :true_len], prev[None]), torch.arange(true_len), cache
            )[:, -1:]
            for j in range(true_len, ids.numel()):
                a = head.step(head.layer_input(ids[None, j : j + 1], a), torch.tensor([j]), cache)
            fresh = head.logits(a[0, -1])
            self.worst = max(self.worst, float((fresh - logits[row]).abs().max()))
            self.checked += 1


@pytest.mark.parametrize("name", ["sps", "mtad", "specinfer", "mmtad"])
def test_head_logits_equal_a_fresh_recomputation(name, tiny_target):
    """The draft distributions a method samples from and later uses are the head's own for that
    context: no stale cache rows after crops, beam reorders or tree walks."""
    head = random_head(tiny_target, seed=4)
    target, draft = head_pair(tiny_target, head)
    check = FreshCheck(tiny_target, draft)
    dec = Decoder(build_method(name, **DRAFT_METHODS[name]), target, draft)
    prompt = list(range(7, 19)) * 4  # the generation crosses the head cache's first bucket
    assert len(prompt) < KV_BUCKET < len(prompt) + 24
    dec.generate(prompt, 24, seed=5)
    assert check.checked > 10
    assert check.worst < 1e-4, f"{name}: head logits differ from a fresh recomputation"


def test_bucketed_cache_holds_what_a_dynamic_cache_holds_and_the_head_step_agrees():
    """HeadRunner's cache (buffers a multiple of KV_BUCKET long, padding masked) against
    transformers' DynamicCache through appends across bucket boundaries, crops, reorders and a
    broadcast of one row: the same keys and values at every point, and the head's step over
    either the same outputs (the padding never reaches them)."""
    torch.manual_seed(0)
    target = build_tiny_model(seed=0)
    head = random_head(target, taps=[3], seed=2).eval()
    bucketed, dynamic = BucketedKV(), DynamicCache()
    d, pos = head.config.hidden_size, 0

    def step(rows: int, n: int) -> None:
        nonlocal pos
        x = torch.randn(rows, n, d)
        positions = torch.arange(pos, pos + n)
        with torch.no_grad():
            a = head.step(x, positions, bucketed)
            b = head.step(x, positions, dynamic)
        pos += n
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        layer, ref = bucketed.layers[0], dynamic.layers[0]
        assert layer.k_buf.shape[-2] % KV_BUCKET == 0 and layer.k_buf.shape[-2] >= pos
        assert torch.equal(layer.keys, ref.keys) and torch.equal(layer.values, ref.values)

    def crop(n: int) -> None:
        nonlocal pos
        bucketed.crop(-n)
        dynamic.crop(-n)
        pos -= n

    step(1, KV_BUCKET - 2)
    step(1, 3)  # a feed of several positions across the first boundary
    crop(2)  # back below it: the next update rebuffers to one bucket
    step(1, 1)
    bucketed.expand_rows(3)
    dynamic.batch_repeat_interleave(3)
    for _ in range(KV_BUCKET + 5):
        step(3, 1)
    rows = torch.tensor([2, 0, 2])
    bucketed.reorder_cache(rows)
    dynamic.reorder_cache(rows)
    crop(4)
    step(3, 2)
    assert torch.isfinite(bucketed.layers[0].k_buf).all()
    with pytest.raises(ValueError, match="minus the positions"):
        bucketed.crop(1)


def test_draft_probabilities_used_are_those_sampled_from(tiny_target, monkeypatch):
    """SpS verifies with the q the tokens were drawn from (a defect class of assisted
    generation elsewhere: q recomputed or taken from another row after a cache change)."""
    import mtad.methods.sps as sps_module

    head = random_head(tiny_target, seed=6)
    target, draft = head_pair(tiny_target, head)
    seen = []
    real_draft, real_accept = sps_module.draft_tokens, sps_module.speculative_accept

    def spy_draft(runner, ids, gamma, warp, generator):
        x, q = real_draft(runner, ids, gamma, warp, generator)
        seen.append({"ctx": ids.clone(), "x": x.clone(), "q": q})
        return x, q

    def spy_accept(logp_x, logq_x, generator):
        seen[-1]["logq_x"] = logq_x.clone()
        return real_accept(logp_x, logq_x, generator)

    monkeypatch.setattr(sps_module, "draft_tokens", spy_draft)
    monkeypatch.setattr(sps_module, "speculative_accept", spy_accept)
    check = FreshCheck(tiny_target, draft)
    warp = WarpConfig(1.0, 10, 0.9)
    dec = Decoder(build_method("sps", gamma=3), target, draft)
    dec.generate(list(range(9, 21)), 20, seed=7)
    assert check.worst < 1e-4
    for rec in seen:
        # the logq used equals the warped distribution each token was drawn from
        q_at = torch.stack([rec["q"][j].logp_of(rec["x"][j]) for j in range(3)])
        assert torch.equal(q_at, rec["logq_x"])
        assert torch.isfinite(rec["logq_x"]).all()
    assert len(seen) >= 4
    del warp


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["sps", "specinfer"])
def test_exact_methods_with_a_head_reproduce_the_target(name, dtype):
    """Chi-square goodness of fit (alpha = 1e-3, 1000 two-token runs) of SpS and SpecInfer
    drafted by a random head against the target's exact joint, as for model drafts."""
    target = build_tiny_model("llama", "target", vocab_size=VOCAB, seed=11).to(dtype).eval()
    head = random_head(target, seed=12).to(dtype)
    warp = WarpConfig(1.0, 6, 0.95)
    exact = exact_two_token_dist(target, [3, 1, 4], warp).float()
    params = {"sps": {"gamma": 2}, "specinfer": {"branching": [2, 2]}}[name]
    t, d = head_pair(target, head)
    dec = Decoder(build_method(name, temperature=1.0, top_k=6, top_p=0.95, **params), t, d)
    stat, df = chi2_statistic(sample_two_tokens(dec, VOCAB, RUNS), exact, RUNS)
    critical = chi2_critical(df, ALPHA)
    print(f"{name} {dtype} head chi2 {stat:.1f} < {critical:.1f}")
    assert stat < critical, f"{name} with a head deviates from the target: {stat:.1f}"


def test_sub_vocabulary_head_gives_zero_outside_and_stays_exact():
    target = build_tiny_model("llama", "target", vocab_size=VOCAB, seed=11).eval()
    kept = torch.tensor([5, 0, 2, 7])
    head = random_head(target, seed=13, vocab_ids=kept)
    t, d = head_pair(target, head)
    full = d.feed(torch.tensor([3, 1, 4]))[0, -1]
    assert torch.isinf(full[[1, 3, 4, 6]]).all() and torch.isfinite(full[kept]).all()
    exact = exact_two_token_dist(target, [3, 1, 4], WarpConfig(1.0, 6, 0.95)).float()
    dec = Decoder(build_method("sps", gamma=2, top_k=6, top_p=0.95), *head_pair(target, head))
    stat, df = chi2_statistic(sample_two_tokens(dec, VOCAB, RUNS), exact, RUNS)
    assert stat < chi2_critical(df, ALPHA)


def test_our_layout_saves_loads_and_runs_through_load_pair(tmp_path, tiny_target):
    head = random_head(tiny_target, seed=8)
    head.save(tmp_path / "head")
    (tmp_path / "head" / "draft_vocab.json").write_text(json.dumps({"ids": list(range(200))}))
    loaded = load_head(tmp_path / "head", tiny_target, list(range(200)))
    for (k, v), (k2, v2) in zip(
        head.state_dict().items(), loaded.state_dict().items(), strict=True
    ):
        assert k == k2 and torch.equal(v, v2)
    pair = load_pair(
        ModelSpec(loader="tiny", tiny={"vocab_size": 320, "seed": 3}),
        ModelSpec(loader="local", path=str(tmp_path / "head"), kind="head"),
    )
    assert isinstance(pair.draft, HeadRunner) and pair.draft.vocab_ids.numel() == 200
    out = Decoder(build_method("mtad", gamma=3), pair.target, pair.draft).generate([5, 6, 7], 12)
    assert len(out.token_ids) == 12


def test_a_published_eagle_checkpoint_layout_loads(tmp_path, tiny_target):
    """EAGLE-1/2 heads (yuhuili/EAGLE-llama2-chat-7B & co.): config.json of one layer and
    pytorch_model.bin with fc (with bias), layers.0.* (no input norm) and embed_tokens; they read
    the target's final normed hidden state and apply the logits head without a norm."""
    cfg = tiny_target.config.to_dict() | {"num_hidden_layers": 1}
    folder = tmp_path / "eagle"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    d = tiny_target.config.hidden_size
    ref = random_head(
        tiny_target,
        taps=[-1],
        fuse=False,
        input_norm=False,
        final_norm=False,
        fc_bias=True,
        layout="eagle",
        seed=9,
    )
    state = {k: v for k, v in ref.state_dict().items() if "input_layernorm" not in k}
    state["embed_tokens.weight"] = torch.zeros(320, d)
    torch.save(state, folder / "pytorch_model.bin")
    pair = load_pair(
        ModelSpec(loader="tiny", tiny={"vocab_size": 320, "seed": 3}),
        ModelSpec(loader="local", path=str(folder), kind="head"),
    )
    assert pair.draft.model.spec.layout == "eagle" and pair.draft.model.norm is None
    assert torch.equal(pair.draft.model.fc.bias, ref.fc.bias)
    out = Decoder(build_method("sps", temperature=0.0, gamma=3), pair.target, pair.draft)
    ar = Decoder(build_method("ar", temperature=0.0), ModelRunner(tiny_target))
    assert out.generate([4, 5, 6], 10).token_ids == ar.generate([4, 5, 6], 10).token_ids


def test_final_norm_tap_reads_what_the_logits_head_reads(tiny_target):
    tap = FeatureTap(tiny_target, [-1])
    with torch.no_grad():
        logits = tiny_target(input_ids=torch.tensor([[3, 4, 5]])).logits
        feat = tap.take()[:, :, 0]
    assert torch.allclose(tiny_target.lm_head(feat), logits, atol=1e-5)
    warp_logprobs(logits[0], WarpConfig(1.0, 10, 0.9))  # a well-formed distribution


@pytest.mark.parametrize("autocast", [False, True])
def test_the_training_loss_and_gradient_do_not_depend_on_the_logits_padding(
    tiny_target, monkeypatch, autocast
):
    """``step_loss`` pads each depth's logits rows to a bucket and scores the padding too: the
    loss, its per-depth sums and the gradient equal those of rows left unpadded (bucket 1)."""
    from mtad_train import head_train

    head = random_head(tiny_target, vocab_ids=torch.arange(0, 320, 3)).train()
    gen = torch.Generator().manual_seed(4)
    b, n, k = 3, 21, 20
    tokens = torch.randint(0, 320, (b, n), generator=gen)
    d = tiny_target.config.hidden_size
    feats = torch.randn(b, n, len(TAPS), d, generator=gen).to(torch.bfloat16)
    t_logp, t_ids = torch.randn(b, n, 320, generator=gen).mul(3).log_softmax(-1).topk(k, dim=-1)
    w = (torch.rand(b, n, generator=gen) < 0.8).float()
    batch = {"tokens": tokens, "feats": feats, "ids": t_ids, "logp": t_logp, "w": w}
    cfg = head_train.HeadTrainConfig(depths=3, autocast=autocast, kl_weight=0.3)
    cols = head_train.column_map(head.vocab_ids, head.vocab_size)
    results, bucket_used = [], head_train.SHAPE_BUCKET
    for bucket in (bucket_used, 1):
        monkeypatch.setattr(head_train, "SHAPE_BUCKET", bucket)
        head.zero_grad(set_to_none=True)
        total, stats = head_train.step_loss(head, batch, cfg, cols)
        total.backward()
        results.append((total.detach(), stats, [p.grad.clone() for p in head.parameters()]))
    (padded, padded_stats, padded_grads), (plain, plain_stats, plain_grads) = results
    assert int(w.sum()) % bucket_used  # the padded run did pad
    torch.testing.assert_close(padded, plain)
    for key in plain_stats:
        torch.testing.assert_close(torch.tensor(padded_stats[key]), torch.tensor(plain_stats[key]))
    assert sum(float(g.abs().sum()) for g in plain_grads) > 0
    for got, want in zip(padded_grads, plain_grads, strict=True):
        torch.testing.assert_close(got, want)


# ----------------------------------------------------------------- training, resumed after a kill

TRAIN_SCRIPT = r"""
import sys, torch
from pathlib import Path
from mtad_train.head_train import HeadTrainConfig, ShardData, train
from mtad.engine.feature_head import FeatureHead, HeadSpec
from mtad.engine.tiny import build_tiny_model
torch.set_num_threads(1)
data_dir, ckpt, steps_before_pause = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3])
target = build_tiny_model("llama", "target", vocab_size=320, seed=3).eval()
head = FeatureHead.from_target(target, HeadSpec(taps=[-1], fuse=False, final_norm=False),
                               torch.arange(0, 320, 2))
cfg = HeadTrainConfig(depths=3, epochs=2.0, tokens_per_step=160, micro_tokens=96, lr=3e-3,
                      warmup_steps=2, reg_weight=1.0, ckpt_every_s=0.0)
data = ShardData(sorted(data_dir.glob("shard*")), taps=[-1])
def on_step(state, rec):
    # the step after the pause step is slow: the pause step's checkpoint (one a step) is on
    # disk by then, and the test, which waits for it, kills the process during this sleep
    if state.step > steps_before_pause:
        import time; time.sleep(30)
state = train(head, data, cfg, ckpt, on_step=on_step, log=lambda m: None)
torch.save(head.state_dict(), ckpt / "final_weights.pt")
print("steps", state.step)
"""


@pytest.fixture(scope="module")
def tiny_shards(tmp_path_factory, tiny_target):
    from mtad_train.features import derive_final, teacher_pass

    folder = tmp_path_factory.mktemp("shards")
    gen = torch.Generator().manual_seed(0)
    seqs = [
        torch.randint(3, 320, (int(n),), generator=gen).tolist()
        for n in torch.randint(12, 40, (30,), generator=gen)
    ]
    paths = teacher_pass(
        tiny_target, seqs, [4] * len(seqs), folder, taps=[1, 2, 3], shard_tokens=300, progress=False
    )
    for p in paths:
        derive_final(tiny_target, p)
    return folder


def _train(script: Path, shards: Path, ckpt: Path, until: str, *fault: str, wait: bool = True):
    """TRAIN_SCRIPT on this checkout's packages: to the end (``until`` inf) or pausing after
    step ``until``; ``fault``: tests/save_fault.py and its cut. A run that is killed or cut runs
    in a subprocess; one that runs to its end in this process."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    argv = [str(script), str(shards), str(ckpt), until]
    if wait and not fault:  # nothing to kill or cut: in this process (no new interpreter)
        from in_process import run_script_here

        return subprocess.CompletedProcess(argv, 0, run_script_here(argv), "")
    cmd = [sys.executable, *fault, *argv]
    if not wait:
        return subprocess.Popen(cmd, env=env)
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tiny_shards) -> tuple[Path, Path, int]:
    """The training run without a cut: (its script, its checkpoint folder, its steps), the one
    every interrupted run below must end on (the script is deterministic: a fresh process
    builds the same head and reads the same shards)."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    script = folder / "train.py"
    script.write_text(TRAIN_SCRIPT)
    full = _train(script, tiny_shards, folder / "a", "inf")
    assert full.returncode == 0, full.stderr
    return script, folder / "a", int(full.stdout.split("steps")[1])


@pytest.mark.parametrize("kind", ["kill", "enospc"])
def test_head_training_cut_mid_checkpoint_resumes_to_the_uninterrupted_weights(
    tmp_path, tiny_shards, uninterrupted, kind
):
    """The 4th checkpoint's save is killed half-written, or the disk is full at it: the 3rd
    stays whole, and the run resumed from it ends on the uninterrupted run's exact weights
    (issue 38 item 4; tests/save_fault.py cuts the save)."""
    script, full, _ = uninterrupted
    fault = str(REPO / "tests" / "save_fault.py")
    cut = _train(script, tiny_shards, tmp_path / "b", "inf", fault, f"ckpt.pt:4:{kind}")
    assert cut.returncode != 0 and not (tmp_path / "b" / "final_weights.pt").exists()
    if kind == "enospc":
        assert "No space left on device" in cut.stderr, cut.stderr[-2000:]
    kept = torch.load(tmp_path / "b" / "ckpt.pt", weights_only=False)["state"]["step"]
    assert kept == 3  # the last whole checkpoint (one per step)
    resumed = _train(script, tiny_shards, tmp_path / "b", "inf")
    assert resumed.returncode == 0, resumed.stderr
    a = torch.load(full / "final_weights.pt")
    b = torch.load(tmp_path / "b" / "final_weights.pt")
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs after a cut checkpoint + resume"


def test_head_training_killed_and_resumed_reaches_the_uninterrupted_weights(
    tmp_path, tiny_shards, uninterrupted
):
    import signal
    import time

    script, full, total = uninterrupted
    assert total >= 6
    proc = _train(script, tiny_shards, tmp_path / "b", str(total // 2), wait=False)
    ckpt = tmp_path / "b" / "ckpt.pt"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if ckpt.is_file():
            step = torch.load(ckpt, weights_only=False)["state"]["step"]
            if step >= total // 2:
                break
        time.sleep(0.5)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (tmp_path / "b" / "final_weights.pt").exists()  # killed mid-run
    resumed = _train(script, tiny_shards, tmp_path / "b", "inf")
    assert resumed.returncode == 0, resumed.stderr
    a = torch.load(full / "final_weights.pt")
    b = torch.load(tmp_path / "b" / "final_weights.pt")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs after kill + resume"
    first = torch.load(full / "ckpt.pt", weights_only=False)["state"]["history"][0]
    last = torch.load(full / "ckpt.pt", weights_only=False)["state"]["history"][-1]
    assert last["kl"][0] < first["kl"][0]  # it learned something


def test_sampled_prompt_positions_give_the_same_expected_loss_in_fewer_rows(tiny_target):
    """``prompt_sampled``: each prompt position scored with probability ``prompt_weight`` at
    weight 1. Over seeded draws the mean loss is the loss of every prompt position at
    ``prompt_weight`` (within 4 standard errors), and about that fraction of prompt rows is
    scored."""
    from mtad_train import head_train
    from mtad_train.teacher import TeacherSignal, assemble_batch

    head = random_head(tiny_target, vocab_ids=torch.arange(0, 320, 3)).train()
    gen = torch.Generator().manual_seed(5)
    lens, plens, d = [30, 24, 17], [18, 10, 9], tiny_target.config.hidden_size
    seqs = [torch.randint(0, 320, (n,), generator=gen).numpy() for n in lens]
    signals = []
    for n in lens:
        logp, ids = torch.randn(n, 320, generator=gen).mul(3).log_softmax(-1).topk(20, dim=-1)
        feats = torch.randn(n, len(TAPS), d, generator=gen).to(torch.bfloat16)
        signals.append(TeacherSignal(feats, ids, logp.to(torch.float16)))
    batch = assemble_batch(seqs, plens, signals, prompt_weight=0.25)
    assert int(batch["prompt"].sum()) == sum(p - 1 for p in plens)
    full_cfg = head_train.HeadTrainConfig(depths=2, prompt_weight=0.25, autocast=False)
    sampled_cfg = head_train.HeadTrainConfig(
        depths=2, prompt_weight=0.25, prompt_sampled=True, autocast=False
    )
    cols = head_train.column_map(head.vocab_ids, head.vocab_size)
    with torch.no_grad():
        want, full_stats = head_train.step_loss(head, batch, full_cfg, cols)
        draws, rows = [], []
        for seed in range(400):
            total, stats = head_train.step_loss(
                head, batch, sampled_cfg, cols, torch.Generator().manual_seed(seed)
            )
            draws.append(float(total))
            rows.append(stats["w"][0])
    mean, se = float(np.mean(draws)), float(np.std(draws, ddof=1)) / len(draws) ** 0.5
    assert se > 0 and abs(mean - float(want)) < 4 * se, (mean, float(want), se)
    # depth 1's scored weight: every response row at 1, on average a quarter of the prompt rows
    responses = sum(n - p for n, p in zip(lens, plens, strict=True))
    assert abs(np.mean(rows) - full_stats["w"][0]) < 0.05 * full_stats["w"][0]
    assert min(rows) >= responses
