"""Where models come from: :func:`load_model` and :func:`load_pair` load what a
:class:`~mtad.engine.spec.ModelSpec` (torch-free, :mod:`mtad.engine.spec`) names.

Loaders: ``hub`` / ``local`` (``from_pretrained``), ``smollm2_gguf``
(:mod:`mtad.engine.smollm2`) and ``tiny`` (random models built in code, :mod:`mtad.engine.tiny`).
"""

from __future__ import annotations

from dataclasses import dataclass
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
from mtad.engine.spec import DTYPE_NAMES, ModelSpec, resolve_path
from mtad.engine.tiny import build_tiny_model, build_tiny_tokenizer

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
assert tuple(DTYPES) == DTYPE_NAMES


@dataclass
class LoadedPair:
    target: ModelRunner
    draft: ModelRunner | None
    tokenizer: PreTrainedTokenizerBase


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
