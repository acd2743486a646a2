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
    if top_k:
        kth = torch.topk(logits, warp.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, NEG_INF)
    if warp.top_p < 1.0:
        if top_k and logits.device.type == "cpu":
            drop = _top_p_drop_few(logits, warp.top_p)
        else:
            drop = _top_p_drop(logits, warp.top_p)
        logits = logits.masked_fill(drop, NEG_INF)
    return torch.log_softmax(logits, dim=-1)


def _top_p_drop(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Top-p drop mask by sorting the whole vocabulary.

    Drop a token when the mass *before* it already reaches ``top_p``: the most likely token
    always survives, and the kept set is the smallest one whose mass reaches ``top_p``.
    """
    sorted_logits, sorted_idx = torch.sort(logits, dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    drop_sorted = (probs.cumsum(dim=-1) - probs) >= top_p
    return drop_sorted.scatter(-1, sorted_idx, drop_sorted)


def _top_p_drop_few(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """:func:`_top_p_drop` for rows with few finite entries (after top-k), on the CPU.

    Sorting 49k-entry rows costs milliseconds on a CPU; only the finite entries matter, so
    ``topk`` sorts just those. The result is the same mask bit for bit: the sorted values and
    hence the cumulative sums are the same sequence; only the order *among equal values* may
    differ, which changes the kept set only when a group of equal values straddles the cut.
    Such rows (a few percent with bfloat16 logits) go through :func:`_top_p_drop` itself.
    One host read (the largest finite count) sizes ``topk``: free on a CPU, so the path is
    CPU-only.
    """
    shape = logits.shape
    flat = logits.reshape(-1, shape[-1])
    n = int(torch.isfinite(flat).sum(dim=-1).max())
    if n == 0:
        return torch.zeros(shape, dtype=torch.bool, device=logits.device)
    vals, idx = torch.topk(flat, n, dim=-1)
    probs = vals.softmax(dim=-1)
    drop_sub = (probs.cumsum(dim=-1) - probs) >= top_p
    drop = torch.ones_like(flat, dtype=torch.bool).scatter_(-1, idx, drop_sub)
    straddle = ((vals[:, 1:] == vals[:, :-1]) & (drop_sub[:, 1:] != drop_sub[:, :-1])).any(-1)
    if bool(straddle.any()):
        rows = straddle.nonzero().flatten()
        drop[rows] = _top_p_drop(flat[rows], top_p)
    return drop.reshape(shape)


def raw_logprobs(logits: torch.Tensor) -> torch.Tensor:
    """Unwarped log-probabilities (temperature 1, no truncation): what perplexity scores."""
    return torch.log_softmax(logits.float(), dim=-1)


def gumbel_like(x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Standard Gumbel noise shaped like ``x`` drawn from ``generator`` (no host sync).

    ``-log(-log U)`` with ``U`` uniform in ``[tiny, 1)``, so the noise is always finite. Built
    from ``uniform_`` rather than ``exponential_``: on CPUs where MKL's exponential generator
    takes its generic path (AMD) that costs ~3x more per 49k-entry row (bench/README.md).
    """
    u = torch.empty_like(x, dtype=torch.float32).uniform_(generator=generator)
    return u.clamp_(min=_TINY).log_().neg_().log_().neg_()


_TINY = torch.finfo(torch.float32).tiny


def sample_from_logprobs(
    logprobs: torch.Tensor, generator: torch.Generator | None, greedy: bool = False
) -> torch.Tensor:
    """One token per row of ``logprobs`` (``[..., V]`` -> ``[...]``), by the Gumbel-max trick.

    ``argmax(log p + Gumbel)`` is an exact categorical sample and never picks a ``-inf`` entry
    while any finite one exists; with ``greedy`` it is plain argmax.
    """
    if greedy:
        return logprobs.argmax(dim=-1)
    return (logprobs + gumbel_like(logprobs, generator)).argmax(dim=-1)


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
    keys = logscores if greedy else logscores + gumbel_like(logscores, generator)
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
