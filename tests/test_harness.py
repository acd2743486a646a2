"""End to end on the tiny pair: every method writes a complete result folder, one W&B offline
run and a codecarbon measurement; a real ``run.py -m`` sweep writes four folders and skips them
all when re-run; bad values stop ``run.py`` on one line before any model loads."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from mtad.harness.config import ConfigError
from mtad.runs.folder import RESULT_FILES, is_complete

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"
METHODS = sorted(p.stem for p in (CONF / "method").glob("*.yaml"))


def compose_cfg(*overrides: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def read_wandb_records(run_dir: Path) -> list[Any]:
    """The records of an offline run's ``run-<id>.wandb`` (a LevelDB-style log of protobufs:
    32 KiB blocks, 7-byte chunk headers ``crc32 | length | type``; type 1 full, 2-4 pieces)."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = run_dir.glob("run-*.wandb")
    data = path.read_bytes()
    block, pos, pending, records = 32768, 7, b"", []  # 7: the file header
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # block trailer
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:
            break
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def wandb_summary(run_dir: Path) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for record in read_wandb_records(run_dir):
        if record.WhichOneof("record_type") == "summary":
            for item in record.summary.update:
                key = item.key or "/".join(item.nested_key)
                summary[key] = json.loads(item.value_json)
    return summary


