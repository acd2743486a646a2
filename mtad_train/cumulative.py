"""Cumulative training of a feature-level head across sessions and machine resets.

The committed head folder is the state of record: its weights (bfloat16, ``model.safetensors``),
``training/state.json`` (the data cursor, the positions and steps trained so far, the sessions)
and ``training/curve.jsonl`` (one held-out row per export, cumulative positions on the x axis).
Nothing training needs lives only on a machine's disk:

* **teacher signal on the fly**: every step runs the target over its sequences (bfloat16 where
  the CPU has it natively, :func:`mtad.cpu.choose_dtype`) and takes the final normed state and
  the top-k next-token log-probabilities there, the same quantities the stored shards of
  :mod:`mtad_train.features` hold, so :func:`mtad_train.head_train.step_loss` trains on it
  unchanged; each sequence's signal is kept in a local cache (:mod:`mtad_train.teacher`, under
  ``ckpt_dir``), which a second process may fill ahead of the training (:func:`fill_ahead`);
* **the data**: committed uint16 id files (:class:`Source`), each with a weight and its own
  seeded permutation per epoch; the cursor says, per source, which epoch and how far, and a
  step draws from the source furthest behind its share, so a source added later joins at its
  weight without disturbing the others' order;
* **a local checkpoint** (fp32 weights, the optimiser, the cursor) under ``ckpt_dir`` every few
  minutes is a pure speed-up: resumed when it descends from the committed export, ignored
  otherwise (a wiped disk resumes from the committed folder with a fresh optimiser warm-up);
* the held-out features (:mod:`mtad_train.head_eval`'s input) are a cache, rebuilt by a
  teacher pass over the committed held-out ids when absent.

The learning rate is constant after a warm-up (no schedule that restarts per session, so
sessions add up) until an optional cooldown over the session's last seconds
(``cooldown_s``: the next session warms up again from the weights it exported, as a
warmup-stable-decay schedule's branches do); the held-out curve is the judge of every change.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import math
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from mtad.engine.feature_head import FeatureHead, HeadSpec
from mtad.engine.features import FINAL_NORM_TAP
from mtad.engine.spec import HEAD_FILE_SUFFIXES
from mtad.engine.subvocab import VOCAB_FILE
from mtad.runs.atomic import append_line_atomic, write_atomic
from mtad_train.head_train import (
    CKPT_FILE,
    HeadTrainConfig,
    SeqRef,
    column_map,
    make_optimizer,
    optimiser_step,
    ref_batches,
    save_checkpoint,
)
from mtad_train.ids import read_ids
from mtad_train.teacher import TeacherCache, TeacherSignal, assemble_batch

TRAINING_DIR = "training"
STATE_FILE = "state.json"
CURVE_FILE = "curve.jsonl"
WEIGHTS_FILE = "model.safetensors"
TEACHER_DIR = "teacher"  # under ckpt_dir: the teacher cache
CURSOR_FILE = "cursor.json"  # under ckpt_dir: the running session's cursor, every step
# under ckpt_dir, optional: the torch threads from the next step on (one integer), so a session
# hands the training the other core when that core is free and takes it back (2 threads: 1.70x
# a step of one on the Intel Xeon, bf16, the teacher cached; .dev scratch timing, notes.md)
THREADS_FILE = "threads"
NEXT_WEIGHTS_FILE = "model.next.safetensors"  # an export's weights until its state is written
TRAINED = "trained"  # the curve's name for the trained weights (beside the averages' labels)


@dataclass
class CumulativeConfig:
    """What a cumulative session trains with (read once at the command line)."""

    head: str = "assets/drafts/smollm2-head"  # the committed head folder (state of record)
    # PATH=WEIGHT: committed ids (a file, or a folder of shards); weight = share of positions.
    # The target's own responses alone since 2026-12-06 (step 9679): against 2:1:3 with
    # data.npz and corpus.npz +0.0028 [+0.0020, +0.0036] at depth 1, against 1:1:6 +0.0006
    # [+0.0000, +0.0012] (250-step A/Bs, assets/drafts/smollm2-head/notes.md)
    sources: list[str] = field(default_factory=lambda: ["assets/drafts/smollm2-head/onpolicy=1"])
    eval_data: str = "assets/evalsets/smollm2-heldout.npz"
    eval_features: str = ".dev/head/features/heldout"  # cache, rebuilt when absent (float32)
    ckpt_dir: str = ".dev/head/cumulative"
    depths: int = 3  # draft depths trained (training-time test), all positions scored
    depth_decay: float = 0.8  # depth k weighted depth_decay ** (k - 1), as EAGLE-3
    eval_depths: int = 4
    lr: float = 1e-3
    warmup_steps: int = 10  # when the optimiser starts afresh (no local checkpoint to resume)
    tokens_per_step: int = 8192
    micro_tokens: int = 2048
    max_len: int = 1024  # longer sequences are cut (teacher and head alike)
    # the warped overlap (the acceptance itself) weighted up against the KL since 2026-12-06:
    # overlap 1.0 against 0.3 (KL 0.3) +0.0023 [+0.0018, +0.0031] / +0.0035 [+0.0030, +0.0043]
    # at depths 1 / 4 (from step 12099), then KL 0.1 against 0.3 +0.0010 [+0.0002, +0.0018] /
    # +0.0032 [+0.0024, +0.0041] (from step 12349), then KL 0.03 against 0.1 +0.0002 [-0.0003,
    # +0.0008] / +0.0021 [+0.0014, +0.0028] (from step 12599; 250-step A/Bs, notes.md)
    kl_weight: float = 0.03
    overlap_weight: float = 1.0
    # no regression on the target's final state since 2026-12-06 (step 11122), as EAGLE-3 (Li
    # et al. 2025) drops it: weight 0.1 against 1.0 +0.0011 [+0.0007, +0.0014] / +0.0023
    # [+0.0018, +0.0028] at depths 1 / 4, then 0 against 0.1 +0.0001 / +0.0003 (250-step A/Bs)
    reg_weight: float = 0.0
    feature_rms: float = 2.0
    prompt_weight: float = 0.1
    # prompt positions (46% of the on-policy ones) scored at rate prompt_weight, weight 1
    # (HeadTrainConfig.prompt_sampled) since 2026-12-06 (step 13047): 1.17x a step on the
    # Intel Xeon, and at equal steps against every prompt position at 0.1 +0.0001 [-0.0001,
    # +0.0003] / -0.0000 [-0.0002, +0.0002] at depths 1 / 4 (200-step A/B, notes.md)
    prompt_sampled: bool = True
    teacher_dtype: str = "auto"  # auto: bfloat16 on a CPU with native bfloat16, else float32
    topk: int = 20
    seed: int = 0
    threads: int = 1  # torch threads until <ckpt_dir>/threads says otherwise (THREADS_FILE)
    time_budget_s: float = 0.0  # stop (and export) after this many seconds; 0: never
    max_steps: int = 0  # stop after this many steps in this session; 0: never
    ckpt_every_s: float = 300.0  # local checkpoint; 0: only with an export
    # the weights exported are exponential moving averages of the trained ones (Polyak
    # averaging), one per decay per step; an export scores each on the held-out responses and
    # exports the best (pooled over kinds, mean over depths); none: the trained weights. Under
    # the constant rate the trained weights stayed at ~0.552 (mean over depths) from 89.9M to
    # 98.0M positions while the averages rose, the slower one faster (0.98: 0.571 -> 0.576,
    # 0.995: 0.575 -> 0.583): hence a third, slower one since 2026-12-06 (curve.jsonl). At
    # 113.55M (depth 1, pooled) the trained weights 0.597, the averages 0.621 / 0.630 / 0.635
    # (0.98 / 0.995 / 0.999), the slowest ahead at every export since 106.82M: hence 0.9997
    # (from step 13793, started from the 0.999 average), and 0.98 dropped. At 122.32M the two
    # slow ones are even (0.9997: 0.636 / 0.605 / 0.588 / 0.574, 0.999: 0.635 / 0.606 / 0.589 /
    # 0.575 at depths 1-4)
    ema_decays: list[float] = field(default_factory=lambda: [0.995, 0.999, 0.9997])
    export_every_s: float = 1800.0  # export + curve row; 0: only when the session stops
    # the last cooldown_s seconds of time_budget_s take the learning rate down to 0 (1 - sqrt
    # of the cooldown's progress: Hagele et al. 2024, "Scaling Laws and Compute-Optimal
    # Training Beyond Fixed Training Durations"; EMA alone did not match a cooldown there);
    # the end's export then scores the cooled weights beside the averages. 0: constant rate
    cooldown_s: float = 0.0
    # keep each sequence's teacher signal under <ckpt_dir>/teacher (a speed-up: computed once
    # per machine instead of once per epoch; mtad_train.teacher)
    teacher_cache: bool = True

    def __post_init__(self) -> None:
        if not all(0.0 <= d < 1.0 for d in self.ema_decays):
            raise ValueError(f"ema_decays must be in [0, 1), got {self.ema_decays!r}")
        if len(set(self.ema_decays)) != len(self.ema_decays):
            raise ValueError(f"ema_decays must differ, got {self.ema_decays!r}")
        if self.cooldown_s < 0 or (self.cooldown_s and not self.time_budget_s):
            raise ValueError("cooldown_s needs a time_budget_s to end at (and must be >= 0)")

    # what a session records of its recipe (state.json's sessions): the data and the objective,
    # so every curve point names what trained it (the objective changed between sessions)
    RECIPE_FIELDS: ClassVar[tuple[str, ...]] = (
        "sources",
        "depths",
        "depth_decay",
        "lr",
        "tokens_per_step",
        "max_len",
        "kl_weight",
        "overlap_weight",
        "reg_weight",
        "feature_rms",
        "prompt_weight",
        "prompt_sampled",
        "topk",
        "ema_decays",
        "cooldown_s",
    )

    def recipe(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.RECIPE_FIELDS}

    def train_config(self, autocast: bool) -> HeadTrainConfig:
        return HeadTrainConfig(
            depths=self.depths,
            depth_weights=[self.depth_decay**k for k in range(self.depths)],
            lr=self.lr,
            warmup_steps=self.warmup_steps,
            tokens_per_step=self.tokens_per_step,
            micro_tokens=self.micro_tokens,
            prompt_weight=self.prompt_weight,
            prompt_sampled=self.prompt_sampled,
            overlap_weight=self.overlap_weight,
            kl_weight=self.kl_weight,
            reg_weight=self.reg_weight,
            feature_rms=self.feature_rms,
            deep_fraction=1.0,
            seed=self.seed,
            autocast=autocast,
        )


@dataclass
class TeacherAheadConfig(CumulativeConfig):
    """Fill the cumulative training's teacher cache ahead of it, in a second process (same
    options as ``cumulative``: the same sources, cut length, k and teacher dtype)."""

    ahead_steps: int = 300  # how many steps ahead of the training's cursor to go


# --- the data stream -------------------------------------------------------------------------
@dataclass
class Source:
    """Committed ids in the ``data.npz`` layout (tokens, lens, plens): one file, or a folder of
    shards that grows (:mod:`mtad_train.respond`'s ``manifest.json`` lists them), re-read at
    the start of each of its epochs so a running session trains on shards written meanwhile.

    A folder's spec may take a range of its shards in the manifest's order, Python's slice
    without a step: ``onpolicy[:55]=1`` and ``onpolicy[55:]=1`` draw the first 55 shards and
    those written after them as two sources, each at its own weight (fresher shards drawn
    more often than old ones: tried 2026-12-06, shards 0055-0061 at half of every step did not
    beat the one folder source on the held-out curve; notes.md)."""

    path: str  # the spec's path with its shard range: the source's name
    weight: float
    seqs: list[np.ndarray]
    plens: list[int]
    max_len: int = 1024
    folder: bool = False  # a folder of shards (a path without a suffix: it may not exist yet)
    files: list[str] = field(default_factory=list)  # the files read
    # where each sequence comes from: (index into ``files``, index in that file), and each
    # file's sequence lengths as cut (a teacher cache is kept per file)
    origins: list[tuple[int, int]] = field(default_factory=list)
    file_lengths: list[list[int]] = field(default_factory=list)
    _orders: dict[tuple[int, int, int], np.ndarray] = field(default_factory=dict, repr=False)
    # a folder's shards drawn, by position in its manifest (all of them unless the spec says)
    shards: slice = field(default_factory=lambda: slice(None))

    @classmethod
    def load(cls, spec: str, max_len: int) -> Source:
        path, _, w = spec.partition("=")
        root, shards = _shard_range(path)
        folder = Path(root).is_dir() or not Path(root).suffix
        if shards != slice(None) and not folder:
            raise ValueError(f"source {spec!r}: a shard range needs a folder of shards")
        src = cls(path, float(w or 1.0), [], [], max_len, folder, shards=shards)
        if folder:
            src.refresh()
        else:
            src._add(path)
        return src

    @property
    def root(self) -> str:
        """The file or folder read (the path without its shard range)."""
        return _shard_range(self.path)[0]

    def _add(self, file: str | Path) -> None:
        ids = read_ids(file)
        seqs = [s[: self.max_len] for s in ids.seqs]
        self.origins += [(len(self.files), i) for i in range(len(seqs))]
        self.file_lengths.append([len(s) for s in seqs])
        self.seqs += seqs
        self.plens += ids.plens
        self.files.append(str(file))

    def refresh(self) -> None:
        """A folder source: read the shards its manifest lists that are not read yet."""
        from mtad_train.respond import shard_paths

        if self.folder:
            for f in shard_paths(self.root)[self.shards][len(self.files) :]:
                self._add(f)

    @property
    def name(self) -> str:
        return self.path

    def order(self, seed: int, epoch: int, size: int) -> np.ndarray:
        """The epoch's permutation of the first ``size`` sequences (those there when it began)."""
        key = (seed, epoch, size)
        if key not in self._orders:  # one permutation per epoch, drawn from many times
            rng = np.random.default_rng([seed, epoch, _stable_int(self.path)])
            self._orders = {key: rng.permutation(size)}
        return self._orders[key]


SHARD_RANGE = re.compile(r"(?P<root>.+)\[(?P<lo>\d*):(?P<hi>\d*)\]")


def _shard_range(path: str) -> tuple[str, slice]:
    """``folder[a:b]`` -> (``folder``, ``slice(a, b)``); any other path -> (path, all)."""
    m = SHARD_RANGE.fullmatch(path)
    if not m:
        return path, slice(None)
    lo, hi = (int(x) if x else None for x in (m["lo"], m["hi"]))
    return m["root"], slice(lo, hi)


def _stable_int(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little")


@dataclass
class SourceCursor:
    epoch: int = 0
    next: int = 0  # index into the epoch's permutation
    positions: int = 0  # positions drawn from this source so far (all sessions)
    size: int = 0  # sequences in this epoch's permutation (0: the source's size, fixed at start)
    # a source that joins later starts at the others' level (positions per unit of weight)
    # rather than at zero, so it is drawn at its weight from then on instead of exclusively
    # until it has caught up
    offset: float = 0.0
    # the weight this source was last drawn at (0: not recorded, a cursor from before): when a
    # session changes the weights, every source is rebased to one level (:func:`_reweigh`)
    weight: float = 0.0

    def level(self, weight: float) -> float:
        return (self.positions + self.offset) / weight


def _reweigh(sources: Sequence[Source], cursor: dict[str, SourceCursor], live: list[int]) -> None:
    """When a source's weight differs from the one its cursor was drawn at, or the live
    sources' levels (positions per unit of weight) lie further apart than one draw can put
    them, put every live source at the same level, so the shares hold from this step on:
    without it a source whose weight grew would be drawn alone until its level caught up with
    the others' (at 33M positions, tens of millions of positions later). The second test
    catches what the first cannot see: a cursor written before weights were recorded (weight
    0), whose session changed the weights (2026-12-06: 1:1:6 after 2:1:3 drew the on-policy
    source alone). Drawing keeps the levels within one sequence of each other (the lowest is
    drawn next), so with the weights unchanged it moves nothing. Records the weights drawn at."""
    curs = [(sources[i], cursor[sources[i].name]) for i in live]
    levels = [c.level(s.weight) for s, c in curs]
    one_draw = max(s.max_len / s.weight for s, _ in curs)
    changed = any(c.weight and c.weight != s.weight for s, c in curs)
    if changed or max(levels) - min(levels) > one_draw:
        top = max(levels)
        for s, c in curs:
            c.offset = top * s.weight - c.positions
    for s, c in curs:
        c.weight = s.weight


def draw_step(
    sources: Sequence[Source], cursor: dict[str, SourceCursor], tokens: int, seed: int
) -> list[tuple[int, int]]:
    """``(source index, sequence index)`` pairs of about ``tokens`` positions; advances
    ``cursor``. Each sequence comes from the source whose positions drawn per unit of weight
    are fewest (deterministic given the cursor and the shards on disk); a source without
    sequences (a folder with no shard yet) is skipped and looked at again next step."""
    for s in sources:
        if not s.seqs:
            s.refresh()
    live = [i for i, s in enumerate(sources) if s.seqs]
    if not live:
        raise ValueError(f"no sequences in any source: {[s.path for s in sources]}")
    known = [
        cursor[sources[i].name].level(sources[i].weight) for i in live if sources[i].name in cursor
    ]
    for i in live:
        if sources[i].name not in cursor:
            cursor[sources[i].name] = SourceCursor(
                offset=min(known, default=0.0) * sources[i].weight
            )
    _reweigh(sources, cursor, live)
    picked, acc = [], 0
    while acc < tokens:
        si = min(live, key=lambda i: (cursor[sources[i].name].level(sources[i].weight), i))
        src, cur = sources[si], cursor[sources[si].name]
        if cur.next == 0:
            src.refresh()
            cur.size = len(src.seqs)
        size = min(cur.size or len(src.seqs), len(src.seqs))
        j = int(src.order(seed, cur.epoch, size)[cur.next])
        cur.next += 1
        if cur.next >= size:
            cur.epoch, cur.next, cur.size = cur.epoch + 1, 0, 0
        n = len(src.seqs[j])
        cur.positions += n
        acc += n
        picked.append((si, j))
    return picked


# --- the state of record -----------------------------------------------------------------------
@dataclass
class CumulativeState:
    steps: int = 0
    positions: int = 0  # depth-1 weighted positions trained on, all sessions
    seconds: float = 0.0  # training wall seconds, all sessions
    cursor: dict[str, SourceCursor] = field(default_factory=dict)
    export: str = ""  # id of the last export (the weights' sha256 prefix)
    sessions: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CumulativeState:
        d = dict(d)
        d["cursor"] = {k: SourceCursor(**v) for k, v in d.get("cursor", {}).items()}
        return cls(**d)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def read_state(head_dir: Path) -> CumulativeState:
    path = head_dir / TRAINING_DIR / STATE_FILE
    if not path.is_file():
        return CumulativeState()
    return CumulativeState.from_json(json.loads(path.read_text()))


def export_head(head: FeatureHead, head_dir: Path, state: CumulativeState) -> None:
    """Write the head in bfloat16 (half the bytes; the fp32 master lives in the local
    checkpoint) and its state, so that a kill or a full disk at any point leaves either the
    previous export or this one, never a mix. The new weights go beside the old ones
    (:data:`NEXT_WEIGHTS_FILE`); the state naming them by hash is the commit point; then they
    are moved into place (:func:`settle_export`, which the next session's start repeats when
    the move was cut short)."""
    from safetensors.torch import save

    tensors = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in head.state_dict().items()}
    blob = save(tensors)
    write_atomic(head_dir / TRAINING_DIR / NEXT_WEIGHTS_FILE, blob)
    state.export = _digest(blob)
    write_atomic(head_dir / TRAINING_DIR / STATE_FILE, json.dumps(state.to_json(), indent=1) + "\n")
    settle_export(head_dir)


def _digest(blob: bytes) -> str:
    return hashlib.sha256(blob).hexdigest()[:16]


def settle_export(head_dir: Path) -> None:
    """Finish an export cut short: the state names the new weights (it was written), so they
    replace the old; weights the state does not name (the cut came before the state) are
    dropped. Then ``head_config.json`` is brought to the state's step and positions."""
    state = read_state(head_dir)
    pending = head_dir / TRAINING_DIR / NEXT_WEIGHTS_FILE
    if pending.is_file():
        if state.export and _digest(pending.read_bytes()) == state.export:
            os.replace(pending, head_dir / WEIGHTS_FILE)
        else:
            pending.unlink()
    cfg_path = head_dir / "head_config.json"
    if cfg_path.is_file() and state.steps:
        cfg = json.loads(cfg_path.read_text())
        if (cfg.get("trained_positions"), cfg.get("step")) != (state.positions, state.steps):
            cfg.update(trained_positions=state.positions, step=state.steps)
            write_atomic(cfg_path, json.dumps(cfg, indent=2) + "\n")


def append_curve(head_dir: Path, row: dict[str, Any]) -> None:
    append_line_atomic(head_dir / TRAINING_DIR / CURVE_FILE, json.dumps(row))


def load_head_weights(head: FeatureHead, head_dir: Path) -> None:
    """The committed weights into ``head`` (kept in its own dtype, float32 for training)."""
    from safetensors.torch import load_file

    state = load_file(str(head_dir / WEIGHTS_FILE))
    missing, unexpected = head.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.startswith("rotary_emb")]
    if missing or unexpected:
        raise ValueError(f"{head_dir}: missing {missing}, unexpected {unexpected}")


