"""Issue 18: what the paper presets need on real GPUs, checked on this CPU-only machine.

Models are freed after every run of an in-process sweep (success and failure, an
accelerate-hooked model too); a model offloaded to CPU or disk is refused; ``runtime.device``
decides where models live and a device-naming ``device_map`` is refused in one line; a GPU run
without NVML records ``gpu_mode: none`` with a warning; prompt + budget past a model's context is
refused; a GPU preset on a host without a GPU is refused in one line within seconds; the beam
draft's in-place cache reorder decodes the same tokens as transformers' copying reorder and
writes fewer bytes. The CUDA side of all this is ``scripts/gpu_check.sh``.

Issue 29 (a review of the CUDA path against a real GPU machine's image), with fakes of what a GPU
has: cuBLAS workspaces freed between jobs, the check keeping a carried PYTHONPATH and limiting
run.py, energy asked only where NVML's counter can tick, the time split waiting for every GPU
of both models, codecarbon given NVML indices matched by UUID, the FR-Spec head's ids beside a
dispatched head.
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


def test_inplace_reorder_writes_fewer_cache_bytes(tiny_llama, monkeypatch) -> None:  # noqa: ANN001
    """Counted, not timed: the draft's cache writes per MTAD iteration drop from ~B*(2*gamma-1)
    context rows (repeat, then per step an append and a full reorder) to ~B*(gamma-1). On the
    GPU's beam path: the CPU's host bookkeeping also skips reorders whose parents are the
    identity, which would blur the comparison."""
    from bench.memory import CacheWrites
    from mtad.methods import beam as beam_module

    monkeypatch.setattr(beam_module, "HOST_BOOKKEEPING_DEVICES", frozenset())

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
    # copy: repeat, then per step an append and a full reorder (the repeat's rows are written
    # once by the next update since HeadRunner/ModelRunner.repeat_rows expand views)
    assert rows["copy"] >= beam * (2 * gamma - 1) - 2 * beam
    assert rows["inplace"] < rows["copy"] - beam
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


# --------------------------------------------------------------------------------------------
# issue 29: what a review of the CUDA path found, exercised here with fakes of what a GPU has


def _gpu_check():  # noqa: ANN202
    """scripts/gpu_check.py as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_release_memory_frees_cublas_workspaces_on_every_gpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """cuBLAS keeps a 32 MiB workspace per handle (Hopper) allocated through the caching
    allocator, which ``empty_cache`` cannot give back while it is held: the job's memory
    release clears the workspaces first, then empties the cache, after waiting for every GPU."""
    from mtad.harness import generation

    workspace = 32 * 2**20
    allocated = {0: workspace, 1: workspace}  # what memory_allocated(i) would say
    events: list[str] = []

    def clear_workspaces() -> None:
        events.append("clear")
        allocated.update({i: 0 for i in allocated})

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda i=None: events.append(f"sync {i}"))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: events.append("empty"))
    monkeypatch.setattr(torch._C, "_cuda_clearCublasWorkspaces", clear_workspaces, raising=False)
    generation.release_memory()
    assert allocated == {0: 0, 1: 0}, "the cuBLAS workspaces outlived the job"
    assert events == ["sync 0", "sync 1", "clear", "empty"]


