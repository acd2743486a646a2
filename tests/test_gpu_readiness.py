"""Issue 18: what the paper presets need on real GPUs, checked on this CPU-only machine.

Models are freed after every run of an in-process sweep (success and failure, an
accelerate-hooked model too); a model offloaded to CPU or disk is refused; ``runtime.device``
decides where models live and a device-naming ``device_map`` is refused in one line; a GPU run
without NVML records ``gpu_mode: none`` with a warning; prompt + budget past a model's context is
refused; a GPU preset on a host without a GPU is refused in one line within seconds; the beam
draft's in-place cache reorder decodes the same tokens as transformers' copying reorder and
writes fewer bytes. The CUDA side of all this is ``scripts/gpu_check.sh``.
"""

from __future__ import annotations

import gc
import os
import resource
import subprocess
import sys
import time
import weakref
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

import mtad.engine.loading
from mtad.engine import Decoder
from mtad.engine.loading import ModelSpec, PlacementError, check_placement, gpu_budget, load_model
from mtad.engine.loop import ContextOverflow
from mtad.engine.runner import ModelRunner
from mtad.engine.tiny import TINY_MAX_POSITIONS, build_tiny_model
from mtad.harness import preflight
from mtad.harness.config import ConfigError, EnergyConfig
from mtad.methods import build_method

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"


