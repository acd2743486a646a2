"""Held-out quality of a feature-level head, at every draft depth, on committed responses.

Expected acceptance at depth ``k`` = mean over response positions of ``sum_v min(p_w(v), q_w(v))``
with both distributions warped as the authors warp (temperature 1, top-k 10, top-p 0.9, by
:func:`mtad.engine.warping.warp_logprobs`), where ``q`` is what the head gives at that position
after drafting ``k - 1`` positions on its own features (the target has verified up to ``k - 1``
positions before; the drafted tokens are the response's own): depth 1 reads only true features
and flatters; depths ``2..gamma`` are what MTAD's later block positions see. A chain starts no
earlier than the prompt's last token, as in decoding.

Both sides are exact from the stored teacher-forced shards (:mod:`mtad_train.features`): the
warped target keeps only its top ``top_k = 10`` tokens and renormalises over them, so warping the
stored top-20 log-probabilities gives ``p_w`` exactly; ``q_w`` warps the head's own (compact)
logits, and tokens outside the head's sub-vocabulary have ``q_w = 0``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mtad.engine.feature_head import FeatureHead
from mtad.engine.warping import warp_logprobs
from mtad_train import objectives as O
from mtad_train.head_report import ALL
from mtad_train.head_train import ShardData, collate, column_map, ref_batches
from mtad_train.unroll import unrolled


@dataclass
class SequenceAcceptance:
    """Held-out expected acceptance kept per response: the unit a resample draws, since the
    positions of one response are not independent of each other. ``sums[i, k]``: the summed
    acceptance over sequence ``i``'s positions scored at depth ``k + 1``, ``counts[i, k]``
    their number; ``keys[i]``: the sequence's index in the held-out ids (what pairs two heads'
    figures), ``kinds[i]`` its evaluation kind."""

    sums: np.ndarray  # [n, depths]
    counts: np.ndarray  # [n, depths]
    keys: list[int]
    kinds: list[str]

    @property
    def depths(self) -> int:
        return self.sums.shape[1]

    def rows(self, kind: str | None = None) -> np.ndarray:
        """Row mask of ``kind`` (all rows for ``None`` or ``"all"``)."""
        if kind in (None, ALL):
            return np.ones(len(self.keys), dtype=bool)
        return np.array([k == kind for k in self.kinds], dtype=bool)

    def table(self) -> dict[str, dict[str, float]]:
        """``{kind: {"d1": acc, ..., "positions": n, "prompts": m}}`` and ``all`` (pooled over
        positions: each kind's figure is its positions' mean)."""
        out: dict[str, dict[str, float]] = {}
        for kind in [*sorted(set(self.kinds)), ALL]:
            m = self.rows(kind)
            out[kind] = _row(self.sums[m].sum(0), self.counts[m].sum(0), int(m.sum()))
        return out

    def standard_error(self, depth: int, kind: str | None = None) -> float:
        """Standard error of the pooled figure at ``depth`` (1-based), sequences as clusters:
        the ratio estimator's linearised variance, ``sqrt(n / (n - 1) * sum((s_i - r c_i)^2))
        / sum(c_i)`` (Cochran, *Sampling Techniques*, 6.9)."""
        m = self.rows(kind)
        s, c = self.sums[m, depth - 1], self.counts[m, depth - 1]
        n, total = len(s), c.sum()
        if n < 2 or total == 0:
            return float("nan")
        r = s.sum() / total
        return float(np.sqrt(n / (n - 1) * ((s - r * c) ** 2).sum()) / total)


@dataclass
class PairedGain:
    """Head A's pooled figure minus head B's on the same held-out positions, with a bootstrap
    confidence interval over sequences resampled in pairs."""

    a: float
    b: float
    gain: float
    low: float
    high: float
    sequences: int
    confidence: float


def paired_gain(
    a: SequenceAcceptance,
    b: SequenceAcceptance,
    depth: int,
    kind: str | None = None,
    confidence: float = 0.95,
    n_resamples: int = 9999,
    seed: int = 0,
    method: str = "BCa",
) -> PairedGain:
    """A minus B at ``depth`` (1-based) over ``kind``'s sequences (all for ``None``): both
    evaluated on the same held-out responses, so each resample draws sequences with both heads'
    sums (``scipy.stats.bootstrap``, ``paired=True``); the statistic is the difference of the
    two position-pooled means, the figure :meth:`SequenceAcceptance.table` reports."""
    from mtad.runs.intervals import bootstrap_interval

    if a.keys != b.keys or not np.array_equal(a.counts, b.counts):
        raise ValueError("the two heads were not scored on the same held-out positions")
    m = a.rows(kind)
    sa, sb, c = a.sums[m, depth - 1], b.sums[m, depth - 1], a.counts[m, depth - 1]
    if c.sum() == 0:
        raise ValueError(f"no positions scored at depth {depth} for {kind or ALL}")

    def gain(x: np.ndarray, y: np.ndarray, n: np.ndarray, axis: int = -1) -> np.ndarray:
        return (x.sum(axis) - y.sum(axis)) / n.sum(axis)

    point = float(gain(sa, sb, c))
    low = high = float("nan")
    if len(c) >= 2:
        # BCa falls back to the percentile interval where it degenerates (e.g. a head against
        # itself: every resample gains exactly nothing)
        methods = ("BCa", "percentile") if method == "BCa" else (method,)
        low, high, _ = bootstrap_interval([sa, sb, c], gain, n_resamples, seed, confidence, methods)
    return PairedGain(
        a=float(sa.sum() / c.sum()),
        b=float(sb.sum() / c.sum()),
        gain=point,
        low=low,
        high=high,
        sequences=len(c),
        confidence=confidence,
    )


@torch.no_grad()
def depth_acceptance(
    head: FeatureHead,
    data: ShardData,
    kinds: list[str],
    depths: int,
    micro_tokens: int = 4096,
    autocast: bool = True,
) -> dict[str, dict[str, float]]:
    """``{kind: {"d1": acc, ..., "dK": acc, "positions": n, "prompts": m}}`` over the
    sequences of ``data`` (``kinds[i]``: the kind of the corpus sequence ``i``), and ``all``
    (position-weighted over every kind)."""
    return sequence_acceptance(head, data, kinds, depths, micro_tokens, autocast).table()


@torch.no_grad()
def sequence_acceptance(
    head: FeatureHead,
    data: ShardData,
    kinds: list[str],
    depths: int,
    micro_tokens: int = 4096,
    autocast: bool = True,
) -> SequenceAcceptance:
    """:func:`depth_acceptance`'s figures kept per sequence (:class:`SequenceAcceptance`)."""
    was_training = head.training
    head.eval()
    cols = column_map(head.vocab_ids, head.vocab_size)
    acc = _SequenceSums(data, kinds, depths)
    for refs_b in ref_batches(data.refs(), micro_tokens):
        b = collate(data, refs_b, 0.0)
        rows = acc.start(refs_b)
        plens = torch.tensor([int(data.shards[r.shard].plens[r.index]) for r in refs_b])
        L = b["tokens"].shape[1]
        pos = torch.arange(L)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            outs = unrolled(head, b["tokens"], head.fused(b["feats"]), depths)
        for k, a in enumerate(outs, start=1):
            # response positions whose chain starts at or after the prompt's last token
            sel = (b["w"] > 0) & (pos[None] - (k - 1) >= (plens[:, None] - 1))
            if not bool(sel.any()):
                continue
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                logits = head.logits(a[sel]).float()
            got = warped_acceptance(logits, b["ids"][sel], b["logp"][sel], cols)
            acc.add(rows, k, sel, got)
    if was_training:
        head.train()
    return acc.result()


