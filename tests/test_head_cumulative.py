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
import torch
from in_process import run_script_here

from mtad_train.cumulative import (
    CURSOR_FILE,
    CURVE_FILE,
    STATE_FILE,
    TEACHER_DIR,
    THREADS_FILE,
    TRAINING_DIR,
    WEIGHTS_FILE,
    Source,
    SourceCursor,
    draw_step,
    fork_arm,
    read_state,
    requested_threads,
)

SAVE_FAULT = Path(__file__).parent / "save_fault.py"


def _ids(path: Path, n: int, seed: int, length: tuple[int, int] = (12, 40)) -> None:
    rng = np.random.default_rng(seed)
    lens = rng.integers(*length, size=n).astype(np.int32)
    toks = rng.integers(0, 256, size=int(lens.sum())).astype(np.uint16)
    plens = np.minimum(lens - 2, 4).astype(np.int32)
    np.savez(path, tokens=toks, lens=lens, plens=plens, kinds=np.array(["x"] * n))


def _ab(tmp_path: Path, wa: float, wb: float) -> list[Source]:
    """Sources a.npz and b.npz under ``tmp_path`` at weights ``wa`` and ``wb``."""
    return [
        Source.load(f"{tmp_path / 'a.npz'}={wa}", 64),
        Source.load(f"{tmp_path / 'b.npz'}={wb}", 64),
    ]


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


def test_changed_weights_hold_from_the_next_step_and_unchanged_ones_move_nothing(tmp_path):
    """After 2:1 for a while, 1:3 holds from the next step on (the source whose weight grew is
    not drawn alone until it catches up); drawn on at the weights it was drawn at, a cursor's
    offsets stay as they were (the rebase moves nothing then)."""
    _ids(tmp_path / "a.npz", 400, 0)
    _ids(tmp_path / "b.npz", 400, 1)

    cur: dict[str, SourceCursor] = {}
    for _ in range(20):
        draw_step(_ab(tmp_path, 2, 1), cur, 300, seed=0)
    for _ in range(5):
        draw_step(_ab(tmp_path, 2, 1), cur, 300, seed=0)
    assert [(v.offset, v.weight) for v in cur.values()] == [(0.0, 2.0), (0.0, 1.0)]
    before = {k: v.positions for k, v in cur.items()}
    srcs = _ab(tmp_path, 1, 3)
    for n in range(1, 9):
        draw_step(srcs, cur, 300, seed=0)
        got = [cur[s.name].positions - before[s.name] for s in srcs]
        assert got[0] > 0, f"step {n}: source a not drawn at all"
    assert abs(got[1] / got[0] - 3.0) < 0.35, got  # within a sequence or two of 1:3
    assert [cur[s.name].weight for s in srcs] == [1.0, 3.0]


def test_a_cursor_without_weights_is_rebased_when_its_levels_are_apart(tmp_path):
    """A cursor written before weights were recorded (weight 0) and drawn at 2:1, then drawn
    at 1:3: the shares hold from the next step (it was drawing b alone until b's level caught
    up); drawn on at 2:1 instead, nothing moves."""
    _ids(tmp_path / "a.npz", 400, 0)
    _ids(tmp_path / "b.npz", 400, 1)

    def legacy() -> dict[str, SourceCursor]:
        cur: dict[str, SourceCursor] = {}
        for _ in range(30):
            draw_step(_ab(tmp_path, 2, 1), cur, 300, seed=0)
        for c in cur.values():
            c.weight = 0.0
        return cur

    same = legacy()
    offsets = [c.offset for c in same.values()]
    draw_step(_ab(tmp_path, 2, 1), same, 300, seed=0)
    assert [c.offset for c in same.values()] == offsets
    cur = legacy()
    before = {k: v.positions for k, v in cur.items()}
    srcs = _ab(tmp_path, 1, 3)
    for n in range(1, 9):
        draw_step(srcs, cur, 300, seed=0)
        got = [cur[s.name].positions - before[s.name] for s in srcs]
        assert got[0] > 0, f"step {n}: source a not drawn at all"
    assert abs(got[1] / got[0] - 3.0) < 0.35, got


def test_an_epoch_wraps_into_a_new_permutation(tmp_path):
    _ids(tmp_path / "a.npz", 10, 0)
    a = Source.load(str(tmp_path / "a.npz"), 64)
    cur: dict[str, SourceCursor] = {}
    drawn = [j for _ in range(12) for _, j in draw_step([a], cur, 1, seed=0)]
    assert sorted(drawn[:10]) == list(range(10))
    assert cur[a.name].epoch == 1 and cur[a.name].next == 2


