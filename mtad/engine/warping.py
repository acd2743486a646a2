"""Logit warping and sampling helpers shared by every decoding method.

Small pure functions in the spirit of gpt-fast's ``logits_to_probs`` / ``sample``
(pytorch-labs/gpt-fast, ``generate.py``): every method warps the target and the draft the same
way, and sampling never forces a host sync.

Methods hold every warped distribution as one type, :class:`Candidates` (from
:func:`warp_candidates`): sparse top-k candidates on the CPU, vocabulary-wide rows elsewhere, the
same interface either way. :func:`warp_logprobs` and the ``sample_*`` functions below are its
building blocks (and what distillation and the tests compare against).

Conventions
-----------
* Warped distributions are **log-probabilities** with ``-inf`` outside the support
  left by top-k / top-p, so that ratios and joint scores are sums and zero-probability tokens are
  recognisable exactly (``isinf``), never confused with small probabilities.
* ``temperature == 0`` means greedy. Greedy choices are argmax / top-B; the *scores* used by
  methods that need probabilities in greedy mode (MTAD's beam weights and joint ratio) come from
  the same warping at temperature 1 (see :meth:`WarpConfig.scoring`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mtad.engine._warping_cpu import (  # CPU fast paths; NEG_INF is shared with them
    NEG_INF,
    sparse_support,
    top_k_top_p_candidates,
    top_k_top_p_masked,
)
from mtad.engine.spec import WarpConfig  # torch-free: the methods' params build it

_TINY = torch.finfo(torch.float32).tiny


def warp_logprobs(logits: torch.Tensor, warp: WarpConfig) -> torch.Tensor:
    """Warped next-token log-probabilities over the last dimension (``-inf`` off-support).

    Greedy warping (temperature 0) returns the scoring distribution (temperature 1); callers
    pick argmax themselves.
    """
    warp = warp.scoring()
    logits = logits.float()
    if warp.temperature != 1.0:
        logits = logits / warp.temperature
    vocab = logits.shape[-1]
    top_k = 0 < warp.top_k < vocab
    if top_k and logits.device.type == "cpu":
        masked = top_k_top_p_masked(logits, warp.top_k, warp.top_p)
        if masked is not None:
            return torch.log_softmax(masked, dim=-1)
    if top_k:
        logits = _top_k_mask(logits, warp.top_k)
    if warp.top_p < 1.0:
        logits = logits.masked_fill(_top_p_drop(logits, warp.top_p), NEG_INF)
    return torch.log_softmax(logits, dim=-1)


def _top_k_mask(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Keep the ``top_k`` largest logits (and any equal to the k-th), ``-inf`` elsewhere."""
    kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, NEG_INF)


