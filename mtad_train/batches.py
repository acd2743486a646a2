"""The one micro-batcher of training and evaluation: sequences sorted by length and packed into
right-padded batches of at most ``micro_tokens`` cells (rows x the longest row)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

T = TypeVar("T")


def micro_batches(
    items: Iterable[T],
    micro_tokens: int,
    length: Callable[[T], int],
    order: Callable[[T], Any] | None = None,
) -> list[list[T]]:
    """``items`` sorted by ``order`` (default: ``length``; the sort is stable) and cut into
    batches whose padded size ``rows x length`` stays <= ``micro_tokens`` (a longer single item
    is a batch of its own)."""
    out, cur = [], []
    for it in sorted(items, key=order or length):
        if cur and (len(cur) + 1) * length(it) > micro_tokens:
            out.append(cur)
            cur = []
        cur.append(it)
    if cur:
        out.append(cur)
    return out
