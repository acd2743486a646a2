"""Disjointness check between the training pool and every evaluation prompt.

Text is normalised (lower case, runs of letters/digits/underscores kept as words, everything else
dropped) and compared as word n-grams: a pool item *overlaps* when it shares an exact normalised
prompt with an evaluation item, or any ``n``-gram (default 8). :func:`filter_pool` drops such
items; :func:`overlap_report` counts what remains (the report prints it: it must be zero).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

WORD = re.compile(r"[a-z0-9_]+")


def normalise(text: str) -> list[str]:
    return WORD.findall(text.lower())


def ngrams(words: list[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def eval_index(eval_texts: dict[str, list[str]], n: int = 8) -> tuple[dict, dict]:
    """(n-gram -> set name, normalised prompt -> set name) over every evaluation prompt."""
    grams: dict[tuple[str, ...], str] = {}
    exact: dict[str, str] = {}
    for name, texts in eval_texts.items():
        for t in texts:
            w = normalise(t)
            exact.setdefault(" ".join(w), name)
            for g in ngrams(w, n):
                grams.setdefault(g, name)
    return grams, exact


def overlaps(text: str, grams: dict, exact: dict, n: int = 8) -> list[str]:
    """Names of evaluation sets this text overlaps with (empty list = disjoint)."""
    w = normalise(text)
    hits = set()
    key = " ".join(w)
    if key in exact:
        hits.add(exact[key])
    for i in range(len(w) - n + 1):
        g = tuple(w[i : i + n])
        if g in grams:
            hits.add(grams[g])
    return sorted(hits)


def filter_pool(
    pool: list[dict], texts: Iterable[str], eval_texts: dict[str, list[str]], n: int = 8
) -> tuple[list[dict], dict[str, int]]:
    """Drop pool items overlapping any evaluation prompt; return (kept, dropped per set)."""
    grams, exact = eval_index(eval_texts, n)
    kept, dropped = [], {}
    for item, text in zip(pool, texts, strict=True):
        hits = overlaps(text, grams, exact, n)
        if hits:
            for h in hits:
                dropped[h] = dropped.get(h, 0) + 1
        else:
            kept.append(item)
    return kept, dropped


def overlap_report(texts: list[str], eval_texts: dict[str, list[str]], n: int = 8) -> dict:
    """Counts of pool texts sharing an n-gram / exact prompt with each evaluation set."""
    grams, exact = eval_index(eval_texts, n)
    per_set = {name: 0 for name in eval_texts}
    examples: list[tuple[str, str]] = []
    for t in texts:
        for h in overlaps(t, grams, exact, n):
            per_set[h] += 1
            if len(examples) < 5:
                examples.append((h, t[:120]))
    return {
        "n": n,
        "pool_items": len(texts),
        "eval_items": {k: len(v) for k, v in eval_texts.items()},
        "eval_ngrams": len(grams),
        "overlapping_items": per_set,
        "examples": examples,
        "disjoint": all(v == 0 for v in per_set.values()),
    }