# --- the loop ----------------------------------------------------------------------------------
def lr_at(cfg: CumulativeConfig, warmup: int, step_in_session: int, elapsed_s: float) -> float:
    """A linear warmup over ``warmup`` steps, then ``cfg.lr``, then over the budget's last
    ``cfg.cooldown_s`` seconds down to 0 as ``1 - sqrt(progress)``."""
    lr = cfg.lr * min(1.0, (step_in_session + 1) / max(1, warmup))
    if cfg.cooldown_s and cfg.time_budget_s:
        progress = (elapsed_s - (cfg.time_budget_s - cfg.cooldown_s)) / cfg.cooldown_s
        lr *= 1.0 - math.sqrt(min(1.0, max(0.0, progress)))
    return lr


def _load_local(folder: Path, committed: CumulativeState):
    """The local checkpoint when it descends from the committed export (it went on training
    from it, or it is the run that wrote it), else None."""
    path = folder / CKPT_FILE
    if not path.is_file():
        return None
    ck = torch.load(path, map_location="cpu", weights_only=False)
    local = CumulativeState.from_json(ck["state"])
    lineage = {s.get("export_at_start") for s in local.sessions} | {local.export}
    if local.steps < committed.steps or (committed.export and committed.export not in lineage):
        return None
    return ck, local