def compose_cfg(*overrides: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def run_py(*args: str, timeout: int = 120) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {**os.environ, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"}
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "run.py", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return done, time.perf_counter() - start


# --------------------------------------------------------------------------------------------
# defect 1: models stay in memory between the jobs of an in-process sweep


def _hooked(model: torch.nn.Module) -> torch.nn.Module:
    """The model dispatched by accelerate as ``device_map`` does (hooks on every module; the
    ``module.forward = partial(new_forward, module)`` reference cycle)."""
    from accelerate import dispatch_model

    model = dispatch_model(model, device_map={"": "cpu"}, force_hooks=True)
    assert hasattr(model, "_hf_hook")
    return model


@pytest.mark.parametrize("outcome", ["success", "failure", "overflow"])
def test_models_are_freed_after_each_run_hooked_or_not(
    outcome: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mtad.harness.job import run
    from mtad.tasks.generator import TextGenerator

    refs: list[weakref.ref] = []
    real_load_pair = mtad.engine.loading.load_pair

    def load_pair_hooked(*args: object, **kwargs: object):  # noqa: ANN202
        pair = real_load_pair(*args, **kwargs)
        pair.target.model = _hooked(pair.target.model)
        for runner in (pair.target, pair.draft):
            refs.append(weakref.ref(runner.model))
        return pair

    monkeypatch.setattr(mtad.engine.loading, "load_pair", load_pair_hooked)
    if outcome != "success":
        real_call = TextGenerator.__call__
        # a plain failure, or one the harness re-raises as a ConfigError chained to it
        error = RuntimeError if outcome == "failure" else ContextOverflow

        def call_then_fail(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
            real_call(self, *args, **kwargs)
            raise error("injected failure after decoding")  # frames hold the models

        monkeypatch.setattr(TextGenerator, "__call__", call_then_fail)

    def one_run(seed: int) -> None:
        cfg = compose_cfg(
            "+experiment=smoke",
            "method=sps",
            "logger=none",
            "energy=none",
            f"runtime.seed={seed}",
            f"results.root={tmp_path}",
        )
        if outcome == "failure":
            with pytest.raises(RuntimeError, match="injected failure"):
                run(cfg)
        elif outcome == "overflow":
            with pytest.raises(ConfigError, match="^task: task prompts: injected failure"):
                run(cfg)
        else:
            assert run(cfg).status == "done"

    for seed in (0, 1):  # two jobs of one in-process sweep
        one_run(seed)
        # no gc.collect() here: the run itself must have freed them
        assert len(refs) == 2 * (seed + 1)
        alive = [r for r in refs if r() is not None]
        assert not alive, f"{len(alive)} model(s) outlived their {outcome} run"


def test_a_hooked_model_needs_the_cycle_collector() -> None:
    """Why the runner collects: a dispatched model outlives its last reference until gc runs."""
    gc.disable()
    try:
        ref = weakref.ref(_hooked(build_tiny_model("llama", "draft")))
        assert ref() is not None
        gc.collect()
        assert ref() is None
    finally:
        gc.enable()


# --------------------------------------------------------------------------------------------
# defect 2: silent offload; placement recorded


def _fake_dispatched(device_map: dict[str, object]) -> torch.nn.Module:
    model = build_tiny_model("llama", "draft")
    model.hf_device_map = device_map
    return model


@pytest.mark.parametrize("offloaded_to", ["cpu", "disk"])
def test_offload_to_cpu_or_disk_is_refused_unless_allowed(offloaded_to: str) -> None:
    model = _fake_dispatched({"model.embed_tokens": 0, "model.layers.0": offloaded_to})
    spec = ModelSpec(loader="hub", path="meta-llama/Llama-2-70b-hf", device_map="auto")
    with pytest.raises(PlacementError, match=f"offloaded part of the model to {offloaded_to}"):
        check_placement(spec, model, "cuda")
    allowed = ModelSpec(loader="hub", path="x", device_map="auto", allow_offload=True)
    check_placement(allowed, model, "cuda")  # accepted when asked for


def test_all_on_gpus_is_accepted_and_recorded() -> None:
    model = _fake_dispatched({"model.embed_tokens": 0, "model.layers.0": 1, "lm_head": 1})
    check_placement(ModelSpec(loader="hub", path="x", device_map="auto"), model, "cuda")
    place = mtad.engine.loading.placement(model, None)
    assert place["gpu_ids"] == [0, 1] and place["gpus_used"] == 2
    assert place["target"]["hf_device_map"]["model.layers.0"] == "1"


def test_gpu_budget_uses_only_the_pairs_gpus_and_no_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    gib = 2**30
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i: (70 * gib, 80 * gib))
    spec = ModelSpec(loader="hub", path="x", device_map="auto", gpus=2, max_memory="50GiB")
    assert gpu_budget(spec, "cuda:1") == {1: 50 * gib, 2: 50 * gib, "cpu": 0}
    free = ModelSpec(loader="hub", path="x", device_map="auto", gpus=1)
    assert gpu_budget(free, "cuda") == {0: 62 * gib, "cpu": 0}  # free minus 10% of the card
    offload = ModelSpec(loader="hub", path="x", device_map="auto", gpus=1, allow_offload=True)
    assert "cpu" not in gpu_budget(offload, "cuda")


# --------------------------------------------------------------------------------------------
# defect 3: runtime.device and the pairs' device_map


def test_a_hub_pair_follows_runtime_device_cpu() -> None:
    """device_map: auto with runtime.device=cpu: on the CPU (not target on a GPU, draft here)."""
    spec = ModelSpec(loader="local", path="assets/drafts/smollm2-draft", device_map="auto")
    model, _ = load_model(spec, "cpu")
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    assert not getattr(model, "hf_device_map", None)


def test_model_on_another_device_kind_is_refused() -> None:
    model = build_tiny_model("llama", "draft")  # on the CPU
    with pytest.raises(PlacementError, match="runtime.device=cuda"):
        check_placement(ModelSpec(loader="tiny"), model, "cuda")


def test_more_gpus_than_the_machine_shows_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    spec = ModelSpec(loader="hub", path="x", device_map="auto", gpus=2)
    preflight.check_placement("cuda:0", {"target": spec})
    with pytest.raises(ConfigError, match=r"^pair\.target\.gpus: 2 GPUs from cuda:1 on"):
        preflight.check_placement("cuda:1", {"target": spec})


def test_device_naming_device_map_is_refused_in_one_line() -> None:
    # a local draft (its loader reads device_map; the tiny loader refuses the key outright)
    done, _ = run_py("pair=smollm2", "method=sps", "logger=none", "pair.draft.device_map=cpu")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error: pair.draft.device_map: 'cpu' names")


# --------------------------------------------------------------------------------------------
# defect 5: energy without NVML


def test_cuda_run_without_nvml_records_gpu_mode_none_with_a_warning() -> None:
    from mtad.harness.energy import EnergyMeter
    from mtad.harness.summary import print_run

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU; scripts/gpu_check.sh checks NVML there")
    meter = EnergyMeter(EnergyConfig(tracker="offline"), device="cuda:0", gpu_ids=[0])
    meter.prepare()
    assert meter.tracker._gpu_ids == [0]  # codecarbon meters the job's GPUs only
    meter.start()
    block = meter.stop(new_tokens=10)
    assert block["gpu_mode"] == "none" and block["gpu_kwh"] == 0.0
    assert "NVML missing or failing" in block["warning"]
    cpu = EnergyMeter(EnergyConfig(tracker="offline"), device="cpu")
    cpu.prepare()
    assert "warning" not in cpu.modes()  # a CPU run has no GPU to miss

    from rich.console import Console

    console = Console(record=True, width=300)
    print_run({"energy": block}, "run", out=console)
    assert "warning: runtime.device=cuda:0 but codecarbon measured no GPU" in console.export_text()


# --------------------------------------------------------------------------------------------
# defect 7: context length


def test_budget_past_the_context_is_refused_in_one_line() -> None:
    done, _ = run_py("+experiment=smoke", "method=sps", "task.max_new_tokens=100000")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr[-2000:]
    assert lines == [
        "error: task.max_new_tokens: task prompts: 100000 new tokens + a block of 5 exceed "
        f"the {TINY_MAX_POSITIONS}-position context of pair.target"
    ]


def test_prompt_past_the_context_is_refused_before_any_forward(tiny_llama) -> None:  # noqa: ANN001
    target, draft = ModelRunner(tiny_llama[0], "target"), ModelRunner(tiny_llama[1], "draft")
    dec = Decoder(build_method("sps"), target, draft)
    prompt = [1] * (TINY_MAX_POSITIONS - 10)
    with pytest.raises(ContextOverflow, match="exceed the 2048-position context of the target"):
        dec.generate(prompt, max_new_tokens=16)
    assert target.forwards == 0 and draft.forwards == 0
    assert len(dec.generate(prompt, max_new_tokens=4).token_ids) == 4  # fits: runs


def test_harness_reports_a_prompt_overflow_as_bad_input_naming_the_task() -> None:
    from mtad.harness.job import _context_is_bad_input

    prep = SimpleNamespace(spec=SimpleNamespace(task_name="humaneval"))
    with (
        pytest.raises(ConfigError, match=r"^task: task humaneval: prompt of"),
        _context_is_bad_input(prep),  # type: ignore[arg-type]
    ):
        raise ContextOverflow("prompt of 9000 tokens + ... exceed the 8192-position context")


# --------------------------------------------------------------------------------------------
# defect 8: a GPU preset on a CPU-only host


def test_gpu_preset_on_a_cpu_host_is_refused_in_one_line_within_10_s(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done, seconds = run_py(
        "+experiment=llama70b",
        f"results.root={tmp_path / 'results'}",
        f"hydra.sweep.dir={tmp_path / 'multirun'}",
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error: runtime.device: cuda is not available")
    assert "slurm" in lines[0]  # says where to launch it
    # CPU seconds: our 2 shared cores make wall time depend on the neighbours (about 5 s alone)
    assert cpu_s < 10, f"took {cpu_s:.1f} CPU s ({seconds:.1f} s wall)"
    assert seconds < 30, f"took {seconds:.1f} s wall"
    assert not (tmp_path / "results").exists() and not (tmp_path / "multirun").exists()


# --------------------------------------------------------------------------------------------
# defect 6: beam drafting's cache copies


@pytest.mark.parametrize("method", ["mtad", "mmtad", "mtjd", "specinfer"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_inplace_reorder_decodes_the_same_tokens_as_copying(
    method: str, temperature: float, tiny_llama
) -> None:  # noqa: ANN001
    out = {}
    for reorder in ("copy", "inplace"):
        target = ModelRunner(tiny_llama[0], "target", reorder=reorder)
        draft = ModelRunner(tiny_llama[1], "draft", reorder=reorder)
        dec = Decoder(build_method(method, temperature=temperature), target, draft, seed=3)
        out[reorder] = [dec.generate([5, 6, 7, 8] * s, 24, seed=s).token_ids for s in (1, 2, 5)]
    assert out["inplace"] == out["copy"]


def test_inplace_reorder_writes_fewer_cache_bytes(tiny_llama) -> None:  # noqa: ANN001
    """Counted, not timed: the draft's cache writes per MTAD iteration drop from ~B*(2*gamma-1)
    context rows (repeat, then per step an append and a full reorder) to ~B*(gamma-1)."""
    from bench.memory import CacheWrites

    rows = {}
    prompt = list(range(200))
    for reorder in ("copy", "inplace"):
        target = ModelRunner(tiny_llama[0], "target", reorder=reorder)
        draft = ModelRunner(tiny_llama[1], "draft", reorder=reorder)
        dec = Decoder(build_method("mtad", temperature=0.0), target, draft)
        counter = CacheWrites()
        with counter.counting():
            out = dec.generate(prompt, 8)
        per_row = len(prompt) * 2 * tiny_llama[1].config.num_hidden_layers * 2 * 16 * 4
        rows[reorder] = counter.bytes["draft"] / out.stats.iterations / per_row
    beam, gamma = 4, 4  # the method's defaults
    assert rows["copy"] >= beam * (2 * gamma - 1)
    assert rows["inplace"] <= beam * (gamma - 1) + 2.5  # + the feed and the winner


# --------------------------------------------------------------------------------------------
# the prepared GPU check


def test_gpu_check_runs_here_and_skips_what_needs_cuda() -> None:
    """The fast checks (the full one takes minutes: README "Running on GPUs")."""
    done = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--only", "environment,nvml,tree,chi-square,cuda"],
        cwd=REPO,
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    verdicts = {line.split(":", 1)[0] for line in lines[1:-1]}
    assert all(v.split()[0] in ("PASS", "SKIP") for v in verdicts), lines
    if not torch.cuda.is_available():
        assert "SKIP environment" in verdicts and "SKIP nvml energy" in verdicts
        assert "SKIP sps/specinfer chi-square" in verdicts
        assert "SKIP cuda fp32 == cpu fp32" in verdicts
    assert "PASS tree mask == sequential" in verdicts
    passed, failed = (int(x.split()[0]) for x in lines[-1].split(" (")[0].split(", "))
    assert failed == 0 and passed == sum(v.startswith("PASS") for v in verdicts)
