"""Where models come from: :func:`load_model` and :func:`load_pair` load what a
:class:`~mtad.engine.spec.ModelSpec` (torch-free, :mod:`mtad.engine.spec`) names.

Loaders: ``hub`` / ``local`` (``from_pretrained``), ``smollm2_gguf``
(:mod:`mtad.engine.smollm2`) and ``tiny`` (random models built in code, :mod:`mtad.engine.tiny`).

Placement has one rule: ``runtime.device`` decides where every model
lives; a pair's ``device_map`` only says how a model spreads over GPUs when that device is a GPU
(accelerate's big-model inference, ``from_pretrained(device_map=..., max_memory=...)``), over
``gpus`` GPUs from the one ``runtime.device`` names, each within ``max_memory``. A model that
would not fit and be offloaded to CPU or disk (10-100x slower, and no error from transformers)
is refused unless ``allow_offload`` is set (:func:`check_placement`). So a hub pair run with
``runtime.device=cpu`` is all on the CPU, never target on a GPU and draft on the CPU.
:func:`placement` says where each model went, for ``metrics.json``.
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

from mtad.cpu import choose_dtype
from mtad.engine.draft_runner import DraftRunner
from mtad.engine.feature_head import load_head
from mtad.engine.head_runner import HeadRunner
from mtad.engine.runner import ModelRunner, check_same_vocab
from mtad.engine.spec import (  # noqa: F401 (re-exported)
    DTYPE_NAMES,
    LOADER_READS,
    LOADERS,
    ModelSpec,
    draft_kind,
    parse_bytes,
    resolve_path,
)
from mtad.engine.subvocab import read_vocab, restrict_vocab
from mtad.engine.tiny import build_tiny_model, build_tiny_tokenizer
from mtad.runs.hardware import device_kind

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
assert tuple(DTYPES) == DTYPE_NAMES


@dataclass
class LoadedPair:
    target: ModelRunner
    draft: DraftRunner | None  # a ModelRunner or a HeadRunner
    tokenizer: PreTrainedTokenizerBase


def load_model(
    spec: ModelSpec, device: str = "cpu"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase | None]:
    """Load one model (and its tokenizer when the source has one) as ``spec`` says, where
    :func:`placement_device` puts it; raise :class:`PlacementError` for an unwanted offload."""
    dtype_name, _ = choose_dtype(spec.dtype, device)  # "auto": by the CPU's bfloat16 support
    dtype = DTYPES[dtype_name]
    tokenizer: PreTrainedTokenizerBase | None = None
    dispatched = False
    if spec.loader == "tiny":
        params = {"family": "llama", "size": "target", "vocab_size": 320, "seed": 0}
        params.update(spec.tiny or {})
        model = build_tiny_model(**params).to(dtype)
        tokenizer = build_tiny_tokenizer()
    elif spec.loader == "smollm2_gguf":
        from mtad.engine.smollm2 import load_smollm2_target

        model, tokenizer = load_smollm2_target(dtype=dtype_name)
    else:
        path = spec.path if spec.loader == "hub" else resolve_path(spec.path or "")
        if spec.loader == "local" and not Path(path).is_dir():
            raise FileNotFoundError(f"path: model folder {path} does not exist")
        kwargs: dict[str, Any] = {"dtype": dtype}
        if spec.device_map and device_kind(device) == "cuda":
            dispatched = True
            kwargs["device_map"] = spec.device_map
            kwargs["max_memory"] = gpu_budget(spec, device)
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
        if spec.loader == "local" and (vocab := read_vocab(path)) is not None:
            restrict_vocab(model, vocab)  # FR-Spec draft vocabulary (mtad.engine.subvocab)
        try:
            tokenizer = AutoTokenizer.from_pretrained(path)
        except (OSError, ValueError):
            tokenizer = None  # drafts shipped without a tokenizer share the target's
    if not dispatched:
        model = model.to(device)
    check_placement(spec, model, device)
    return model.eval(), tokenizer


# --------------------------------------------------------------------------------------------
# placement


class PlacementError(RuntimeError):
    """A model is not where ``runtime.device`` and the pair's placement keys say it must be."""


# What a device_map may fill of a GPU's free memory: the rest is for KV caches and activations.
GPU_HEADROOM_FRACTION = 0.1
OFFLOAD_DEVICES = ("cpu", "disk", "meta")


def allowed_gpus(spec: ModelSpec, device: str) -> list[int]:
    """GPU indices a device_map may use: ``spec.gpus`` of them (null: all) from the index
    ``device`` names (``cuda`` = ``cuda:0``)."""
    start = int(device.split(":", 1)[1]) if ":" in device else 0
    count = torch.cuda.device_count() - start
    return list(range(start, start + min(count, spec.gpus or count)))


def gpu_budget(spec: ModelSpec, device: str) -> dict[int | str, int]:
    """accelerate's ``max_memory`` for ``spec``: per allowed GPU, ``spec.max_memory`` capped by
    what is free now minus :data:`GPU_HEADROOM_FRACTION` of the card (so a draft loaded after
    its target fits beside it), and no CPU or disk unless ``allow_offload``."""
    budget: dict[int | str, int] = {}
    for index in allowed_gpus(spec, device):
        free, total = torch.cuda.mem_get_info(index)
        room = int(free - GPU_HEADROOM_FRACTION * total)
        if spec.max_memory is not None:
            room = min(room, parse_bytes(spec.max_memory))
        budget[index] = max(room, 0)
    if not spec.allow_offload:
        budget["cpu"] = 0
    return budget


