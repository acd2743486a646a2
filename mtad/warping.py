"""Logit warping and sampling helpers shared by every decoding method.

Small pure functions in the spirit of gpt-fast's ``logits_to_probs`` / ``sample``
(pytorch-labs/gpt-fast, ``generate.py``): every method warps the target and the draft the same
way, and sampling never forces a host sync.

Conventions
-----------
* Warped distributions are returned as **log-probabilities** with ``-inf`` outside the support
  left by top-k / top-p, so that ratios and joint scores are sums and zero-probability tokens are
  recognisable exactly (``isinf``), never confused with small probabilities.
* ``temperature == 0`` means greedy. Greedy choices are argmax / top-B; the *scores* used by
  methods that need probabilities in greedy mode (MTAD's beam weights and joint ratio) come from
  the same warping at temperature 1 (see :meth:`WarpConfig.scoring`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

NEG_INF = float("-inf")


@dataclass(frozen=True)
class WarpConfig:
    """Temperature / top-k / top-p applied identically to the target and the draft."""

    temperature: float = 1.0
    top_k: int = 0  # 0 disables top-k
    top_p: float = 1.0  # 1.0 disables top-p

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def scoring(self) -> WarpConfig:
        """The warping whose probabilities score tokens; temperature 1 stands in for greedy."""
        if self.greedy:
            return WarpConfig(temperature=1.0, top_k=self.top_k, top_p=self.top_p)
        return self


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
        masked = _top_k_top_p_cpu(logits, warp.top_k, warp.top_p)
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
    always survives, and the kept set is the smallest one whose mass reaches ``top_p``.
    """
    sorted_logits, sorted_idx = torch.sort(logits, dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    drop_sorted = (probs.cumsum(dim=-1) - probs) >= top_p
    return drop_sorted.scatter(-1, sorted_idx, drop_sorted)


_TIE_SLACK = 16  # extra top-k candidates that absorb ties at the k-th value


def _top_k_top_p_cpu(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor | None:
    """The top-k (+ top-p) masked logits of the generic path, bit for bit, in a few passes.

    Sorting and masking 49k-entry rows costs milliseconds per row on a CPU, while only the
    ``top_k`` survivors matter: one ``topk`` of ``top_k + slack`` candidates holds all of them,
    top-p runs on those candidates, and the survivors are written into a ``-inf`` row. The
    survivors' values, and so the result, equal the generic path's exactly: the k-th value is
    the same, the sorted candidate values (hence softmax and cumulative sums) are the same
    sequence, and only the order *among equal values* can differ -- which changes the top-p
    set only when a group of equal values straddles the cut. Those rows (a few percent with
    bfloat16 logits) take the generic path, and so does everything (``None``) when ties at the
    k-th value overflow the candidate window. The host reads are free on a CPU, hence CPU-only.
    """
    shape = logits.shape
    vocab = shape[-1]
    flat = logits.reshape(-1, vocab)
    found = _top_k_top_p_candidates(flat, top_k, top_p)
    if found is None:
        return None
    idx, top_k_vals, kept, straddle = found
    out = torch.full_like(flat, NEG_INF).scatter_(-1, idx, kept)
    if straddle is not None and bool(straddle.any()):
        m = idx.shape[-1]
        # The generic path's own sort, on the same top-k-masked rows, decides the order among
        # equal values; only the first m sorted entries can be finite.
        rows = straddle.nonzero().flatten()
        masked = torch.full((rows.numel(), vocab), NEG_INF, dtype=flat.dtype, device=flat.device)
        masked.scatter_(-1, idx[rows], top_k_vals[rows])
        sorted_vals, order = torch.sort(masked, dim=-1, descending=True)
        head, head_idx = sorted_vals[:, :m], order[:, :m]
        head_probs = head.softmax(dim=-1)
        head_drop = (head_probs.cumsum(dim=-1) - head_probs) >= top_p
        out[rows] = torch.full_like(masked, NEG_INF).scatter_(
            -1, head_idx, head.masked_fill(head_drop, NEG_INF)
        )
    return out.reshape(shape)


def gumbel_like(x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Standard Gumbel noise shaped like ``x`` drawn from ``generator`` (no host sync).

    ``-log(-log U)`` with ``U`` uniform in ``[tiny, 1)``, so the noise is always finite. Built
    from ``uniform_`` rather than ``exponential_``: on CPUs where MKL's exponential generator
    takes its generic path (AMD) that costs ~3x more per 49k-entry row (bench/README.md).
    """
    u = torch.empty_like(x, dtype=torch.float32).uniform_(generator=generator)
    return u.clamp_(min=_TINY).log_().neg_().log_().neg_()


_TINY = torch.finfo(torch.float32).tiny


def perturb(logscores: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """``logscores + Gumbel`` (float32), the keys of Gumbel-max / Gumbel-top-k sampling.

    ``-inf`` entries (outside the top-k / top-p support) stay ``-inf`` and need no noise. On
    the CPU, when the support is a small part of the row (a few dozen of 49k tokens after
    top-k), noise is drawn only for the support: per 49k-entry row that saves the uniform
    draws and two logarithms, the bulk of sampling time. The keys have the same
    distribution; the generator's stream is consumed differently (one draw per live entry).
    """
    live = _sparse_support(logscores)
    if live is None:
        return logscores + gumbel_like(logscores, generator)
    vals = logscores[live].float()
    keys = torch.full(logscores.shape, NEG_INF, dtype=torch.float32)
    keys[live] = vals + gumbel_like(vals, generator)
    return keys


def _top_k_top_p_candidates(flat: torch.Tensor, top_k: int, top_p: float) -> tuple | None:
    """Top-k (+ top-p) survivors of ``[rows, V]`` logits among ``top_k + slack`` candidates.

    Returns ``(idx, top_k_vals, kept, straddle)``: candidate ids (by descending value), their
    values with everything below the k-th at ``-inf``, the values after top-p too, and the
    rows where equal values straddle the top-p cut (``None`` without top-p), whose kept set
    depends on the order among equal values; ``None`` when ties at the k-th value overflow
    the candidate window.
    """
    vocab = flat.shape[-1]
    m = min(vocab, top_k + _TIE_SLACK)
    vals, idx = _topk_rows(flat, m, top_k)  # sorted, descending
    kth = vals[:, top_k - 1 : top_k]
    if m < vocab and bool((vals[:, -1:] >= kth).any()):
        return None
    top_k_vals = vals.masked_fill(vals < kth, NEG_INF)
    if top_p >= 1.0:
        return idx, top_k_vals, top_k_vals, None
    probs = top_k_vals.softmax(dim=-1)
    drop = (probs.cumsum(dim=-1) - probs) >= top_p
    tie = (vals[:, 1:] == vals[:, :-1]) & (drop[:, 1:] != drop[:, :-1])
    return idx, top_k_vals, top_k_vals.masked_fill(drop, NEG_INF), tie.any(dim=-1)


@dataclass(frozen=True)
class Candidates:
    """A warped next-token distribution per row as candidate tokens and their log-probabilities.

    ``logp[..., j]`` is the warped log-probability of token ``tokens[..., j]``; tokens that are
    not candidates have probability 0. Built by :func:`warp_candidates`: with top-k on the CPU
    only a few dozen candidates of a 49k vocabulary are kept, so beam scoring, sampling and
    lookups never touch vocabulary-wide rows; otherwise every token is a candidate (``dense``,
    ``tokens`` an expanded ``arange``: no copy).
    """

    tokens: torch.Tensor  # [..., m] int64
    logp: torch.Tensor  # [..., m] float32, -inf for candidates warping dropped
    dense: bool

    def __getitem__(self, rows: int | slice) -> Candidates:
        """Some rows (indexing the leading dimensions), e.g. ``c[k]`` or ``c[:g]``."""
        return Candidates(self.tokens[rows], self.logp[rows], self.dense)

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
    def stack(rows: list[Candidates], vocab: int) -> Candidates:
        """One-row distributions stacked into rows (dense if any row is, or widths differ)."""
        if all(not r.dense for r in rows) and len({r.logp.shape[-1] for r in rows}) == 1:
            return Candidates(
                torch.stack([r.tokens for r in rows]), torch.stack([r.logp for r in rows]), False
            )
        logp = torch.stack([r.to_dense(vocab) for r in rows])
        return Candidates(torch.arange(vocab, device=logp.device).expand(logp.shape), logp, True)

    def sample(self, generator: torch.Generator | None, greedy: bool = False) -> torch.Tensor:
        """One token per row (Gumbel-max over the candidates; argmax when ``greedy``)."""
        j = sample_from_logprobs(self.logp, generator, greedy)
        return self.tokens.gather(-1, j[..., None]).squeeze(-1)


def warp_candidates(logits: torch.Tensor, warp: WarpConfig) -> Candidates:
    """:func:`warp_logprobs` as :class:`Candidates`: the same support and, up to the rounding
    of the normaliser (a sum over the kept values instead of a whole row), the same values.

    The sparse form applies on the CPU with top-k and no tie straddling the top-p cut (the
    dense path settles those); anything else returns the dense distribution.
    """
    w = warp.scoring()
    vocab = logits.shape[-1]
    if logits.device.type == "cpu" and 0 < w.top_k < vocab:
        x = logits.float()
        if w.temperature != 1.0:
            x = x / w.temperature
        flat = x.reshape(-1, vocab)
        found = _top_k_top_p_candidates(flat, w.top_k, w.top_p)
        if found is not None:
            idx, _, kept, straddle = found
            if straddle is None or not bool(straddle.any()):
                logp = kept - torch.logsumexp(kept, dim=-1, keepdim=True)
                shape = (*logits.shape[:-1], idx.shape[-1])
                return Candidates(idx.reshape(shape), logp.reshape(shape), dense=False)
    logp = warp_logprobs(logits, warp)
    tokens = torch.arange(vocab, device=logits.device).expand(logp.shape)
    return Candidates(tokens, logp, dense=True)


def _sparse_support(logscores: torch.Tensor) -> tuple[torch.Tensor, ...] | None:
    """Indices (``nonzero(as_tuple=True)`` order) of the finite entries when they are few (at
    most 1/8 of all) and the tensor is on the CPU; ``None`` otherwise (dense noise is cheaper).

    Two levels: the max of every chunk of ``_CHUNK`` entries (one fast vectorised pass) finds
    the chunks holding a finite entry, and only those are searched -- a full ``nonzero`` over a
    49k-entry row is ~10x slower than the chunk maxima on a CPU.
    """
    if logscores.device.type != "cpu":
        return None
    numel = logscores.numel()
    if numel % _CHUNK or logscores.dim() == 0:
        live = (logscores > NEG_INF).nonzero(as_tuple=True)  # host read: free on a CPU
        return live if live[0].numel() * 8 <= numel else None
    chunks = logscores.reshape(-1, _CHUNK)
    active = (chunks.amax(dim=-1) > NEG_INF).nonzero().flatten()  # (NaN chunks count as dead)
    if active.numel() * _CHUNK > numel // 8:
        return None
    hit = (chunks[active] > NEG_INF).nonzero()
    flat = active[hit[:, 0]] * _CHUNK + hit[:, 1]
    if logscores.dim() == 1:
        return (flat,)
    return torch.unravel_index(flat, logscores.shape)


_CHUNK = 64


def _topk_rows(flat: torch.Tensor, m: int, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.topk(flat, m, dim=-1)`` as far as :func:`_top_k_top_p_cpu` reads it: every
    value >= the ``top_k``-th largest, with its index, in descending order, and whether the
    window of ``m`` is full of them. Found among the ``m`` chunks with the largest maxima: an
    element outside them is at most the m-th chunk maximum, which is below the k-th value
    unless ties reach it (then plain ``topk`` runs). ~2x faster than ``topk`` on 49k rows."""
    rows, vocab = flat.shape
    n_chunks = vocab // _CHUNK
    if vocab % _CHUNK or n_chunks < 4 * m:
        return torch.topk(flat, m, dim=-1)
    chunks = flat.view(rows, n_chunks, _CHUNK)
    cmax, cidx = torch.topk(chunks.amax(dim=-1), m, dim=-1)
    cand = chunks.gather(1, cidx[:, :, None].expand(rows, m, _CHUNK)).reshape(rows, m * _CHUNK)
    vals, pos = torch.topk(cand, m, dim=-1)
    if bool((cmax[:, -1:] >= vals[:, top_k - 1 : top_k]).any()) or bool(cmax.isnan().any()):
        return torch.topk(flat, m, dim=-1)
    return vals, cidx.gather(1, pos // _CHUNK) * _CHUNK + pos % _CHUNK


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
        live = _sparse_support(logprobs)
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
    k = min(k, logscores.shape[-1])
    if not greedy and logscores.dim() == 1:
        live = _sparse_support(logscores)
        if live is not None and live[0].numel() >= k:
            # Gumbel-top-k among the finite entries only (all picks are then valid)
            vals = logscores[live].float()
            top = torch.topk(vals + gumbel_like(vals, generator), k).indices
            return live[0][top], torch.ones(k, dtype=torch.bool, device=logscores.device)
    keys = logscores if greedy else perturb(logscores, generator)
    idx = torch.topk(keys, k, dim=-1).indices
    valid = torch.isfinite(logscores.gather(-1, idx))
    return idx, valid


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