@pytest.fixture(scope="module")
def method_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every method once on the tiny pair, in-process, with W&B (offline) and codecarbon."""
    from mtad.harness.job import run

    tmp = tmp_path_factory.mktemp("runs")
    outcomes = {}
    for method in METHODS:
        cfg = compose_cfg(
            "+experiment=smoke",
            f"method={method}",
            f"results.root={tmp / 'results'}",
            f"logger.dir={tmp}",
            "logger.mode=offline",
        )
        outcomes[method] = (cfg, run(cfg))
    return outcomes


@pytest.mark.parametrize("method", METHODS)
def test_every_method_writes_a_complete_result_folder(method_runs: dict, method: str) -> None:
    _, outcome = method_runs[method]
    folder = outcome.result_dir
    assert outcome.status == "done" and is_complete(folder)
    assert sorted(p.name for p in folder.iterdir()) == sorted(RESULT_FILES)
    assert folder.parent.name == "smoke" and folder.name == outcome.signature

    metrics = json.loads((folder / "metrics.json").read_text())
    assert (metrics["method"], metrics["pair"], metrics["task"]) == (method, "tiny", "prompts")
    assert metrics["n_samples"] == 2 and metrics["new_tokens"] > 0
    for key in (
        "ms_per_token",
        "tokens_per_s",
        "wall_time",
        "block_efficiency",
        "ppl",
        "ppl_token_weighted",
        "time_draft",
        "time_verify",
        "target_forwards",
    ):
        assert metrics[key] is not None, key
    uses_draft = method not in ("ar", "mtjd")
    assert (metrics["draft_forwards"] > 0) == uses_draft
    assert (metrics["acceptance_rate"] is not None) == (metrics["drafted"] > 0)
    assert metrics["threads"] == 1  # runtime.threads of the smoke preset
    # the logits head of each model and, for a CPU head, the kernel each row count ran
    kernels = metrics["lm_head_kernels"]
    assert "target" in kernels and set(kernels) == set(metrics["lm_head"])
    assert all(bool(kernels[r]) == (metrics["lm_head"][r] == "fast") for r in kernels)
    # how many projections ran on prepacked weights: none in float32 (the smoke preset's)
    assert metrics["packed_linears"] == {r: 0 for r in metrics["lm_head"]}

    energy = metrics["energy"]  # codecarbon, around generation only
    assert energy["tracker"] == "offline" and energy["kwh"] > 0 and energy["j_per_token"] > 0
    assert energy["cpu_mode"] in ("rapl", "load_estimate", "tdp_estimate", "power_gadget")
    overhead = metrics["overhead_s"]
    assert {"load_models", "wandb_init", "energy_init", "warmup", "score"} <= set(overhead)

    samples = [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 2
    for row in samples:
        for key in (
            "id",
            "output",
            "prompt_tokens",
            "output_tokens",
            "new_tokens",
            "acceptance_rate",
            "accept_lengths",
        ):
            assert key in row, key
        assert "wall_time" not in row and "ms_per_token" not in row  # clock readings: timings
    assert sum(r["new_tokens"] for r in samples) == metrics["new_tokens"]
    timings = [json.loads(line) for line in (folder / "timings.jsonl").read_text().splitlines()]
    assert [t["id"] for t in timings] == [r["id"] for r in samples]
    assert all(t["wall_time"] > 0 and t["ms_per_token"] > 0 for t in timings)

    env = json.loads((folder / "environment.json").read_text())
    assert env["packages"]["torch"] and env["hardware"]["cpu_count"]
    assert "commit" in env["git"]
    config = (folder / "config.yaml").read_text()
    assert f"signature: {outcome.signature}" in config


@pytest.mark.parametrize("method", METHODS)
def test_every_run_has_an_offline_wandb_run_with_the_summary(
    method_runs: dict, method: str
) -> None:
    _, outcome = method_runs[method]
    metrics = json.loads((outcome.result_dir / "metrics.json").read_text())
    run_dir = Path(metrics["wandb"]["run_dir"])
    assert run_dir.name.startswith("offline-run-") and run_dir.is_dir()
    summary = wandb_summary(run_dir)
    assert summary["ms_per_token"] == pytest.approx(metrics["ms_per_token"])
    assert summary["energy/kwh"] == pytest.approx(metrics["energy"]["kwh"])
    assert summary["signature"] == outcome.signature
    (table,) = run_dir.glob("files/media/table/samples_*.table.json")  # per-sample table
    assert len(json.loads(table.read_text())["data"]) == metrics["n_samples"]


def test_complete_folder_is_skipped_without_loading(method_runs: dict, monkeypatch) -> None:
    import mtad.engine.loading
    from mtad.harness.job import run

    cfg, first = method_runs["mtad"]
    monkeypatch.setattr(mtad.engine.loading, "load_pair", _no_model)
    again = run(cfg)
    assert again.status == "skipped" and again.result_dir == first.result_dir


def _no_model(*args: object, **kwargs: object) -> None:
    raise AssertionError("a model was loaded")


@pytest.mark.parametrize(
    ("override", "key"), [("method.gamma=0", "method.gamma"), ("method.tau=1.5", "method.tau")]
)
def test_bad_value_stops_before_loading(
    override: str, key: str, tmp_path: Path, monkeypatch
) -> None:
    import mtad.engine.loading
    from mtad.harness.job import run

    monkeypatch.setattr(mtad.engine.loading, "load_pair", _no_model)
    cfg = compose_cfg("+experiment=smoke", override, f"results.root={tmp_path}")
    with pytest.raises(ConfigError) as info:
        run(cfg)
    assert info.value.key == key
    assert not any(tmp_path.iterdir())


# ------------------------------------------------------------------------------------------
# run.py as the user types it


def run_py(*args: str, tmp: Path, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "run.py", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_sweep_writes_four_runs_then_skips_them(tmp_path: Path) -> None:
    where = [f"results.root={tmp_path / 'results'}", f"logger.dir={tmp_path}"]
    sweep = ["-m", "+experiment=smoke", "method=mtad", "method.gamma=2,3", "method.tau=0.3,0.6"]

    first = run_py(*sweep, *where, f"hydra.sweep.dir={tmp_path / 'm1'}", tmp=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    folders = sorted((tmp_path / "results" / "smoke").iterdir())
    assert len(folders) == 4 and len({f.name for f in folders}) == 4
    assert all(is_complete(f) for f in folders)
    params = {
        (m["params"]["gamma"], m["params"]["tau"])
        for m in (json.loads((f / "metrics.json").read_text()) for f in folders)
    }
    assert params == {(2, 0.3), (2, 0.6), (3, 0.3), (3, 0.6)}
    assert len(list((tmp_path / "wandb").glob("offline-run-*"))) == 4
    assert "sweep: 4 run, 0 skipped" in first.stdout  # the sweep summary table
    mtimes = {f.name: (f / "metrics.json").stat().st_mtime_ns for f in folders}

    second = run_py(*sweep, *where, f"hydra.sweep.dir={tmp_path / 'm2'}", tmp=tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    assert second.stdout.count("skip ") == 4 and "sweep: 0 run, 4 skipped" in second.stdout
    after = sorted((tmp_path / "results" / "smoke").iterdir())
    assert [f.name for f in after] == [f.name for f in folders]
    assert {f.name: (f / "metrics.json").stat().st_mtime_ns for f in after} == mtimes
    assert len(list((tmp_path / "wandb").glob("offline-run-*"))) == 4


@pytest.mark.parametrize(
    ("override", "key"),
    [("method.gamma=0", "method.gamma"), ("pair=nope", "pair"), ("method=foo", "method")],
)
def test_run_py_reports_bad_values_on_one_line(override: str, key: str, tmp_path: Path) -> None:
    out = run_py(
        "+experiment=smoke",
        override,
        f"results.root={tmp_path / 'results'}",
        f"logger.dir={tmp_path}",
        f"hydra.run.dir={tmp_path / 'out'}",
        tmp=tmp_path,
    )
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {key}: "), out.stderr
    assert not (tmp_path / "results").exists() and not (tmp_path / "wandb").exists()
