"""On-policy training text for the feature head: the target's own responses to the offline
prompt pool, generated in the background and committed as uint16 id shards.

The head is judged on the target's responses (the held-out set is the target's warped samples),
so the positions that teach it most are the target's own text in the shapes of those prompts
(Medusa-2's self-distillation, Cai et al., 2024; HASS/EAGLE-3 also train on target-written
data). Each call goes on where the last one stopped:

* the prompts are the distillation pool's training items (:func:`mtad_train.prompts.prepare_pool`,
  checked disjoint from every evaluation prompt), from ``manifest.json``'s ``next_item`` on;
  prompts already in an ``--exclude`` file (the committed ``data.npz``) are skipped, and a
  fraction of each batch are second turns of chats the target finished earlier in the run
  (the MT-Bench turn-2 shape);
* responses are sampled as the held-out set was (the authors' warping), in batches of prompts
  of similar length (left padding costs a batched CPU generation up to half its speed);
* a response sharing a word 8-gram with an evaluation prompt is dropped (counted);
* every ``shard_every_s`` the sequences so far become one shard ``NNNN.npz`` (the
  ``data.npz`` layout, atomically written), then the manifest advances; a kill loses at most
  the sequences since the last shard, and a rerun regenerates exactly those prompts.

The cumulative training reads the shards as one source (``onpolicy/*.npz``,
:class:`mtad_train.cumulative.Source`).
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mtad.runs.atomic import write_atomic
from mtad_train.cli import opt
from mtad_train.ids import read_ids, write_ids

MANIFEST = "manifest.json"
WARP_TEXT = "temperature 1, top-k 10, top-p 0.9"  # mtad_train.objectives.AUTHORS_WARP


@dataclass
class RespondCommand:
    """The target's responses to the prompt pool (on-policy head data), as id shards."""

    out: str = "assets/drafts/smollm2-head/onpolicy"
    pool: str = ".dev/distill_pool.jsonl.gz"  # built from this disk when absent
    pool_seed: int = 0
    first_item: int = opt(
        6000, help="pool item to start from when the folder has no manifest yet"
    )  # the committed data.npz drew its 3,072 prompts from the first ~3,000 items
    exclude: list[str] = opt(
        default_factory=lambda: ["assets/drafts/smollm2-draft/data.npz"],
        nargs="*",
        help="id files whose prompts are skipped",
    )
    batch_size: int = 32
    max_new: int = 128
    max_prompt_tokens: int = 448
    followup_frac: float = 0.15
    dtype: str = "auto"  # auto: bfloat16 on a CPU with native bfloat16, else float32
    threads: int = 1
    seed: int = 0
    shard_every_s: float = 900.0
    time_budget_s: float = opt(0.0, help="stop (writing a last shard) after this long; 0: never")
    max_items: int = opt(0, help="stop after this many pool items; 0: never")
    passes: int = opt(
        1,
        help="how many times the pool is answered: pass k > 1 answers items first_item.. "
        "again, sampled with fresh seeds (more on-policy data once the pool is used up)",
    )
    ngram: int = 8

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.max_new < 1:
            raise ValueError("--batch-size and --max-new must be positive")
        if not 0.0 <= self.followup_frac < 1.0:
            raise ValueError("--followup-frac must be in [0, 1)")
        if self.passes < 1:
            raise ValueError("--passes must be at least 1")


def read_manifest(folder: Path) -> dict[str, Any]:
    path = folder / MANIFEST
    return json.loads(path.read_text()) if path.is_file() else {"shards": []}


def shard_paths(folder: str | Path) -> list[Path]:
    """The shards a manifest lists, in order (a shard file without its manifest entry, left
    by a kill between the two writes, is not read)."""
    folder = Path(folder)
    return [folder / s["file"] for s in read_manifest(folder)["shards"]]


def respond(cfg: RespondCommand) -> None:
    """Load the pool (built when absent), the target and the evaluation prompts, then
    :func:`write_responses`."""
    import torch

    from mtad.cpu import choose_dtype
    from mtad.engine.packed import set_linears
    from mtad.engine.smollm2 import load_smollm2_target
    from mtad_train.config import DistillConfig
    from mtad_train.evalsets import evaluation_texts
    from mtad_train.head_commands import file_log
    from mtad_train.prompts import prepare_pool

    log = file_log(Path(".dev/head/respond.log"))
    torch.set_num_threads(cfg.threads)
    dtype, why = choose_dtype(cfg.dtype, "cpu")
    log(f"respond: target {dtype} ({why})")
    pool = prepare_pool(
        DistillConfig(out="", pool=cfg.pool, pool_seed=cfg.pool_seed, max_steps=1), log
    )
    target, tok = load_smollm2_target(dtype)
    # decoding's few rows per step: prepacked projections where the CPU has oneDNN bfloat16
    # (the same tokens, fewer seconds; mtad.engine.packed)
    log(f"respond: {set_linears(target.eval(), 'auto')} projections on prepacked weights")
    write_responses(
        cfg, target, tok, pool["train"], evaluation_texts(), pool["recipe"]["fingerprint"], log
    )