def _folder(path: Path, shards: list[int]) -> None:
    """A folder of shards with their manifest (respond's layout), shard i of ``shards[i]``
    sequences."""
    path.mkdir()
    for i, n in enumerate(shards):
        _ids(path / f"{i:04d}.npz", n, seed=10 + i)
    manifest = {"shards": [{"file": f"{i:04d}.npz"} for i in range(len(shards))]}
    (path / "manifest.json").write_text(json.dumps(manifest))


def test_a_shard_range_draws_its_shards_only_at_its_own_weight(tmp_path):
    _folder(tmp_path / "on", [30, 30, 30, 10])
    old, new = (
        Source.load(f"{tmp_path / 'on'}[:3]=1", 64),
        Source.load(f"{tmp_path / 'on'}[3:]=1", 64),
    )
    assert [Path(f).name for f in old.files] == ["0000.npz", "0001.npz", "0002.npz"]
    assert [Path(f).name for f in new.files] == ["0003.npz"] and len(new.seqs) == 10
    assert old.name != new.name and new.root == str(tmp_path / "on")
    cur: dict[str, SourceCursor] = {}
    for _ in range(10):
        draw_step([old, new], cur, 200, seed=0)
    # 1:1 by positions: the 10-sequence range goes round three times before the 90-sequence
    # one goes round once
    assert abs(cur[old.name].positions / cur[new.name].positions - 1.0) < 0.1
    assert cur[new.name].epoch >= 3 and cur[old.name].epoch == 0
    # a shard written later joins the open-ended range when its epoch ends, not the closed one
    _ids(tmp_path / "on" / "0004.npz", 5, seed=99)
    manifest = json.loads((tmp_path / "on" / "manifest.json").read_text())
    manifest["shards"].append({"file": "0004.npz"})
    (tmp_path / "on" / "manifest.json").write_text(json.dumps(manifest))
    for _ in range(10):
        draw_step([old, new], cur, 200, seed=0)
    assert len(old.files) == 3 and [Path(f).name for f in new.files] == ["0003.npz", "0004.npz"]
    with pytest.raises(ValueError, match="needs a folder"):
        Source.load(f"{tmp_path / 'on' / '0000.npz'}[1:]=1", 64)


