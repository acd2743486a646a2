"""The benchmarks run end to end on the tiny pair (seconds) and report what they promise."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench import overhead, vs_assisted
from bench.common import FALLBACK_PROMPTS, ForwardClock, truncate_at_eos
from mtad.engine import DecodeStats
from mtad.methods import METHODS
from mtad.runs.intervals import DOES_NOT_HOLD, HOLDS, UNRESOLVED, verdict

TINY = ["--pair", "tiny", "--prompts", "2", "--max-new", "10"]
REPO = Path(__file__).resolve().parents[1]


def test_overhead_bench_every_method(capsys) -> None:
    res = overhead.main([*TINY, "--methods", "all", "--claim-sps", "1.05"])
    assert set(res) == set(METHODS)
    for r in res.values():
        s = r["stats"]
        assert s.new_tokens > 0
        # forwards + overhead account for the whole wall time
        total = r["target_fwd_s"] + r["draft_fwd_s"] + r["overhead_s"]
        assert total == pytest.approx(s.wall_time)
        assert 0.0 <= r["overhead_pct"] <= 100.0
    out = capsys.readouterr().out
    assert "overhead %" in out and "mtad" in out
    # every other drafting method's accepted length beside SpS's, paired over the prompts
    assert "beside SpS's on the same 2 prompts" in out
    paired = {m: r["accepted_vs_sps"] for m, r in res.items() if "accepted_vs_sps" in r}
    assert set(paired) == {m for m, (_, cls) in METHODS.items() if cls.uses_draft} - {"sps"}
    for m, row in paired.items():
        assert row["mean"] == pytest.approx(row["sps_mean"] + row["difference"]), m
        assert row["n_prompts"] == 2 and row["lo"] <= row["difference"] <= row["hi"], m
    # every method's speed-up over AR and SpS, with no interval (and no verdict) from 2 prompts
    assert "speed-up on the same 2 prompts (2 distinct; 95% paired bootstrap" in out
    assert ">= 1.05x" in out and "unresolved" in out
    for m, r in res.items():
        for base in {"ar", "sps"} - {m}:
            iv = r[f"speedup_vs_{base}"]
            expected = res[base]["stats"].ms_per_token / r["stats"].ms_per_token
            assert iv.mean == pytest.approx(expected) and not iv.has_interval, (m, base)


def _stats(wall_times: list[float], tokens: list[int]) -> list[DecodeStats]:
    return [DecodeStats(new_tokens=n, wall_time=w) for w, n in zip(wall_times, tokens, strict=True)]


def test_the_speed_up_interval_pairs_prompts_and_decides_a_floor() -> None:
    """The speed-up over a baseline is the ratio of the summed times per token, with a paired
    interval: a run 1.5x as fast on every prompt, whatever the prompts' own spread, gets a tight
    interval around 1.5 that decides a 1.2 floor (holds) and a 1.6 floor (does not hold); one
    that is faster on half the prompts and slower on the others gets an unresolved verdict."""
    rng = np.random.default_rng(0)
    base_time = rng.uniform(1.0, 10.0, size=12)  # prompts of very different lengths
    tokens = rng.integers(20, 64, size=12).tolist()
    noise = rng.uniform(0.98, 1.02, size=12)
    stats = {
        "base": _stats(base_time.tolist(), tokens),
        "fast": _stats((base_time / 1.5 * noise).tolist(), tokens),
        "mixed": _stats((base_time * np.tile([0.6, 1.6], 6)).tolist(), tokens),
    }
    out = overhead.speed_intervals(stats, "base", [f"p{i}" for i in range(12)])
    assert set(out) == {"fast", "mixed"}
    fast = out["fast"]
    assert fast.mean == pytest.approx(base_time.sum() / (base_time / 1.5 * noise).sum())
    assert 1.45 < fast.lo < fast.mean < fast.hi < 1.55 and fast.n_prompts == 12
    assert verdict(fast.lo, fast.hi, "above", 1.2) == HOLDS
    assert verdict(fast.lo, fast.hi, "above", 1.6) == DOES_NOT_HOLD
    mixed = out["mixed"]
    assert mixed.lo < 1.0 < mixed.hi
    assert verdict(mixed.lo, mixed.hi, "above", 1.05) == UNRESOLVED
    # 6 prompts of different speed-ups, each run twice alike (the file cycled): the repeats
    # are one cluster, so the interval is the 6 prompts' own, not the narrower one that 12
    # independent prompts would give
    six = {k: v[:6] for k, v in stats.items() if k != "fast"}
    twice = {k: v + v for k, v in six.items()}
    ids = [f"p{i}" for i in range(6)]
    alone = overhead.speed_intervals(six, "base", ids)["mixed"]
    cycled = overhead.speed_intervals(twice, "base", ids + ids)["mixed"]
    naive = overhead.speed_intervals(twice, "base", [f"p{i}" for i in range(12)])["mixed"]
    assert cycled.n_prompts == 6 and naive.n_prompts == 12
    assert (cycled.mean, cycled.lo, cycled.hi) == pytest.approx((alone.mean, alone.lo, alone.hi))
    assert naive.hi - naive.lo < 0.9 * (cycled.hi - cycled.lo)


def test_benchmarks_run_as_modules_without_path_edits() -> None:
    """``python -m bench.memory`` from the repository root with no PYTHONPATH: ``python -m``
    alone resolves ``bench`` and ``mtad``, and so does the fresh process it starts per method.
    Only the authors' worker (another interpreter) puts a folder on its path."""
    editing = [
        p.name
        for p in sorted((REPO / "bench").glob("*.py"))
        if "sys.path" in p.read_text() and p.name != "authors_worker.py"
    ]
    assert editing == []
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    cmd = [sys.executable, "-m", "bench.memory", *TINY, "--rounds", "1", "--methods", "ar"]
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "resident memory" in out.stdout and "\nar " in out.stdout


