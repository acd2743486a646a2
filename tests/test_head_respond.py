"""On-policy head data (mtad_train.respond) and the growing folder source that trains on it
(mtad_train.cumulative.Source): shards and manifest, a rerun going on where the last stopped,
excluded prompts, responses overlapping an evaluation prompt dropped, new shards joining a
running stream at the next epoch, and a late source drawn at its weight.

Tiny random target and byte-level tokenizer (mtad.engine.tiny); no pool is built."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from mtad_train.cumulative import Source, SourceCursor, draw_step
from mtad_train.data import encode_item
from mtad_train.ids import read_ids, write_ids
from mtad_train.respond import MANIFEST, RespondCommand, shard_paths, write_responses


@pytest.fixture(scope="module")
def tiny():
    from mtad.engine.tiny import build_tiny_model, build_tiny_tokenizer

    torch.manual_seed(0)
    return build_tiny_model(
        "llama", "target", vocab_size=320, seed=3
    ).eval(), build_tiny_tokenizer()


def _items(n: int) -> list[dict]:
    return [
        {"id": i, "kind": "chat", "messages": [{"role": "user", "content": f"question {i}?"}]}
        for i in range(n)
    ]


def _cfg(out, **kw) -> RespondCommand:
    base = dict(out=str(out), first_item=0, exclude=[], batch_size=4, max_new=5, threads=1)
    return RespondCommand(**{**base, **kw, "shard_every_s": 0.0})


def test_shards_hold_prompt_and_response_and_a_rerun_goes_on(tmp_path, tiny):
    target, tok = tiny
    items = _items(40)
    write_responses(_cfg(tmp_path, max_items=8), target, tok, items, {}, "pool-a", print)
    first = json.loads((tmp_path / MANIFEST).read_text())
    assert first["next_item"] == 16  # one chunk is 4 batches of fresh prompts
    assert first["pool"] == "pool-a"
    ids = read_ids(tmp_path / first["shards"][0]["file"])
    prompts = [encode_item(tok, it) for it in items[:16]]
    got = [tuple(s[:p].tolist()) for s, p in zip(ids.seqs, ids.plens, strict=True)]
    assert sorted(got) == sorted(tuple(p) for p in prompts)
    assert all(len(s) > p for s, p in zip(ids.seqs, ids.plens, strict=True))  # a response
    assert all(len(s) - p <= 5 for s, p in zip(ids.seqs, ids.plens, strict=True))
    write_responses(_cfg(tmp_path, max_items=8), target, tok, items, {}, "pool-a", print)
    second = json.loads((tmp_path / MANIFEST).read_text())
    assert second["next_item"] == 32 and len(second["shards"]) == 2
    assert second["shards"][1]["items"] == [16, 32]
    later = read_ids(tmp_path / second["shards"][1]["file"])
    got = {tuple(s[:p].tolist()) for s, p in zip(later.seqs, later.plens, strict=True)}
    assert got == {tuple(encode_item(tok, it)) for it in items[16:32]}


def test_a_second_pass_answers_the_same_prompts_again_with_fresh_samples(tmp_path, tiny):
    target, tok = tiny
    items = _items(20)
    write_responses(_cfg(tmp_path, first_item=4), target, tok, items, {}, "pool-a", print)
    once = json.loads((tmp_path / MANIFEST).read_text())
    assert once["next_item"] == 20  # one pass: items 4-19, then the pool is used up
    write_responses(_cfg(tmp_path, first_item=4, passes=2), target, tok, items, {}, "pool-a", print)
    twice = json.loads((tmp_path / MANIFEST).read_text())
    assert twice["next_item"] == 36 and twice["shards"][1]["items"] == [20, 36]
    first, second = (read_ids(tmp_path / s["file"]) for s in twice["shards"])

    def chats(ids) -> dict[tuple, tuple]:
        return {
            tuple(s[:p].tolist()): tuple(s[p:].tolist())
            for s, p in zip(ids.seqs, ids.plens, strict=True)
        }

    a, b = chats(first), chats(second)
    assert a.keys() == b.keys() == {tuple(encode_item(tok, it)) for it in items[4:]}
    assert sum(a[k] != b[k] for k in a) >= len(a) // 2  # sampled afresh, not replayed


def test_excluded_prompts_are_skipped(tmp_path, tiny):
    target, tok = tiny
    items = _items(8)
    done = [encode_item(tok, it) for it in items[:5]]
    write_ids(tmp_path / "old.npz", [p + [1] for p in done], [len(p) for p in done], ["x"] * 5)
    cfg = _cfg(tmp_path / "out", exclude=[str(tmp_path / "old.npz")])
    write_responses(cfg, target, tok, items, {}, "pool", print)
    (shard,) = shard_paths(tmp_path / "out")
    ids = read_ids(shard)
    got = {tuple(s[:p].tolist()) for s, p in zip(ids.seqs, ids.plens, strict=True)}
    assert got == {tuple(encode_item(tok, it)) for it in items[5:]}


def test_a_response_sharing_an_8gram_with_an_evaluation_prompt_is_dropped(
    tmp_path, tiny, monkeypatch
):
    target, tok = tiny
    leak = "one two three four five six seven eight nine"
    calls = []

    def fake_generate(_t, _tok, prompts, *_a, **_k):
        calls.append(len(prompts))
        # the first prompt of each batch answers with an evaluation prompt's words
        return [tok(leak if i == 0 else "fine").input_ids for i in range(len(prompts))]

    monkeypatch.setattr("mtad_train.data.generate", fake_generate)
    evals = {"mtbench": [leak + " ten"]}
    write_responses(_cfg(tmp_path), target, tok, _items(8), evals, "pool", print)
    (entry,) = json.loads((tmp_path / MANIFEST).read_text())["shards"]
    assert entry["dropped_for_overlap"] == {"mtbench": len(calls)}
    assert entry["sequences"] == 8 - len(calls)


def test_a_shard_file_without_its_manifest_entry_is_not_read(tmp_path):
    write_ids(tmp_path / "0000.npz", [[1, 2, 3]], [1], ["x"])
    write_ids(tmp_path / "0001.npz", [[4, 5, 6]], [1], ["x"])
    (tmp_path / MANIFEST).write_text(json.dumps({"shards": [{"file": "0000.npz"}]}))
    assert shard_paths(tmp_path) == [tmp_path / "0000.npz"]


def _shard(folder, name: str, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    seqs = [rng.integers(0, 256, size=int(rng.integers(12, 40))).tolist() for _ in range(n)]
    write_ids(folder / name, seqs, [4] * n, ["x"] * n)
    path = folder / MANIFEST
    man = json.loads(path.read_text()) if path.is_file() else {"shards": []}
    man["shards"].append({"file": name})
    path.write_text(json.dumps(man))


def test_shards_written_during_training_join_the_folder_source_at_its_next_epoch(tmp_path):
    folder = tmp_path / "onpolicy"
    src = Source.load(f"{folder}=1", 64)  # the folder need not exist yet
    cur: dict[str, SourceCursor] = {}
    with pytest.raises(ValueError, match="no sequences"):
        draw_step([src], cur, 10, seed=0)
    folder.mkdir()
    _shard(folder, "0000.npz", 10, 0)
    first = [j for _ in range(6) for _, j in draw_step([src], cur, 1, seed=0)]
    _shard(folder, "0001.npz", 5, 1)  # written while the first epoch is under way
    rest = [j for _ in range(4 + 15) for _, j in draw_step([src], cur, 1, seed=0)]
    assert sorted(first + rest[:4]) == list(range(10))  # the epoch that began keeps its size
    assert sorted(rest[4:]) == list(range(15))  # the next one holds the new shard too
    assert len(src.seqs) == 15 and len(src.files) == 2


def test_a_source_that_joins_later_is_drawn_at_its_weight_not_until_it_caught_up(tmp_path):
    for name, seed in (("a.npz", 0), ("b.npz", 1)):
        rng = np.random.default_rng(seed)
        seqs = [rng.integers(0, 256, size=20).tolist() for _ in range(400)]
        write_ids(tmp_path / name, seqs, [4] * 400, ["x"] * 400)
    a = Source.load(str(tmp_path / "a.npz"), 64)
    b = Source.load(f"{tmp_path / 'b.npz'}=1", 64)
    cur: dict[str, SourceCursor] = {}
    for _ in range(20):
        draw_step([a], cur, 200, seed=0)  # 4,000 positions from a alone
    drawn = [si for _ in range(10) for si, _ in draw_step([a, b], cur, 200, seed=0)]
    share_b = drawn.count(1) / len(drawn)
    assert 0.4 <= share_b <= 0.6  # 1:1 from the moment it joined (without: 1.0)