def run_session(
    cfg: CumulativeConfig,
    head: FeatureHead,
    target: torch.nn.Module,
    sources: Sequence[Source],
    evaluate: Callable[[FeatureHead], dict[str, Any]] | None = None,
    host: dict[str, Any] | None = None,
    log: Callable[[str], None] = print,
    autocast: bool = False,
) -> CumulativeState:
    """Train ``head`` (float32, built for ``target``) from the committed state in ``cfg.head``
    (or the local checkpoint that descends from it) until the time budget or ``max_steps``;
    export to ``cfg.head`` every ``export_every_s`` and at the end, with a curve row."""
    head_dir, ckpt, tcfg = Path(cfg.head), Path(cfg.ckpt_dir), cfg.train_config(autocast)
    head.train()
    opt = make_optimizer(head, tcfg)
    state, saved = _resume(head, opt, head_dir, ckpt, log)
    averages = weight_averages(head, cfg, saved)
    # a fresh optimiser warms up; one whose moments came back with the local checkpoint goes on
    # at full rate, so a session resumed after a crash continues the uninterrupted run exactly
    warmup = 0 if opt.state else cfg.warmup_steps
    session = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "export_at_start": state.export,
        "steps_at_start": state.steps,
        "positions_at_start": state.positions,
        **(host or {}),
        "recipe": cfg.recipe(),
    }
    state.sessions.append(session)
    cols = column_map(head.vocab_ids, head.vocab_size)
    teacher = TeacherCache(
        ckpt / TEACHER_DIR if cfg.teacher_cache else None,
        target,
        cfg.topk,
        cfg.max_len,
        head.spec.taps,
    )
    started = last_ckpt = last_export = time.monotonic()
    steps_here = 0
    stop_asked = stop_on_term(log)
    while True:
        threads = requested_threads(ckpt)
        if threads and threads != torch.get_num_threads():
            log(f"{threads} torch threads from step {state.steps + 1} ({ckpt / THREADS_FILE})")
            torch.set_num_threads(threads)
        t0 = time.perf_counter()
        lr = lr_at(cfg, warmup, steps_here, time.monotonic() - started)
        batches = _next_batches(cfg, teacher, sources, state)
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + state.steps)
        sums, positions = optimiser_step(head, opt, tcfg, batches, cols, lr, gen)
        for average in averages:
            average.update(head)
        state.steps += 1
        steps_here += 1
        state.positions += positions
        state.seconds += time.perf_counter() - t0
        write_cursor(ckpt, state)
        if steps_here % 10 == 0 or steps_here <= 3:
            _log_step(log, state, time.perf_counter() - t0, lr, sums, teacher)
        now = time.monotonic()
        stop = (
            stop_asked()
            or (cfg.max_steps and steps_here >= cfg.max_steps)
            or (cfg.time_budget_s and now - started >= cfg.time_budget_s)
        )
        if stop or (cfg.export_every_s and now - last_export >= cfg.export_every_s):
            session.update(steps_at_end=state.steps, positions_at_end=state.positions)
            _export(head, head_dir, state, session["started"], host, evaluate, log, averages)
            save_checkpoint(ckpt, head, opt, state, _extra(averages))
            last_export = last_ckpt = time.monotonic()
        elif cfg.ckpt_every_s and now - last_ckpt >= cfg.ckpt_every_s:
            save_checkpoint(ckpt, head, opt, state, _extra(averages))
            last_ckpt = now
        if stop:
            head.eval()
            return state


