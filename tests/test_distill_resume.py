"""A distillation killed mid-run resumes from its checkpoint to the same end as an
uninterrupted run: same step count, same generated data, same draft weights (issue #17).

Runs the real command line (``scripts/distill_draft.py``) on the tiny random target, in
subprocesses so that the kill is a real SIGKILL."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from in_process import run_script_here
from safetensors.torch import load_file

from mtad_train import objectives as O
from mtad_train.data import Buffer, fill_teacher, topk_of_logits

REPO = Path(__file__).resolve().parents[1]
STEPS = 14


def _pool(path: Path) -> None:
    words = [
        "alpha",
        "beta",
        "gamma",
        "delta",
        "epsilon",
        "zeta",
        "eta",
        "theta",
        "iota",
        "kappa",
        "lambda",
        "mu",
    ]
    items = [
        {
            "kind": "chat",
            "source": "test",
            "messages": [{"role": "user", "content": f"say {w} {i} twice"}],
        }
        for i in range(40)
        for w in words[i % 3 :: 5]
    ]
    with gzip.open(path, "wt") as f:
        for it in items:
            f.write(json.dumps(it) + "\n")


def _cmd(tmp: Path, run: str) -> list[str]:
    return [
        sys.executable,
        str(REPO / "scripts" / "distill_draft.py"),
        "--target",
        "tiny",
        "--target-dtype",
        "float32",
        "--device",
        "cpu",
        "--threads",
        "1",
        "--pool",
        str(tmp / "pool.jsonl.gz"),
        "--require-eval-kinds",
        "",
        "--max-steps",
        str(STEPS),
        "--gen-batch-size",
        "6",
        "--gen-max-new",
        "12",
        "--followup-frac",
        "0",
        "--eval-max-new",
        "6",
        "--eval-n-humaneval",
        "1",
        "--eval-n-mtbench",
        "1",
        "--eval-n-default",
        "1",
        "--eval-n-pool",
        "2",
        "--no-eval-mtbench-turn2",
        "--tokens-per-step",
        "96",
        "--micro-tokens",
        "96",
        "--replay-ratio",
        "1",
        "--warmup-steps",
        "2",
        "--autocast",
        "off",
        "--drafts",
        "D:layers=1,hidden=32,intermediate=64,heads=2,kv_heads=1",
        "--export-every-s",
        "0",
        "--ckpt-every-s",
        "0",
        "--save-data",
        "--teacher-topk",
        "16",
        "--out",
        str(tmp / run / "out"),
        "--ckpt-dir",
        str(tmp / run / "ckpt"),
    ]


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "WANDB_MODE": "offline",
        "PYTHONPATH": str(REPO),
    }


def _distill(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    """A distillation that runs to its end, in this process (``cmd`` minus the interpreter:
    no new interpreter's imports); the kills and the cut saves run in subprocesses."""
    return subprocess.CompletedProcess(cmd, 0, run_script_here(cmd[1:]), "")


def _ckpt_step(folder: Path) -> int:
    f = folder / "state.pt"
    if not f.is_file():
        return -1
    try:
        return int(torch.load(f, map_location="cpu", weights_only=False)["step"])
    except Exception:  # written atomically, but may vanish between is_file and load
        return -1


def _stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (state ``T`` in /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] == "T"


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    """The uninterrupted distillation, run once for this module's resume tests (its folder)."""
    tmp = tmp_path_factory.mktemp("distill")
    _pool(tmp / "pool.jsonl.gz")
    out = _distill(_cmd(tmp, "a"))
    assert out.returncode == 0, out.stderr[-2000:]
    return tmp / "a"


def _same_end(a: Path, b: Path) -> None:
    """Two distillations ended alike: data, plan and the draft's weights."""
    da, db = (np.load(r / "out" / "data.npz") for r in (a, b))
    for key in ("tokens", "lens", "plens"):
        assert np.array_equal(da[key], db[key]), key
    ra, rb = (json.loads((r / "out" / "D" / "recipe.json").read_text())["plan"] for r in (a, b))
    assert ra["steps"] == rb["steps"] == STEPS
    assert ra["gen_tokens"] == rb["gen_tokens"] > 0
    wa, wb = (load_file(str(r / "out" / "D" / "model.safetensors")) for r in (a, b))
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=0, atol=0, msg=k)


