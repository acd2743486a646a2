"""Compact run records (mtad.runs.store): a stored run gives the row and the per-prompt values
its result folder gives, so every interval computed from records equals the folder's."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mtad.runs.comparison import (
    BY_COLUMN,
    STORED_PROMPTS,
    comparison_interval,
    paired_runs,
    with_identity,
)
from mtad.runs.folder import write_config, write_json, write_jsonl
from mtad.runs.frame import record_of, run_record
from mtad.runs.store import (
    PROMPT_FIELDS,
    StoredRun,
    read_records,
    stored_run,
    write_records,
)

N_PROMPTS = 8


def _run_folder(root: Path, method: str, speed: float, seed: int = 0) -> Path:
    """A complete result folder of an instruct run on 8 prompts (values drawn per method)."""
    rng = random.Random(f"{method}/{seed}")
    folder = root / f"{method}-tiny-instruct-{seed}"
    samples, timings = [], []
    for i in range(N_PROMPTS):
        tokens = rng.randint(10, 40)
        logprob = math.nan if i == 3 and method == "mtad" else -rng.uniform(0.5, 2.0)
        samples.append(
            {
                "id": str(i),
                "output": "x" * tokens,  # kept in the folder, not in the record
                "output_tokens": tokens,
                "new_tokens": tokens,
                "target_forwards": max(1, int(tokens / speed)),
                "mean_logprob": logprob,
                "prompt_strict": rng.random() < 0.7,
                "accept_lengths": [1, 2],
            }
        )
        wall = tokens * 0.03 / speed * rng.uniform(0.8, 1.2)
        timings.append(
            {"id": str(i), "wall_time": wall, "time_draft": wall / 3, "time_verify": wall / 2,
             "time_other": wall / 6, "tokens_per_s": tokens / wall, "ms_per_token": 0.0}
        )  # fmt: skip
    total = sum(s["new_tokens"] for s in samples)
    wall = sum(t["wall_time"] for t in timings)
    metrics = {
        "study": "s",
        "signature": folder.name,
        "pair": "tiny",
        "method": method,
        "task": "instruct",
        "seed": seed,
        "device_kind": "cpu",
        "cpu_model": "test cpu",
        "cpu_bf16": "none",
        "threads": 1,
        "params": {},
        "n_samples": N_PROMPTS,
        "new_tokens": total,
        "wall_time": wall,
        "ms_per_token": 1000 * wall / total,
        "ppl": 3.0,
        "score": sum(s["prompt_strict"] for s in samples) / N_PROMPTS,
        "score_name": "prompt_level_strict_acc",
        "score_record": "prompt_strict",
        "energy": {"tracker": "offline", "j_per_token": 1.0 / speed, "kwh": 1e-6},
    }
    write_config(folder / "config.yaml", {"pair": {"name": "tiny"}, "task": {"name": "instruct"}})
    write_jsonl(folder / "samples.jsonl", samples)
    write_jsonl(folder / "timings.jsonl", timings)
    write_json(folder / "environment.json", {"git": {"commit": "abc123"}})
    write_json(folder / "metrics.json", metrics)
    return folder


def _from_json(run: StoredRun) -> StoredRun:
    return StoredRun.from_json(json.loads(json.dumps(run.to_json())))


def test_a_stored_run_keeps_what_the_tables_read_and_drops_the_rest(tmp_path: Path) -> None:
    folder = _run_folder(tmp_path, "mtad", 1.5)
    run = _from_json(stored_run(folder))
    assert run.signature == folder.name and run.commit == "abc123"
    assert list(run.prompts) == [str(i) for i in range(N_PROMPTS)]  # the folder's order
    first = run.prompts["0"]
    assert set(first) == {"id", *PROMPT_FIELDS, "prompt_strict"}
    assert "output" not in first and "accept_lengths" not in first
    assert math.isnan(run.prompts["3"]["mean_logprob"])  # NaN survives JSON as null
    row = record_of(run.metrics, run.comparison_key, run.hardware)
    folder_row = run_record(folder)
    assert folder_row is not None
    assert {k: v for k, v in row.items() if k != "result_dir"} == {
        k: v for k, v in folder_row.items() if k != "result_dir"
    }


@pytest.mark.parametrize(
    "column", ["speedup_vs_ar", "ppl_change_vs_ar", "score_change_vs_ar", "energy_ratio_vs_sps"]
)
def test_intervals_from_records_equal_the_folders(tmp_path: Path, column: str) -> None:
    baseline = BY_COLUMN[column].baseline
    folders = [
        _run_folder(tmp_path, m, s, seed)
        for seed in (0, 1)
        for m, s in ((baseline, 1.0), ("mtad", 1.6))
    ]
    from_folders = pd.DataFrame([run_record(f) for f in folders])
    stored = [_from_json(stored_run(f)) for f in folders]
    from_records = pd.DataFrame(
        [
            {**record_of(s.metrics, s.comparison_key, s.hardware), STORED_PROMPTS: s.prompts}
            for s in stored
        ]
    )
    intervals = []
    for frame in (from_folders, from_records):
        frame = with_identity(frame.assign(label=frame["method"]))
        runs = frame[frame["method"] == "mtad"]
        intervals.append(comparison_interval(paired_runs(runs, BY_COLUMN[column], frame)))
    a, b = intervals
    assert (a.n_prompts, a.n_seeds) == (b.n_prompts, b.n_seeds)
    assert a.mean == pytest.approx(b.mean, rel=0, abs=0)
    assert (a.lo, a.hi) == (b.lo, b.hi) and a.has_interval


def test_records_folders_round_trip_byte_for_byte(tmp_path: Path) -> None:
    runs = [stored_run(_run_folder(tmp_path / "runs", m, 1.0)) for m in ("ar", "sps")]
    header = {"profile": "smoke", "recipes": ["main"], "pairs": ["tiny"], "overrides": []}
    statuses = [
        {"key": ["method=sps", "task=instruct"], "state": "done", "signature": runs[1].signature},
        {"key": ["method=ar", "task=instruct"], "state": "done", "signature": runs[0].signature},
        {"key": ["method=ar", "task=spider"], "state": "not_run", "reason": "not run: no data"},
    ]
    write_records(tmp_path / "a", header, statuses, runs)
    back = read_records(tmp_path / "a")
    assert back.header["profile"] == "smoke" and set(back.runs) == {r.signature for r in runs}
    assert back.statuses[("method=ar", "task=spider")]["reason"] == "not run: no data"
    write_records(tmp_path / "b", back.header, back.statuses.values(), back.runs.values())
    for name in ("plan.jsonl", "runs.jsonl"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    with pytest.raises(FileNotFoundError, match="not a records folder"):
        read_records(tmp_path / "missing")


def test_a_per_prompt_score_gets_its_interval_over_prompts(tmp_path: Path) -> None:
    """AR's accuracy on 400 prompts x 1 seed: the bootstrap interval is the binomial one
    (+-1.96 sqrt(p(1-p)/n) = +-4.7 points at p = 0.35), from folders and records alike."""
    from mtad.runs.comparison import score_interval
    from mtad.runs.intervals import mean_bootstrap

    rng = np.random.default_rng(0)
    passed = (rng.random((1, 400)) < 0.35).astype(float)
    interval = mean_bootstrap(passed)
    half = 1.96 * math.sqrt(interval.mean * (1 - interval.mean) / 400)
    assert (interval.hi - interval.lo) / 2 == pytest.approx(half, rel=0.1)
    assert (interval.hi - interval.lo) / 2 < 0.05 and interval.lo > 0
    folders = [_run_folder(tmp_path, "ar", 1.0, seed) for seed in (0, 1)]
    from_folders = score_interval(pd.DataFrame([run_record(f) for f in folders]))
    stored = [_from_json(stored_run(f)) for f in folders]
    rows = [
        {**record_of(s.metrics, s.comparison_key, s.hardware), STORED_PROMPTS: s.prompts}
        for s in stored
    ]
    from_records = score_interval(pd.DataFrame(rows))
    assert from_folders is not None and from_folders == from_records
    assert (from_folders.n_prompts, from_folders.n_seeds) == (N_PROMPTS, 2)
    assert from_folders.has_interval and from_folders.lo <= from_folders.mean <= from_folders.hi
