"""The teacher signal of the cumulative training, per committed sequence, and its local cache.

Every training step needs, for each of its sequences, the target's final normed state (or the
layers the head fuses) and its top-k next-token log-probabilities (:func:`teacher_sequence`).
Computing them was half of a step's time on one core (py-spy, 2026-12-04: 51% in the teacher
forward on the Intel Xeon, bf16). The committed sources are read for many epochs, so each
sequence's teacher signal is kept in a cache on this machine's disk (:class:`TeacherCache`) and
computed once per machine: a pure speed-up, rebuilt when absent, never committed; a second
process can fill it ahead of the training (``scripts/train_head.py teacher``,
:func:`fill_ahead`).

The signal is computed one sequence at a time, so it does not depend on which sequences share a
micro-batch (padded batches round differently): a cache hit gives the same bits as computing it
again, and a session resumed on a wiped disk trains on exactly what an uninterrupted one did.
A sequence alone costs ~8-10% more than in padded micro-batches (measured side by side on 8,192
positions, bf16, one thread), which the cache repays from the second epoch on.

Crash safety: a sequence's arrays are written and flushed before its ``done`` flag; a kill
between the two leaves the flag unset and the sequence is computed again.
"""

from __future__ import annotations

import hashlib
import json
import platform
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mtad.engine.features import FINAL_NORM_TAP, FeatureTap
from mtad.runs.atomic import write_atomic
from mtad_train.head_train import PAD_LOGP, bucketed, row_top_lse

# The layers a head reads unless it names others: the final normed state alone (EAGLE-1/2).
FINAL_ONLY: tuple[int, ...] = (FINAL_NORM_TAP,)


@dataclass
class TeacherSignal:
    """One sequence's teacher signal: ``feats`` ``[n, taps, d]`` bfloat16 (the head's tapped
    layers; tap -1 the target's final normed state), ``ids`` ``[n, k]`` and ``logp`` ``[n, k]``
    float16 (its top-k next tokens)."""

    feats: torch.Tensor
    ids: torch.Tensor
    logp: torch.Tensor


@torch.inference_mode()
def teacher_sequence(
    target: torch.nn.Module, seq: np.ndarray, topk: int, taps: Sequence[int] = FINAL_ONLY
) -> TeacherSignal:
    """The target over ``seq`` alone: the outputs of its layers ``taps`` (tap -1: the final
    normed state) and its top-k log-probabilities, rounded as stored shards round them
    (bfloat16 features, float16 log-probabilities)."""
    tokens = torch.from_numpy(seq.astype(np.int64))[None]
    tap = FeatureTap(target, taps) if tuple(taps) != FINAL_ONLY else None
    try:
        hidden = target.model(input_ids=tokens).last_hidden_state[0]  # normed
        feats = tap.take()[0] if tap is not None else hidden[:, None]
    finally:
        if tap is not None:
            tap.remove()
    # log-probabilities = logits - logsumexp, in cache-sized row chunks (row_top_lse)
    lse, top, ids, _ = row_top_lse(target.lm_head(hidden), topk)
    logp = top - lse[:, None]
    return TeacherSignal(feats.to(torch.bfloat16), ids, logp.to(torch.float16))


def assemble_batch(
    seqs: Sequence[np.ndarray],
    plens: Sequence[int],
    signals: Sequence[TeacherSignal],
    prompt_weight: float,
    pad_id: int = 0,
) -> dict[str, Any]:
    """The micro-batch :func:`mtad_train.head_train.step_loss` reads, as
    :func:`mtad_train.head_train.collate` builds it from stored shards: right-padded tokens,
    features ``[b, L, 1, d]`` (one "tap": the final normed state), top-k ids and
    log-probabilities, per-position loss weights (``prompt_weight`` on the prompt, 1 on the
    response, 0 on the last position and the padding) and the prompt's positions."""
    b, width = len(seqs), bucketed(max(len(s) for s in seqs))
    taps, d, k = *signals[0].feats.shape[-2:], signals[0].ids.shape[-1]
    tokens = torch.full((b, width), pad_id, dtype=torch.long)
    feats = torch.zeros(b, width, taps, d, dtype=torch.bfloat16)
    ids = torch.zeros(b, width, k, dtype=torch.long)
    logp = torch.full((b, width, k), PAD_LOGP)
    w = torch.zeros(b, width)
    prompt = torch.zeros(b, width, dtype=torch.bool)
    for r, (s, p, sig) in enumerate(zip(seqs, plens, signals, strict=True)):
        n = len(s)
        tokens[r, :n] = torch.from_numpy(s.astype(np.int64))
        feats[r, :n] = sig.feats
        ids[r, :n] = sig.ids
        logp[r, :n] = sig.logp.float()
        w[r, : max(p - 1, 0)] = prompt_weight
        prompt[r, : max(p - 1, 0)] = True
        w[r, max(p - 1, 0) : n - 1] = 1.0
    return {"tokens": tokens, "feats": feats, "ids": ids, "logp": logp, "w": w, "prompt": prompt}


