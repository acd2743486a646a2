"""dtype ``auto``: bfloat16 on CPUs with native bfloat16, float32 elsewhere; the choice and the
CPU's bfloat16 support are recorded and part of the run signature (issue #17)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from mtad import cpu
from mtad.harness.config import ConfigError, validate
from mtad.harness.prepare import prepare
from mtad.runs import hardware

CONF = Path(__file__).resolve().parents[1] / "conf"

AMX = frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})
AVX512_BF16 = frozenset({"avx2", "avx512f", "avx512_bf16"})
AVX2 = frozenset({"avx2", "fma"})


@pytest.mark.parametrize(
    ("flags", "dtype", "flag"),
    [
        (AMX, "bfloat16", "amx_bf16"),
        (AVX512_BF16, "bfloat16", "avx512_bf16"),
        (AVX2, "float32", None),
        (frozenset(), "float32", None),
    ],
)
def test_auto_follows_native_bf16(flags, dtype, flag):
    assert cpu.native_bf16(flags) == flag
    chosen, why = cpu.choose_dtype("auto", "cpu", flags)
    assert chosen == dtype
    assert (flag in why) if flag else ("no native bfloat16" in why)


def test_explicit_dtype_and_gpu():
    assert cpu.choose_dtype("float16", "cpu", AMX) == ("float16", "set in the config")
    assert cpu.choose_dtype("auto", "cuda:0", AVX2)[0] == "bfloat16"
    # the CPU's bfloat16 is part of a CPU run's identity only (mtad.runs.hardware)
    assert "cpu_bf16" not in hardware.hardware_key({"device_kind": "cuda", "cpu_bf16": "none"})


def _cfg(*overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=["pair=smollm2", "logger=none", *overrides])


def test_smollm2_pair_resolves_auto_on_this_host_and_hashes_it(monkeypatch, tmp_path):
    for cap in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA"):  # the flags below say the host
        monkeypatch.delenv(cap, raising=False)
    results = f"results.root={tmp_path}"
    for flags, dtype in ((AMX, "bfloat16"), (AVX2, "float32")):
        monkeypatch.setattr(hardware, "cpu_flags", lambda flags=flags: flags)
        spec = validate(_cfg(results))
        assert spec.target.dtype == spec.draft.dtype == dtype
        assert spec.cfg.pair.target.dtype == dtype
        assert "auto" in spec.dtype_choice["target"]
    monkeypatch.setattr(hardware, "cpu_flags", lambda: AMX)
    amx = prepare(_cfg(results), host_checks=False)
    assert amx.config["pair"]["target"]["dtype"] == "bfloat16"
    assert amx.config["hardware"]["cpu_bf16"] == "amx_bf16"
    monkeypatch.setattr(hardware, "cpu_flags", lambda: AVX2)
    avx2 = prepare(_cfg(results), host_checks=False)
    assert avx2.config["pair"]["target"]["dtype"] == "float32"
    assert avx2.config["hardware"]["cpu_bf16"] == "none"
    assert amx.signature != avx2.signature
    # a dtype set in the config is kept whatever the CPU has
    pinned = prepare(_cfg(results, "pair.target.dtype=float32"), host_checks=False)
    assert pinned.config["pair"]["target"]["dtype"] == "float32"
    assert pinned.spec.dtype_choice["target"] == "set in the config"


def test_bad_dtype_is_one_line_naming_the_key():
    with pytest.raises(ConfigError, match=r"pair\.target.*dtype"):
        validate(_cfg("pair.target.dtype=bf17"))


@pytest.mark.parametrize(
    ("flags", "text"),
    [
        (AMX, "avx512_bf16, AMX"),
        (AVX512_BF16, "avx512_bf16, no AMX"),
        (AVX2, "no avx512_bf16, no AMX"),
    ],
)
def test_benchmarks_cpu_features_read_from_the_host_probe(monkeypatch, flags, text):
    """The benchmarks' CPU line names the bfloat16 and AMX units from :mod:`mtad.runs.hardware`'s
    flags, like the dtype choice does."""
    assert hardware.cpu_features_text(flags) == text
    monkeypatch.setattr(hardware, "cpu_flags", lambda: flags)
    assert hardware.cpu_features_text() == text


@pytest.mark.parametrize(
    ("env", "capped"),
    [
        ({}, False),
        ({"ATEN_CPU_CAPABILITY": "avx2"}, True),
        ({"ATEN_CPU_CAPABILITY": "default"}, True),
        ({"ATEN_CPU_CAPABILITY": "avx512"}, False),
        ({"ONEDNN_MAX_CPU_ISA": "AVX2"}, True),
        ({"ONEDNN_MAX_CPU_ISA": "avx2_vnni"}, True),
        ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"}, False),
    ],
)
def test_kernels_capped_below_avx512_make_bfloat16_not_native(monkeypatch, env, capped):
    """With torch's kernels capped to AVX2 (how the test command's AVX2 estimate runs on an
    AVX-512 host) bfloat16 is emulated whatever the flags say: ``auto`` picks float32."""
    for cap in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA"):
        monkeypatch.delenv(cap, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(hardware, "cpu_flags", lambda: AMX)
    assert hardware.kernels_capped_below_avx512() is capped
    assert cpu.native_bf16() == (None if capped else "amx_bf16")
    assert cpu.choose_dtype("auto", "cpu")[0] == ("float32" if capped else "bfloat16")
    assert cpu.native_bf16(AMX) == "amx_bf16"  # flags given: a hypothetical host, no cap