def test_gpu_check_keeps_the_callers_pythonpath_and_limits_run_py(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Packages carried to a device machine on PYTHONPATH stay visible to run.py (the check
    used to overwrite it); run.py runs under a time limit; run.py dying before it writes a
    result is reported with its stderr, not as a FileNotFoundError."""
    gc_mod = _gpu_check()
    carried = tmp_path / "site"
    carried.mkdir()
    (carried / "carried_probe.py").write_text("VALUE = 29\n")
    monkeypatch.setenv("PYTHONPATH", str(carried))
    calls: list[dict] = []

    def died(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess:
        calls.append(kwargs)
        return subprocess.CompletedProcess(cmd, 1, "", "ModuleNotFoundError: No module named 'x'")

    with monkeypatch.context() as m:
        m.setattr(gc_mod.subprocess, "run", died)
        with pytest.raises(AssertionError, match=r"wrote no result folder.*No module named 'x'"):
            gc_mod.check_harness("cpu")
    path = calls[0]["env"]["PYTHONPATH"].split(os.pathsep)
    assert path == [str(REPO), str(REPO / "tests"), str(carried)]
    assert calls[0]["timeout"] == gc_mod.HARNESS_TIMEOUT_S

    probe = [sys.executable, "-c", "import carried_probe; print(carried_probe.VALUE)"]
    done = gc_mod.run_sweep(probe)
    assert done.returncode == 0 and done.stdout.strip() == "29", done.stderr
    start = time.perf_counter()
    with pytest.raises(AssertionError, match=r"run.py still running after 1 s"):
        gc_mod.run_sweep([sys.executable, "-c", "import time; time.sleep(60)"], timeout_s=1)
    assert time.perf_counter() - start < 30


def _records(duration_s: float, gpu_kwh: float, before: int, uuid: str) -> dict:
    energy = {"gpu_mode": "nvml", "gpu_uuids": [uuid], "gpu_kwh": gpu_kwh, "duration_s": duration_s}
    return {
        "method": "sps",
        "gpu_model": "NVIDIA H200",
        "energy": energy,
        "placement": {"gpu_memory_before_load_bytes": {"cuda:0": before}},
    }


def test_gpu_check_asks_energy_only_where_the_counter_can_tick_and_memory_exactly_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gc_mod = _gpu_check()
    uuid = "GPU-0000aaaa-0000-0000-0000-000000000002"
    monkeypatch.setattr(gc_mod, "nvml_tick_s", lambda device: 0.1)
    monkeypatch.setattr(gc_mod, "cuda_uuid", lambda index: uuid)
    ok = [_records(0.15, 0.0, 0, uuid), _records(0.5, 1e-8, 0, uuid)]  # 0 J over < 2 ticks
    assert "in the 1 of 2 jobs" in gc_mod.check_gpu_records("cuda", ok)
    with pytest.raises(AssertionError, match="gpu_kwh 0 over 0.50 s"):
        gc_mod.check_gpu_records("cuda", [_records(0.5, 0.0, 0, uuid)])
    # exact: one cuBLAS workspace, or even the tiny target's 0.7 MiB, left by the previous job
    with pytest.raises(AssertionError, match="not back to 0"):
        gc_mod.check_gpu_records("cuda", [_records(0.5, 1e-8, 4096, uuid)])
    with pytest.raises(AssertionError, match=f"metered .'GPU-another-jobs-gpu'., not {uuid}"):
        gc_mod.check_gpu_records("cuda", [_records(0.5, 1e-8, 0, "GPU-another-jobs-gpu")])


def test_timing_waits_for_every_gpu_either_model_runs_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """``torch.cuda.synchronize()`` names torch's current device only: with the target spread
    over cuda:0 and cuda:1 and the draft on cuda:2, the draft/verify split must wait for all
    three (here the models run on the CPU and only their recorded placement says GPU)."""
    from mtad.engine.tiny import build_tiny_pair

    target, draft = build_tiny_pair("llama", vocab_size=320, seed=0)
    runners = ModelRunner(target, "target"), ModelRunner(draft, "draft")
    target.hf_device_map = {"model.embed_tokens": 0, "model.layers": 1, "lm_head": 1}
    draft.hf_device_map = {"": 2}
    synced: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    out = Decoder(build_method("sps", gamma=3), *runners).generate([5, 17, 3], 6)
    gpus = [torch.device(f"cuda:{i}") for i in range(3)]
    phases = 2 * out.stats.iterations + 1  # draft + verify per step, then the loop's end
    assert synced == gpus * phases


def test_energy_meters_the_jobs_gpus_by_uuid_not_by_cuda_index(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under SLURM's ``CUDA_VISIBLE_DEVICES=2,3`` the job's cuda:0 and cuda:1 are NVML's GPUs 2
    and 3 (NVML numbers all the host's GPUs): codecarbon must be given 2 and 3, found by UUID."""
    import codecarbon

    from mtad.harness import energy

    host = [f"GPU-{i}a1b2c3d-0000-0000-0000-00000000000{i}" for i in range(4)]
    visible = [2, 3]  # CUDA_VISIBLE_DEVICES=2,3

    class NVMLError(Exception):
        pass

    def by_uuid(uuid: str) -> int:
        if uuid not in host:
            raise NVMLError(f"no GPU {uuid}")
        return host.index(uuid)  # the handle: its NVML index

    fake_nvml = SimpleNamespace(
        NVMLError=NVMLError,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetHandleByUUID=by_uuid,
        nvmlDeviceGetIndex=lambda handle: handle,
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml)
    # torch prints the UUID without NVML's "GPU-" prefix
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda i: SimpleNamespace(uuid=host[visible[i]].removeprefix("GPU-")),
    )
    given: dict = {}

    class Tracker:
        def __init__(self, **kwargs: object) -> None:
            given.update(kwargs)

    monkeypatch.setattr(codecarbon, "OfflineEmissionsTracker", Tracker)
    meter = energy.EnergyMeter(EnergyConfig(tracker="offline"), "cuda:0", gpu_ids=[0, 1])
    meter.prepare()
    assert given["gpu_ids"] == [2, 3]
    modes = meter.modes()
    assert modes["gpu_uuids"] == host[2:] and modes["nvml_gpu_ids"] == [2, 3]
    assert modes["gpu_ids"] == [0, 1]  # the job's own (CUDA) numbering stays recorded
    assert energy.nvml_gpu_ids([1]) == ([3], [host[3]])


def test_restrict_vocab_keeps_its_ids_beside_a_dispatched_head() -> None:
    """After a ``device_map`` load the head stays where accelerate put it (no later
    ``model.to``): the FR-Spec head's id buffer must be made there, and the body's hidden states
    (from another GPU) moved to it. The "other device" here is ``meta``."""
    from mtad.engine.subvocab import restrict_vocab

    model = build_tiny_model("llama", "draft", vocab_size=320, seed=0)
    model.lm_head.to("meta")  # the head on another device than torch.tensor's default
    restrict_vocab(model, list(range(0, 320, 3)))
    head = model.get_output_embeddings()
    assert head.ids.device == head.weight.device == torch.device("meta")
    hidden = torch.randn(2, model.config.hidden_size)  # on the CPU, as from the last layer
    assert head(hidden).device == torch.device("meta")


def test_a_jobs_phase_clocks_wait_for_every_gpu_and_start_no_cuda_context(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``overhead_s`` phases (load, warm-up, generation loop, scoring) are read once every GPU
    finished what the phase queued; before CUDA is initialised (a CPU run on a GPU machine)
    the clock waits for nothing and starts no CUDA context."""
    from mtad.harness import job

    events: list[str] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda i=None: events.append(f"sync {i}"))
    monkeypatch.setattr(job.time, "perf_counter", lambda: events.append("clock") or 0.0)
    into: dict[str, float] = {}
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    with job._timer(into, "load_models"):
        events.append("load")
    assert events == ["clock", "load", "clock"] and "load_models" in into
    events.clear()
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with job._timer(into, "load_models"):
        events.append("load")
    assert events == ["clock", "load", "sync 0", "sync 1", "clock"]