def test_vs_assisted_same_outputs(capsys) -> None:
    acc = vs_assisted.main(TINY)
    # greedy: ours and transformers' assisted generation produce the same tokens
    assert acc["ours sps"]["outputs"] == acc["hf assisted"]["outputs"]
    assert acc["ours ar"]["outputs"] == acc["hf greedy"]["outputs"]
    assert "identical outputs 2/2" in capsys.readouterr().out


def test_forward_clock_counts_outermost_calls_only() -> None:
    import torch

    inner = torch.nn.Linear(2, 2)
    outer = torch.nn.Sequential(inner)
    clock = ForwardClock({"outer": outer, "inner": inner})
    outer(torch.zeros(1, 2))
    assert clock.calls == {"outer": 1, "inner": 0}
    clock.remove()


def test_truncate_at_eos_and_fallback_prompts() -> None:
    assert truncate_at_eos([5, 6, 2, 7], [2]) == [5, 6, 2]
    assert truncate_at_eos([5, 6], [2]) == [5, 6]
    assert {p["kind"] for p in FALLBACK_PROMPTS} == {"chat", "code", "prose"}


@pytest.mark.skipif(
    not os.environ.get("MTAD_AUTHORS_REPO") or not os.environ.get("MTAD_AUTHORS_PYTHON"),
    reason="set MTAD_AUTHORS_REPO and MTAD_AUTHORS_PYTHON to run the authors' side",
)
def test_vs_authors_tiny(capsys) -> None:
    from bench import vs_authors

    repo, python = os.environ["MTAD_AUTHORS_REPO"], os.environ["MTAD_AUTHORS_PYTHON"]
    assert Path(repo, "src", "inference", "strategies.py").is_file()
    sides = vs_authors.main([*TINY, "--authors-repo", repo, "--authors-python", python])
    assert sides["ours"]["tokens"] > 0 and sides["authors"]["tokens"] > 0
    assert "BatchMTADStrategy" in capsys.readouterr().out


def test_lm_head_bench_prints_every_kernel(capsys) -> None:
    """Every kernel, dtype and row count, for the heads of the pair it loads (shapes read from
    the models, none hard-coded), with the kernel ours runs among them."""
    from bench import lm_head
    from mtad.engine.heads import HEAD_KERNELS
    from mtad.engine.tiny import build_tiny_pair

    rows = lm_head.main(["--pair", "tiny", "--rows", "1,3", "--reps", "1"])
    out = capsys.readouterr().out
    assert "F.linear" in out and "(W @ x.T).T" in out and "float32" in out and "bfloat16" in out
    for role, model in zip(("target", "draft"), build_tiny_pair("llama"), strict=True):
        vocab, hidden = model.get_output_embeddings().weight.shape
        assert out.count(f"{role} {vocab}x{hidden}") == 4  # 2 dtypes x 2 row counts
    assert len(rows) == 8 and {r[2 + len(HEAD_KERNELS)] for r in rows} <= set(HEAD_KERNELS)