def test_a_distillation_cut_mid_checkpoint_resumes_to_the_same_end(tmp_path, straight):
    """The disk is full at one checkpoint's save, then a later save is killed half-written:
    each time the last whole checkpoint stays, and the run resumed after both ends as the
    uninterrupted one (issue 38 item 4; tests/save_fault.py cuts the saves)."""
    shutil.copy(straight.parent / "pool.jsonl.gz", tmp_path / "pool.jsonl.gz")
    fault = [sys.executable, str(REPO / "tests" / "save_fault.py")]
    for spec in ("state.pt:5:enospc", "state.pt:4:kill"):
        cmd = _cmd(tmp_path, "b")
        cut = subprocess.run(
            [*fault, spec, *cmd[1:]], env=_env(), capture_output=True, text=True, timeout=600
        )
        assert cut.returncode != 0, f"{spec} did not happen"
        assert _ckpt_step(tmp_path / "b" / "ckpt") > 0  # a whole checkpoint is there, read back
    assert "No space left on device" in cut.stderr or cut.returncode == -9
    resumed = _distill(_cmd(tmp_path, "b"))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    _same_end(straight, tmp_path / "b")


def test_killed_distillation_resumes_to_the_same_end(tmp_path, straight):
    """SIGKILL from outside after the checkpoint of step STEPS // 2 (the run stops itself
    there, tests/save_fault.py, so a fast run cannot reach its end first), then a resume."""
    shutil.copy(straight.parent / "pool.jsonl.gz", tmp_path / "pool.jsonl.gz")
    fault = [sys.executable, str(REPO / "tests" / "save_fault.py"), f"state.pt:{STEPS // 2}:stop"]
    proc = subprocess.Popen(
        [*fault, *_cmd(tmp_path, "b")[1:]],
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 300
    while not _stopped(proc.pid) and time.time() < deadline:
        assert proc.poll() is None, "the run ended before it could be killed"
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    killed_at = _ckpt_step(tmp_path / "b" / "ckpt")
    assert 0 < killed_at < STEPS, killed_at

    resumed = _distill(_cmd(tmp_path, "b"))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert (
        f"resumed from {tmp_path / 'b' / 'ckpt'}: step {killed_at}"
        in resumed.stdout + resumed.stderr
    )

    _same_end(straight, tmp_path / "b")


def test_topk_kl_is_the_full_kl_when_k_is_the_vocabulary_and_a_lower_bound_below():
    g = torch.Generator().manual_seed(0)
    t_logits = torch.randn(50, 40, generator=g) * 3
    d_logits = torch.randn(50, 40, generator=g) * 3
    full = O.forward_kl(torch.log_softmax(t_logits, -1), d_logits)
    ids, logp = topk_of_logits(t_logits, 40)
    torch.testing.assert_close(
        O.topk_kl(ids.long(), logp.float(), d_logits), full, rtol=2e-3, atol=2e-3
    )  # float16 log-probs
    ids, logp = topk_of_logits(t_logits, 8)
    part = O.topk_kl(ids.long(), logp.float(), d_logits)
    assert (part <= full + 2e-3).all() and (part >= -1e-4).all()


@pytest.mark.parametrize("k", [10, 16])
def test_target_sparse_from_topk_equals_the_full_warp(k):
    g = torch.Generator().manual_seed(1)
    t_logits = torch.randn(30, 64, generator=g) * 2
    ids, logp = topk_of_logits(t_logits, k)
    full_idx, full_p = O.target_sparse(t_logits)
    idx, p = O.target_sparse_from_topk(ids.long(), logp.float())
    # as distributions over the vocabulary (float16 log-probs may swap near-ties in order)
    dense = torch.zeros_like(t_logits).scatter_add_(-1, idx, p)
    full = torch.zeros_like(t_logits).scatter_add_(-1, full_idx, full_p)
    same_support = ((dense > 0) == (full > 0)).all(-1)
    torch.testing.assert_close(dense[same_support], full[same_support], rtol=0, atol=2e-3)
    # a row may keep other tokens only where float16 rounding swaps a near-tie: the tokens
    # kept by one and not the other have (nearly) equal logits
    assert (~same_support).sum() <= 2
    for r in (~same_support).nonzero().flatten().tolist():
        differ = ((dense[r] > 0) != (full[r] > 0)).nonzero().flatten()
        assert len(differ) == 2
        assert abs(float(t_logits[r, differ[0]] - t_logits[r, differ[1]])) < 1e-2


def test_fill_teacher_matches_a_teacher_forced_forward(tiny_llama):
    target, _ = tiny_llama
    buf = Buffer()
    g = torch.Generator().manual_seed(2)
    for n in (9, 14):
        seq = torch.randint(0, 256, (n,), generator=g).tolist()
        buf.add(seq[:4], seq[4:], "chat", False)
    assert fill_teacher(buf, target, 5, "cpu", 64) == 2
    with torch.no_grad():
        for i, s in enumerate(buf.seqs):
            logits = target(input_ids=torch.tensor([s])).logits[0, buf.plens[i] - 1 : -1]
            ids, logp = topk_of_logits(logits, 5)
            assert np.array_equal(buf.teach[i][0], ids.numpy())
            np.testing.assert_allclose(buf.teach[i][1], logp.numpy(), atol=2e-3)


def test_prompt_positions_train_on_the_stored_teacher_in_the_cells_order(tiny_llama):
    """--prompt-weight > 0 with a stored teacher: the target's top-k at the prompt positions
    is filled by one teacher-forced pass and handed to training before the response
    positions, row by row, in the order of the micro-batch's ``w > 0`` cells."""
    from types import SimpleNamespace

    from mtad_train.data import collate
    from mtad_train.train import cached_teacher

    target, _ = tiny_llama
    buf = Buffer()
    g = torch.Generator().manual_seed(3)
    for n, p in ((9, 4), (14, 6)):
        seq = torch.randint(0, 256, (n,), generator=g).tolist()
        buf.add(seq[:p], seq[p:], "chat", False)
    fill_teacher(buf, target, 5, "cpu", 64)
    args = SimpleNamespace(prompt_weight=0.5, device="cpu")
    assert cached_teacher(buf, [0, 1], args) is None  # prompt positions not filled yet
    assert fill_teacher(buf, target, 5, "cpu", 64, prompts=True) == 2
    ids, logp = cached_teacher(buf, [0, 1], args)
    x, w = collate(buf, [0, 1], 0, args.prompt_weight, "cpu")
    with torch.no_grad():
        logits = target(input_ids=x).logits[w > 0]  # row-major: the training step's order
    want_ids, want_logp = topk_of_logits(logits, 5)
    assert ids.shape[0] == int((w > 0).sum()) == (9 - 1) + (14 - 1)
    assert torch.equal(ids, want_ids.long())
    torch.testing.assert_close(logp, want_logp.float(), atol=2e-3, rtol=0)
    # without prompt weight only the response positions, as before
    only = cached_teacher(buf, [0, 1], SimpleNamespace(prompt_weight=0.0, device="cpu"))
    assert only[0].shape[0] == (9 - 4) + (14 - 6)


def test_a_continued_run_draws_prompts_not_already_in_its_data(tmp_path, straight):
    """``--data-in`` data are not generated again: a run continued from an earlier run's
    data.npz prompts the target with pool items the earlier run did not use."""
    shutil.copy(straight.parent / "pool.jsonl.gz", tmp_path / "pool.jsonl.gz")
    cmd = _cmd(tmp_path, "c") + ["--data-in", str(straight / "out" / "data.npz")]
    cmd[cmd.index("--replay-ratio") + 1] = "0.5"  # generate soon after loading
    cont = _distill(cmd)
    assert cont.returncode == 0, cont.stderr[-2000:]

    def prompts(path: Path) -> list[tuple[int, ...]]:
        z = np.load(path)
        ends = np.cumsum(z["lens"])
        return [
            tuple(z["tokens"][e - n : e - n + p])
            for e, n, p in zip(ends, z["lens"], z["plens"], strict=True)
        ]

    old = prompts(straight / "out" / "data.npz")
    both = prompts(tmp_path / "c" / "out" / "data.npz")
    assert both[: len(old)] == old  # the loaded data come first
    new = both[len(old) :]
    assert new, "the continued run generated nothing"
    assert not set(new) & set(old)
    assert len(set(new)) == len(new)


def test_a_run_killed_after_filling_the_teacher_of_loaded_data_resumes_without_refilling(
    tmp_path, straight
):
    """The teacher-forced pass over ``--data-in`` data (an hour on a CPU for the shipped
    data) is checkpointed before the first step: a run killed after it resumes from that
    state without a second pass and ends where an uninterrupted run ends."""
    shutil.copy(straight.parent / "pool.jsonl.gz", tmp_path / "pool.jsonl.gz")

    def continued(run: str) -> list[str]:
        cmd = _cmd(tmp_path, run) + [
            "--data-in",
            str(straight / "out" / "data.npz"),
            "--gen-frac",
            "0",
            "--prompt-weight",
            "0.5",
        ]
        # no periodic checkpoint: the only one before the end is the one after the fill
        cmd[cmd.index("--ckpt-every-s") + 1] = "3600"
        return cmd

    whole = _distill(continued("s"))
    assert whole.returncode == 0, whole.stderr[-2000:]
    filled = "teacher top-16 computed for"
    assert filled in whole.stdout + whole.stderr

    proc = subprocess.Popen(
        continued("k"), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.time() + 300
    while _ckpt_step(tmp_path / "k" / "ckpt") < 0 and time.time() < deadline:
        assert proc.poll() is None, "the run ended before it could be killed"
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    assert _ckpt_step(tmp_path / "k" / "ckpt") == 0
    resumed = _distill(continued("k"))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    log = resumed.stdout + resumed.stderr
    assert f"resumed from {tmp_path / 'k' / 'ckpt'}: step 0" in log
    assert filled not in log

    ws, wk = (load_file(str(tmp_path / r / "out" / "D" / "model.safetensors")) for r in "sk")
    for k in ws:
        torch.testing.assert_close(ws[k], wk[k], rtol=0, atol=0, msg=k)