class _SequenceSums:
    """Per-sequence sums and counts of a held-out pass, filled batch by batch."""

    def __init__(self, data: ShardData, kinds: list[str], depths: int) -> None:
        self.data, self.kinds, self.depths = data, kinds, depths
        self.keys: list[int] = []
        self.sums: list[np.ndarray] = []
        self.counts: list[np.ndarray] = []

    def start(self, refs_b) -> list[int]:
        """Rows for a batch's sequences (in the batch's order)."""
        first = len(self.keys)
        for r in refs_b:
            self.keys.append(int(self.data.shards[r.shard].seq_index[r.index]))
            self.sums.append(np.zeros(self.depths))
            self.counts.append(np.zeros(self.depths))
        return list(range(first, len(self.keys)))

    def add(self, rows: list[int], depth: int, sel: torch.Tensor, got: torch.Tensor) -> None:
        """Acceptance ``got`` of the positions ``sel`` ``[batch, L]`` at ``depth``."""
        row_of = sel.nonzero()[:, 0]
        per_row = torch.zeros(sel.shape[0], dtype=torch.float64).index_add_(0, row_of, got.double())
        n_row = torch.bincount(row_of, minlength=sel.shape[0])
        for i, row in enumerate(rows):
            self.sums[row][depth - 1] += float(per_row[i])
            self.counts[row][depth - 1] += int(n_row[i])

    def result(self) -> SequenceAcceptance:
        order = sorted(range(len(self.keys)), key=self.keys.__getitem__)
        return SequenceAcceptance(
            sums=np.array([self.sums[i] for i in order]).reshape(-1, self.depths),
            counts=np.array([self.counts[i] for i in order]).reshape(-1, self.depths),
            keys=[self.keys[i] for i in order],
            kinds=[self.kinds[self.keys[i]] for i in order],
        )


