"""The teacher-forced pass of a feature-level head's training: the target's hidden states and
top-k next-token log-probabilities at every position of a token corpus, stored in shards.

One target forward per micro-batch of sequences (parallel over positions, no generation) gives,
per position ``t``:

* the outputs of the decoder layers in ``taps`` (low, middle and high, as EAGLE-3 fuses them; Li
  et al. 2025), bfloat16, ``[len(taps), hidden]``;
* the ``topk`` most likely next tokens and their raw (temperature 1) log-probabilities, the
  teacher of the loss (the authors' warping keeps at most ``top_k = 10`` of them).

Shards of about ``shard_tokens`` positions are written to a temporary folder and renamed into
place, so a killed pass loses at most the shard it was writing and the same command resumes
after the last complete one. Features are recomputed from the committed ids on every machine,
never committed (a million positions take ~3.5 GB).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from mtad.engine.features import FINAL_NORM_TAP, FeatureTap
from mtad.runs.atomic import writing

# Decoder-layer outputs the head reads, for SmolLM2-135M's 30 layers: low, middle, and the input
# of the last layer (EAGLE-3's choice of three depths; the last one lets the head start as a copy
# of the target's last layer, see mtad.engine.feature_head).
DEFAULT_TAPS = (2, 15, 28)
SHARD_FORMAT = 1
FINAL_FILE = "final.npy"


@dataclass
class Shard:
    """One stored shard: positions of whole sequences, concatenated."""

    folder: Path
    lens: np.ndarray  # [S] sequence lengths
    plens: np.ndarray  # [S] prompt lengths
    seq_index: np.ndarray  # [S] index of each sequence in the corpus
    tokens: np.ndarray  # [N] uint16
    feats: np.ndarray  # [N, taps, hidden] uint16 (bfloat16 bits), memory-mapped
    topk_ids: np.ndarray  # [N, K] uint16
    topk_logp: np.ndarray  # [N, K] float16
    final: np.ndarray | None = None  # [N, hidden] uint16 (bfloat16 bits): final normed state
    taps: tuple[int, ...] = DEFAULT_TAPS  # the layers of ``feats``, as the pass's meta.json names

    def tapped(self, start: int, end: int, taps: Sequence[int] | None) -> np.ndarray:
        """Positions ``start .. end - 1``'s features ``[n, len(taps), hidden]`` (bfloat16 bits)
        of the layers ``taps`` (tap -1: the final normed state), or all stored taps (None)."""
        if taps is None:
            return np.asarray(self.feats[start:end])
        cols = []
        for t in taps:
            if t == FINAL_NORM_TAP:
                if self.final is None:
                    raise ValueError(f"{self.folder}: no {FINAL_FILE} (train_head.py finals)")
                cols.append(np.asarray(self.final[start:end])[:, None])
            elif t in self.taps:
                cols.append(np.asarray(self.feats[start:end, self.taps.index(t)])[:, None])
            else:
                raise ValueError(f"{self.folder}: tap {t} not stored (taps {list(self.taps)})")
        return cols[0] if len(cols) == 1 else np.concatenate(cols, axis=1)

    @property
    def starts(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.lens)[:-1]]).astype(np.int64)


def load_shard(folder: Path, mmap: bool = True) -> Shard:
    z = np.load(folder / "index.npz")
    mode = "r" if mmap else None
    final = folder / FINAL_FILE
    meta = folder.parent / "meta.json"
    taps = json.loads(meta.read_text())["taps"] if meta.is_file() else DEFAULT_TAPS
    return Shard(
        folder,
        z["lens"],
        z["plens"],
        z["seq_index"],
        z["tokens"],
        np.load(folder / "feats.npy", mmap_mode=mode),
        np.load(folder / "topk_ids.npy", mmap_mode=mode),
        np.load(folder / "topk_logp.npy", mmap_mode=mode),
        np.load(final, mmap_mode=mode) if final.is_file() else None,
        tuple(int(t) for t in taps),
    )


def shard_plan(lens: Sequence[int], shard_tokens: int) -> list[tuple[int, int]]:
    """Consecutive ``(first, end)`` sequence ranges of about ``shard_tokens`` positions each."""
    plan, start, acc = [], 0, 0
    for i, n in enumerate(lens):
        acc += int(n)
        if acc >= shard_tokens:
            plan.append((start, i + 1))
            start, acc = i + 1, 0
    if start < len(lens):
        plan.append((start, len(lens)))
    return plan


def to_bf16_bits(x: torch.Tensor) -> np.ndarray:
    return x.to(torch.bfloat16).contiguous().view(torch.int16).numpy().view(np.uint16)


def from_bf16_bits(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)


@torch.inference_mode()
def teacher_pass(
    target: torch.nn.Module,
    seqs: Sequence[Sequence[int]],
    plens: Sequence[int],
    out_dir: str | os.PathLike[str],
    taps: Sequence[int] = DEFAULT_TAPS,
    topk: int = 20,
    shard_tokens: int = 65_536,
    micro_tokens: int = 4096,
    part: tuple[int, int] = (0, 1),
    progress: bool = True,
) -> list[Path]:
    """Write the shards of ``seqs`` under ``out_dir`` (``part = (i, n)``: only shards ``j`` with
    ``j % n == i``, so ``n`` processes share a pass); complete shards are skipped. Returns the
    folders of this part's shards."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"format": SHARD_FORMAT, "taps": list(taps), "topk": topk, "shard_tokens": shard_tokens}
    meta_path = out / "meta.json"
    if meta_path.exists():
        old = json.loads(meta_path.read_text())
        if old != meta:
            raise ValueError(f"{out}: written with {old}, asked for {meta}; use another folder")
    else:
        meta_path.write_text(json.dumps(meta))
    plan = shard_plan([len(s) for s in seqs], shard_tokens)
    mine = [(j, r) for j, r in enumerate(plan) if j % part[1] == part[0]]
    todo = [(j, r) for j, r in mine if not (out / f"shard{j:05d}").is_dir()]
    tap = FeatureTap(target, taps)
    pad = int(getattr(target.config, "pad_token_id", None) or 0)
    positions = sum(len(seqs[i]) for _, (a, b) in todo for i in range(a, b))
    bar = tqdm(
        total=positions,
        unit="tok",
        desc="teacher pass",
        dynamic_ncols=True,
        mininterval=10.0,
        disable=not progress,
    )
    try:
        for j, (a, b) in todo:
            _write_shard(
                target, tap, seqs, plens, a, b, out / f"shard{j:05d}", topk, micro_tokens, pad, bar
            )
    finally:
        tap.remove()
        bar.close()
    return [out / f"shard{j:05d}" for j, _ in mine]