SESSION = textwrap.dedent(
    """
    import sys, torch
    from pathlib import Path
    from mtad_train.cumulative import CumulativeConfig, Source, head_for_training, run_session
    from mtad.engine.tiny import build_tiny_model

    head_dir, ckpt, data, steps, export_s = sys.argv[1:6]
    ckpt_s = float(sys.argv[6]) if len(sys.argv) > 6 else 0.0
    torch.manual_seed(0)
    torch.set_num_threads(1)
    target = build_tiny_model("llama", "target", vocab_size=320, seed=3).eval()
    cfg = CumulativeConfig(head=head_dir, sources=[data + "=1"], ckpt_dir=ckpt, depths=2,
        tokens_per_step=160, micro_tokens=160, max_len=64, topk=20, max_steps=int(steps),
        export_every_s=float(export_s), ckpt_every_s=ckpt_s, warmup_steps=2)
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


@pytest.fixture(scope="module")
def head_template(tmp_path_factory):
    """A committed head built from the tiny target, the ids it trains on and the session
    script, once per module: every test starts from a copy of this head (the sessions read the
    ids where they are: a source's path seeds its order)."""
    from mtad.engine.feature_head import FeatureHead, HeadSpec
    from mtad.engine.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("head")
    target = build_tiny_model("llama", "target", vocab_size=320, seed=3).eval()
    head = FeatureHead.from_target(target, HeadSpec(taps=[-1], fuse=False, final_norm=False))
    folder = root / "repo" / "head"
    head.save(folder)
    _ids(root / "repo" / "ids.npz", 300, 5)
    script = root / "session.py"
    script.write_text(SESSION)
    return folder, script


@pytest.fixture()
def head_folder(tmp_path, head_template):
    template, script = head_template
    folder = tmp_path / "repo" / "head"
    shutil.copytree(template, folder)
    return folder, script


def _session(script, folder, ckpt, steps, export_s="0", wait=True, ckpt_s="0", fault=None):
    """One training session: in a subprocess where the process is the point (``wait=False``:
    the caller kills or signals it; ``fault`` (``NAME:N:KIND``) cuts the N-th save of a file
    NAME short (tests/save_fault.py): the session then fails, and its output is returned for
    the caller to check); else in this process (what it leaves on disk is the same, without a
    new interpreter's ~4 s of imports). Its log."""
    data = str(script.parent / "repo" / "ids.npz")
    cmd = [str(script), str(folder), str(ckpt), data, str(steps), export_s, ckpt_s]
    if wait and not fault:
        return run_script_here(cmd)
    cmd = [sys.executable, *([str(SAVE_FAULT), fault] if fault else []), *cmd]
    # this checkout's packages first (an editable install may point at another checkout)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[1])}
    if not wait:
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    if fault:
        assert out.returncode != 0, f"the fault {fault} did not happen: {out.stdout}"
        return out.stdout + out.stderr
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
    # each session names its recipe: the data and the objective it trained with
    recipe = b.sessions[1]["recipe"]
    assert recipe["depths"] == 2 and recipe["tokens_per_step"] == 160
    assert recipe["sources"][0].endswith("ids.npz=1") and "reg_weight" in recipe


def test_the_threads_file_sets_the_trainings_threads_from_the_next_step(tmp_path, head_folder):
    folder, script = head_folder
    ckpt = tmp_path / "ck"
    ckpt.mkdir()
    assert requested_threads(ckpt) is None  # no file: the session's own threads
    for text in ("0", "-1", "two", ""):
        (ckpt / THREADS_FILE).write_text(text)
        assert requested_threads(ckpt) is None
    (ckpt / THREADS_FILE).write_text("2\n")
    assert requested_threads(ckpt) == 2
    before = torch.get_num_threads()
    try:
        log = _session(script, folder, ckpt, 2)  # in this process: the session sets 1 first
        during = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    assert f"2 torch threads from step 1 ({ckpt / THREADS_FILE})" in log
    assert during == 2 and log.count("torch threads from step") == 1


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


def _weights_and_digest(folder: Path) -> tuple[bytes, str | None]:
    blob = (folder / WEIGHTS_FILE).read_bytes()
    return blob, read_state(folder).export


@pytest.fixture(scope="module")
def uninterrupted_4(tmp_path_factory, head_template):
    """4 steps from the committed head, a local checkpoint after each, nothing cut: (the head
    folder it exported to, its checkpoint folder)."""
    template, script = head_template
    root = tmp_path_factory.mktemp("straight")
    straight = root / "straight"
    shutil.copytree(template, straight)
    _session(script, straight, root / "ck0", 4, ckpt_s="1e-9")
    return straight, root / "ck0"


@pytest.mark.parametrize("kind", ["kill", "enospc"])
def test_a_checkpoint_cut_short_keeps_the_last_one_and_resumes_to_the_uninterrupted_weights(
    tmp_path, head_folder, uninterrupted_4, kind
):
    """The 3rd local checkpoint's save is killed half-written or hits a full disk: the 2nd stays
    whole, and the session resumed from it ends on the uninterrupted run's exact weights (its
    optimiser came back too, so no second warm-up)."""
    import torch

    folder, script = head_folder
    straight, straight_ckpt = uninterrupted_4
    ckpt = tmp_path / "ck1"
    out = _session(script, folder, ckpt, 4, ckpt_s="1e-9", fault=f"ckpt.pt:3:{kind}")
    if kind == "enospc":
        assert "No space left on device" in out and str(ckpt / "ckpt.pt") in out, out
    kept = torch.load(ckpt / "ckpt.pt", weights_only=False)
    assert kept["state"]["steps"] == 2  # the last whole one
    log = _session(script, folder, ckpt, 2, ckpt_s="1e-9")
    assert "resumed the local checkpoint: step 2" in log
    a, b = (torch.load(d / "ckpt.pt", weights_only=False) for d in (straight_ckpt, ckpt))
    assert a["state"]["steps"] == b["state"]["steps"] == 4
    for k in a["head"]:
        assert torch.equal(a["head"][k], b["head"][k]), k
    assert _weights_and_digest(straight) == _weights_and_digest(folder)
    # a full disk leaves no temporary file; a kill may leave its one hidden temporary
    # (beside the checkpoint: the cursor for a teacher filling ahead, and the teacher cache)
    leftovers = [
        p.name for p in ckpt.iterdir() if p.name not in ("ckpt.pt", CURSOR_FILE, TEACHER_DIR)
    ]
    assert len(leftovers) <= (0 if kind == "enospc" else 1), leftovers
    assert all(name.startswith(".ckpt.pt.") for name in leftovers), leftovers


def test_a_forked_arm_goes_on_as_the_training_would_and_exports_into_itself(
    tmp_path, head_folder, uninterrupted_4
):
    """An A/B arm forked after 2 steps and trained 2 more ends on the uninterrupted run's exact
    weights and cursor (checkpoint, optimiser and averages came along), exports into the arm and
    leaves the committed folder alone; an arm forked where no checkpoint descends from the
    committed head starts from the committed head."""
    import torch

    folder, script = head_folder
    straight, straight_ckpt = uninterrupted_4
    ckpt = tmp_path / "ck"
    _session(script, folder, ckpt, 2, ckpt_s="1e-9")
    committed = _weights_and_digest(folder), (folder / TRAINING_DIR / CURVE_FILE).read_text()
    arm = tmp_path / "arm"
    assert fork_arm(folder, ckpt, arm) == "local checkpoint, step 2"
    assert (arm / "ckpt" / TEACHER_DIR).resolve() == (ckpt / TEACHER_DIR).resolve()
    log = _session(script, arm / "head", arm / "ckpt", 2, ckpt_s="1e-9")
    assert "resumed the local checkpoint: step 2" in log
    a, b = (torch.load(d / "ckpt.pt", weights_only=False) for d in (straight_ckpt, arm / "ckpt"))
    for k in a["head"]:
        assert torch.equal(a["head"][k], b["head"][k]), k
    assert _weights_and_digest(straight) == _weights_and_digest(arm / "head")
    assert read_state(arm / "head").cursor == read_state(straight).cursor
    assert [r["steps"] for r in _curve(arm / "head")] == [2, 4]
    assert (_weights_and_digest(folder), (folder / TRAINING_DIR / CURVE_FILE).read_text()) == (
        committed
    )
    with pytest.raises(ValueError, match="not empty"):
        fork_arm(folder, ckpt, arm)
    elsewhere = tmp_path / "other"
    _session(script, folder, elsewhere, 1)  # the committed head moves on: ck no longer descends
    assert fork_arm(folder, ckpt, tmp_path / "arm2") == "committed head, step 3"
    assert not (tmp_path / "arm2" / "ckpt" / "ckpt.pt").exists()


@pytest.mark.parametrize(
    "cut, kind",  # each file of an export, both kinds of cut among them
    [
        ("model.next.safetensors:2", "kill"),
        ("state.json:2", "enospc"),
        ("head_config.json:2", "kill"),
        ("curve.jsonl:2", "enospc"),
    ],
)
def test_an_export_cut_at_any_file_leaves_one_whole_export(tmp_path, head_folder, cut, kind):
    """Exports after every step; the 2nd is cut at one of its files. What the repository then
    holds is one whole export (the weights are the ones its state names, the config says the
    same step), and the next session goes on from it."""
    import hashlib

    from mtad_train.cumulative import NEXT_WEIGHTS_FILE, settle_export

    folder, script = head_folder
    _session(script, folder, tmp_path / "ck", 3, export_s="1e-9", fault=f"{cut}:{kind}")
    settle_export(folder)  # what the next session's start does first
    state = read_state(folder)
    blob, digest = _weights_and_digest(folder)
    assert hashlib.sha256(blob).hexdigest()[:16] == digest
    assert not (folder / TRAINING_DIR / NEXT_WEIGHTS_FILE).exists()
    # the state is the commit point: a cut before it is written keeps the 1st export
    committed_2nd = cut.split(":")[0] not in ("model.next.safetensors", "state.json")
    assert state.steps == (2 if committed_2nd else 1)
    config = json.loads((folder / "head_config.json").read_text())
    assert (config["step"], config["trained_positions"]) == (state.steps, state.positions)
    # every line whole; the row is written last, so the 2nd export's is lost (a measurement,
    # not state: the next export adds its own)
    assert [r["steps"] for r in _curve(folder)] == [1]
    shutil.rmtree(tmp_path / "ck")
    log = _session(script, folder, tmp_path / "ck2", 1, export_s="1e-9")
    assert f"resumed the committed head: step {state.steps}" in log
    assert read_state(folder).steps == state.steps + 1


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


def test_the_weight_average_follows_its_decay_and_swaps_back_the_trained_weights():
    import torch

    from mtad.engine.feature_head import FeatureHead, HeadSpec
    from mtad.engine.tiny import build_tiny_model
    from mtad_train.cumulative import WeightAverage

    target = build_tiny_model("llama", "target", vocab_size=320, seed=3).eval()
    head = FeatureHead.from_target(target, HeadSpec(taps=[-1], fuse=False, final_norm=False))
    average = WeightAverage(head, 0.9)
    params = dict(head.named_parameters())
    name = average.names[0]
    start = params[name].detach().clone()
    with torch.no_grad():
        for n in average.names:
            params[n].add_(1.0)
    average.update(head)
    assert torch.allclose(average.avg[name], start + 0.1, atol=1e-6)  # 0.9 * w + 0.1 * (w + 1)
    trained = params[name].detach().clone()
    with average.swapped_in(head):
        assert torch.allclose(params[name], start + 0.1, atol=1e-6)
    assert torch.equal(params[name], trained)
    frozen = [n for n, p in head.named_parameters() if not p.requires_grad]
    assert not set(frozen) & set(average.names)  # the target's frozen rows are not averaged


def _moved_head_with_two_averages():
    """A tiny head with averages of decays 0.5 and 0.9 after its first trainable tensor moved
    by +1: ``(target, spec, head, averages, that tensor's name, the tensor, its value before)``."""
    import torch

    from mtad.engine.feature_head import FeatureHead, HeadSpec
    from mtad.engine.tiny import build_tiny_model
    from mtad_train.cumulative import CumulativeConfig, weight_averages

    target = build_tiny_model("llama", "target", vocab_size=320, seed=3).eval()
    spec = HeadSpec(taps=[-1], fuse=False, final_norm=False)
    head = FeatureHead.from_target(target, spec)
    averages = weight_averages(head, CumulativeConfig(ema_decays=[0.5, 0.9]), None)
    name = averages[0].names[0]
    param = dict(head.named_parameters())[name]
    start = param.detach().clone()
    with torch.no_grad():
        param.add_(1.0)
    for a in averages:
        a.update(head)
    return target, spec, head, averages, name, param, start


def test_averages_resume_by_decay_and_a_new_decay_starts_from_the_nearest():
    """A checkpoint's averages are found by their decay; a decay added since starts from the
    saved average of the nearest decay, and with nothing saved all start from the weights."""
    import torch

    from mtad_train.cumulative import CumulativeConfig, WeightAverage, weight_averages

    _, _, head, moved, name, param, start = _moved_head_with_two_averages()
    saved = {a.label: a.avg for a in moved}  # "ema 0.5": start + 0.5, "ema 0.9": start + 0.1
    cfg = CumulativeConfig(ema_decays=[0.9, 0.5, 0.999])
    resumed = weight_averages(head, cfg, saved)
    assert [a.label for a in resumed] == ["ema 0.9", "ema 0.5", "ema 0.999"]
    assert all(WeightAverage.is_key(a.label) for a in resumed)
    torch.testing.assert_close(resumed[0].avg[name], start + 0.1)
    torch.testing.assert_close(resumed[1].avg[name], start + 0.5)
    torch.testing.assert_close(resumed[2].avg[name], start + 0.1)  # from 0.9's, the nearest
    fresh = weight_averages(head, cfg, None)
    for a in fresh:
        torch.testing.assert_close(a.avg[name], param.detach().float())
    assert weight_averages(head, CumulativeConfig(ema_decays=[]), saved) == []


def test_an_export_scores_both_averages_and_exports_the_better(tmp_path):
    """Two averages (decays 0.5 and 0.9) after the trained weights moved: the export scores the
    trained weights and each average, writes the better average's weights and labels the curve
    row with it; without an evaluation the fast average is exported."""
    import json

    import torch

    from mtad.engine.feature_head import FeatureHead
    from mtad_train.cumulative import CumulativeState, _export, load_head_weights

    target, spec, head, averages, name, param, start = _moved_head_with_two_averages()
    assert [a.label for a in averages] == ["ema 0.5", "ema 0.9"]

    def evaluate(h):  # scores the weights' distance from the start: the slow average is closest
        shift = float((dict(h.named_parameters())[name] - start).abs().mean())
        return {"all": {"d1": 1.0 - shift, "d2": 0.5}}

    for folder, scorer, want in (("scored", evaluate, "ema 0.9"), ("unscored", None, "ema 0.5")):
        head_dir = tmp_path / folder
        head.save(head_dir)
        _export(head, head_dir, CumulativeState(), "now", {}, scorer, lambda m: None, averages)
        row = json.loads((head_dir / "training/curve.jsonl").read_text().splitlines()[-1])
        assert row["weights"] == want
        chosen = next(a for a in averages if a.label == want)
        saved = FeatureHead.from_target(target, spec)
        load_head_weights(saved, head_dir)
        exported = dict(saved.named_parameters())[name]
        # exported in bfloat16 (the committed weights' dtype); the two averages are 0.4 apart
        torch.testing.assert_close(exported, chosen.avg[name].bfloat16().to(exported.dtype))
        assert torch.equal(param, start + 1.0)  # the trained weights are back
        if scorer is not None:
            assert set(row["heldout_averages"]) == {"ema 0.5", "ema 0.9"}
            assert row["heldout"] == row["heldout_averages"]["ema 0.9"]
            assert row["heldout_trained"]["all"]["d1"] < row["heldout"]["all"]["d1"]


def test_the_cooldown_takes_the_rate_to_zero_over_the_budgets_last_seconds():
    from mtad_train.cumulative import CumulativeConfig, lr_at

    constant = CumulativeConfig(lr=1e-3, time_budget_s=100.0)
    assert [lr_at(constant, 0, 50, t) for t in (0.0, 99.0, 200.0)] == [1e-3] * 3
    assert lr_at(constant, 10, 0, 0.0) == pytest.approx(1e-4)  # warmup: step 1 of 10
    cfg = CumulativeConfig(lr=1e-3, time_budget_s=100.0, cooldown_s=40.0)
    assert lr_at(cfg, 0, 50, 60.0) == pytest.approx(1e-3)  # the cooldown starts at 60 s
    # 1 - sqrt(progress): a quarter through, half the rate; at the end and past it, none
    assert lr_at(cfg, 0, 50, 70.0) == pytest.approx(5e-4)
    assert lr_at(cfg, 0, 50, 100.0) == 0.0 and lr_at(cfg, 0, 50, 130.0) == 0.0
    rates = [lr_at(cfg, 0, 50, t) for t in range(55, 101)]
    assert all(a >= b for a, b in zip(rates, rates[1:], strict=False))
    assert lr_at(cfg, 10, 0, 70.0) == pytest.approx(5e-5)  # warmup and cooldown multiply
    with pytest.raises(ValueError, match="cooldown_s needs a time_budget_s"):
        CumulativeConfig(cooldown_s=60.0)


def test_an_export_takes_the_trained_weights_when_they_score_best(tmp_path):
    """After a cooldown the trained weights may beat both averages: then they are exported
    and the row says so; the averages' scores stay in the row."""
    import torch

    from mtad.engine.feature_head import FeatureHead
    from mtad_train.cumulative import CumulativeState, _export, load_head_weights

    target, spec, head, averages, name, param, start = _moved_head_with_two_averages()

    def evaluate(h):  # the farther from the start the better: the trained weights win
        shift = float((dict(h.named_parameters())[name] - start).abs().mean())
        return {"all": {"d1": shift / 2.0, "d2": 0.1}}

    head.save(tmp_path)
    _export(head, tmp_path, CumulativeState(), "now", {}, evaluate, lambda m: None, averages)
    row = json.loads((tmp_path / "training/curve.jsonl").read_text().splitlines()[-1])
    assert row["weights"] == "trained"
    assert row["heldout"] == row["heldout_trained"]
    assert set(row["heldout_averages"]) == {"ema 0.5", "ema 0.9"}
    assert all(
        v["all"]["d1"] < row["heldout"]["all"]["d1"] for v in row["heldout_averages"].values()
    )
    saved = FeatureHead.from_target(target, spec)
    load_head_weights(saved, tmp_path)
    exported = dict(saved.named_parameters())[name]
    torch.testing.assert_close(exported, param.detach().bfloat16().to(exported.dtype))


def test_the_averages_must_differ_and_decay():
    from mtad_train.cumulative import CumulativeConfig

    with pytest.raises(ValueError, match="ema_decays must differ"):
        CumulativeConfig(ema_decays=[0.98, 0.98])
    with pytest.raises(ValueError, match="ema_decays must be in"):
        CumulativeConfig(ema_decays=[0.98, 1.0])