def _log_step(log, state: CumulativeState, dt: float, lr: float, sums, teacher) -> None:
    ov = (sums["overlap"] / np.maximum(sums["w"], 1e-9)).round(3).tolist()
    log(
        f"step {state.steps} pos {state.positions} {dt:.1f}s/step lr {lr:.1e} "
        f"train overlap by depth {ov}; teacher cache {teacher.hits} hits, "
        f"{teacher.misses} computed"
    )


def write_cursor(ckpt: Path, state: CumulativeState) -> None:
    """The running session's step and cursor, for a process filling the teacher cache ahead
    (:func:`fill_ahead`); not a resume point (the checkpoint and the export are)."""
    cursor = {k: asdict(v) for k, v in state.cursor.items()}
    write_atomic(ckpt / CURSOR_FILE, json.dumps({"steps": state.steps, "cursor": cursor}))


def requested_threads(ckpt: Path) -> int | None:
    """The torch threads ``<ckpt>/threads`` asks for (:data:`THREADS_FILE`); None when the file
    is absent or holds anything but a positive integer (the training goes on as it was)."""
    try:
        n = int((ckpt / THREADS_FILE).read_text().strip())
    except (OSError, ValueError):
        return None
    return n if n > 0 else None


def stop_on_term(log: Callable[[str], None]) -> Callable[[], bool]:
    """SIGTERM / SIGINT end the session after the current step, with an export (a kill -9
    loses the steps since the last export, nothing else)."""
    import signal
    import threading

    asked = threading.Event()
    if threading.current_thread() is threading.main_thread():

        def on_signal(signum, _frame) -> None:
            log(f"signal {signum}: stopping after this step, with an export")
            asked.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, on_signal)
    return asked.is_set


