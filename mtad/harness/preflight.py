"""Checks that need the environment (devices, files, folders), run before any model loads.

:func:`mtad.harness.config.validate` checks values in isolation; these check that the values fit
this machine and each other: the device exists, the weights are there and readable, draft and
target share one vocabulary, the block size fits the token budget, the output folders are
writable. Each raises a one-line :class:`~mtad.harness.config.ConfigError` naming the key, so a
mistake costs seconds instead of a model load and a full run (an unwritable results root used
to fail at the first write, after the whole run had computed).

Everything here reads file headers and small JSON files only: no weights are loaded.
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import try_to_load_from_cache

from mtad.engine import DecodingMethod
from mtad.engine.loading import resolve_path
from mtad.engine.runner import context_limit_of
from mtad.engine.smollm2 import SmolLM2Unavailable, cached_dir, gguf_path
from mtad.engine.spec import HEAD_CONFIG_FILE, ModelSpec
from mtad.engine.tiny import TINY_MAX_POSITIONS
from mtad.harness.config import ConfigError

WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth")
GGUF_MAGIC = b"GGUF"


# accelerate's placement strategies: what a pair's device_map may say. Where the models live is
# runtime.device's choice alone (mtad.engine.loading), so a device_map never names a device.
DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")


def check_placement(device: str, models: dict[str, ModelSpec]) -> None:
    """One rule for ``runtime.device`` and the pairs' ``device_map``: the device decides where
    every model lives, a device_map only how a model spreads over the GPUs from that device on.
    Refused: a device_map naming a device (``cpu`` with a cuda run would split draft and target
    across device kinds) and more GPUs (``gpus``) than the machine shows from that device on."""
    kind, _, index = device.partition(":")
    for role, spec in models.items():
        key = f"pair.{role}.device_map"
        if spec.device_map is not None and spec.device_map not in DEVICE_MAP_STRATEGIES:
            raise ConfigError(
                key,
                f"{spec.device_map!r} names a device, but where models live is runtime.device "
                f"({device}) alone; use one of {', '.join(DEVICE_MAP_STRATEGIES)} or null",
            )
        if kind != "cuda" or not spec.device_map or spec.gpus is None:
            continue
        seen = torch.cuda.device_count() - int(index or 0)
        if spec.gpus > seen:
            raise ConfigError(
                f"pair.{role}.gpus",
                f"{spec.gpus} GPUs from {device} on, but this machine shows {max(seen, 0)}",
            )


def check_token_budget(method: DecodingMethod, max_new_tokens: int | None) -> None:
    """A method that drafts deeper per step (:meth:`draft_depth`: SpS's gamma, SpecInfer's
    tree depth, BiLD's max_draft, ...) than the whole token budget drafts tokens that can
    never be kept, and with a large depth runs for minutes."""
    depth = method.draft_depth()
    if max_new_tokens is None or depth is None:
        return
    if depth.tokens > max_new_tokens:
        raise ConfigError(
            f"method.{depth.key}",
            f"block of {depth.tokens} tokens exceeds the token budget "
            f"task.max_new_tokens={max_new_tokens}",
        )


# --------------------------------------------------------------------------------------------
# weights and vocabularies


def check_weights(role: str, spec: ModelSpec) -> None:
    """The model's weights exist and their headers are intact (no weights are read)."""
    key = f"pair.{role}.path"
    if spec.loader == "local":
        _check_folder(key, Path(resolve_path(spec.path or "")), spec.kind)
    elif spec.loader == "smollm2_gguf":
        try:
            path = gguf_path()
        except SmolLM2Unavailable as err:
            raise ConfigError(key, str(err).splitlines()[0]) from err
        with open(path, "rb") as f:
            if f.read(4) != GGUF_MAGIC:
                raise ConfigError(key, f"{path} is not a GGUF file (corrupt download?)")
    elif spec.loader == "hub":
        _check_hub(key, spec.path or "")


def _check_folder(key: str, folder: Path, kind: str = "model") -> None:
    """A model folder: ``config.json`` and intact weights. A feature head's folder holds our
    ``head_config.json`` or, a published EAGLE head, a ``config.json``."""
    if not folder.is_dir():
        raise ConfigError(key, f"model folder {folder} is missing")
    if kind != "head" or not (folder / HEAD_CONFIG_FILE).is_file():
        _read_config(key, folder)
    weights = sorted(p for pattern in WEIGHT_PATTERNS for p in folder.glob(pattern))
    if not weights:
        raise ConfigError(key, f"no weights ({', '.join(WEIGHT_PATTERNS)}) in {folder}")
    for path in weights:
        if path.suffix == ".safetensors":
            _check_safetensors(key, path)
        elif path.stat().st_size == 0:
            raise ConfigError(key, f"{path} is empty")


def _check_safetensors(key: str, path: Path) -> None:
    """Header length, JSON header, and a file size that covers every tensor's byte range."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ConfigError(key, f"{path} is corrupt: {size} bytes, shorter than a header")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            raise ConfigError(key, f"{path} is corrupt: header of {n} bytes in a {size}-byte file")
        try:
            header = json.loads(f.read(n))
        except ValueError as err:
            raise ConfigError(key, f"{path} is corrupt: unreadable header ({err})") from err
    end = max(
        (int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"),
        default=0,
    )
    if 8 + n + end > size:
        raise ConfigError(key, f"{path} is truncated: {size} of {8 + n + end} bytes")


def _read_config(key: str, folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    if not path.is_file():
        raise ConfigError(key, f"{folder} has no config.json")
    try:
        config = json.loads(path.read_text())
    except ValueError as err:
        raise ConfigError(key, f"{path} is corrupt ({err})") from err
    if not isinstance(config, dict):
        raise ConfigError(key, f"{path} is corrupt (not a JSON object)")
    return config


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def _check_hub(key: str, repo: str) -> None:
    """A hub name must be in the local cache when the hub is offline (else: a download error
    after the target has loaded). A local folder given as a hub path is checked as a folder."""
    if Path(repo).expanduser().is_dir():
        _check_folder(key, Path(repo).expanduser())
        return
    if not _hub_offline():
        return  # from_pretrained downloads it; nothing to check without a network round trip
    if _hub_cached_config(repo) is None:
        raise ConfigError(
            key, f"{repo} is not in the Hugging Face cache and the hub is offline (HF_HUB_OFFLINE)"
        )


def _hub_cached_config(repo: str) -> Path | None:
    found = try_to_load_from_cache(repo, "config.json")
    return Path(found) if isinstance(found, str) else None


def model_config(spec: ModelSpec) -> dict[str, Any] | None:
    """The model's ``config.json`` (no weights), None when unknown here (a hub model not in
    the cache, SmolLM2 before its first conversion). Tiny models: the fields preflight reads."""
    if spec.loader == "tiny":
        return {
            "vocab_size": int((spec.tiny or {}).get("vocab_size", 320)),
            "max_position_embeddings": TINY_MAX_POSITIONS,
        }
    folder: Path | None = None
    if spec.loader == "local":
        folder = Path(resolve_path(spec.path or ""))
    elif spec.loader == "smollm2_gguf":
        folder = cached_dir()  # the converted copy, when it exists
    elif spec.loader == "hub":
        if Path(spec.path or "").expanduser().is_dir():
            folder = Path(spec.path or "").expanduser()
        else:
            cached = _hub_cached_config(spec.path or "")
            folder = cached.parent if cached else None
    if folder is None or not (folder / "config.json").is_file():
        return None
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def vocab_size(spec: ModelSpec) -> int | None:
    """The model's output vocabulary from its config (no weights), None when unknown here."""
    config = model_config(spec) or {}
    size = config.get("vocab_size", (config.get("text_config") or {}).get("vocab_size"))
    return int(size) if size is not None else None


