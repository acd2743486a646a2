"""A run's identity: the one function that says which runs are the same experiment.

:meth:`RunIdentity.of` takes the run's resolved config and the hardware it runs on. It keeps
what can change a result (after audiocraft's experiment signatures: a hash of the config minus
the keys that do not change it) and adds the hardware that decides timing
(:func:`mtad.runs.hardware.hardware_key`). Everything that names a run derives from it:

- :attr:`RunIdentity.signature`: the result folder ``<method>-<pair>-<task>-<hash>``; the
  harness skips a run whose identity has a complete folder;
- :meth:`RunIdentity.comparison_key`: the identity without the method, within a study: two
  runs with one key are compared (a speed-up is never taken across machines);
- :attr:`RunIdentity.paper_key`: the whole identity, by which the paper's planner finds a run's
  folder whatever its name;
- :attr:`RunIdentity.setup_key`: the identity without the hardware, by which a planner that
  cannot run a device itself (a login node planning GPU runs) finds runs written elsewhere.

What the config names by path is identified by content: the task's data files
(:meth:`mtad.tasks.base.Task.signature`) and the weights of the pair's models
(:func:`folder_signature`, recorded as ``model_data`` by :mod:`mtad.harness.prepare`), so a
retrained draft in the same folder is a new run, not a stale "complete" one.

Kept out (:data:`EXCLUDED`): logging, output locations, tags, the device string (its kind is
hardware), the threads setting (the effective count is hardware), placement and the energy
meter's bookkeeping. Energy polling is in (:func:`energy_identity`): it shares the cores with
decoding, so a run metered otherwise measured otherwise.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtad.runs.hardware import hardware_key

# Dotted keys that never change what a run measures. "*" matches any one key.
EXCLUDED: tuple[str, ...] = (
    "logger",
    "results",
    "tags",
    "signature",
    "hardware",
    "runtime.device",
    "runtime.threads",
    "runtime.progress",
    "pair.notes",
    "pair.*.device_map",
    "pair.*.gpus",
    "pair.*.max_memory",
    "pair.*.allow_offload",
)
SIGNATURE_HASH = 10
KEY_HASH = 12
CONTENT_HASH = 12
# The files of a model folder that a load reads (from_pretrained, the feature head, the draft
# vocabulary): weights by suffix, configs and tokenizers by name. Reports, curves and training
# records beside them change no decoding.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
MODEL_CONFIG_FILES = (
    "config.json",
    "generation_config.json",
    "head_config.json",
    "draft_vocab.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)


# Files above this size (a large model's weight shards, tens of GB on a GPU node) are hashed by
# their size and SAMPLED_BLOCKS blocks spread evenly over them: every run's preparation reads
# each file, and training rewrites every block of a weight file, so a sample tells two of them
# apart. Smaller files (task data, this repository's drafts) are hashed whole.
FULL_HASH_BYTES = 256 << 20
SAMPLED_BLOCKS = 64
SAMPLED_BLOCK_BYTES = 64 << 10


@functools.lru_cache(maxsize=256)
def _file_sha256(path: str, size: int, mtime_ns: int, inode: int) -> str:
    """Keyed by size, modification time and inode too: a planner preparing hundreds of runs
    hashes each file once, and a file rewritten in place or replaced is hashed again."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        if size <= FULL_HASH_BYTES:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
            return digest.hexdigest()
        digest.update(f"sampled {size}".encode())
        stride = (size - SAMPLED_BLOCK_BYTES) // (SAMPLED_BLOCKS - 1)
        for i in range(SAMPLED_BLOCKS):
            f.seek(i * stride)
            digest.update(f.read(SAMPLED_BLOCK_BYTES))
    return digest.hexdigest()


def content_tag(path: Path) -> str:
    """``name:hash`` of a file, by content (no absolute path: it differs per checkout)."""
    stat = path.stat()
    digest = _file_sha256(str(path), stat.st_size, stat.st_mtime_ns, stat.st_ino)
    return f"{path.name}:{digest[:CONTENT_HASH]}"


def model_files(folder: Path) -> list[Path]:
    """The files of ``folder`` a load reads (:data:`WEIGHT_SUFFIXES`,
    :data:`MODEL_CONFIG_FILES`, sharded weights' ``*.index.json``), sorted by name."""
    return sorted(
        f
        for f in folder.iterdir()
        if f.is_file()
        and (
            f.suffix in WEIGHT_SUFFIXES
            or f.name in MODEL_CONFIG_FILES
            or f.name.endswith(".index.json")
        )
    )