def _next_batches(
    cfg: CumulativeConfig, teacher: TeacherCache, sources: Sequence[Source], state: CumulativeState
) -> list[dict[str, Any]]:
    """The next step's sequences (advancing the cursor) in micro-batches, with the target's
    teacher signal (cached, or computed now)."""
    picked = draw_step(sources, state.cursor, cfg.tokens_per_step, cfg.seed)
    refs = [SeqRef(si, j, len(sources[si].seqs[j])) for si, j in picked]
    pad = int(getattr(teacher.target.config, "pad_token_id", None) or 0)
    batches = []
    for mb in ref_batches(refs, cfg.micro_tokens):
        seqs = [sources[r.shard].seqs[r.index] for r in mb]
        plens = [
            min(sources[r.shard].plens[r.index], len(s)) for r, s in zip(mb, seqs, strict=True)
        ]
        signals = [sequence_signal(teacher, sources[r.shard], r.index) for r in mb]
        batches.append(assemble_batch(seqs, plens, signals, cfg.prompt_weight, pad))
    return batches


def sequence_signal(teacher: TeacherCache, source: Source, j: int) -> TeacherSignal:
    """The teacher signal of ``source``'s sequence ``j``, through the cache of its file."""
    fi, i = source.origins[j]
    file = teacher.file(source.files[fi], source.file_lengths[fi])
    return teacher.signal(file, i, source.seqs[j])


