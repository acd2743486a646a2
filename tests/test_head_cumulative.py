"""Cumulative head training (mtad_train.cumulative): the data cursor, and a session killed at
any point resumes from what the repository holds when the disk is wiped, continuing the curve.

Tiny random target (byte vocabulary), a head built from it, ids written by the test."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from mtad_train.cumulative import (
    CURVE_FILE,
    STATE_FILE,
    TRAINING_DIR,
    Source,
    SourceCursor,
    draw_step,
    read_state,
)


def _ids(path: Path, n: int, seed: int, length: tuple[int, int] = (12, 40)) -> None:
    rng = np.random.default_rng(seed)
    lens = rng.integers(*length, size=n).astype(np.int32)
    toks = rng.integers(0, 256, size=int(lens.sum())).astype(np.uint16)
    plens = np.minimum(lens - 2, 4).astype(np.int32)
    np.savez(path, tokens=toks, lens=lens, plens=plens, kinds=np.array(["x"] * n))


def test_draw_step_keeps_each_source_at_its_weight_and_is_deterministic(tmp_path):
    _ids(tmp_path / "a.npz", 200, 0)
    _ids(tmp_path / "b.npz", 200, 1)
    srcs = [Source.load(f"{tmp_path / 'a.npz'}=2", 64), Source.load(f"{tmp_path / 'b.npz'}=1", 64)]
    c1: dict[str, SourceCursor] = {}
    c2: dict[str, SourceCursor] = {}
    steps1 = [draw_step(srcs, c1, 300, seed=0) for _ in range(20)]
    steps2 = [draw_step(srcs, c2, 300, seed=0) for _ in range(20)]
    assert steps1 == steps2
    pa, pb = c1[srcs[0].name].positions, c1[srcs[1].name].positions
    assert abs(pa / pb - 2.0) < 0.1  # within one sequence of the 2:1 share
    # no sequence repeats within an epoch of its source
    seen = [j for st in steps1 for si, j in st if si == 1]
    assert len(seen) == len(set(seen))


def test_a_source_added_later_leaves_the_others_order_alone(tmp_path):
    _ids(tmp_path / "a.npz", 100, 0)
    _ids(tmp_path / "b.npz", 100, 1)
    a = Source.load(str(tmp_path / "a.npz"), 64)
    b = Source.load(str(tmp_path / "b.npz"), 64)
    alone: dict[str, SourceCursor] = {}
    first = [j for _ in range(5) for _, j in draw_step([a], alone, 200, seed=3)]
    both: dict[str, SourceCursor] = {}
    drawn = [draw_step([a, b], both, 200, seed=3) for _ in range(10)]
    from_a = [j for st in drawn for si, j in st if si == 0]
    assert from_a[: len(first)] == first[: len(from_a)]


def test_an_epoch_wraps_into_a_new_permutation(tmp_path):
    _ids(tmp_path / "a.npz", 10, 0)
    a = Source.load(str(tmp_path / "a.npz"), 64)
    cur: dict[str, SourceCursor] = {}
    drawn = [j for _ in range(12) for _, j in draw_step([a], cur, 1, seed=0)]
    assert sorted(drawn[:10]) == list(range(10))
    assert cur[a.name].epoch == 1 and cur[a.name].next == 2


SESSION = textwrap.dedent(
    """
    import sys, torch
    from pathlib import Path
    from mtad_train.cumulative import CumulativeConfig, Source, head_for_training, run_session
    from mtad.engine.tiny import build_tiny_model

    head_dir, ckpt, data, steps, export_s = sys.argv[1:6]
    torch.manual_seed(0)
    torch.set_num_threads(1)
    target = build_tiny_model("llama", "target", vocab_size=320, seed=3).eval()
    cfg = CumulativeConfig(head=head_dir, sources=[data + "=1"], ckpt_dir=ckpt, depths=2,
        tokens_per_step=160, micro_tokens=160, max_len=64, topk=20, max_steps=int(steps),
        export_every_s=float(export_s), ckpt_every_s=0.0, warmup_steps=2)
    head = head_for_training(target, Path(head_dir))
    sources = [Source.load(s, cfg.max_len) for s in cfg.sources]
    n = [0]
    def evaluate(h):
        n[0] += 1
        return {"all": {"d1": float(n[0])}}
    run_session(cfg, head, target, sources, evaluate=evaluate, host={"cpu_model": "test"},
                log=lambda m: print(m, flush=True))
    """
)


@pytest.fixture()
def head_folder(tmp_path):
    from mtad.engine.feature_head import FeatureHead, HeadSpec
    from mtad.engine.tiny import build_tiny_model

    target = build_tiny_model("llama", "target", vocab_size=320, seed=3).eval()
    head = FeatureHead.from_target(target, HeadSpec(taps=[-1], fuse=False, final_norm=False))
    folder = tmp_path / "repo" / "head"
    head.save(folder)
    _ids(tmp_path / "repo" / "ids.npz", 300, 5)
    script = tmp_path / "session.py"
    script.write_text(SESSION)
    return folder, script


def _session(script, folder, ckpt, steps, export_s="0", wait=True):
    data = str(script.parent / "repo" / "ids.npz")
    cmd = [sys.executable, str(script), str(folder), str(ckpt), data, str(steps), export_s]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if not wait:
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def _curve(folder: Path) -> list[dict]:
    path = folder / TRAINING_DIR / CURVE_FILE
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_two_sessions_on_wiped_disks_continue_the_uninterrupted_data_stream(tmp_path, head_folder):
    folder, script = head_folder
    straight = tmp_path / "straight"
    shutil.copytree(folder, straight)
    _session(script, straight, tmp_path / "ck0", 6)
    _session(script, folder, tmp_path / "ck1", 3)
    first_export = read_state(folder).export
    shutil.rmtree(tmp_path / "ck1")  # the machine is reset: only the repository is left
    log = _session(script, folder, tmp_path / "ck2", 3)
    assert "resumed the committed head: step 3" in log
    a, b = read_state(straight), read_state(folder)
    assert (b.steps, b.positions) == (a.steps, a.positions)
    assert {k: vars(v) for k, v in b.cursor.items()} == {k: vars(v) for k, v in a.cursor.items()}
    rows = _curve(folder)
    assert [r["steps"] for r in rows] == [3, 6]
    assert rows[0]["positions"] < rows[1]["positions"] == b.positions
    assert [s["steps_at_start"] for s in b.sessions] == [0, 3]
    assert b.sessions[1]["export_at_start"] == first_export != b.export


def test_a_session_killed_mid_run_resumes_from_its_last_export_on_a_wiped_disk(
    tmp_path, head_folder
):
    folder, script = head_folder
    ckpt = tmp_path / "ck"
    proc = _session(script, folder, ckpt, 10_000, export_s="0.5", wait=False)
    curve = folder / TRAINING_DIR / CURVE_FILE
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if curve.is_file() and len(curve.read_text().splitlines()) >= 2:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert len(curve.read_text().splitlines()) >= 2, "the session exported nothing in time"
    killed = read_state(folder)  # parses: every file was replaced whole
    before = _curve(folder)
    shutil.rmtree(ckpt)
    log = _session(script, folder, tmp_path / "ck2", 2)
    assert f"resumed the committed head: step {killed.steps}" in log
    after = _curve(folder)
    assert after[: len(before)] == before
    assert after[-1]["steps"] == killed.steps + 2
    positions = [r["positions"] for r in after]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    assert (folder / TRAINING_DIR / STATE_FILE).is_file()


def test_the_local_checkpoint_is_resumed_only_when_it_descends_from_the_committed_head(
    tmp_path, head_folder
):
    folder, script = head_folder
    ckpt = tmp_path / "ck"
    _session(script, folder, ckpt, 2)
    log = _session(script, folder, ckpt, 2)
    assert "resumed the local checkpoint: step 2" in log
    stale = tmp_path / "stale"
    shutil.copytree(ckpt, stale)  # step 4, the committed head's own checkpoint
    # another machine trains the committed head on and commits it: the copy is now behind
    _session(script, folder, tmp_path / "other", 1)
    log = _session(script, folder, stale, 1)
    assert "resumed the committed head: step 5" in log


def test_sigterm_ends_the_session_after_its_step_with_an_export(tmp_path, head_folder):
    folder, script = head_folder
    proc = _session(script, folder, tmp_path / "ck", 10_000, wait=False)
    assert proc.stdout is not None
    for line in proc.stdout:  # the first logged step
        if line.startswith(b"step ") or b" step 1 " in line:
            break
    proc.send_signal(signal.SIGTERM)
    out = proc.stdout.read().decode()
    assert proc.wait(timeout=120) == 0, out
    assert "stopping after this step" in out
    state = read_state(folder)
    assert state.steps >= 1
    assert [r["steps"] for r in _curve(folder)] == [state.steps]


def test_the_reports_verdict_checks_each_figure_of_issue_39s_bar():
    from mtad_train.head_report import verdict

    def res(pooled, each):
        out = {k: {"d1": each, "d2": 0.0, "d3": 0.0} for k in ("humaneval", "mtbench")}
        out["all"] = dict(zip(("d1", "d2", "d3"), pooled, strict=True))
        return out

    assert verdict(res((0.5, 0.45, 0.4), 0.4), 3).startswith("Meets")
    text = verdict(res((0.5, 0.44, 0.4), 0.39), 3)
    assert text.startswith("Below issue 39's bar on 3 of 5 figures")
    assert "all kinds, depth 2 0.440 < 0.45" in text and "mtbench, depth 1 0.390 < 0.4" in text