def folder_signature(folder: Path) -> dict[str, Any]:
    """What identifies the model a folder holds beyond the config that names it: its
    :func:`model_files` by content."""
    return {"files": [content_tag(f) for f in model_files(folder)]}


def energy_identity(energy: Mapping[str, Any] | None) -> dict[str, Any]:
    """What of ``energy`` changes the measurements: whether codecarbon meters the run (offline
    and online meter alike), how often it polls and what it counts."""
    energy = energy or {}
    if energy.get("tracker", "none") == "none":
        return {"meter": "none"}
    return {
        "meter": "codecarbon",
        "measure_power_secs": energy.get("measure_power_secs"),
        "tracking_mode": energy.get("tracking_mode"),
    }


def _drop(tree: Any, path: tuple[str, ...]) -> None:
    if not isinstance(tree, dict) or not path:
        return
    head, rest = path[0], path[1:]
    for key in list(tree) if head == "*" else [head]:
        if key not in tree:
            continue
        if rest:
            _drop(tree[key], rest)
        else:
            del tree[key]


def relevant_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` (a resolved plain mapping) as it enters the identity: a JSON-typed copy
    without the :data:`EXCLUDED` keys, its energy block as :func:`energy_identity`."""
    tree = json.loads(json.dumps(dict(config), default=str))
    for key in EXCLUDED:
        _drop(tree, tuple(key.split(".")))
    if "energy" in tree:
        tree["energy"] = energy_identity(tree["energy"])
    return tree


def _digest(tree: Any) -> str:
    canonical = json.dumps(tree, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha1(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class RunIdentity:
    """``setup``: the result-relevant config (:func:`relevant_config`); ``hardware``: the
    :func:`~mtad.runs.hardware.hardware_key` of the machine it runs on."""

    setup: dict[str, Any]
    hardware: dict[str, Any]

    @classmethod
    def of(cls, config: Mapping[str, Any], hardware: Mapping[str, Any]) -> RunIdentity:
        """The identity of a run of ``config`` on ``hardware`` (a host probe, a
        ``metrics.json`` or a key already)."""
        return cls(relevant_config(config), hardware_key(hardware))

    def tree(self) -> dict[str, Any]:
        return {**self.setup, "hardware": self.hardware}

    @property
    def signature(self) -> str:
        """The result folder's name: readable prefix, identity in the hash."""
        parts = [
            str(self.setup.get("method", {}).get("name", "method")),
            str(self.setup.get("pair", {}).get("name", "pair")),
            str(self.setup.get("task", {}).get("name", "task")),
        ]
        prefix = "-".join(re.sub(r"[^A-Za-z0-9_.]+", "_", p) for p in parts)
        return f"{prefix}-{_digest(self.tree())[:SIGNATURE_HASH]}"

    @property
    def paper_key(self) -> str:
        return _digest(self.tree())

    @property
    def setup_key(self) -> str:
        return _digest(self.setup)

    def comparison_key(self, study: str | None) -> str:
        """Runs of one study with one key differ in the method alone."""
        tree = {k: v for k, v in self.tree().items() if k != "method"}
        return _digest({**tree, "study": study})[:KEY_HASH]


def recorded_setup(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """The setup a ``metrics.json`` alone tells (a folder without a readable config)."""
    return {
        "method": {"name": metrics.get("method"), **dict(metrics.get("params") or {})},
        "pair": {"name": metrics.get("pair")},
        "task": {"name": metrics.get("task")},
        "runtime": {"seed": metrics.get("seed")},
    }


def identity_of(config: Mapping[str, Any], metrics: Mapping[str, Any]) -> RunIdentity:
    """The identity of a written run from its ``config.yaml`` and ``metrics.json``: the
    hardware as ``metrics.json`` records it (the config's ``hardware`` block where it is
    silent), the setup from the config (from ``metrics.json`` when there is none)."""
    facts = {**dict(config.get("hardware") or {}), **{k: v for k, v in metrics.items()}}
    if config.get("method"):
        return RunIdentity.of(config, facts)
    return RunIdentity(recorded_setup(metrics), hardware_key(facts))


__all__ = [
    "EXCLUDED",
    "RunIdentity",
    "content_tag",
    "energy_identity",
    "folder_signature",
    "identity_of",
    "model_files",
    "recorded_setup",
    "relevant_config",
]