def context_limit(spec: ModelSpec) -> int | None:
    """Positions the model was trained for (``max_position_embeddings``; GPT-2 style
    ``n_positions``), None when unknown here."""
    return context_limit_of(model_config(spec) or {})


def check_context(
    task: str, max_new_tokens: int | None, block: int, models: dict[str, ModelSpec]
) -> None:
    """The token budget plus one block must fit every model's context: past it, learned
    positions (OPT: 2048) index out of range (on CUDA a device-side assert that poisons every
    later job of the process) and rotary ones decode far outside what the model was trained
    on. Each prompt's own length is checked again before it is decoded
    (:class:`mtad.engine.loop.Decoder`)."""
    if max_new_tokens is None:
        return
    for role, spec in models.items():
        limit = context_limit(spec)
        if limit is not None and max_new_tokens + block > limit:
            raise ConfigError(
                "task.max_new_tokens",
                f"task {task}: {max_new_tokens} new tokens + a block of {block} exceed the "
                f"{limit}-position context of pair.{role}",
            )


def check_vocab(target: ModelSpec, draft: ModelSpec) -> None:
    """Draft and target must share one vocabulary (known from the configs, where known)."""
    t, d = vocab_size(target), vocab_size(draft)
    if t is not None and d is not None and t != d:
        raise ConfigError(
            "pair.draft", f"vocabulary of {d} tokens differs from the target's {t} tokens"
        )


# --------------------------------------------------------------------------------------------
# output folders


def check_writable(key: str, folder: Path) -> None:
    """``folder`` can be created and written: a probe directory is made (and removed) in its
    nearest existing ancestor, so the check leaves nothing behind."""
    folder = Path(folder).expanduser().absolute()
    ancestor = folder
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ConfigError(key, f"{folder} is not writable ({ancestor} is not a folder)")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".mtad-write-probe-", dir=ancestor))
    except OSError as err:
        raise ConfigError(key, f"{folder} is not writable ({err.strerror or err})") from err