def _top_p_drop(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Top-p drop mask by sorting the whole vocabulary.

    Drop a token when the mass *before* it already reaches ``top_p``: the most likely token
    always survives, and the kept set is the smallest one whose mass reaches ``top_p``. Equal
    values are ordered by token id (a stable sort), so when a group of equal values straddles
    the cut the lower ids are kept: one rule on every device, which the CPU candidate path
    reproduces on its few candidates (an unstable sort's order among equal values is whatever
    the sorting kernel leaves).
    """
    sorted_logits, sorted_idx = torch.sort(logits, dim=-1, descending=True, stable=True)
    probs = sorted_logits.softmax(dim=-1)
    drop_sorted = (probs.cumsum(dim=-1) - probs) >= top_p
    return drop_sorted.scatter(-1, sorted_idx, drop_sorted)


def gumbel_like(x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Standard Gumbel noise shaped like ``x`` drawn from ``generator`` (no host sync).

    ``-log(-log U)`` with ``U`` uniform in ``[tiny, 1)``, so the noise is always finite. Built
    from ``uniform_`` rather than ``exponential_``: on CPUs where MKL's exponential generator
    takes its generic path (AMD) that costs ~3x more per 49k-entry row (bench/README.md).
    """
    u = torch.empty_like(x, dtype=torch.float32).uniform_(generator=generator)
    return u.clamp_(min=_TINY).log_().neg_().log_().neg_()


def perturb(logscores: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """``logscores + Gumbel`` (float32), the keys of Gumbel-max / Gumbel-top-k sampling.

    ``-inf`` entries (outside the top-k / top-p support) stay ``-inf`` and need no noise. On
    the CPU, when the support is a small part of the row (a few dozen of 49k tokens after
    top-k), noise is drawn only for the support: per 49k-entry row that saves the uniform
    draws and two logarithms, the bulk of sampling time. The keys have the same
    distribution; the generator's stream is consumed differently (one draw per live entry).
    """
    live = sparse_support(logscores)
    if live is None:
        return logscores + gumbel_like(logscores, generator)
    vals = logscores[live].float()
    keys = torch.full(logscores.shape, NEG_INF, dtype=torch.float32)
    keys[live] = vals + gumbel_like(vals, generator)
    return keys


@dataclass(frozen=True)
class Candidates:
    """The warped next-token distribution every method samples from, scores and looks up.

    One type with two layouts behind one interface: ``logp[..., j]`` is the warped
    log-probability of token ``tokens[..., j]``, and tokens that are not candidates have
    probability 0. Built by :func:`warp_candidates`: on the CPU with top-k only a few dozen
    candidates of a 49k vocabulary are kept (``dense=False``), so scoring, sampling and lookups
    never touch vocabulary-wide rows; otherwise (GPU, no top-k) every token is a candidate
    (``dense``: ``logp`` is the vocabulary-wide row and ``tokens`` an expanded ``arange``, no
    copy). Methods never need to know which: index rows, :meth:`logp_of` / :meth:`lookup` a
    token, :meth:`sample` or :meth:`draw` tokens.
    """

    tokens: torch.Tensor  # [..., m] int64
    logp: torch.Tensor  # [..., m] float32, -inf for candidates warping dropped
    dense: bool

    @classmethod
    def from_logprobs(cls, logp: torch.Tensor) -> Candidates:
        """Vocabulary-wide log-probability rows ``[..., V]`` as a dense distribution."""
        tokens = torch.arange(logp.shape[-1], device=logp.device).expand(logp.shape)
        return cls(tokens, logp, dense=True)

    def __getitem__(self, rows: int | slice | torch.Tensor | None) -> Candidates:
        """Some rows (indexing the leading dimensions), e.g. ``c[k]``, ``c[:g]``, ``c[idx]``."""
        if self.dense:  # a fresh expanded arange: indexing the expanded one would copy it
            return Candidates.from_logprobs(self.logp[rows])
        return Candidates(self.tokens[rows], self.logp[rows], False)

    def _matched(self, tokens: torch.Tensor) -> torch.Tensor:
        # log-probability of each entry of ``tokens [..., 1]`` among the candidates broadcast
        # against it; -inf where it is not a kept candidate
        return torch.where(self.tokens == tokens, self.logp, NEG_INF).amax(dim=-1)

    def logp_of(self, token: torch.Tensor) -> torch.Tensor:
        """Log-probability of one token per row (``token`` ``[...]``; ``-inf`` if not kept)."""
        if self.dense:
            return self.logp.gather(-1, token[..., None]).squeeze(-1)
        return self._matched(token[..., None])

    def lookup(self, tokens: torch.Tensor) -> torch.Tensor:
        """Log-probabilities of any ``tokens`` under a one-row distribution (``-inf`` if not
        kept)."""
        if self.dense:
            return self.logp[tokens]
        return self._matched(tokens[..., None])

    def to_dense(self, vocab: int) -> torch.Tensor:
        """The vocabulary-wide log-probability rows (``-inf`` off the candidates)."""
        if self.dense:
            return self.logp
        out = torch.full((*self.logp.shape[:-1], vocab), NEG_INF, device=self.logp.device)
        return out.scatter_(-1, self.tokens, self.logp)

    @staticmethod
    def cat(parts: list[Candidates], vocab: int) -> Candidates:
        """Rows of several distributions concatenated (dense if any part is, or widths differ)."""
        if all(not p.dense for p in parts) and len({p.logp.shape[-1] for p in parts}) == 1:
            return Candidates(
                torch.cat([p.tokens for p in parts]), torch.cat([p.logp for p in parts]), False
            )
        return Candidates.from_logprobs(torch.cat([p.to_dense(vocab) for p in parts]))

    @staticmethod
    def stack(rows: list[Candidates], vocab: int) -> Candidates:
        """One-row distributions stacked into rows (dense if any row is, or widths differ)."""
        return Candidates.cat([r[None] for r in rows], vocab)

    def sample(self, generator: torch.Generator | None, greedy: bool = False) -> torch.Tensor:
        """One token per row (Gumbel-max over the candidates; argmax when ``greedy``)."""
        j = sample_from_logprobs(self.logp, generator, greedy)
        return self.tokens.gather(-1, j[..., None]).squeeze(-1)

    def draw(self, k: int, generator: torch.Generator | None, greedy: bool = False) -> torch.Tensor:
        """``k`` i.i.d. tokens per row (``[..., k]``); greedy: the ``k`` most likely, distinct.

        When fewer than ``k`` tokens have non-zero probability, greedy picks include
        zero-probability tokens; their ``logp_of`` is ``-inf``, so no verifier accepts them.
        A row narrower than ``k`` (greedy only) repeats its last pick: callers get ``k``.
        """
        j, _ = sample_with_replacement(self.logp, k, generator, greedy)
        if j.shape[-1] < k:
            j = torch.cat([j, j[..., -1:].expand(*j.shape[:-1], k - j.shape[-1])], dim=-1)
        return self.tokens.gather(-1, j)


_TOPK_DTYPES = (torch.float32, torch.bfloat16)


def warp_candidates(logits: torch.Tensor, warp: WarpConfig) -> Candidates:
    """:func:`warp_logprobs` as :class:`Candidates`: the same support and, up to the rounding
    of the normaliser (a sum over the kept values instead of a whole row), the same values.

    The sparse form applies on the CPU with top-k (unless ties at the k-th value overflow the
    candidate window); anything else returns the dense distribution.
    """
    w = warp.scoring()
    vocab = logits.shape[-1]
    if logits.device.type == "cpu" and 0 < w.top_k < vocab:
        # at T = 1 the top-k search runs on the logits as they are (bf16 -> fp32 is exact and
        # monotone: the same candidates); only the candidates are converted to float32
        x = logits if w.temperature == 1.0 and logits.dtype in _TOPK_DTYPES else logits.float()
        if w.temperature != 1.0:
            x = x / w.temperature
        flat = x.reshape(-1, vocab)
        found = top_k_top_p_candidates(flat, w.top_k, w.top_p, True)  # normalised
        if found is not None:
            idx, logp = found
            shape = (*logits.shape[:-1], idx.shape[-1])
            return Candidates(idx.reshape(shape), logp.reshape(shape), dense=False)
    return Candidates.from_logprobs(warp_logprobs(logits, warp))


def compact_candidates(
    logits: torch.Tensor, warp: WarpConfig, vocab_ids: torch.Tensor
) -> Candidates | None:
    """:func:`warp_candidates` of the full-width rows, from compact rows over ``vocab_ids``
    (ascending ids; every other token has probability zero: an FR-Spec draft head,
    :class:`mtad.engine.subvocab.SubVocabHead`), candidates named by vocabulary id.

    The same candidates as the full-width row's: top-k and top-p never keep a ``-inf`` entry
    while finite ones remain, and equal values order by id in both. None when the sparse form
    does not apply (the caller widens the rows and warps those)."""
    w = warp.scoring()
    if logits.device.type != "cpu" or not 0 < w.top_k < logits.shape[-1]:
        return None
    found = warp_candidates(logits, warp)
    if found.dense:
        return None
    return Candidates(vocab_ids.take(found.tokens), found.logp, dense=False)


def sample_from_logprobs(
    logprobs: torch.Tensor, generator: torch.Generator | None, greedy: bool = False
) -> torch.Tensor:
    """One token per row of ``logprobs`` (``[..., V]`` -> ``[...]``), by the Gumbel-max trick.

    ``argmax(log p + Gumbel)`` is an exact categorical sample and never picks a ``-inf`` entry
    while any finite one exists; with ``greedy`` it is plain argmax.
    """
    if greedy:
        return logprobs.argmax(dim=-1)
    if logprobs.dim() == 1:  # one row: the argmax among the support, no dense keys
        live = sparse_support(logprobs)
        if live is not None and live[0].numel():
            vals = logprobs[live].float()
            return live[0][(vals + gumbel_like(vals, generator)).argmax()]
    return perturb(logprobs, generator).argmax(dim=-1)


def sample_without_replacement(
    logscores: torch.Tensor, k: int, generator: torch.Generator | None, greedy: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw ``k`` distinct indices from the last dim of unnormalised ``logscores``.

    Gumbel-top-k (Kool, van Hoof & Welling, "Stochastic Beams and Where to Find Them", ICML
    2019): the top-k of ``logscores + Gumbel`` is a sample without replacement. Returns
    ``(indices, valid)`` where ``valid`` is False for picks whose score is ``-inf`` -- those only
    appear when fewer than ``k`` entries have non-zero probability, and callers must treat them as
    dead (``torch.multinomial`` would silently return such zero-probability indices instead).
    """
    idx, all_valid = gumbel_top_k(logscores, k, generator, greedy)
    if all_valid:
        return idx, torch.ones(idx.shape, dtype=torch.bool, device=logscores.device)
    return idx, torch.isfinite(logscores.gather(-1, idx))


def gumbel_top_k(
    logscores: torch.Tensor, k: int, generator: torch.Generator | None, greedy: bool = False
) -> tuple[torch.Tensor, bool]:
    """The indices of :func:`sample_without_replacement` (the same draws), and whether all
    of them are known to be valid (picked among finite entries) without looking: callers that
    read the picked scores anyway decide validity from those."""
    k = min(k, logscores.shape[-1])
    if not greedy and logscores.dim() == 1:
        live = sparse_support(logscores)
        if live is not None and live[0].numel() >= k:
            # Gumbel-top-k among the finite entries only (all picks are then valid)
            vals = logscores[live].float()
            top = torch.topk(vals + gumbel_like(vals, generator), k).indices
            return live[0][top], True
    keys = logscores if greedy else perturb(logscores, generator)
    return torch.topk(keys, k, dim=-1).indices, False


def sample_with_replacement(
    logscores: torch.Tensor, k: int, generator: torch.Generator | None, greedy: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw ``k`` i.i.d. indices (with replacement) from the last dim of ``logscores``.

    Greedy falls back to distinct top-k (repeating the argmax ``k`` times would only duplicate a
    beam). Returns ``(indices, valid)`` like :func:`sample_without_replacement`.
    """
    if greedy:
        return sample_without_replacement(logscores, k, generator, greedy=True)
    expanded = logscores.unsqueeze(-2).expand(*logscores.shape[:-1], k, logscores.shape[-1])
    idx = sample_from_logprobs(expanded, generator)
    valid = torch.isfinite(logscores.gather(-1, idx))
    return idx, valid
