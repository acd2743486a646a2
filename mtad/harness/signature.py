"""A run's identity: a hash of the config keys that can change its results.

After audiocraft's experiment signatures: logging, energy-metering and output-location keys
are dropped, everything else (pair with its dtypes, method params with defaults filled in, task,
seed, warm-up) is hashed. Two runs with one signature are the same experiment, so a sweep re-run
skips folders that are already complete.

The hardware that changes results is hashed through the ``hardware`` block the job adds
(:func:`mtad.harness.prepare.prepare`: device kind and GPU model, from
:func:`mtad.harness.results.hardware_identity`), so a CPU study re-run on a GPU is a new run.
The device *string* (``cuda:0`` vs ``cuda:1``) and the thread count stay out: they do not change
what is computed (threads are recorded in ``metrics.json``).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

# Dotted keys that never change what a run measures. "*" matches any one key.
EXCLUDED: tuple[str, ...] = (
    "logger",
    "energy",
    "results",
    "tags",
    "runtime.device",
    "runtime.threads",
    "runtime.progress",
    "pair.notes",
    "pair.*.device_map",
    "pair.*.gpus",
    "pair.*.max_memory",
    "pair.*.allow_offload",
)


def _drop(tree: Any, path: tuple[str, ...]) -> None:
    if not isinstance(tree, dict) or not path:
        return
    head, rest = path[0], path[1:]
    keys = list(tree) if head == "*" else [head]
    for key in keys:
        if key not in tree:
            continue
        if rest:
            _drop(tree[key], rest)
        else:
            del tree[key]


def relevant_config(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` (a resolved plain dict) without the :data:`EXCLUDED` keys."""
    tree = json.loads(json.dumps(config, default=str))  # deep copy, JSON-typed
    for key in EXCLUDED:
        _drop(tree, tuple(key.split(".")))
    return tree


def config_hash(config: dict[str, Any], length: int = 10) -> str:
    canonical = json.dumps(relevant_config(config), sort_keys=True, separators=(",", ":"))
    return hashlib.sha1(canonical.encode()).hexdigest()[:length]


def run_signature(config: dict[str, Any]) -> str:
    """Folder name ``<method>-<pair>-<task>-<hash>``: readable prefix, identity in the hash."""
    parts = [
        str(config.get("method", {}).get("name", "method")),
        str(config.get("pair", {}).get("name", "pair")),
        str(config.get("task", {}).get("name", "task")),
    ]
    prefix = "-".join(re.sub(r"[^A-Za-z0-9_.]+", "_", p) for p in parts)
    return f"{prefix}-{config_hash(config)}"
