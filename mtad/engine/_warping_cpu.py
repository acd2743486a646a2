"""CPU fast paths of :mod:`mtad.engine.warping` (private: call the public functions there).

On a CPU, host reads are free and a 49k-entry row is expensive to sort, mask or fill with noise,
while top-k leaves a few dozen live tokens. These kernels find the top-k (+ top-p) survivors among
a small candidate window and the live entries of mostly ``-inf`` rows; each returns what the
generic path would (bit for bit where stated) or ``None`` when it cannot, and the caller then takes
the generic path.
"""

from __future__ import annotations

import array
import itertools
import math
import struct

import torch

from mtad.engine.kernels import KernelTable, cache_evictor, kernel_table

NEG_INF = float("-inf")
INF = float("inf")
_TIE_SLACK = 16  # extra top-k candidates that absorb ties at the k-th value
_CHUNK = 64
# Below this many entries noise for every entry beats finding the support. The rows the engine
# meets are either candidate rows (tens to hundreds of entries) or vocabulary rows (32k-150k),
# so any value in between makes the same choice on any CPU.
_SPARSE_MIN_NUMEL = 2048
# Up to this many top-k candidates in all (rows x window) their bookkeeping runs on the host
# (:func:`_host_top_k`); beyond, Python's per-value cost outgrows the tensor ops it saves.
_HOST_MAX = 1024