def _write_shard(target, tap, seqs, plens, a, b, folder, topk, micro_tokens, pad, bar) -> None:
    lens = np.array([len(seqs[i]) for i in range(a, b)], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
    n, d = int(lens.sum()), None
    feats = ids_k = logp_k = final = None
    order = sorted(range(a, b), key=lambda i: len(seqs[i]))
    batches, cur = [], []
    for i in order:
        if cur and (len(cur) + 1) * len(seqs[i]) > micro_tokens:
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    for rows in batches:
        width = max(len(seqs[i]) for i in rows)
        x = torch.full((len(rows), width), pad, dtype=torch.long)
        for r, i in enumerate(rows):
            x[r, : len(seqs[i])] = torch.tensor(seqs[i])
        hidden = target.model(input_ids=x).last_hidden_state
        tapped = tap.take()
        logp = torch.log_softmax(target.lm_head(hidden).float(), dim=-1)
        vals, idx = logp.topk(topk, dim=-1)
        if feats is None:
            d = tapped.shape[-1]
            feats = np.empty((n, tapped.shape[-2], d), dtype=np.uint16)
            ids_k = np.empty((n, topk), dtype=np.uint16)
            logp_k = np.empty((n, topk), dtype=np.float16)
            final = np.empty((n, d), dtype=np.uint16)
        for r, i in enumerate(rows):
            s, m = int(starts[i - a]), len(seqs[i])
            feats[s : s + m] = to_bf16_bits(tapped[r, :m])
            final[s : s + m] = to_bf16_bits(hidden[r, :m])  # last_hidden_state is normed
            ids_k[s : s + m] = idx[r, :m].numpy().astype(np.uint16)
            logp_k[s : s + m] = vals[r, :m].numpy().astype(np.float16)
        bar.update(sum(len(seqs[i]) for i in rows))
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    np.save(tmp / "feats.npy", feats)
    np.save(tmp / "topk_ids.npy", ids_k)
    np.save(tmp / "topk_logp.npy", logp_k)
    np.save(tmp / FINAL_FILE, final)  # the same forward's; derive_final only for older shards
    tokens = np.fromiter((t for i in range(a, b) for t in seqs[i]), dtype=np.uint16, count=n)
    np.savez(
        tmp / "index.npz",
        lens=lens,
        plens=np.array([plens[i] for i in range(a, b)], dtype=np.int64),
        seq_index=np.arange(a, b, dtype=np.int64),
        tokens=tokens,
    )
    os.replace(tmp, folder)


@torch.inference_mode()
def derive_final(target: torch.nn.Module, folder: Path, micro_tokens: int = 8192) -> bool:
    """Add the target's final normed hidden state of every position to a shard whose taps hold
    the input of the last decoder layer: that layer (with its causal attention over the sequence
    and its rotary positions) and the final norm, run over the stored input -- 1/30 of the
    target's forward for SmolLM2 -- as ``final.npy``. The feature EAGLE-1/2 heads read and
    regress. Returns False when the shard has it already."""
    from mtad.engine.features import decoder_layers, final_norm

    if (folder / FINAL_FILE).is_file():
        return False
    meta = json.loads((folder.parent / "meta.json").read_text())
    layers = decoder_layers(target)
    last = len(layers) - 1
    if last - 1 not in meta["taps"]:
        raise ValueError(
            f"{folder}: taps {meta['taps']} lack layer {last - 1}, the last one's input"
        )
    j = meta["taps"].index(last - 1)
    sh = load_shard(folder)
    starts = sh.starts
    out = np.empty((int(sh.lens.sum()), sh.feats.shape[-1]), dtype=np.uint16)
    order = np.argsort(sh.lens, kind="stable")
    batches, cur = [], []
    for i in order:
        if cur and (len(cur) + 1) * int(sh.lens[i]) > micro_tokens:
            batches.append(cur)
            cur = []
        cur.append(int(i))
    if cur:
        batches.append(cur)
    dtype = next(target.parameters()).dtype
    norm = final_norm(target)
    rotary = target.model.rotary_emb
    for rows in batches:
        width = int(max(sh.lens[i] for i in rows))
        x = torch.zeros(len(rows), width, sh.feats.shape[-1], dtype=dtype)
        for r, i in enumerate(rows):
            s, n = int(starts[i]), int(sh.lens[i])
            x[r, :n] = from_bf16_bits(sh.feats[s : s + n, j]).to(dtype)
        pos = torch.arange(width)[None].expand(len(rows), -1)
        h = layers[last](x, position_embeddings=rotary(x, pos), position_ids=pos)
        h = norm(h[0] if isinstance(h, tuple) else h)
        for r, i in enumerate(rows):
            s, n = int(starts[i]), int(sh.lens[i])
            out[s : s + n] = to_bf16_bits(h[r, :n])
    with writing(folder / FINAL_FILE) as f:
        np.save(f, out)
    return True