def _row(s: np.ndarray, c: np.ndarray, prompts: int) -> dict[str, float]:
    row = {f"d{k + 1}": float(s[k] / c[k]) if c[k] else float("nan") for k in range(len(s))}
    row["positions"] = int(c[0])
    row["prompts"] = prompts
    return row


def warped_acceptance(
    logits: torch.Tensor, t_ids: torch.Tensor, t_logp: torch.Tensor, cols: torch.Tensor | None
) -> torch.Tensor:
    """Per row ``sum_v min(p_w, q_w)``: ``p_w`` from the target's stored top-k (exact, see the
    module docstring), ``q_w`` from the head's compact ``logits``."""
    p_w = warp_logprobs(t_logp, O.AUTHORS_WARP).exp()  # [n, K] over t_ids
    q_w = warp_logprobs(logits, O.AUTHORS_WARP).exp()  # [n, V'] compact columns
    c = t_ids if cols is None else cols[t_ids]
    q_at = torch.where(c >= 0, q_w.gather(-1, c.clamp_min(0)), 0.0)
    return torch.minimum(p_w, q_at).sum(-1)


@torch.no_grad()
def model_draft_acceptance(
    draft: torch.nn.Module,
    data: ShardData,
    kinds: list[str],
    micro_tokens: int = 4096,
) -> dict[str, dict[str, float]]:
    """The same held-out figure for an independent draft model, on the same responses and
    positions as :func:`depth_acceptance`'s depth 1. A draft restricted to a sub-vocabulary
    (:func:`mtad.engine.subvocab.restrict_vocab`, as it decodes) already gives full-width
    logits, -inf off its sub-vocabulary. Teacher-forced on the response, a model draft's
    distribution at a position does not depend on how many positions it drafted before (it
    reads tokens, not features), so its acceptance is the same at every depth."""
    acc = _SequenceSums(data, kinds, 1)
    for refs_b in ref_batches(data.refs(), micro_tokens):
        b = collate(data, refs_b, 0.0)
        rows = acc.start(refs_b)
        logits = draft(input_ids=b["tokens"]).logits.float()
        sel = b["w"] > 0  # response positions (prompt weight 0), as depth 1 of the head
        acc.add(rows, 1, sel, warped_acceptance(logits[sel], b["ids"][sel], b["logp"][sel], None))
    return acc.result().table()