def test_forward_clock_sees_our_cpu_head() -> None:
    """The clock wraps what our runners call (CPUHeadLM), so forwards are not overhead."""
    import torch

    from bench.common import BenchPair, pair_clock
    from mtad.engine.loading import LoadedPair
    from mtad.engine.runner import ModelRunner
    from mtad.engine.tiny import build_tiny_model, build_tiny_tokenizer

    runner = ModelRunner(build_tiny_model("llama", "target"), "target", lm_head="fast")
    clock = pair_clock(
        BenchPair(
            LoadedPair(runner, None, build_tiny_tokenizer()),
            "tiny",
            None,
            False,
            "float32",
            "float32",
        )
    )
    runner.feed(torch.tensor([1, 2, 3]))
    assert clock.calls["target"] == 1 and clock.seconds["target"] > 0
    clock.remove()


class ScriptedAuthors:
    """Stands in for the authors' worker process: every generation 6 tokens in 3 iterations."""

    info = {"strategy": "BatchMTADStrategy", "transformers": "-", "torch": "-", "rope_theta": 0}

    def __init__(self, python: str, config: dict) -> None:
        self.calls = 0

    def call(self, msg: dict) -> dict:
        self.calls += 1
        return {"tokens": [5] * 6, "wall": 0.01, "forward_s": 0.005, "iterations": 3} | {
            "accepted": 3,
            "draft_s": 0.002,
            "verify_s": 0.003,
        }

    def close(self) -> None:
        pass