def write_responses(
    cfg: RespondCommand,
    target,
    tok,
    items: list[dict],
    eval_texts: dict[str, list[str]],
    pool_id: str,
    log: Callable[[str], None],
) -> None:
    """Generate and write shards from the folder's ``next_item`` (or ``cfg.first_item``) on,
    until the pool, the time budget or ``cfg.max_items`` ends or a SIGTERM comes."""
    from mtad_train.cumulative import stop_on_term

    writer = ResponseWriter(cfg, target, tok, items, eval_texts, pool_id, log)
    stop = stop_on_term(log)
    t0 = time.monotonic()
    while not stop():
        if cfg.time_budget_s and time.monotonic() - t0 > cfg.time_budget_s:
            break
        if cfg.max_items and writer.cursor - writer.first_item >= cfg.max_items:
            break
        chunk = writer.next_chunk()
        if not chunk:
            log(f"the pool is used up ({cfg.passes} pass(es); --passes N answers it again)")
            break
        chunk.sort(key=lambda x: len(x[1]))  # batches of similar length: little padding
        for b in range(0, len(chunk), cfg.batch_size):
            writer.respond_to(chunk[b : b + cfg.batch_size], seed=cfg.seed + writer.cursor + b)
        if time.monotonic() - writer.last_shard > cfg.shard_every_s:
            writer.write_shard()
    writer.write_shard()