def read_cursor(ckpt: Path, head_dir: Path) -> CumulativeState:
    """The running session's cursor (:func:`write_cursor`), else the committed one."""
    try:
        d = json.loads((ckpt / CURSOR_FILE).read_text())
    except (OSError, ValueError):
        return read_state(head_dir)
    return CumulativeState.from_json({"steps": d["steps"], "cursor": d["cursor"]})


def fill_ahead(
    cfg: CumulativeConfig,
    teacher: TeacherCache,
    sources: Sequence[Source],
    ahead_steps: int,
    stop: Callable[[], bool],
    log: Callable[[str], None] = print,
    poll_s: float = 10.0,
) -> None:
    """Fill the teacher cache with the sequences the training draws next: the steps after the
    running session's cursor are drawn here as :func:`draw_step` will draw them there (the draw
    is deterministic given the cursor), up to ``ahead_steps`` ahead; when the training passes
    this process it starts again from the training's cursor. The training computes whatever
    is missing itself, so this is a speed-up only, and may stop at any time."""
    ckpt, head_dir = Path(cfg.ckpt_dir), Path(cfg.head)
    while not stop():
        state = read_cursor(ckpt, head_dir)
        computed, k = 0, 0
        for k in range(ahead_steps):
            for si, j in draw_step(sources, state.cursor, cfg.tokens_per_step, cfg.seed):
                fi, i = sources[si].origins[j]
                file = teacher.file(sources[si].files[fi], sources[si].file_lengths[fi])
                computed += teacher.ensure(file, i, sources[si].seqs[j]) if file else 0
            if stop() or read_cursor(ckpt, head_dir).steps > state.steps + k:
                break  # the training reached this step: go on from where it is
        log(f"teacher ahead: {computed} sequences computed, {k + 1} steps after step {state.steps}")
        if computed == 0:
            time.sleep(poll_s)


def weight_averages(
    head: FeatureHead, cfg: CumulativeConfig, saved: dict[str, Any] | None
) -> list[WeightAverage]:
    """The moving averages a session keeps, one per ``cfg.ema_decays``, each resumed from the
    local checkpoint's average of its decay; one missing there (a decay added since) starts
    from the saved average of the nearest decay, else from the weights the session starts from."""
    saved = saved or {}
    averages = []
    for decay in cfg.ema_decays:  # the nearest saved decay: its own when it was saved
        nearest = min(saved, key=lambda k: abs(WeightAverage.decay_of(k) - decay), default=None)
        averages.append(WeightAverage(head, decay, saved.get(nearest)))
    return averages


def _extra(averages: Sequence[WeightAverage]) -> dict[str, Any] | None:
    return {a.label: a.avg for a in averages} or None