def cache_key(
    target: torch.nn.Module,
    dtype: torch.dtype,
    topk: int,
    max_len: int,
    taps: Sequence[int] = FINAL_ONLY,
) -> str:
    """What decides a cached signal's bits: the target's weights (their size and config), its
    dtype, k, the cut length, the torch build and the CPU (kernels round differently), and the
    layers kept (named only when other than the final state alone, the key of the caches
    written before heads read other layers: those stay valid)."""
    from mtad.runs.hardware import cpu_model

    n_params = sum(p.numel() for p in target.parameters())
    facts = [
        target.config.to_json_string(use_diff=False),
        n_params,
        str(dtype),
        topk,
        max_len,
        torch.__version__,
        cpu_model(),
        platform.machine(),
    ]
    if tuple(taps) != FINAL_ONLY:
        facts.append([int(t) for t in taps])
    return hashlib.sha256(json.dumps(facts, default=str).encode()).hexdigest()[:16]


def file_digest(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


class FileCache:
    """The cached signals of one id file's sequences (cut at the cache's ``max_len``): three
    memory-mapped arrays of all positions end to end, and a flag per sequence."""

    def __init__(self, folder: Path, lengths: Sequence[int], d: int, k: int, taps: int = 1) -> None:
        self.lengths = [int(n) for n in lengths]
        self.starts = np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)
        total, n_seqs = int(self.starts[-1]), len(self.lengths)
        meta = {"lengths": hashlib.sha256(np.asarray(self.lengths).tobytes()).hexdigest(), "d": d}
        meta["k"] = k
        if taps != 1:  # one tap's files are laid out as before taps were kept (still valid)
            meta["taps"] = taps
        folder.mkdir(parents=True, exist_ok=True)
        fresh = not _same_meta(folder / "meta.json", meta)
        shapes = {
            "feats": ((total, taps, d), np.int16),  # bfloat16 bits
            "ids": ((total, k), np.int32),
            "logp": ((total, k), np.float16),
            "done": ((n_seqs,), np.uint8),
        }
        if fresh:  # sparse files: only what is written takes disk space
            for name, (shape, dt) in shapes.items():
                with open(folder / f"{name}.bin", "wb") as f:
                    f.truncate(int(np.prod(shape)) * np.dtype(dt).itemsize)
            write_atomic(folder / "meta.json", json.dumps(meta) + "\n")
        self.arrays = {
            name: np.memmap(folder / f"{name}.bin", dtype=dt, mode="r+", shape=shape)
            for name, (shape, dt) in shapes.items()
        }

    def get(self, i: int) -> TeacherSignal | None:
        if not self.arrays["done"][i]:
            return None
        a, b = int(self.starts[i]), int(self.starts[i + 1])
        feats = torch.from_numpy(np.array(self.arrays["feats"][a:b])).view(torch.bfloat16)
        ids = torch.from_numpy(self.arrays["ids"][a:b].astype(np.int64))
        logp = torch.from_numpy(np.array(self.arrays["logp"][a:b]))
        return TeacherSignal(feats, ids, logp)

    def put(self, i: int, sig: TeacherSignal) -> None:
        a, b = int(self.starts[i]), int(self.starts[i + 1])
        self.arrays["feats"][a:b] = sig.feats.view(torch.int16).numpy()
        self.arrays["ids"][a:b] = sig.ids.numpy()
        self.arrays["logp"][a:b] = sig.logp.numpy()
        for name in ("feats", "ids", "logp"):
            self.arrays[name].flush()
        self.arrays["done"][i] = 1
        self.arrays["done"].flush()

    def cached(self) -> int:
        return int(self.arrays["done"].sum())


def _same_meta(path: Path, meta: dict[str, Any]) -> bool:
    try:
        return json.loads(path.read_text()) == meta
    except (OSError, ValueError):
        return False


class TeacherCache:
    """Cached teacher signals under ``root/<key>/<file digest>/`` (:class:`FileCache`), for
    one target, dtype, k and cut length (:func:`cache_key`). ``root`` None: nothing is cached,
    every signal is computed."""

    def __init__(
        self,
        root: str | Path | None,
        target: torch.nn.Module,
        topk: int,
        max_len: int,
        taps: Sequence[int] = FINAL_ONLY,
    ) -> None:
        self.target, self.topk, self.max_len = target, topk, max_len
        self.taps = tuple(int(t) for t in taps)
        dtype = next(target.parameters()).dtype
        key = cache_key(target, dtype, topk, max_len, self.taps)
        self.root = Path(root) / key if root else None
        self.files: dict[str, FileCache] = {}
        self.hits = self.misses = 0

    def file(self, path: str, lengths: Sequence[int]) -> FileCache | None:
        if self.root is None:
            return None
        if path not in self.files:
            d = int(self.target.config.hidden_size)
            folder = self.root / file_digest(path)
            self.files[path] = FileCache(folder, lengths, d, self.topk, len(self.taps))
        return self.files[path]

    def ensure(self, file: FileCache, index: int, seq: np.ndarray) -> bool:
        """Compute and cache sequence ``index`` of ``file`` unless it is cached; True when it
        was computed now."""
        if file.arrays["done"][index]:
            return False
        file.put(index, teacher_sequence(self.target, seq, self.topk, self.taps))
        return True

    def signal(self, file: FileCache | None, index: int, seq: np.ndarray) -> TeacherSignal:
        """Sequence ``index`` of ``file`` (``seq``, already cut): from the cache, or computed
        now and cached."""
        sig = file.get(index) if file is not None else None
        if sig is not None:
            self.hits += 1
            return sig
        self.misses += 1
        sig = teacher_sequence(self.target, seq, self.topk, self.taps)
        if file is not None:
            file.put(index, sig)
        return sig


__all__ = [
    "FileCache",
    "TeacherCache",
    "TeacherSignal",
    "assemble_batch",
    "cache_key",
    "teacher_sequence",
]