class ResponseWriter:
    """The state of one :func:`write_responses` call: the pool cursor, the prompts seen, the
    sequences of the shard being filled, the finished chats that may get a second turn."""

    def __init__(
        self,
        cfg: RespondCommand,
        target,
        tok,
        items: list[dict],
        eval_texts: dict[str, list[str]],
        pool_id: str,
        log: Callable[[str], None],
    ) -> None:
        from mtad_train.overlap import eval_index

        self.cfg, self.target, self.tok, self.items, self.log = cfg, target, tok, items, log
        self.out = Path(cfg.out)
        first = next(target.parameters())
        self.dtype = str(first.dtype).removeprefix("torch.")
        self.device = first.device.type
        self.grams, self.exact = eval_index(eval_texts, cfg.ngram)
        self.excluded = {tuple(s[:p].tolist()) for f in cfg.exclude for s, p in _prompts(f)}
        self.seen = set(self.excluded)  # the excluded prompts and this pass's so far
        self.manifest = read_manifest(self.out)
        self.manifest.setdefault("pool", pool_id)
        if self.manifest["pool"] != pool_id:
            log(
                f"note: this disk's pool {pool_id[:12]} differs from the manifest's "
                f"{self.manifest['pool'][:12]}; items are read by index all the same"
            )
        self.cursor = self.first_item = self.start_item = int(
            self.manifest.get("next_item", cfg.first_item)
        )
        # the cursor counts items over all passes: pass 1 is items [first_item, len(items)),
        # each later pass the same items again (:meth:`item`)
        self.pass_len = len(items) - min(cfg.first_item, len(items))
        self.end = len(items) + (cfg.passes - 1) * self.pass_len
        item, pass_ = self.item(self.cursor)
        log(f"respond: from pool item {item} of {len(items)} (pass {pass_}); config {cfg}")
        self.rng = random.Random(f"{cfg.seed}:{self.cursor}")
        self.last_shard = time.monotonic()
        self.seqs: list[list[int]] = []
        self.plens: list[int] = []
        self.kinds: list[str] = []
        self.dropped: Counter[str] = Counter()
        self.finished: list[tuple[dict, list[int]]] = []
        self.batches = 0

    def next_chunk(self) -> list[tuple[dict, list[int]]]:
        """Four batches' worth of fresh pool prompts (advancing the cursor), plus second turns
        of finished chats: ``(item, prompt ids)`` pairs."""
        from mtad_train.data import encode_item
        from mtad_train.prompts import FOLLOW_UPS

        cfg, tok, rng = self.cfg, self.tok, self.rng
        chunk: list[tuple[dict, list[int]]] = []
        while len(chunk) < 4 * cfg.batch_size and self.cursor < self.end:
            index, pass_ = self.item(self.cursor)
            if index == self.cfg.first_item and pass_ > 1:  # a new pass: its prompts again
                self.seen = set(self.excluded)
            it = self.items[index]
            self.cursor += 1
            p = encode_item(tok, it)
            if len(p) <= cfg.max_prompt_tokens and tuple(p) not in self.seen:
                self.seen.add(tuple(p))
                chunk.append((it, p))
        n_follow = int(len(chunk) * cfg.followup_frac) if self.finished else 0
        for _ in range(n_follow):
            it, resp = self.finished[rng.randrange(len(self.finished))]
            msgs = it["messages"] + [
                {"role": "assistant", "content": tok.decode(resp, skip_special_tokens=True)},
                {"role": "user", "content": rng.choice(FOLLOW_UPS)},
            ]
            p = encode_item(tok, {"messages": msgs})
            if len(p) <= cfg.max_prompt_tokens:
                chunk.append(({"kind": "followup", "messages": msgs}, p))
        return chunk

    def item(self, cursor: int) -> tuple[int, int]:
        """The pool index and the pass (from 1) of the cursor's item."""
        if cursor < len(self.items):
            return cursor, 1
        k = cursor - len(self.items)
        return self.cfg.first_item + k % self.pass_len, 2 + k // self.pass_len

    def respond_to(self, part: list[tuple[dict, list[int]]], seed: int) -> None:
        """The target's sampled responses to one batch, kept unless they overlap an
        evaluation prompt."""
        from mtad_train.data import generate
        from mtad_train.overlap import overlaps

        cfg, tok = self.cfg, self.tok
        tg = time.perf_counter()
        prompts = [p for _, p in part]
        res = generate(self.target, tok, prompts, cfg.max_new, False, self.device, seed)
        self.batches += 1
        for (it, p), r in zip(part, res, strict=True):
            text = tok.decode(r, skip_special_tokens=True)
            hits = overlaps(text, self.grams, self.exact, cfg.ngram)
            if hits:
                self.dropped.update(hits)
                continue
            self.seqs.append(p + r)
            self.plens.append(len(p))
            self.kinds.append(it["kind"])
            if _finished_chat(it, r, tok.eos_token_id):
                self.finished.append((it, r))
                if len(self.finished) > 4096:
                    self.finished.pop(self.rng.randrange(len(self.finished)))
        self.log(
            f"batch {self.batches}: {len(part)} prompts (<= {len(part[-1][1])} tokens), "
            f"{sum(map(len, res))} tokens in {time.perf_counter() - tg:.1f} s; item {self.cursor}"
        )

    def write_shard(self) -> None:
        """The sequences so far as the next shard, then the manifest (which alone makes the
        shard part of the folder, :func:`shard_paths`)."""
        cfg, man = self.cfg, self.manifest
        if self.seqs:
            name = f"{len(man['shards']):04d}.npz"
            write_ids(
                self.out / name, self.seqs, self.plens, self.kinds, seed=cfg.seed, warp=WARP_TEXT
            )
            resp = sum(len(s) - p for s, p in zip(self.seqs, self.plens, strict=True))
            man["shards"].append(
                {
                    "file": name,
                    "items": [self.start_item, self.cursor],
                    "sequences": len(self.seqs),
                    "positions": sum(map(len, self.seqs)),
                    "response_tokens": resp,
                    "dropped_for_overlap": dict(self.dropped),
                    "dtype": self.dtype,
                    "written": time.strftime("%Y-%m-%dT%H:%M:%S"),
                }
            )
            self.log(f"shard {name}: {len(self.seqs)} sequences, {resp} response tokens")
        man["next_item"] = self.cursor
        man["config"] = {k: v for k, v in asdict(cfg).items() if k != "time_budget_s"}
        write_atomic(self.out / MANIFEST, json.dumps(man, indent=1) + "\n")
        self.seqs, self.plens, self.kinds, self.dropped = [], [], [], Counter()
        self.start_item, self.last_shard = self.cursor, time.monotonic()


def _prompts(path: str):
    ids = read_ids(path)
    return zip(ids.seqs, ids.plens, strict=True)


def _finished_chat(it: dict, r: list[int], eos: int) -> bool:
    """A single-turn chat the target ended (EOS) within 300 tokens may get a second turn."""
    return (
        "messages" in it
        and it["kind"] != "followup"
        and "assistant_prefix" not in it
        and bool(r)
        and r[-1] == eos
        and len(r) < 300
    )