def _resume(
    head: FeatureHead, opt, head_dir: Path, ckpt: Path, log
) -> tuple[CumulativeState, dict[str, dict[str, torch.Tensor]] | None]:
    """The state to go on from and the weight averages (by key): the local checkpoint's when it
    descends from the committed export (weights, optimiser and averages loaded), else the
    committed state and weights (the averages start from them)."""
    settle_export(head_dir)
    committed = read_state(head_dir)
    resumed = _load_local(ckpt, committed)
    if resumed is not None:
        ck, state = resumed
        head.load_state_dict(ck["head"])
        opt.load_state_dict(ck["opt"])
        log(f"resumed the local checkpoint: step {state.steps}, {state.positions} positions")
        averages = {k: v for k, v in ck.items() if WeightAverage.is_key(k) and v is not None}
        return state, averages
    if (head_dir / WEIGHTS_FILE).is_file():
        load_head_weights(head, head_dir)
    log(f"resumed the committed head: step {committed.steps}, {committed.positions} positions")
    return committed, None


def _export(
    head,
    head_dir: Path,
    state: CumulativeState,
    started: str,
    host,
    evaluate,
    log,
    averages: Sequence[WeightAverage] = (),
):
    """The head and its state into the committed folder, and a curve row. With ``evaluate``
    and weight averages, the trained weights (``heldout_trained``) and each average
    (``heldout_averages``) are scored on the held-out responses and the best (pooled over
    kinds, mean over depths) is exported: an average under a constant rate, the trained
    weights where a cooldown beat them; the row names it (``weights``) and holds its score
    (``heldout``). Without ``evaluate`` the first average is exported."""
    row: dict[str, Any] = {
        "steps": state.steps,
        "positions": state.positions,
        "seconds": round(state.seconds, 1),
        "session": started,
        **(host or {}),
    }
    scored: dict[str, Any] = {}
    if averages and evaluate is not None:
        row["heldout_trained"] = scored[TRAINED] = evaluate(head)
        log("held-out, trained weights " + _short(row["heldout_trained"]))
        for a in averages:
            with a.swapped_in(head):
                scored[a.label] = evaluate(head)
            log(f"held-out, {a.label} " + _short(scored[a.label]))
        if len(averages) > 1:
            row["heldout_averages"] = {a.label: scored[a.label] for a in averages}
    by_label = {a.label: a for a in averages}
    if scored:  # the best scored: an average, or the trained weights after a cooldown
        row["weights"] = max(scored, key=lambda label: _pooled(scored[label]))
    else:
        row["weights"] = averages[0].label if averages else TRAINED
    chosen = by_label.get(row["weights"])
    with chosen.swapped_in(head) if chosen is not None else contextlib.nullcontext():
        export_head(head, head_dir, state)
        if evaluate is not None:
            row["heldout"] = scored.get(row["weights"]) or evaluate(head)
            log(f"held-out ({row['weights']}, exported) " + _short(row["heldout"]))
    head.train()
    append_curve(head_dir, row)


def _pooled(heldout: dict[str, Any]) -> float:
    """Held-out acceptance pooled over kinds (``all``), mean over the depths scored."""
    pooled = heldout.get("all", next(iter(heldout.values())))
    values = [v for k, v in pooled.items() if k.startswith("d")]
    return sum(values) / len(values)


class WeightAverage:
    """An exponential moving average of the head's trainable weights (Polyak averaging), in
    float32. The learning rate is constant (a session's cooldown aside), so the trained
    weights jitter around where the data leads (two exports two steps apart differed by 0.01
    in held-out acceptance at every depth); their average is close to what an annealed
    schedule would give, with no schedule to restart per session."""

    KEY_PREFIX = "ema "  # a key of the local checkpoint, and the average's name in the curve

    def __init__(
        self, head: FeatureHead, decay: float, avg: dict[str, torch.Tensor] | None = None
    ) -> None:
        self.decay = decay
        self.label = self.key_of(decay)
        params = dict(head.named_parameters())
        self.names = [n for n, p in params.items() if p.requires_grad]
        fresh = {n: params[n].detach().float().clone() for n in self.names}
        self.avg = {n: avg[n].float().clone() for n in self.names} if avg else fresh

    @classmethod
    def key_of(cls, decay: float) -> str:
        return f"{cls.KEY_PREFIX}{decay}"

    @classmethod
    def is_key(cls, key: str) -> bool:
        return key.startswith(cls.KEY_PREFIX)

    @classmethod
    def decay_of(cls, key: str) -> float:
        return float(key.removeprefix(cls.KEY_PREFIX))

    @torch.no_grad()
    def update(self, head: FeatureHead) -> None:
        params = dict(head.named_parameters())
        for n in self.names:
            self.avg[n].lerp_(params[n].detach().float(), 1.0 - self.decay)

    @contextlib.contextmanager
    def swapped_in(self, head: FeatureHead) -> Iterator[None]:
        """``head`` holds the average inside the block, its trained weights again after."""
        params = dict(head.named_parameters())
        trained = {n: params[n].detach().clone() for n in self.names}
        with torch.no_grad():
            for n in self.names:
                params[n].copy_(self.avg[n])
        try:
            yield
        finally:
            with torch.no_grad():
                for n in self.names:
                    params[n].copy_(trained[n])


def _short(heldout: dict[str, Any]) -> str:
    return json.dumps(
        {k: [round(v[d], 3) for d in sorted(v) if d.startswith("d")] for k, v in heldout.items()}
    )


def head_for_training(target_fp32: torch.nn.Module, head_dir: Path) -> FeatureHead:
    """A float32 head of the committed folder's layout and sub-vocabulary over a float32 copy of
    the target's embeddings and logits rows (decoding on a float32 host uses those), weights
    loaded by :func:`run_session`."""
    from mtad.engine.subvocab import read_vocab

    spec = head_spec(head_dir)
    ids = read_vocab(head_dir)
    vocab = torch.tensor(sorted(ids)) if ids else None
    embed = copy.deepcopy(target_fp32.get_input_embeddings()).requires_grad_(False)
    weight = target_fp32.get_output_embeddings().weight.detach().clone()
    head = FeatureHead(target_fp32.config, spec, embed, weight, vocab).to(torch.float32)
    return head