def test_vs_authors_tables_both_sides_without_their_code(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    from bench import vs_authors

    (tmp_path / "src" / "inference").mkdir(parents=True)
    (tmp_path / "src" / "inference" / "strategies.py").write_text("")
    monkeypatch.setattr(vs_authors, "AuthorsWorker", ScriptedAuthors)
    argv = [*TINY, "--authors-repo", str(tmp_path), "--authors-python", sys.executable]
    sides = vs_authors.main([*argv, "--repeats", "2"])
    assert sides["authors"]["tokens"] == 2 * 2 * 6 and sides["authors"]["iters"] == 2 * 2 * 3
    assert sides["authors"]["be"] == [2.0] * 4 and len(sides["ours"]["be"]) == 4
    assert sides["ours"]["tokens"] > 0
    assert "x authors" in capsys.readouterr().out


def test_subvocab_bench_times_both_paths(capsys) -> None:
    from bench import subvocab

    rows = subvocab.main(["--rows", "1,4", "--reps", "2"])
    assert [r[0] for r in rows] == ["1", "4"]
    assert all(float(x) > 0 for r in rows for x in r[1:])
    assert "wide / compact" in capsys.readouterr().out


@pytest.mark.skipif(
    not __import__("mtad.engine.packed", fromlist=["x"]).bf16_packing_supported(),
    reason="this CPU's oneDNN has no bfloat16",
)
def test_packed_linears_bench_times_both_modes_on_the_real_pair(capsys) -> None:
    """Both modes on SmolLM2, its independent draft and the shipped head: every forward timed,
    and the logits of the two modes compared (bit for bit on an AMX Xeon; elsewhere a gap of
    one rounding step is reported, not hidden)."""
    from bench import packed_linears

    rows = packed_linears.main(["--reps", "1"])
    assert [r[0] for r in rows] == [
        "target 1 token",
        "target 5 tokens",
        "draft 1 token",
        "head 1 token x 4 rows",
    ]
    assert all(float(r[1]) > 0 and float(r[2]) > 0 for r in rows)
    assert all(r[4] == "equal" or r[4].startswith("max |diff|") for r in rows)
    assert "stock / packed" in capsys.readouterr().out
    # where the packed kernel gives F.linear's bits on SmolLM2's shapes, every row must say so
    import torch

    from mtad.engine.packed import PackedWeight, linear

    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        same = all(
            torch.equal(linear(x, w, None, PackedWeight()), torch.nn.functional.linear(x, w))
            for w in (torch.randn(n, 576, generator=g).bfloat16() for n in (576, 1536, 49152))
            for x in (torch.randn(r, 576, generator=g).bfloat16() for r in (1, 4, 5))
        )
    if same:
        assert [r[4] for r in rows] == ["equal"] * 4


def test_head_train_step_times_both_topk_arms_on_the_training_batches(tmp_path) -> None:
    """One timed step per top-k arm on the committed cursor's next 256 positions (teacher
    signal computed into a fresh cache); the loss's top-k is torch's again afterwards."""
    from bench import head_train_step
    from mtad_train import head_train

    original = head_train.blocked_topk
    args = head_train_step.parse_args(
        ["--steps", "1", "--tokens-per-step", "256", "--ckpt-dir", str(tmp_path)]
    )
    times = head_train_step.time_steps(args)
    assert set(times) == set(head_train_step.TOPK_ARMS)
    assert all(len(v) == 1 and v[0] > 0 for v in times.values())
    assert head_train.blocked_topk is original


def test_the_lean_allocator_file_is_what_continue_sh_exports() -> None:
    from bench.head_train_step import ALLOCATOR_ENV, allocator_env

    env = allocator_env()
    assert env["THP_MEM_ALLOC_ENABLE"] == "1" and "mmap_max=0" in env["GLIBC_TUNABLES"]
    script = (REPO / "assets/drafts/smollm2-head/continue.sh").read_text()
    assert f". {ALLOCATOR_ENV.relative_to(REPO)}" in script
    shell = "set -a; . scripts/lean_allocator.env; set +a; env"
    out = subprocess.run(["bash", "-c", shell], cwd=REPO, capture_output=True, text=True)
    exported = out.stdout.splitlines()
    assert all(f"{k}={v}" in exported for k, v in env.items())


def test_head_calls_bench_times_both_caches_on_the_shipped_head(capsys) -> None:
    """Feeds, forwards and the attention inside each, for the engine's bucketed cache and
    transformers' DynamicCache on the same prompt; the two give the same tokens."""
    from bench import head_calls

    rows, same = head_calls.main(
        ["--draft", "assets/drafts/smollm2-head", "--prompts", "1", "--max-new", "12"]
    )
    assert [r[0] for r in rows] == [
        "feed",
        "attention in feed",
        "forward",
        "attention in forward",
        "all calls per iteration",
    ]
    assert all(r[1] > 0 for r in rows)
    assert same == 1 and "same tokens: 1 of 1 prompts" in capsys.readouterr().out


def test_accepted_lengths_beside_sps_count_a_repeated_prompt_once() -> None:
    """Six prompts, each run twice alike (the file cycled): the same figures and interval as the
    six run once, over 6 prompts, not 12."""
    labels = {"sps": ("sps", "inplace"), "mtad": ("mtad", "inplace")}
    accepted = {"sps": [4, 9, 3, 7, 5, 6], "mtad": [6, 8, 7, 9, 6, 10]}
    once = {m: [DecodeStats(iterations=5, accepted=a) for a in v] for m, v in accepted.items()}
    ids = [f"p{i}" for i in range(6)]
    alone = overhead.accepted_vs_sps(once, labels, "sps", ids)["mtad"]
    twice = overhead.accepted_vs_sps({m: v + v for m, v in once.items()}, labels, "sps", ids + ids)[
        "mtad"
    ]
    assert alone["n_prompts"] == twice["n_prompts"] == 6
    for key in ("mean", "sps_mean", "difference", "lo", "hi"):
        assert twice[key] == pytest.approx(alone[key]), key
    assert alone["difference"] == pytest.approx((46 - 34) / 5 / 6)
    assert alone["lo"] < alone["difference"] < alone["hi"]


def test_bench_prompt_file_rows_are_checked(tmp_path: Path) -> None:
    """--prompt-file is read as the prompts task reads task.files: a bad row names its line; a
    missing file is an error, not the built-in fallback."""
    import argparse

    from bench.common import load_prompts
    from mtad.engine.tiny import build_tiny_tokenizer
    from mtad.tasks.rows import RowError

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "prompt": "fine"}\n{"id": "b", "prompt": ""}\n')
    with pytest.raises(RowError, match="line 2"):
        load_prompts(argparse.Namespace(prompt_file=str(bad), prompts=2), build_tiny_tokenizer())
    missing = argparse.Namespace(prompt_file=str(tmp_path / "none.jsonl"), prompts=1)
    with pytest.raises(FileNotFoundError, match="--prompt-file"):
        load_prompts(missing, build_tiny_tokenizer())
