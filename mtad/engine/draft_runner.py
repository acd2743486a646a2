"""The draft contract: what a decoding method, the decoding loop and the harness may ask of the
model a method drafts with, written once as :class:`DraftRunner`.

Two runners implement it (SPEC: "two kinds, one contract"):

* :class:`~mtad.engine.runner.ModelRunner`: an independent draft model and its KV cache (and
  the target itself, which MTJD beam-samples);
* :class:`~mtad.engine.head_runner.HeadRunner`: a feature-level draft head
  (:class:`~mtad.engine.feature_head.FeatureHead`) reading the target's hidden states.

Methods type their draft as :class:`DraftRunner`, so a method written against it runs with
either kind; ``tests/test_draft_runner.py`` checks that both runners define every member here.
What only the target does (verify a token tree, keep the features of its accepted path) is
:class:`~mtad.engine.runner.ModelRunner`'s alone.

Words: ``lm_head`` is a runner's output projection (hidden states -> logits), chosen by the
``runtime.head`` setting; a *head* unqualified is the feature-level draft head.
"""

from __future__ import annotations

from typing import ClassVar, Protocol, runtime_checkable

import torch

from mtad.engine.warping import Candidates, WarpConfig


@runtime_checkable
class DraftRunner(Protocol):
    """A draft model plus its cache: feed, crop, select rows, distributions.

    ``cached_ids``-style bookkeeping is the runner's: callers keep the invariant that the cache
    holds a prefix of the committed sequence (plus, transiently, drafted tokens), so catching
    up is always :meth:`feed` of the committed ids.
    """

    role: str  # "draft" or "target": names the model in errors
    model: torch.nn.Module  # the weights (placement, the GPUs the time split waits for)
    device: torch.device
    vocab_size: int  # width of the output distribution (the target's vocabulary)
    vocab_ids: torch.Tensor | None  # an FR-Spec sub-vocabulary's ids (compact rows), or None
    context_limit: int | None  # positions the model was trained for (None: not known)
    forwards: int  # forwards since :meth:`reset` (``DecodeStats.draft_forwards``)
    # which output projection runs: "stock", "fast" (CPU), "subvocab" or "feature" (a head's);
    # metrics.json records it as ``lm_head``
    lm_head: str
    # how many of its projections run on prepacked CPU weights (mtad.engine.packed);
    # metrics.json records it as ``packed_linears``
    packed_linears: int
    # True for a draft that reads the target's hidden states: the decoding loop has the
    # target read the prompt before the first draft step (as EAGLE's generation starts)
    reads_target_features: ClassVar[bool]

    @property
    def cache_len(self) -> int:
        """Positions the cache holds."""
        ...

    @property
    def rows(self) -> int:
        """Rows of the cache (beams or tree nodes)."""
        ...

    @property
    def lm_head_kernels(self) -> dict[str, str]:
        """Row count -> the CPU output-projection kernel it ran (empty when none was chosen)."""
        ...

    def reset(self) -> None:
        """Empty the cache and the forward counter (start of a new prompt)."""
        ...

    def feed(
        self, ids: torch.Tensor, extra: torch.Tensor | None = None, compact: bool = False
    ) -> torch.Tensor:
        """Feed the part of the 1-D committed ``ids`` the cache lacks, then ``extra``; logits
        ``[rows, 1 + len(extra), V]`` (compact rows of a sub-vocabulary when ``compact``)."""
        ...

    def forward(
        self, input_ids: torch.Tensor, keep: int = 0, compact: bool = False
    ) -> torch.Tensor:
        """Drafted tokens ``[rows, n]`` after the cache; logits of the last ``keep`` (0: all)."""
        ...

    def crop(self, length: int) -> None:
        """Roll the cache back to (at most) its first ``length`` positions."""
        ...

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep / reorder cache rows by index (beam reorder, picking the winning beam)."""
        ...

    def repeat_rows(self, n: int) -> None:
        """Turn a one-row cache into ``n`` identical rows (the start of a beam search)."""
        ...

    def candidates(self, logits: torch.Tensor, warp: WarpConfig) -> Candidates:
        """The warped distribution of logits this runner returned, named by vocabulary id."""
        ...

    def vocab_token(self, index: torch.Tensor) -> torch.Tensor:
        """Vocabulary ids of column indices into logits this runner returned."""
        ...