def head_spec(head_dir: Path) -> HeadSpec:
    """The layout of the committed head in ``head_dir`` (its taps name the teacher's layers)."""
    return HeadSpec(**json.loads((head_dir / "head_config.json").read_text())["head"])


def fuse_warm_start(src: Path, dst: Path, taps: Sequence[int]) -> None:
    """A head folder at ``dst`` whose head fuses the target layers ``taps`` (EAGLE-3's fusion of
    low, middle and high layers; Li et al. 2025), warm-started from the committed head at
    ``src``, which reads the final normed state alone: its weights, with a ``fuse`` projection
    that reads the final normed state and ignores the other layers (identity there, zeros
    elsewhere), so the new head computes exactly what ``src``'s does; its sub-vocabulary, its
    state (positions, cursor, sessions) and curve, so a cumulative session goes on from there
    and the curve says whether the other layers add anything."""
    from safetensors.torch import load_file, save

    spec = head_spec(src)
    taps = [int(t) for t in taps]
    if spec.taps != [FINAL_NORM_TAP] or spec.fuse:
        raise ValueError(f"{src}: a head reading the final normed state alone, not {spec.taps}")
    if FINAL_NORM_TAP not in taps or len(taps) < 2 or len(set(taps)) != len(taps):
        raise ValueError(f"taps {taps}: distinct layers, -1 (the final normed state) among them")
    if dst.exists():
        raise ValueError(f"{dst} exists: the warm start writes a new folder")
    settle_export(src)
    weights = load_file(str(src / WEIGHTS_FILE))
    d = int(weights["fc.weight"].shape[0])
    fuse = torch.zeros(d, len(taps) * d, dtype=weights["fc.weight"].dtype)
    j = taps.index(FINAL_NORM_TAP)
    fuse[:, j * d : (j + 1) * d] = torch.eye(d)
    dst.mkdir(parents=True)
    (dst / TRAINING_DIR).mkdir()
    blob = save({**weights, "fuse.weight": fuse})
    write_atomic(dst / WEIGHTS_FILE, blob)
    cfg = json.loads((src / "head_config.json").read_text())
    cfg["head"] = {**cfg["head"], "taps": taps, "fuse": True, "tap_norm": True}
    cfg["warm_start"] = {"from": str(src), "step": cfg.get("step"), "taps": [FINAL_NORM_TAP]}
    write_atomic(dst / "head_config.json", json.dumps(cfg, indent=2) + "\n")
    if (src / VOCAB_FILE).is_file():
        shutil.copy2(src / VOCAB_FILE, dst / VOCAB_FILE)
    state = read_state(src)
    state.export = _digest(blob)  # the state names the weights it goes on from
    write_atomic(dst / TRAINING_DIR / STATE_FILE, json.dumps(state.to_json(), indent=1) + "\n")
    if (src / TRAINING_DIR / CURVE_FILE).is_file():
        shutil.copy2(src / TRAINING_DIR / CURVE_FILE, dst / TRAINING_DIR / CURVE_FILE)


def fork_arm(head_dir: Path, ckpt_dir: Path, out: Path) -> str:
    """An arm of an A/B between training variants: ``out/head`` (the committed head's files,
    state and curve) and ``out/ckpt`` (the local checkpoint and cursor when they descend from
    that export, and a link to the teacher cache, which depends on the taps and the data, not
    on the variant), so that ``cumulative --head out/head --ckpt-dir out/ckpt`` goes on exactly
    as the original would (same weights, optimiser, averages and data), whatever the variant
    changes, and exports into the arm, never the committed folder. Fork every arm from the same
    stopped training (SIGTERM exports; its checkpoint is then the export's), train each for the
    same ``--max-steps`` with ``--export-every-s 0``, then ``train_head.py compare`` the arms'
    heads. How it resumed: "local checkpoint, step N" or "committed head, step N"."""
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out} exists and is not empty: an arm is forked into a new folder")
    settle_export(head_dir)
    committed = read_state(head_dir)
    arm_head, arm_ckpt = out / "head", out / "ckpt"
    (arm_head / TRAINING_DIR).mkdir(parents=True)
    arm_ckpt.mkdir()
    for f in head_dir.iterdir():
        if f.is_file() and f.name.endswith(HEAD_FILE_SUFFIXES):
            shutil.copy2(f, arm_head / f.name)
    for name in (STATE_FILE, CURVE_FILE):
        if (head_dir / TRAINING_DIR / name).is_file():
            shutil.copy2(head_dir / TRAINING_DIR / name, arm_head / TRAINING_DIR / name)
    local = _load_local(ckpt_dir, committed)
    if local is not None:
        shutil.copy2(ckpt_dir / CKPT_FILE, arm_ckpt / CKPT_FILE)
        write_cursor(arm_ckpt, local[1])
    if (ckpt_dir / TEACHER_DIR).is_dir():
        (arm_ckpt / TEACHER_DIR).symlink_to((ckpt_dir / TEACHER_DIR).resolve())
    steps = local[1].steps if local is not None else committed.steps
    return f"{'local checkpoint' if local is not None else 'committed head'}, step {steps}"
