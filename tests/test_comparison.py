"""The one comparison rule (mtad.runs.comparison): which runs are paired, and per-prompt pairing."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from mtad.runs.comparison import (
    COMPARISONS,
    add_comparisons,
    paired_runs,
    paired_samples,
)
from mtad.runs.folder import write_atomic, write_json
from mtad.runs.frame import load_study

SPEEDUP_VS_AR = next(c for c in COMPARISONS if c.column == "speedup_vs_ar")


def write_run(
    root: Path,
    name: str,
    method: str,
    ms: float,
    *,
    device: str = "cpu",
    max_new_tokens: int = 12,
    params: dict[str, Any] | None = None,
    prompts: tuple[str, ...] = ("a", "b"),
) -> None:
    config = {
        "pair": {"name": "tiny"},
        "task": {"name": "prompts", "max_new_tokens": max_new_tokens},
        "method": {"name": method, **(params or {})},
        "runtime": {"seed": 0, "device": device},
    }
    metrics = {
        "study": "s",
        "signature": name,
        "pair": "tiny",
        "method": method,
        "task": "prompts",
        "seed": 0,
        "device": device,
        "device_kind": device.split(":")[0],
        "params": params or {},
        "new_tokens": 10,
        "ms_per_token": ms,
    }
    folder = root / "s" / name
    write_atomic(folder / "config.yaml", yaml.safe_dump(config))
    samples = [json.dumps({"id": p, "mean_logprob": -1.0 - i}) for i, p in enumerate(prompts)]
    timings = [json.dumps({"id": p, "ms_per_token": ms + i}) for i, p in enumerate(prompts)]
    write_atomic(folder / "samples.jsonl", "\n".join(samples) + "\n")
    write_atomic(folder / "timings.jsonl", "\n".join(timings) + "\n")
    write_json(folder / "metrics.json", metrics)


def speedups(root: Path) -> dict[str, float]:
    df = add_comparisons(load_study(root, "s"))
    return dict(zip(df["signature"], df["speedup_vs_ar"], strict=True))


def test_runs_whose_configs_differ_beyond_the_method_are_not_compared(tmp_path: Path) -> None:
    write_run(tmp_path, "ar", "ar", 10.0)
    write_run(tmp_path, "mtad", "mtad", 5.0)
    write_run(tmp_path, "mtad-longer", "mtad", 4.0, max_new_tokens=64)  # no AR at 64 tokens
    got = speedups(tmp_path)
    assert got["mtad"] == pytest.approx(2.0)
    assert math.isnan(got["mtad-longer"])


def test_the_device_index_is_not_hardware(tmp_path: Path) -> None:
    write_run(tmp_path, "ar", "ar", 10.0, device="cuda:0")
    write_run(tmp_path, "mtad", "mtad", 5.0, device="cuda:1")
    write_run(tmp_path, "mtad-cpu", "mtad", 5.0, device="cpu")  # other hardware: no ratio
    got = speedups(tmp_path)
    assert got["mtad"] == pytest.approx(2.0)
    assert math.isnan(got["mtad-cpu"])


def test_a_swept_baseline_has_no_run_called_by_its_name(tmp_path: Path) -> None:
    write_run(tmp_path, "ar-fast", "ar", 10.0, params={"x": 1})
    write_run(tmp_path, "ar-slow", "ar", 30.0, params={"x": 2})
    write_run(tmp_path, "mtad", "mtad", 5.0)
    assert math.isnan(speedups(tmp_path)["mtad"])  # not the mean of two different baselines


def test_paired_samples_join_the_two_runs_by_prompt(tmp_path: Path) -> None:
    write_run(tmp_path, "ar", "ar", 10.0, prompts=("a", "b", "c"))
    write_run(tmp_path, "mtad", "mtad", 5.0, prompts=("b", "a"))
    runs = load_study(tmp_path, "s")
    (pair,) = paired_runs(runs[runs["method"] == "mtad"], SPEEDUP_VS_AR, runs)
    assert pair.baseline["signature"] == "ar" and pair.seed == 0
    joined = {pid: (r["ms_per_token"], b["ms_per_token"]) for pid, r, b in paired_samples(pair)}
    assert joined == {"b": (5.0, 11.0), "a": (6.0, 10.0)}  # c: only the baseline decoded it