def model_devices(model: PreTrainedModel) -> list[str]:
    """Devices holding the model's weights: accelerate's ``hf_device_map`` values when it was
    dispatched (``cpu`` / ``disk`` there are offloaded modules), else its parameters' devices."""
    device_map = getattr(model, "hf_device_map", None)
    if device_map:
        found = {str(d) if not isinstance(d, int) else f"cuda:{d}" for d in device_map.values()}
    else:
        found = {str(p.device) for p in model.parameters()}
    return sorted(found)


def check_placement(spec: ModelSpec, model: PreTrainedModel, device: str) -> None:
    """Every weight on ``device``'s kind: refuse a model offloaded to CPU or disk (unless
    ``allow_offload``) or on another device kind than ``runtime.device``."""
    devices = model_devices(model)
    kind = device_kind(device)
    stray = [d for d in devices if device_kind(d) != kind]
    if not stray or (spec.allow_offload and kind == "cuda"):
        return
    offloaded = [d for d in stray if d in OFFLOAD_DEVICES]
    if offloaded and kind == "cuda" and getattr(model, "hf_device_map", None):
        raise PlacementError(
            f"{spec.path or spec.loader}: device_map {spec.device_map!r} offloaded part of the "
            f"model to {'/'.join(offloaded)} (it does not fit max_memory on GPUs "
            f"{allowed_gpus(spec, device)}); give it more GPUs (gpus) or memory (max_memory), "
            "or set allow_offload=true to accept a 10-100x slower run"
        )
    raise PlacementError(
        f"{spec.path or spec.loader}: weights on {', '.join(stray)} but runtime.device={device}"
    )


def placement(target: PreTrainedModel, draft: PreTrainedModel | None) -> dict[str, Any]:
    """Where the models are (``metrics.json`` ``placement``): per role the devices and
    accelerate's ``hf_device_map`` (module -> device, when dispatched), and the GPUs used."""
    out: dict[str, Any] = {}
    gpus: set[str] = set()
    for role, model in (("target", target), ("draft", draft)):
        if model is None:
            continue
        devices = model_devices(model)
        gpus |= {d for d in devices if device_kind(d) == "cuda"}
        device_map = getattr(model, "hf_device_map", None)
        out[role] = {
            "devices": devices,
            "hf_device_map": {k: str(v) for k, v in device_map.items()} if device_map else None,
        }
    out["gpu_ids"] = sorted(torch.device(d).index or 0 for d in gpus)
    out["gpus_used"] = len(gpus)
    return out


def load_pair(
    target: ModelSpec,
    draft: ModelSpec | None,
    device: str = "cpu",
    lm_head: str = "auto",
    linears: str = "auto",
) -> LoadedPair:
    """Load target (+ draft) and check they share one vocabulary. ``lm_head``: the output
    projection (the ``runtime.head`` setting), see :func:`head_for`; ``linears``: prepacked
    CPU projections or stock (``runtime.linears``, :func:`mtad.engine.packed.set_linears`).
    A draft of kind ``head``
    (a feature-level draft head) runs in a :class:`HeadRunner` over the target's features;
    ``auto`` is what the draft's folder holds (:func:`mtad.engine.spec.draft_kind`)."""
    target_model, tokenizer = load_model(target, device)
    if tokenizer is None:
        raise ValueError("target: the target source provides no tokenizer")
    if draft is not None and draft_kind(draft) == "head":
        head_model = load_head(head_folder(draft), target_model, read_vocab(head_folder(draft)))
        taps = head_model.spec.taps
        target_runner = ModelRunner(
            target_model, "target", lm_head, feature_taps=taps, linears=linears
        )
        head_runner = HeadRunner(head_model, target_runner, linears=linears)
        return LoadedPair(target_runner, head_runner, tokenizer)
    draft_runner = None
    if draft is not None:
        draft_model, _ = load_model(draft, device)
        check_same_vocab(target_model, draft_model)
        draft_runner = ModelRunner(draft_model, "draft", lm_head, linears=linears)
    target_runner = ModelRunner(target_model, "target", lm_head, linears=linears)
    return LoadedPair(target_runner, draft_runner, tokenizer)


def head_folder(spec: ModelSpec) -> str:
    """The local folder of a feature-level head: ``local`` paths as they are, ``hub`` names
    through the hub's snapshot cache (published EAGLE heads; needs the hub or its cache)."""
    if spec.loader == "local":
        folder = resolve_path(spec.path or "")
        if not Path(folder).is_dir():
            raise FileNotFoundError(f"path: head folder {folder} does not exist")
        return folder
    if spec.loader == "hub":
        if Path(spec.path or "").is_dir():
            return str(spec.path)
        from huggingface_hub import snapshot_download

        return snapshot_download(spec.path)
    raise ValueError(f"kind: a head is loaded from a 'local' or 'hub' folder, not {spec.loader!r}")
