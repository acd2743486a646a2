"""The KV-cache wrapper every decoding method shares.

:class:`ModelRunner` owns one Hugging Face causal LM and its transformers ``DynamicCache``. It
knows exactly which token ids its cache holds (``cached_ids``), so methods never slice caches by
hand: they *feed* what the cache lacks (:meth:`ModelRunner.feed`), *crop* on rollback (a view, no
copy), and *select rows* on beam reorder (``DynamicCache.reorder_cache``), as transformers'
candidate generators do (``generation/candidate_generator.py``).
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer

from mtad.engine.features import FeatureTap
from mtad.engine.heads import CPUHeadLM, head_for
from mtad.engine.packed import set_linears
from mtad.engine.subvocab import SubVocabHead, SubVocabLM
from mtad.engine.warping import Candidates, WarpConfig, compact_candidates, warp_candidates

# Attention implementations that apply a custom 4-D *additive* mask as given (transformers
# passes a 4-D mask through untouched): the ones tree verification may use. FlashAttention
# kernels take no arbitrary mask, so a tree forward there would silently attend causally.
TREE_ATTENTION_IMPLS = ("eager", "sdpa")
# Config keys that hold a model's trained context length, in the order transformers' families use.
POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length")


def context_limit_of(config: dict[str, Any]) -> int | None:
    """Positions a model config says the model was trained for (None when it does not say)."""
    for source in (config, config.get("text_config") or {}):
        for key in POSITION_KEYS:
            if source.get(key):
                return int(source[key])
    return None


def vocab_size_of(model: PreTrainedModel) -> int:
    """Width of the model's output distribution (may exceed the tokenizer's vocabulary)."""
    head = model.get_output_embeddings()
    # a SubVocabHead (mtad.engine.subvocab) projects onto fewer rows but spans the vocabulary
    return int(getattr(head, "vocab_size", head.weight.shape[0]))


def check_same_vocab(target: PreTrainedModel | int, draft: PreTrainedModel | int) -> None:
    """Refuse a draft whose output distribution is not over the target's vocabulary (models, or
    their vocabulary sizes)."""
    t = target if isinstance(target, int) else vocab_size_of(target)
    d = draft if isinstance(draft, int) else vocab_size_of(draft)
    if t != d:
        raise ValueError(
            f"draft: vocabulary size {d} differs from the target's {t}; "
            "draft and target must share one tokenizer"
        )


class ModelRunner:
    """A causal LM plus its KV cache, with the cache bookkeeping methods need: a
    :class:`~mtad.engine.draft_runner.DraftRunner`, and the target's runner (tree forwards).

    ``cached_ids[r, :]`` are the ids whose keys/values sit in row ``r`` of the cache. Callers keep
    the invariant that the cache holds a prefix of the committed sequence (plus, transiently,
    drafted tokens), so catching up is always "feed ``ids[cache_len:]``". ``lm_head``: the
    output projection to run, ``"auto"``, ``"stock"`` or ``"fast"`` (:func:`head_for`; the
    ``runtime.head`` setting); :attr:`lm_head` is then the one that runs. ``linears``: the
    model's projections on prepacked weights where the CPU supports it (``"auto"``) or as stock
    (``"stock"``; :func:`~mtad.engine.packed.set_linears`, the ``runtime.linears`` setting);
    :attr:`packed_linears` counts the packed ones.
    """

    REORDERS = ("inplace", "copy")
    reads_target_features: ClassVar[bool] = False

    def __init__(
        self,
        model: PreTrainedModel,
        role: str = "model",
        lm_head: str = "auto",
        reorder: str = "inplace",
        feature_taps: list[int] | None = None,
        linears: str = "auto",
    ) -> None:
        if reorder not in self.REORDERS:
            raise ValueError(f"reorder must be one of {self.REORDERS}, got {reorder!r}")
        self.reorder = reorder
        self.model = model.eval()
        self.role = role
        self.packed_linears = set_linears(model, linears)
        self.device = next(model.parameters()).device
        self.vocab_size = vocab_size_of(model)
        self.context_limit = context_limit_of(model.config.to_dict())
        self.forwards = 0
        # what is called for logits: the model, the model with a CPU-friendly lm_head, or (an
        # FR-Spec sub-vocabulary lm_head) the model's body and its compact projection
        out_head = model.get_output_embeddings()
        if isinstance(out_head, SubVocabHead):
            self.net: torch.nn.Module = SubVocabLM(self.model)
            self.lm_head = "subvocab"
            self.vocab_ids: torch.Tensor | None = out_head.ids
        else:
            self.net = head_for(self.model, lm_head)
            self.lm_head = "fast" if isinstance(self.net, CPUHeadLM) else "stock"
            self.vocab_ids = None
        # transformers renamed ``past_key_values`` to ``cache`` during 5.x; accept both.
        body = model if self.lm_head == "stock" else model.base_model
        params = inspect.signature(body.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._can_trim_logits = self.lm_head != "stock" or "logits_to_keep" in params
        # the hidden states a feature-level draft head reads (mtad.engine.head_runner)
        self.features = FeatureStore(model, feature_taps) if feature_taps else None
        self.reset()

    def reset(self) -> None:
        """Empty the cache and the forward counter (start of a new prompt)."""
        self.cache = DynamicCache(config=self.model.config)
        self.cached_ids = torch.empty((1, 0), dtype=torch.long, device=self.device)
        self._shared_len = 0  # leading cache positions identical in every row (see rows)
        self.forwards = 0
        self.sliding_window = sliding_window_of(self.cache)
        if self.features is not None:
            self.features.reset()

    def _check_window(self, new: int) -> None:
        """Refuse a forward that would fill a sliding-window layer (Mistral-style).

        Rollback is a cache crop; a sliding-window layer keeps only its last ``window - 1``
        keys once the window is reached and cannot be cropped back past that point (transformers
        raises, or without recorded past states would keep wrong ones), and a tree mask over the
        full context would not match its shortened keys. Below the window the layer is a plain
        cache and everything is exact, so short generations run and longer ones stop here.
        """
        w = self.sliding_window
        if w is not None and self.cache_len + new >= w:
            raise RuntimeError(
                f"{self.role}: the model uses sliding-window attention (window {w} tokens) and "
                f"this forward would reach {self.cache_len + new} cached tokens; its cache cannot "
                "be rolled back past the window, so speculative rollback would be wrong. Refused: "
                "shorten the prompt / task.max_new_tokens to stay under the window, or use a "
                "model without sliding-window attention."
            )

    @property
    def lm_head_kernels(self) -> dict[str, str]:
        """Row count -> output-projection kernel the CPU lm_head chose (empty for the others)."""
        if isinstance(self.net, CPUHeadLM):
            return {str(rows): k for rows, k in self.net.kernels.items()}
        return {}

    @property
    def cache_len(self) -> int:
        return self.cached_ids.shape[1]

    @property
    def rows(self) -> int:
        return self.cached_ids.shape[0]

    @torch.inference_mode()
    def forward(
        self, input_ids: torch.Tensor, keep: int = 0, compact: bool = False
    ) -> torch.Tensor:
        """Run ``input_ids`` ``[rows, n]`` after the cached context.

        Returns logits ``[rows, keep, V]`` of the last ``keep`` positions (all when 0): the
        full-vocabulary lm_head is skipped for prompt positions nobody reads. ``compact``: a
        model with an FR-Spec lm_head returns its compact rows ``[..., len(vocab_ids)]``
        instead (read them only through :meth:`candidates` / :meth:`vocab_token`); other models
        ignore it.
        """
        if compact and self.vocab_ids is not None:
            logits = self._logits(input_ids, keep, compact=True)
        else:
            logits = self._logits(input_ids, keep)
        if keep:
            logits = logits[:, -keep:]
        if self.features is not None:
            self.features.record(self.cache_len, self.features.taken()[0])
        self.cached_ids = torch.cat([self.cached_ids, input_ids], dim=1)
        self.forwards += 1
        return logits

    def _logits(self, input_ids: torch.Tensor, keep: int, **kwargs: Any) -> torch.Tensor:
        """One forward through the cache; logits of (at least) the last ``keep`` positions."""
        self._check_window(input_ids.shape[1])
        kwargs.update({self._cache_kw: self.cache, "use_cache": True})
        if keep and self._can_trim_logits:
            kwargs["logits_to_keep"] = keep
        out = self.net(input_ids=input_ids, **kwargs)
        return out if isinstance(out, torch.Tensor) else out.logits

    def candidates(self, logits: torch.Tensor, warp: WarpConfig) -> Candidates:
        """:func:`~mtad.engine.warping.warp_candidates` of logits this runner returned,
        compact (``compact=True``) or full-width: candidates named by vocabulary id."""
        return warp_rows(logits, warp, self.vocab_ids, self.vocab_size)

    def vocab_token(self, index: torch.Tensor) -> torch.Tensor:
        """Vocabulary ids of column indices into logits this runner returned (compact or not),
        e.g. an argmax."""
        return index if self.vocab_ids is None else self.vocab_ids[index]

    def feed(
        self, ids: torch.Tensor, extra: torch.Tensor | None = None, compact: bool = False
    ) -> torch.Tensor:
        """Feed the part of the 1-D committed sequence ``ids`` the cache lacks, then ``extra``.

        Returns logits ``[rows, 1 + len(extra), V]``: the last committed position (predicting
        the first new token) and every ``extra`` position. At least one token is always fed: the
        cache never holds the last committed token, whose logits predict the next one.
        """
        pending = ids[self.cache_len :]
        keep = 1
        if extra is not None:
            pending = torch.cat([pending, extra])
            keep += extra.numel()
        if pending.numel() == 0:
            raise RuntimeError(f"{self.role}: nothing to feed (cache already holds all ids)")
        return self.forward(pending.unsqueeze(0).expand(self.rows, -1), keep=keep, compact=compact)

    @torch.inference_mode()
    def feed_tree(
        self, ids: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor
    ) -> torch.Tensor:
        """Feed the committed tokens the cache lacks plus a token tree, in one forward.

        ``tokens``/``parents``/``depths`` are ``[N]``, nodes in breadth-first order; ``parents[i]``
        is the index of node ``i``'s parent or ``-1`` under the last committed token; depth 1 is
        the first drafted position. Each node attends to the committed context and its own
        ancestors only (a tree attention mask, as in SpecInfer, Miao et al., ASPLOS 2024).
        Returns logits ``[1 + N, V]``: the last committed position, then every node. The tree's
        keys/values are scratch: call :meth:`commit_tree_path` (back to ``len(ids)``) before the
        next feed.

        The mask is passed as an additive float mask (0 where allowed, the dtype's minimum
        elsewhere): SDPA reads a boolean mask as "keep", but eager attention *adds* the mask to
        the scores, so a boolean one would add 0/1 and mask nothing. The float form means the
        same to both (:func:`additive_mask`); other implementations are refused.
        """
        if self.rows != 1:
            raise RuntimeError(f"{self.role}: tree verification needs a single-row cache")
        self.check_tree_attention()
        start = self.cache_len
        pending = ids[start:]
        p, n = pending.numel(), tokens.numel()
        dev = self.device
        # ancestor-or-self relation: transitive closure of (identity + parent links) by
        # repeated boolean squaring, log2(N) small matmuls and no host sync
        idx = torch.arange(n, device=dev)
        anc = torch.zeros(n, n, dtype=torch.bool, device=dev)
        anc[idx, idx] = True
        has = parents >= 0
        anc[idx[has], parents[has]] = True
        for _ in range(max(1, n).bit_length()):
            anc = (anc.float() @ anc.float()) > 0
        allow = torch.zeros(p + n, start + p + n, dtype=torch.bool, device=dev)
        allow[:, :start] = True
        allow[:p, start : start + p] = torch.ones(p, p, dtype=torch.bool, device=dev).tril()
        allow[p:, start : start + p] = True
        allow[p:, start + p :] = anc
        positions = torch.cat(
            [torch.arange(start, start + p, device=dev), start + p - 1 + depths.to(dev)]
        )
        logits = self._logits(
            torch.cat([pending, tokens]).unsqueeze(0),
            n + 1,
            attention_mask=additive_mask(allow, self.model.dtype)[None, None],
            position_ids=positions.unsqueeze(0),
        )[0, -(n + 1) :]
        if self.features is not None:
            tapped = self.features.taken()[0]
            self.features.record(start, tapped[:p])
            self.features.tree = tapped[p:]
        self.cached_ids = torch.cat([self.cached_ids, pending[None], tokens[None]], dim=1)
        self.forwards += 1
        return logits

    @torch.inference_mode()
    def commit_tree_path(self, length: int, nodes: list[int]) -> None:
        """End a tree verification (:meth:`feed_tree`): roll the tree's scratch keys/values back
        to the committed ``length`` (the accepted tokens are fed again with the next block) and
        keep what the accepted ``nodes`` (root to leaf) leave behind: with ``feature_taps``, the
        target's features of those nodes as those of the next positions, so a feature-level
        draft reads them before the target re-reads the path. One call, so tree methods need
        not know which kind of draft runs beside them."""
        self.crop(length)
        if self.features is not None and nodes:
            self.features.record(self.cache_len, self.features.tree[nodes])

    @property
    def attn_implementation(self) -> str:
        return str(getattr(self.model.config, "_attn_implementation", None) or "eager")

    def check_tree_attention(self) -> None:
        """Raise unless the model's attention applies a custom tree mask (eager or SDPA)."""
        impl = self.attn_implementation
        if impl not in TREE_ATTENTION_IMPLS:
            raise ValueError(
                f"{self.role}: tree verification needs attn_implementation in "
                f"{TREE_ATTENTION_IMPLS} (a custom 4-D mask); this model uses {impl!r}, which "
                "would ignore the tree mask. Load it with attn_implementation='sdpa'."
            )

    def crop(self, length: int) -> None:
        """Roll the cache back to its first ``length`` positions (a view: nothing is copied)."""
        remove = self.cache_len - length
        if remove > 0:
            # transformers >= 5 takes a negative count of tokens to drop (4.x accepted it too).
            self.cache.crop(-remove)
            self.cached_ids = self.cached_ids[:, :length]
            self._shared_len = min(self._shared_len, length)
        if self.features is not None:
            self.features.valid = min(self.features.valid, length)

    @property
    def shared_len(self) -> int:
        """Leading cache positions that hold the same keys/values in every row."""
        return self.cache_len if self.rows == 1 else self._shared_len

    def _plain_layers(self) -> bool:
        layers = getattr(self.cache, "layers", None)
        return bool(layers) and all(
            type(layer) is DynamicLayer and layer.is_initialized for layer in layers
        )

    @torch.inference_mode()
    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep / reorder cache rows by index (beam reorder or picking the winning beam).

        In place (``reorder="inplace"``, plain layers, no more rows than now): the positions
        after :attr:`shared_len` of the chosen rows are gathered into the first
        ``len(rows)`` rows and the cache narrowed to them (a view); the shared context, the
        same in every row, is not touched. Otherwise transformers' ``reorder_cache``.
        """
        n = rows.numel()
        shared = self.shared_len
        if self.reorder == "inplace" and n <= self.rows and self._plain_layers():
            for layer in self.cache.layers:
                layer.keys = _gather_rows_after(layer.keys, rows, shared)
                layer.values = _gather_rows_after(layer.values, rows, shared)
        else:
            self.cache.reorder_cache(rows)
        self.cached_ids = self.cached_ids.index_select(0, rows)
        # any choice of rows that share a prefix shares it
        self._shared_len = shared

    def repeat_rows(self, n: int) -> None:
        """Turn a one-row cache into ``n`` identical rows (the start of a beam search).

        In place: the rows are a broadcast view of the one row; the next forward's cache append
        (a ``torch.cat``) writes them out once, as it would have copied them anyway."""
        if n == 1:
            return
        if self.rows != 1:
            raise RuntimeError(f"{self.role}: repeat_rows needs a one-row cache, not {self.rows}")
        if self.reorder == "inplace" and self._plain_layers():
            for layer in self.cache.layers:
                layer.keys = layer.keys.expand(n, -1, -1, -1)
                layer.values = layer.values.expand(n, -1, -1, -1)
        else:
            self.cache.batch_repeat_interleave(n)
        self._shared_len = self.cache_len
        self.cached_ids = self.cached_ids.repeat_interleave(n, dim=0)


def warp_rows(
    logits: torch.Tensor, warp: WarpConfig, vocab_ids: torch.Tensor | None, vocab_size: int
) -> Candidates:
    """Warped candidates of a draft's logits, full-width or compact (columns ``vocab_ids``, an
    FR-Spec sub-vocabulary in ascending id order), named by vocabulary id."""
    if vocab_ids is None or logits.shape[-1] == vocab_size:
        return warp_candidates(logits, warp)
    found = compact_candidates(logits, warp, vocab_ids)
    if found is not None:
        return found
    wide = logits.new_full((*logits.shape[:-1], vocab_size), float("-inf"))
    return warp_candidates(wide.index_copy_(-1, vocab_ids, logits), warp)


class FeatureStore:
    """The target's hidden states at the committed positions, for a feature-level draft head.

    A :class:`~mtad.engine.features.FeatureTap` keeps the tapped layers' outputs of every
    target forward; :meth:`record` writes those of the fed positions at their place. ``valid``
    counts the leading positions holding the target's features of the committed sequence: a
    crop lowers it, a verification forward raises it over the tokens it read.
    """

    def __init__(self, model: PreTrainedModel, taps: list[int]) -> None:
        self.tap = FeatureTap(model, taps)
        self.zero = torch.zeros(  # the feature of position -1, read by position 0
            1, len(taps), model.config.hidden_size, dtype=model.dtype, device=model.device
        )
        self.buf: torch.Tensor | None = None  # [capacity, taps, d]
        self.tree: torch.Tensor | None = None  # features of the last tree forward's nodes
        self.valid = 0

    def reset(self) -> None:
        self.valid = 0
        self.tree = None

    def taken(self) -> torch.Tensor:
        return self.tap.take()

    def record(self, start: int, feats: torch.Tensor) -> None:
        """``feats`` ``[n, taps, d]`` are the features of positions ``start .. start + n - 1``."""
        end = start + feats.shape[0]
        if self.buf is None or self.buf.shape[0] < end:
            grown = feats.new_empty((max(2 * end, 256), *feats.shape[1:]))
            if self.buf is not None:
                grown[: self.buf.shape[0]] = self.buf
            self.buf = grown
        self.buf[start:end] = feats
        if start <= self.valid:
            self.valid = max(self.valid, end)

    def before(self, start: int, end: int) -> torch.Tensor:
        """Features of positions ``start - 1 .. end - 2`` (what positions ``start .. end - 1``
        of a head read), zeros for position -1: ``[end - start, taps, d]``."""
        assert end - 1 <= self.valid
        if end - 1 == 0:
            return self.zero
        assert self.buf is not None
        out = self.buf[max(start - 1, 0) : end - 1]
        return torch.cat([self.zero, out]) if start == 0 else out


def _gather_rows_after(t: torch.Tensor, rows: torch.Tensor, start: int) -> torch.Tensor:
    """``t[rows]`` for a ``[batch, heads, seq, dim]`` cache tensor whose rows agree on the first
    ``start`` positions: only the positions after ``start`` are moved, into the first
    ``len(rows)`` rows of ``t`` itself; returns those rows (a view)."""
    n = rows.numel()
    if t.shape[-2] > start:
        if t.stride(0) == 0:  # still the broadcast view of repeat_rows: give it its own rows
            t = t.contiguous()
        t[:n, :, start:].copy_(t[:, :, start:].index_select(0, rows.to(t.device)))
    return t[:n]


def sliding_window_of(cache: DynamicCache) -> int | None:
    """The smallest sliding window among the cache's layers (None: full attention only)."""
    windows = [
        int(layer.sliding_window)
        for layer in getattr(cache, "layers", [])
        if getattr(layer, "sliding_window", None)
    ]
    return min(windows) if windows else None


def additive_mask(allow: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean "may attend" mask as the additive float mask attention adds to its scores:
    0 where allowed, ``finfo(dtype).min`` elsewhere (what transformers' own mask builders use;
    not ``-inf``, which turns a fully masked row into NaN)."""
    if not dtype.is_floating_point:
        dtype = torch.float32
    zero = torch.zeros((), dtype=dtype, device=allow.device)
    return torch.where(allow, zero, torch.finfo(dtype).min)
