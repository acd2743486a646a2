"""The ``data.npz`` layout of token sequences, read and written here only.

One file holds sequences of token ids (a prompt, then a response): ``tokens`` (uint16, every
sequence's ids end to end), ``lens`` (int32, each sequence's length), ``plens`` (int32, its
prompt's length) and ``kinds`` (its kind: ``humaneval``, ``chat``, ...), plus scalars a writer
adds (a distillation's ``gen_tokens`` and ``gen_tokens_greedy``, an evaluation set's seed and
warping). Distillations write it (``--save-data``), the corpus and evaluation-set commands of
``scripts/train_head.py`` write it; the teacher pass, the head's training, the draft vocabulary
(``scripts/draft_vocab.py``) and ``--data-in`` read it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mtad.runs.atomic import writing

LAYOUT = ("tokens", "lens", "plens", "kinds")


@dataclass
class Ids:
    """The sequences of one ``data.npz`` (each a uint16 view into the file's ``tokens``)."""

    seqs: list[np.ndarray]
    plens: list[int]
    kinds: list[str]
    extra: dict[str, Any] = field(default_factory=dict)  # the writer's other arrays

    def lists(self) -> list[list[int]]:
        """Every sequence as a list of Python ints."""
        return [s.tolist() for s in self.seqs]

    def responses(self) -> list[np.ndarray]:
        """Every sequence's response part (after its prompt), as int64."""
        return [s[p:].astype(np.int64) for s, p in zip(self.seqs, self.plens, strict=True)]


def read_ids(path: str | os.PathLike[str]) -> Ids:
    with np.load(path) as z:
        toks, lens = z["tokens"], z["lens"]
        starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
        seqs = [toks[s : s + int(n)] for s, n in zip(starts, lens, strict=True)]
        extra = {k: z[k] for k in z.files if k not in LAYOUT}
        return Ids(seqs, [int(p) for p in z["plens"]], [str(k) for k in z["kinds"]], extra)


def read_kinds(path: str | os.PathLike[str]) -> list[str]:
    """The kind of every sequence (without reading the tokens)."""
    with np.load(path) as z:
        return [str(k) for k in z["kinds"]]


def write_ids(
    path: str | os.PathLike[str],
    seqs: Sequence[Sequence[int]],
    plens: Sequence[int],
    kinds: Sequence[str],
    compress: bool = True,
    **extra: Any,
) -> None:
    """Sequences as uint16 ids in the ``data.npz`` layout (plus ``extra`` arrays), atomically."""
    path = Path(path)
    lens = np.array([len(x) for x in seqs], dtype=np.int32)
    toks = np.fromiter((t for x in seqs for t in x), dtype=np.uint16, count=int(lens.sum()))
    save = np.savez_compressed if compress else np.savez
    with writing(path) as f:
        save(
            f,
            tokens=toks,
            lens=lens,
            plens=np.array(plens, dtype=np.int32),
            kinds=np.array(kinds),
            **extra,
        )