def top_k_top_p_masked(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor | None:
    """The top-k (+ top-p) masked logits of the generic path, bit for bit, in a few passes.

    Sorting and masking 49k-entry rows costs milliseconds per row on a CPU, while only the
    ``top_k`` survivors matter: one ``topk`` of ``top_k + slack`` candidates holds all of them,
    top-p runs on those candidates, and the survivors are written into a ``-inf`` row. The
    survivors' values, and so the result, equal the generic path's exactly: the k-th value is
    the same, and the candidates are put in the generic path's order (descending value, equal
    values by token id, :func:`mtad.engine.warping._top_p_drop`'s stable sort), so softmax,
    cumulative sums and the top-p cut are the same sequence -- also when equal values straddle
    the cut (frequent with bfloat16 logits). ``None`` (take the generic path) when ties at the
    k-th value overflow the candidate window. The host reads are free on a CPU, hence CPU-only.
    """
    shape = logits.shape
    vocab = shape[-1]
    flat = logits.reshape(-1, vocab)
    found = top_k_top_p_candidates(flat, top_k, top_p)
    if found is None:
        return None
    idx, kept = found
    # (kept holds the row's own values or -inf: exact in the row's dtype)
    return torch.full_like(flat, NEG_INF).scatter_(-1, idx, kept.to(flat.dtype)).reshape(shape)


def top_k_top_p_candidates(
    flat: torch.Tensor, top_k: int, top_p: float, normalise: bool = False
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Top-k (+ top-p) survivors of ``[rows, V]`` logits among ``top_k + slack`` candidates.

    Returns ``(idx, kept)``: candidate ids ordered by descending value, equal values by
    ascending id (the generic path's order), and their values after top-k and top-p
    (``-inf`` for candidates dropped); ``None`` when ties at the k-th value overflow the
    candidate window. ``normalise``: the values as log-probabilities over the survivors,
    ``kept - logsumexp(kept)`` (bit for bit; with the row maxima known finite, torch's
    logsumexp without its guard against infinite maxima).
    """
    vocab = flat.shape[-1]
    m = min(vocab, top_k + _TIE_SLACK)
    vals, idx = topk_rows(flat, m, top_k)  # sorted, descending
    if 0 < vals.numel() <= _HOST_MAX and vals.dtype in (torch.float32, torch.bfloat16):
        found = _host_top_k(vals, idx, top_k, m < vocab, top_p)
        if found is not False:
            if found is None:
                return None
            idx, kept, finite_max, top_p_done = found
            if not top_p_done:
                kept = _top_p(kept, top_p)
            if not normalise:
                return idx, kept
            if not finite_max:
                return idx, kept - torch.logsumexp(kept, dim=-1, keepdim=True)
            # the first candidate is the row's maximum (top-k and top-p always keep it)
            mx = kept[:, :1]
            return idx, kept - (kept - mx).exp_().sum(dim=-1, keepdim=True).log_().add_(mx)
    vals = vals.float()  # (bf16 rows: their top-k found in bf16, computed on in float32)
    kth = vals[:, top_k - 1 : top_k]
    if m < vocab and bool((vals[:, -1:] >= kth).any()):
        return None
    if bool((vals[:, 1:] == vals[:, :-1]).any()):  # equal values: order them by id
        idx, by_id = idx.sort(dim=-1)
        vals, by_val = vals.gather(-1, by_id).sort(dim=-1, descending=True, stable=True)
        idx = idx.gather(-1, by_val)
    kept = _top_p(vals.masked_fill(vals < kth, NEG_INF), top_p)
    if normalise:
        return idx, kept - torch.logsumexp(kept, dim=-1, keepdim=True)
    return idx, kept


def _top_p(top_k_vals: torch.Tensor, top_p: float) -> torch.Tensor:
    if top_p >= 1.0:
        return top_k_vals
    probs = top_k_vals.softmax(dim=-1)
    drop = (probs.cumsum(dim=-1) - probs) >= top_p
    return top_k_vals.masked_fill(drop, NEG_INF)


def _host_top_k(
    vals: torch.Tensor, idx: torch.Tensor, top_k: int, window: bool, top_p: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor, bool, bool] | None | bool:
    """The part of :func:`top_k_top_p_candidates` after ``topk``, on the host: the window
    check, the order of equal values by id and the top-k mask are comparisons and a
    permutation, exact in Python floats (every float32 or bfloat16 value is one), and top-p's
    cut is decided in float64 wherever float32 rounding cannot move it (below). They replace
    a dozen small tensor ops -- each of which costs several times more right after a forward
    than in a tight loop (its code and data evicted), the draft step's situation.

    Returns ``(idx, kept, finite_max, top_p_done)``: the tensor path's candidates and values
    bit for bit, after top-k and, when ``top_p_done``, top-p (else the caller applies
    :func:`_top_p`); ``finite_max``: every row's maximum (its first value) is finite.
    ``None``: the window overflows; ``False``: a NaN (the tensor path decides what it gives).

    Top-p: the tensor path drops candidate ``j`` when ``cumsum(p)_j - p_j >= top_p`` in
    float32 (softmax of float32 values, cumsum accumulated in double and rounded). That
    exclusive sum is within a few 1e-6 of its exact value for a few dozen candidates (each
    ``p`` within ~1e-6 relative plus 3e-8 absolute, the sum within ``m`` ulps), so where the
    float64 sum is more than :data:`_TOP_P_MARGIN` (scaled with ``m``) from ``float32(top_p)``,
    float32 decides the same; a row with a sum nearer the cut (e.g. equal values summing to
    exactly ``top_p``) leaves top-p to the tensor ops. Sorted rows keep a prefix."""
    rows = vals.tolist()
    k1 = top_k - 1
    reorder = False
    for r in rows:
        kth = r[k1]
        if kth != kth or r[0] != r[0] or r[-1] != r[-1]:  # NaN (rows are sorted: ends hold it)
            return False
        if window and r[-1] >= kth:
            return None
        if not reorder and len(set(r)) < len(r):  # equal values (adjacent: sorted)
            reorder = True
    if reorder:  # descending value, equal values by ascending id (the generic path's order)
        ids = idx.tolist()
        for i, (r, t) in enumerate(zip(rows, ids, strict=True)):
            if len(set(r)) < len(r):
                order = sorted(range(len(r)), key=lambda j, r=r, t=t: (-r[j], t[j]))
                rows[i] = [r[j] for j in order]
                ids[i] = [t[j] for j in order]
        idx = host_tensor(ids, torch.long)
    finite_max = all(-INF < r[0] < INF for r in rows)
    keep = [_top_k_len(r, r[k1]) for r in rows]  # top-k keeps a prefix of a sorted row
    top_p_done = top_p >= 1.0
    if not top_p_done and finite_max:
        cut = _top_p_lens(rows, keep, top_p)
        if cut is not None:
            keep, top_p_done = cut, True
    m = len(rows[0])
    kept = [r[:n] + [NEG_INF] * (m - n) for r, n in zip(rows, keep, strict=True)]
    return idx, host_tensor(kept, torch.float32), finite_max, top_p_done


_TYPECODES = {torch.float32: "f", torch.long: "q"}


def host_tensor(rows: list, dtype: torch.dtype) -> torch.Tensor:
    """``torch.tensor(rows, dtype=dtype)`` for a list of equal-length lists (or a flat list)
    of Python floats / ints, through a typed array (~4x faster: no per-element type checks;
    float32 values convert exactly). The tensor owns the array (``torch.frombuffer``)."""
    if not rows:
        return torch.tensor(rows, dtype=dtype)
    if not isinstance(rows[0], list):
        return torch.frombuffer(array.array(_TYPECODES[dtype], rows), dtype=dtype)
    flat = array.array(_TYPECODES[dtype], itertools.chain.from_iterable(rows))
    if not flat:
        return torch.tensor(rows, dtype=dtype)
    return torch.frombuffer(flat, dtype=dtype).view(len(rows), -1)


def _top_k_len(r: list[float], kth: float) -> int:
    n = len(r)
    while n and not r[n - 1] >= kth:
        n -= 1
    return n


_TOP_P_MARGIN = 2e-5  # per 32 candidates (see _host_top_k); at least 16x the error bound


def _top_p_lens(rows: list[list[float]], keep: list[int], top_p: float) -> list[int] | None:
    """Per row, how many of its ``keep`` top-k values top-p keeps, decided in float64; None
    when some exclusive sum lies within the margin of the cut (float32 might decide
    otherwise)."""
    threshold = _f32(top_p)  # the tensor path compares float32 sums with float32(top_p)
    margin = _TOP_P_MARGIN * max(1.0, len(rows[0]) / 32)
    out = []
    for r, n in zip(rows, keep, strict=True):
        mx = r[0]
        e = [math.exp(x - mx) for x in r[:n]]
        total = math.fsum(e)
        before, j = 0.0, 0
        while j < n:
            c = before / total  # the exclusive sum of candidate j
            if abs(c - threshold) <= margin:
                return None
            if c >= threshold:
                break
            before += e[j]
            j += 1
        out.append(j)
    return out


def _f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def sparse_support(logscores: torch.Tensor) -> tuple[torch.Tensor, ...] | None:
    """Indices (``nonzero(as_tuple=True)`` order) of the finite entries when they are few (at
    most 1/8 of all) and the tensor is on the CPU; ``None`` otherwise (dense noise is cheaper).
    Small tensors -- sparse candidates, a few dozen entries per row -- are ``None`` at once:
    finding their support costs more small ops than noise for all of them.

    Two levels: the max of every chunk of ``_CHUNK`` entries (one fast vectorised pass) finds
    the chunks holding a finite entry, and only those are searched -- a full ``nonzero`` over a
    49k-entry row is ~10x slower than the chunk maxima on a CPU.
    """
    numel = logscores.numel()
    if logscores.device.type != "cpu" or numel < _SPARSE_MIN_NUMEL:
        return None
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


def topk_rows(flat: torch.Tensor, m: int, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.topk(flat, m, dim=-1)`` as far as :func:`top_k_top_p_candidates` reads it: every
    value >= the ``top_k``-th largest, with its index, in descending order, and whether the
    window of ``m`` is full of them.

    Two kernels, the faster one measured for each shape on this machine
    (:class:`~mtad.engine.kernels.KernelTable`, key ``topk_rows``): plain ``topk``, or
    ``chunked``: the top ``m`` among the ``m`` chunks of ``_CHUNK`` entries with the largest
    maxima. An element outside those chunks is at most the m-th chunk maximum, which is below
    the k-th value unless ties reach it (then plain ``topk`` runs). The chunk maxima are one
    vectorised pass, and ``chunked`` is ~1.5-2x faster than ``topk`` on 49k-entry rows in a
    tight loop; but it is a dozen small ops, and right after a forward (caches cold: the weights
    streamed through them) each costs several times more, so on the AMD EPYC measured plain
    ``topk`` won there by 2x. Hence timed with the caches evicted
    (:func:`~mtad.engine.kernels.cache_evictor`).
    """
    rows, vocab = flat.shape
    if vocab % _CHUNK or vocab // _CHUNK < 4 * m:
        return torch.topk(flat, m, dim=-1)
    key = (rows, vocab, m, top_k, flat.dtype, torch.get_num_threads())
    kernel = _topk_kernel.get(key)
    if kernel is None:
        kernel = _topk_kernel[key] = _measure_topk(rows, vocab, m, top_k, flat.dtype)
    if kernel == "topk":
        return torch.topk(flat, m, dim=-1)
    return _topk_chunked(flat, m, top_k)


_topk_kernel: dict[tuple, str] = {}  # this process's choices (the table's file is the cache)


def _measure_topk(rows: int, vocab: int, m: int, top_k: int, dtype: torch.dtype) -> str:
    table, key = kernel_table(), KernelTable.key("topk_rows", dtype, rows, vocab, m, top_k)
    # a cached choice needs neither the random rows nor the evictor's buffer (twice the
    # last-level cache, tens of MB to allocate): both only when measuring
    if (known := table.known(key, ("chunked", "topk"))) is not None:
        return known
    x = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(0)).to(dtype)
    return table.choose(
        key,
        {
            "chunked": lambda: _topk_chunked(x, m, top_k),
            "topk": lambda: torch.topk(x, m, dim=-1),
        },
        before=cache_evictor(),  # warping follows a forward: timed with cold caches
    )


def _topk_chunked(flat: torch.Tensor, m: int, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    rows, vocab = flat.shape
    n_chunks = vocab // _CHUNK
    chunks = flat.view(rows, n_chunks, _CHUNK)
    cmax, cidx = torch.topk(chunks.amax(dim=-1), m, dim=-1)
    cand = chunks.gather(1, cidx[:, :, None].expand(rows, m, _CHUNK)).reshape(rows, m * _CHUNK)
    vals, pos = torch.topk(cand, m, dim=-1)
    if bool((cmax[:, -1:] >= vals[:, top_k - 1 : top_k]).any()) or bool(cmax.isnan().any()):
        return torch.topk(flat, m, dim=-1)
    return vals, cidx.gather(1, pos // _CHUNK) * _CHUNK + pos % _CHUNK
