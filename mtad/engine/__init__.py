"""The decoding engine: models and their caches, warping and sampling, and the decoding loop.

One job per module:

* :mod:`~mtad.engine.loop`: :class:`Decoder` (the loop every method shares), :class:`DecodeStats`,
  the :class:`DecodingMethod` base class, :class:`DecodeContext` and :class:`StepResult`;
* :mod:`~mtad.engine.runner`: :class:`ModelRunner`, a model plus its KV cache (feed, crop, rows);
* :mod:`~mtad.engine.heads`: the logits head (:class:`~mtad.engine.heads.CPUHeadLM`);
* :mod:`~mtad.engine.warping`: warped distributions and sampling (CPU kernels in
  ``_warping_cpu``). Every method holds a warped distribution as one type,
  :class:`~mtad.engine.warping.Candidates` (made by :func:`warp_candidates`), and samples,
  draws and looks tokens up through it; beam search draws (beam, token) pairs from their scores
  with :func:`sample_with_replacement` / :func:`sample_without_replacement`;
* :mod:`~mtad.engine.loading`: :class:`ModelSpec`, :func:`load_model`, :func:`load_pair`;
  :mod:`~mtad.engine.smollm2` (the GGUF target) and :mod:`~mtad.engine.tiny` (random test
  models) are two of its sources.

A method author needs only the names re-exported here.
"""

from mtad.engine.loading import LoadedPair, ModelSpec, load_pair
from mtad.engine.loop import (
    DecodeContext,
    Decoder,
    DecodeStats,
    DecodingMethod,
    GenerationOutput,
    StepResult,
)
from mtad.engine.runner import ModelRunner
from mtad.engine.warping import (
    NEG_INF,
    Candidates,
    WarpConfig,
    sample_with_replacement,
    sample_without_replacement,
    warp_candidates,
)

__all__ = [
    "NEG_INF",
    "Candidates",
    "DecodeContext",
    "DecodeStats",
    "Decoder",
    "DecodingMethod",
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
