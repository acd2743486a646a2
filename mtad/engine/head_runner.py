"""The draft contract for a feature-level head: :class:`HeadRunner`.

A :class:`~mtad.engine.feature_head.FeatureHead` drafts from the target's hidden states, so its
runner reads them from the target's :class:`~mtad.engine.runner.FeatureStore` (filled by every
target forward) and otherwise implements the same
:class:`~mtad.engine.draft_runner.DraftRunner` as the independent draft's
:class:`~mtad.engine.runner.ModelRunner`: methods *feed* it the committed sequence, run
drafted tokens *forward*, *crop* on rollback and *select* / *repeat* rows for beams and trees,
through one :class:`BucketedKV` cache of one layer.

What differs is kept here:

* the head's cache entries are of two kinds: read from the target's true features (positions the
  target has verified) or from the head's own outputs (drafted positions). :meth:`crop` keeps only
  the first kind, so after a verification the accepted tokens are fed again with their true
  target features, as EAGLE does;
* every row carries its own feature chain (``last``: the head's output at its last position), so
  MTAD's beams and SpecInfer's tree nodes each continue from their own state.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from mtad.engine.feature_head import FeatureHead
from mtad.engine.packed import set_linears
from mtad.engine.runner import ModelRunner, warp_rows
from mtad.engine.warping import Candidates, WarpConfig

# Positions: the head's cache holds its keys and values in buffers whose length is a multiple
# of this. Why: on the CPU, torch runs a bfloat16 matmul through oneDNN, which builds a primitive
# for every new shape (~1.2 ms on the Intel Xeon); an attention over exactly the cached positions
# meets a new key length at almost every call of the decoding loop (its 1-row feed of k + 1
# positions: 1.28 ms median in MTAD's loop, against 0.16 ms for a shape seen before). With the
# key length a bucket's, a shape repeats for 64 positions and its primitive is built once
# (0.23 ms in the loop; assets/drafts/smollm2-head/notes.md, 2026-12-05 evening).
KV_BUCKET = 64


def bucket_length(n: int) -> int:
    """The buffer length that holds ``n`` positions: ``n`` rounded up to :data:`KV_BUCKET`."""
    return max(KV_BUCKET, -(-n // KV_BUCKET) * KV_BUCKET)


class BucketedLayer:
    """One layer's keys and values ``[rows, kv heads, capacity, head dim]`` in zero-initialised
    buffers of :func:`bucket_length` positions; the first :attr:`length` positions are the cache.

    :meth:`update` writes new positions in place and returns the whole buffers: the caller
    attends over ``capacity`` keys and masks those at or after :attr:`length` (stale values of
    cropped positions or zeros: finite, so a masked key's zero weight keeps them out exactly).
    The buffers are contiguous whenever they are returned (a strided view of a larger buffer
    took oneDNN's slow path: 0.43 ms against 0.07 ms for the same product)."""

    def __init__(self) -> None:
        self.k_buf: torch.Tensor | None = None
        self.v_buf: torch.Tensor | None = None
        self.length = 0

    @property
    def keys(self) -> torch.Tensor:
        assert self.k_buf is not None
        return self.k_buf[:, :, : self.length]

    @property
    def values(self) -> torch.Tensor:
        assert self.v_buf is not None
        return self.v_buf[:, :, : self.length]

    def get_seq_length(self) -> int:
        return self.length

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        end = self.length + k.shape[-2]
        if (
            self.k_buf is None
            or self.v_buf is None
            or self.k_buf.shape[-2] != bucket_length(end)
            or self.k_buf.shape[0] != k.shape[0]
        ):
            self._rebuffer(k, v, bucket_length(end))
        elif not self.k_buf.is_contiguous():  # a broadcast view after expand_rows: write it out
            self.k_buf, self.v_buf = self.k_buf.contiguous(), self.v_buf.contiguous()
        assert self.k_buf is not None and self.v_buf is not None
        self.k_buf[:, :, self.length : end] = k
        self.v_buf[:, :, self.length : end] = v
        self.length = end
        return self.k_buf, self.v_buf

    def _rebuffer(self, k: torch.Tensor, v: torch.Tensor, capacity: int) -> None:
        rows, heads, _, dim = k.shape
        new_k = k.new_zeros(rows, heads, capacity, dim)
        new_v = v.new_zeros(rows, v.shape[1], capacity, v.shape[-1])
        if self.length:
            new_k[:, :, : self.length] = self.keys
            new_v[:, :, : self.length] = self.values
        self.k_buf, self.v_buf = new_k, new_v

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last ``-tokens_to_remove`` positions (transformers' convention: negative)."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes minus the positions to remove, got {tokens_to_remove}")
        self.length = max(0, self.length + tokens_to_remove)

    def reorder(self, rows: torch.Tensor) -> None:
        if self.k_buf is not None and self.v_buf is not None:
            self.k_buf = self.k_buf.index_select(0, rows)
            self.v_buf = self.v_buf.index_select(0, rows)

    def expand_rows(self, n: int) -> None:
        """``n`` identical rows as a broadcast view: the next update writes them out once."""
        if self.k_buf is not None and self.v_buf is not None:
            self.k_buf = self.k_buf.expand(n, -1, -1, -1)
            self.v_buf = self.v_buf.expand(n, -1, -1, -1)


class BucketedKV:
    """The head's cache: :class:`BucketedLayer` s behind the part of transformers' ``Cache``
    interface that :meth:`mtad.engine.feature_head.FeatureHead.step` and :class:`HeadRunner`
    use (``update`` returns the bucket's buffers; ``get_seq_length`` is the cached length)."""

    def __init__(self, layers: int = 1) -> None:
        self.layers = [BucketedLayer() for _ in range(layers)]

    def update(
        self, k: torch.Tensor, v: torch.Tensor, layer_idx: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.layers[layer_idx].update(k, v)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.layers[layer_idx].get_seq_length()

    def crop(self, tokens_to_remove: int) -> None:
        for layer in self.layers:
            layer.crop(tokens_to_remove)

    def reorder_cache(self, rows: torch.Tensor) -> None:
        for layer in self.layers:
            layer.reorder(rows)

    def expand_rows(self, n: int) -> None:
        for layer in self.layers:
            layer.expand_rows(n)


class _Call(torch.nn.Module):
    """What a :class:`HeadRunner` calls for every head computation: a module, so forward hooks
    (``bench``'s forward clock) see the draft's time as they see a model draft's."""

    def forward(self, fn, *args):
        return fn(*args)


class HeadRunner:
    """A :class:`FeatureHead` and its cache, reading features from ``target``'s store (a
    :class:`~mtad.engine.draft_runner.DraftRunner`)."""

    # the cache each reset starts (bench.head_calls swaps transformers' DynamicCache in on an
    # instance to time the code before the buckets side by side)
    cache_class: type = BucketedKV
    # the logits come from the head's own projection (the target's frozen lm_head, restricted
    # to its sub-vocabulary when it has one): recorded as such in metrics.json's ``lm_head``
    lm_head = "feature"
    reads_target_features: ClassVar[bool] = True

    def __init__(
        self, model: FeatureHead, target: ModelRunner, role: str = "draft", linears: str = "auto"
    ) -> None:
        if target.features is None:
            raise ValueError(f"{role}: the target runner records no features (feature_taps)")
        self.model = model.eval()
        # its layer's projections and its logits on prepacked weights (mtad.engine.packed)
        self.packed_linears = set_linears(model, linears)
        self.target = target
        self.role = role
        self.device = target.device
        self.vocab_size = model.vocab_size
        self.vocab_ids: torch.Tensor | None = model.vocab_ids
        self.context_limit = target.context_limit
        self.net = _Call()
        self.reset()

    def reset(self) -> None:
        self.cache = self.cache_class()
        self.cached_ids = torch.empty((1, 0), dtype=torch.long, device=self.device)
        self.true_len = 0  # leading cache positions computed from the target's true features
        self.last: torch.Tensor | None = None  # [rows, d]: output at each row's last position
        self.forwards = 0

    @property
    def cache_len(self) -> int:
        return self.cached_ids.shape[1]

    @property
    def lm_head_kernels(self) -> dict[str, str]:
        """Empty: no CPU output-projection kernel is chosen for a head's logits."""
        return {}

    @property
    def rows(self) -> int:
        return self.cached_ids.shape[0]

    # --- running the head -------------------------------------------------------------------
    def _run(self, tokens: torch.Tensor, feature: torch.Tensor) -> torch.Tensor:
        """The layer over ``tokens`` ``[rows, n]`` with their input features ``[rows, n, d]``
        after the cache; returns the outputs ``[rows, n, d]``."""
        start = self.cache_len
        positions = torch.arange(start, start + tokens.shape[1], device=self.device)
        a = self.model.step(self.model.layer_input(tokens, feature), positions, self.cache)
        self.cached_ids = torch.cat([self.cached_ids, tokens], dim=1)
        self.last = a[:, -1]
        return a

    def _own(self, tokens: torch.Tensor) -> torch.Tensor:
        """Drafted positions, one at a time, each reading the previous output of its row."""
        outs = []
        for j in range(tokens.shape[1]):
            assert self.last is not None, "a drafted position needs a fed one before it"
            outs.append(self._run(tokens[:, j : j + 1], self.last[:, None]))
        return torch.cat(outs, dim=1)

    @torch.inference_mode()
    def feed(
        self, ids: torch.Tensor, extra: torch.Tensor | None = None, compact: bool = False
    ) -> torch.Tensor:
        return self.net(self._feed, ids, extra, compact)

    def _feed(self, ids: torch.Tensor, extra: torch.Tensor | None, compact: bool) -> torch.Tensor:
        """Feed the committed ``ids`` the cache lacks (with the target's true features where it
        has them), then ``extra`` drafted tokens; logits ``[rows, 1 + len(extra), V']`` of the
        last committed position and of every ``extra`` one (compact rows for a sub-vocabulary
        head when ``compact``)."""
        start, n = self.cache_len, ids.numel()
        if start >= n:
            raise RuntimeError(f"{self.role}: nothing to feed (cache already holds all ids)")
        pending = ids[start:].unsqueeze(0).expand(self.rows, -1)
        # position j reads the target's feature of j - 1: known below the store's valid length
        n_true = max(0, min(n, self.target.features.valid + 1) - start)
        outs = []
        if n_true and start == self.true_len:
            feats = self.model.fused(self.target.features.before(start, start + n_true))
            outs.append(self._run(pending[:, :n_true], feats.expand(self.rows, -1, -1)))
            self.true_len = start + n_true
        else:
            n_true = 0
        if n_true < pending.shape[1]:
            outs.append(self._own(pending[:, n_true:]))
        a = torch.cat(outs, dim=1)[:, -1:]
        if extra is not None and extra.numel():
            a = torch.cat([a, self._own(extra.unsqueeze(0).expand(self.rows, -1))], dim=1)
        self.forwards += 1
        return self._logits(a, compact)

    @torch.inference_mode()
    def forward(
        self, input_ids: torch.Tensor, keep: int = 0, compact: bool = False
    ) -> torch.Tensor:
        """Drafted tokens ``[rows, n]`` after the cache, each reading its row's own previous
        output; logits ``[rows, keep or n, V']``."""
        return self.net(self._forward, input_ids, keep, compact)

    def _forward(self, input_ids: torch.Tensor, keep: int, compact: bool) -> torch.Tensor:
        a = self._own(input_ids)
        if keep:
            a = a[:, -keep:]
        self.forwards += 1
        return self._logits(a, compact)

    def _logits(self, a: torch.Tensor, compact: bool) -> torch.Tensor:
        # as 2-D rows: a slice such as ``a[:, -1:]`` of ``[1, n, d]`` keeps the stride of n
        # positions, and matmul does not fold such a 3-D input onto one ``mm`` (it checks
        # strides of size-1 dims too): it broadcasts the weight to a batched product and copies
        # its transpose, the whole (sub-)vocabulary matrix, every call (~14 MB, several ms)
        logits = self.model.logits(a.reshape(-1, a.shape[-1])).view(*a.shape[:-1], -1)
        if compact or self.vocab_ids is None:
            return logits
        out = logits.new_full((*logits.shape[:-1], self.vocab_size), float("-inf"))
        return out.index_copy_(-1, self.vocab_ids, logits)

    # --- the rest of the draft contract --------------------------------------------------------
    def candidates(self, logits: torch.Tensor, warp: WarpConfig) -> Candidates:
        return warp_rows(logits, warp, self.vocab_ids, self.vocab_size)

    def vocab_token(self, index: torch.Tensor) -> torch.Tensor:
        return index if self.vocab_ids is None else self.vocab_ids[index]

    def crop(self, length: int) -> None:
        """Roll back to at most ``length`` positions, and never past the last one computed from
        true target features: drafted positions are fed again, with the target's features."""
        keep = min(length, self.true_len)
        remove = self.cache_len - keep
        if remove > 0:
            self.cache.crop(-remove)
            self.cached_ids = self.cached_ids[:, :keep]
            self.last = None  # the next feed recomputes at least one position
        self.true_len = min(self.true_len, keep)

    @torch.inference_mode()
    def select_rows(self, rows: torch.Tensor) -> None:
        self.cache.reorder_cache(rows)
        self.cached_ids = self.cached_ids.index_select(0, rows)
        if self.last is not None:
            self.last = self.last.index_select(0, rows)

    @torch.inference_mode()
    def repeat_rows(self, n: int) -> None:
        if n == 1:
            return
        if self.rows != 1:
            raise RuntimeError(f"{self.role}: repeat_rows needs a one-row cache, not {self.rows}")
        # views, not copies: the rows are equal until the next position, whose cache update
        # writes them out once (BucketedLayer.update makes a broadcast view contiguous first)
        self.cache.expand_rows(n)
        self.cached_ids = self.cached_ids.expand(n, -1)
        if self.last is not None:
            self.last = self.last.expand(n, -1)
