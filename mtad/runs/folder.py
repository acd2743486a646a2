"""The result folder of one run, ``<root>/<study>/<signature>/``: its files, written atomically,
and read back.

Files: ``config.yaml`` (resolved config), ``samples.jsonl`` (one line per prompt: outputs,
scores, token counters; no clock readings, so a rerun with the same config and seed gives the
same bytes on a CPU), ``timings.jsonl`` (per-prompt times), ``environment.json`` (git commit,
package versions, hardware, SLURM job) and ``metrics.json``. Every file is written to a
temporary name and renamed into place; ``metrics.json`` is written last, so a folder holding it
(and the others) is complete and a re-run skips it. ``failed.json`` marks a run that raised;
such a folder is not complete, and the next run of the command retries it. ``samples.jsonl`` is
written twice: with the generations alone before scoring (ids, outputs, token counters), then
with the scores; so a run that failed while scoring keeps every generation in its folder.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from mtad.runs.atomic import write_atomic

CONFIG_FILE = "config.yaml"
SAMPLES_FILE = "samples.jsonl"
TIMINGS_FILE = "timings.jsonl"
ENVIRONMENT_FILE = "environment.json"
METRICS_FILE = "metrics.json"
FAILED_FILE = "failed.json"
RESULT_FILES = (CONFIG_FILE, SAMPLES_FILE, TIMINGS_FILE, ENVIRONMENT_FILE, METRICS_FILE)

J_PER_KWH = 3.6e6  # codecarbon measures kWh; the tables show joules


def result_dir(root: str | os.PathLike[str], study: str, signature: str) -> Path:
    return Path(root) / study / signature


def is_complete(folder: Path) -> bool:
    """All result files present and ``metrics.json`` readable."""
    if not all((folder / name).is_file() for name in RESULT_FILES):
        return False
    return read_metrics(folder) is not None


class ResultsNotWritten(RuntimeError):
    """A result folder could not be written (disk full, quota, permissions): one line saying
    what, where, and that the run does not count as complete (it has no ``metrics.json``)."""

    def __init__(self, folder: Path, err: OSError) -> None:
        what = err.filename or folder
        super().__init__(
            f"results.root: could not write {what} ({err.strerror or err}); nothing is counted "
            f"as complete: {folder} has no {METRICS_FILE}, so the next run redoes it"
        )


# --------------------------------------------------------------------------------------------
# writing


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


def write_config(path: Path, config: dict[str, Any]) -> None:
    """``config.yaml``: the resolved config in the order it was composed."""
    plain = json.loads(dumps(config, indent=None))  # JSON types only, as read back
    write_atomic(path, yaml.safe_dump(plain, sort_keys=False, allow_unicode=True))


# --------------------------------------------------------------------------------------------
# reading


def read_metrics(folder: Path) -> dict[str, Any] | None:
    """``metrics.json`` (None when missing or unreadable: a half-written folder is no result)."""
    try:
        metrics = json.loads((folder / METRICS_FILE).read_text())
    except (OSError, ValueError):
        return None
    return metrics if isinstance(metrics, dict) else None


# libyaml's safe loader where PyYAML was built with it: the same documents, ~10x faster (a
# re-render reads every run's config; the pure-Python loader took ~10 ms a config)
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_config(folder: Path) -> dict[str, Any]:
    """The run's resolved ``config.yaml`` ({} when it cannot be read)."""
    try:
        config = yaml.load((folder / CONFIG_FILE).read_text(), Loader=_SAFE_LOADER)  # noqa: S506
    except (OSError, yaml.YAMLError):
        return {}
    return config if isinstance(config, dict) else {}


def read_failure(folder: Path) -> str:
    """The first line of the error ``failed.json`` records."""
    try:
        info = json.loads((folder / FAILED_FILE).read_text())
    except (OSError, ValueError):
        return "unreadable failure record"
    return str(info.get("error") or info.get("message") or "error").splitlines()[0][:200]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def per_prompt(folder: Path) -> dict[Any, dict[str, Any]]:
    """Prompt id -> its ``samples.jsonl`` line merged with its ``timings.jsonl`` line."""
    records: dict[Any, dict[str, Any]] = {}
    for row in read_jsonl(folder / SAMPLES_FILE):
        records[row.get("id")] = dict(row)
    for row in read_jsonl(folder / TIMINGS_FILE):
        records.setdefault(row.get("id"), {}).update(row)
    return records


__all__ = [
    "CONFIG_FILE",
    "ENVIRONMENT_FILE",
    "FAILED_FILE",
    "J_PER_KWH",
    "METRICS_FILE",
    "RESULT_FILES",
    "SAMPLES_FILE",
    "TIMINGS_FILE",
    "ResultsNotWritten",
    "dumps",
    "is_complete",
    "per_prompt",
    "read_config",
    "read_failure",
    "read_jsonl",
    "read_metrics",
    "result_dir",
    "write_atomic",
    "write_config",
    "write_json",
    "write_jsonl",
]
