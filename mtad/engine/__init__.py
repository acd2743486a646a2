"""The decoding engine: models and their caches, warping and sampling, and the decoding loop.

One job per module:

* :mod:`~mtad.engine.loop`: :class:`Decoder` (the loop every method shares), :class:`DecodeStats`,
  the :class:`DecodingMethod` base class, :class:`DecodeContext` and :class:`StepResult`;
* :mod:`~mtad.engine.draft_runner`: :class:`DraftRunner`, the draft contract (feed, crop,
  rows, distributions) that :class:`ModelRunner` and
  :class:`~mtad.engine.head_runner.HeadRunner` (a feature-level draft head) both implement;
* :mod:`~mtad.engine.runner`: :class:`ModelRunner`, a model plus its KV cache (feed, crop, rows);
* :mod:`~mtad.engine.heads`: the output projection, ``lm_head``
  (:class:`~mtad.engine.heads.CPUHeadLM`), as distinct from a *head*, the feature-level draft
  (:mod:`~mtad.engine.feature_head`);
* :mod:`~mtad.engine.warping`: warped distributions and sampling (CPU kernels in
  ``_warping_cpu``). Every method holds a warped distribution as one type,
  :class:`~mtad.engine.warping.Candidates` (made by :func:`warp_candidates`), and samples,
  draws and looks tokens up through it; beam search draws (beam, token) pairs from their scores
  with :func:`sample_with_replacement` / :func:`sample_without_replacement`;
* :mod:`~mtad.engine.spec`: :class:`ModelSpec` and path resolution, and :class:`WarpConfig`,
  free of torch (config code reads them before any model loads);
  :mod:`~mtad.engine.loading`: :func:`load_model`,
  :func:`load_pair`;
  :mod:`~mtad.engine.smollm2` (the GGUF target) and :mod:`~mtad.engine.tiny` (random test
  models) are two of its sources.

A method author needs only the names re-exported here. They are imported on first use (PEP
562 module ``__getattr__``), so ``import mtad.engine.spec`` does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# public name -> the module that defines it
_SOURCES = {
    "NEG_INF": "warping",
    "Candidates": "warping",
    "DecodeContext": "loop",
    "DecodeStats": "loop",
    "Decoder": "loop",
    "DecodingMethod": "loop",
    "DraftDepth": "loop",
    "DraftRunner": "draft_runner",
    "GenerationOutput": "loop",
    "LoadedPair": "loading",
    "ModelRunner": "runner",
    "ModelSpec": "spec",
    "StepResult": "loop",
    "WarpConfig": "spec",
    "load_pair": "loading",
    "sample_with_replacement": "warping",
    "sample_without_replacement": "warping",
    "warp_candidates": "warping",
}

if TYPE_CHECKING:
    from mtad.engine.draft_runner import DraftRunner
    from mtad.engine.loading import LoadedPair, load_pair
    from mtad.engine.loop import (
        DecodeContext,
        Decoder,
        DecodeStats,
        DecodingMethod,
        DraftDepth,
        GenerationOutput,
        StepResult,
    )
    from mtad.engine.runner import ModelRunner
    from mtad.engine.spec import ModelSpec, WarpConfig
    from mtad.engine.warping import (
        NEG_INF,
        Candidates,
        sample_with_replacement,
        sample_without_replacement,
        warp_candidates,
    )


def __getattr__(name: str) -> Any:
    if name not in _SOURCES:
        raise AttributeError(f"module 'mtad.engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"mtad.engine.{_SOURCES[name]}"), name)
    globals()[name] = value  # once: later lookups skip this function
    return value


__all__ = [
    "NEG_INF",
    "Candidates",
    "DecodeContext",
    "DecodeStats",
    "Decoder",
    "DecodingMethod",
    "DraftDepth",
    "DraftRunner",
    "GenerationOutput",
    "LoadedPair",
    "ModelRunner",
    "ModelSpec",
    "StepResult",
    "WarpConfig",
    "load_pair",
    "sample_with_replacement",
    "sample_without_replacement",
    "warp_candidates",
]
assert sorted(__all__) == sorted(_SOURCES)
