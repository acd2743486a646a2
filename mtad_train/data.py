"""Training data of a distillation: prompts encoded as the harness encodes them, the target's
continuations, the buffer of generated sequences, its micro-batches
(:func:`mtad_train.batches.micro_batches`) and its ``data.npz`` files (:mod:`mtad_train.ids`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from mtad.runs.atomic import write_atomic
from mtad_train import objectives as O
from mtad_train.batches import micro_batches
from mtad_train.ids import read_ids, write_ids


def encode_item(tok, item) -> list[int]:
    """Token ids of a pool/eval item, built as the harness builds prompts (mtad.tasks.base):
    chat-template text (+ system message, + assistant prefill), tokenised without extra specials;
    raw text items are tokenised as they are."""
    if "messages" in item:
        msgs = list(item["messages"])
        if item.get("system"):
            msgs = [{"role": "system", "content": item["system"]}] + msgs
        text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        text += item.get("assistant_prefix", "")
        return tok(text, add_special_tokens=False).input_ids
    return tok(item["text"], add_special_tokens=False).input_ids


class AuthorsSample:
    """A transformers logits processor that samples each row's next token as the engine does
    (:func:`mtad.engine.warping.warp_candidates`: temperature, top-k, then top-p over the top-k;
    :meth:`~mtad.engine.warping.Candidates.sample` over the few kept candidates, from its own
    ``generator``) and hands back a row that is ``0`` at that token and ``-inf`` elsewhere, so
    generation runs greedy: its argmax is the sample. transformers' own sampling would sort every
    row's whole vocabulary for top-p (12% of a ``respond`` batch of 32 rows by py-spy, 49,152
    columns each) and draw its multinomial from exponential keys over all of them (19% by
    torch's profiler, 39 ms a step)."""

    def __init__(self, warp, generator: torch.Generator) -> None:
        self.warp = warp
        self.generator = generator

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        from mtad.engine.warping import NEG_INF, warp_candidates

        token = warp_candidates(scores, self.warp).sample(self.generator)
        out = torch.full_like(scores, NEG_INF)
        return out.scatter_(-1, token[:, None], 0.0)


@torch.no_grad()
def generate(
    target,
    tok,
    prompts: list[list[int]],
    max_new: int,
    greedy: bool,
    device: str,
    generator_seed: int,
    teacher_topk: int = 0,
):
    """Target continuations (cut after the first EOS, EOS kept) of left-padded prompts.

    With ``teacher_topk`` > 0 returns ``(continuations, teacher)`` where ``teacher[i]`` holds,
    for every token of continuation ``i``, the target's ``teacher_topk`` most likely next tokens
    and their raw (temperature 1) log-probabilities, read off the logits the generation computed
    anyway: training on them needs no second target forward (see :func:`topk_of_logits`)."""
    from transformers import GenerationConfig, LogitsProcessorList

    pad = tok.pad_token_id
    eos = tok.eos_token_id
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    gc = GenerationConfig(
        max_new_tokens=max_new,
        do_sample=False,
        pad_token_id=pad,
        eos_token_id=eos,
        bos_token_id=tok.bos_token_id,
    )
    processors = LogitsProcessorList()
    if not greedy:  # sampled by AuthorsSample, so transformers' own decoding is its argmax
        generator = torch.Generator().manual_seed(generator_seed)
        processors.append(AuthorsSample(O.AUTHORS_WARP, generator))
    if teacher_topk:
        gc.return_dict_in_generate, gc.output_logits = True, True
    out = target.generate(
        input_ids=ids.to(device),
        attention_mask=mask.to(device),
        generation_config=gc,
        logits_processor=processors,
    )
    seqs = out.sequences if teacher_topk else out
    rows = seqs[:, width:].cpu().tolist()
    res = []
    for row in rows:
        if eos in row:
            row = row[: row.index(eos) + 1]
        res.append(row)
    if not teacher_topk:
        return res
    # logits[j] is the distribution of new token j: (steps, batch, K) -> per row
    top = [topk_of_logits(lg, teacher_topk) for lg in out.logits]
    ids_k = torch.stack([t[0] for t in top], 1)
    logp_k = torch.stack([t[1] for t in top], 1)
    teacher = [(ids_k[i, : len(r)].numpy(), logp_k[i, : len(r)].numpy()) for i, r in enumerate(res)]
    return res, teacher


def topk_of_logits(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` most likely tokens of each row and their log-probabilities, compactly: ids as
    int32 (uint16 does not index), log-probabilities as float16; sorted, most likely first."""
    logp = torch.log_softmax(logits.float(), -1)
    vals, idx = torch.topk(logp, min(k, logp.shape[-1]), dim=-1)
    return idx.to(torch.int32).cpu(), vals.to(torch.float16).cpu()


@torch.no_grad()
def fill_teacher(
    buf: Buffer,
    target,
    k: int,
    device: str,
    micro_tokens: int,
    log=None,
    prompts: bool = False,
    progress: bool = False,
) -> int:
    """Teacher top-k for every buffered sequence that has none (data loaded as bare ids, e.g.
    on another machine from the committed ``data.npz``), and with ``prompts`` also at its prompt
    positions (``--prompt-weight``: generation computes no logits there): one teacher-forced
    target forward over each sequence; returns the number of sequences filled. ``progress``
    shows a bar in token positions (loaded data on a CPU: tens of minutes)."""
    todo = [
        i
        for i, (t, tp) in enumerate(zip(buf.teach, buf.teach_prompt, strict=True))
        if t is None or (prompts and tp is None)
    ]
    pad = target.config.pad_token_id or 0
    bar = tqdm(
        total=sum(len(buf.seqs[i]) for i in todo),
        unit="tok",
        desc="teacher top-k",
        dynamic_ncols=True,
        mininterval=5.0,
        disable=not (progress and todo),
    )
    for rows in make_batches(buf, todo, micro_tokens):
        x, w = collate(buf, rows, pad, 0.0, device)
        logits = target(input_ids=x).logits
        for r, i in enumerate(rows):
            p, n = buf.plens[i], len(buf.seqs[i]) - buf.plens[i]
            if buf.teach[i] is None:
                ids_k, logp_k = topk_of_logits(logits[r, p - 1 : p - 1 + n], k)
                buf.teach[i] = (ids_k.numpy(), logp_k.numpy())
            if prompts and buf.teach_prompt[i] is None:
                ids_k, logp_k = topk_of_logits(logits[r, : p - 1], k)
                buf.teach_prompt[i] = (ids_k.numpy(), logp_k.numpy())
        bar.update(sum(len(buf.seqs[i]) for i in rows))
    bar.close()
    if log and todo:
        where = "response and prompt positions" if prompts else "response positions"
        log(f"teacher top-{k} computed for {len(todo)} sequences ({where})")
    return len(todo)


@dataclass
class Buffer:
    seqs: list = field(default_factory=list)  # list[list[int]] prompt+response
    plens: list = field(default_factory=list)  # prompt lengths
    kinds: list = field(default_factory=list)
    gen_tokens: int = 0
    gen_tokens_greedy: int = 0
    # per sequence: None or (ids [n, K], log-probs [n, K]) of the target at its n response
    # positions (see generate(teacher_topk=...)); never written to data.npz (ids only)
    teach: list = field(default_factory=list)
    # the same at the prompt positions 0..p-2 (each predicting the next prompt token), for
    # --prompt-weight > 0: None until a teacher-forced pass fills it (fill_teacher(prompts=True))
    teach_prompt: list = field(default_factory=list)

    def __post_init__(self) -> None:
        # a checkpoint written before teach_prompt existed: nothing filled yet
        self.teach_prompt += [None] * (len(self.seqs) - len(self.teach_prompt))

    def add(self, prompt, resp, kind, greedy, teach=None):
        if not resp:
            return
        self.seqs.append(prompt + resp)
        self.plens.append(len(prompt))
        self.kinds.append(kind)
        self.teach.append(teach)
        self.teach_prompt.append(None)
        self.gen_tokens += len(resp)
        if greedy:
            self.gen_tokens_greedy += len(resp)


def make_batches(buf: Buffer, idx: list[int], micro_tokens: int) -> list[list[int]]:
    """Buffer rows ``idx`` in right-padded micro-batches of <= micro_tokens cells."""
    return micro_batches(idx, micro_tokens, length=lambda i: len(buf.seqs[i]))


def collate(buf: Buffer, rows: list[int], pad: int, prompt_weight: float, device: str):
    L = max(len(buf.seqs[i]) for i in rows)
    x = torch.full((len(rows), L), pad, dtype=torch.long)
    w = torch.zeros((len(rows), L))
    for r, i in enumerate(rows):
        s = buf.seqs[i]
        x[r, : len(s)] = torch.tensor(s)
        p = buf.plens[i]
        # position t predicts token t+1: response targets start at t = p-1, end at len-2
        w[r, p - 1 : len(s) - 1] = 1.0
        if prompt_weight > 0:
            w[r, : p - 1] = prompt_weight
    return x.to(device), w.to(device)


def save_data(buf: Buffer, path: Path, transport_dir: str | None, chunk_mib: float):
    """Generated sequences in the ``data.npz`` layout (:mod:`mtad_train.ids`), atomically."""
    write_ids(
        path,
        buf.seqs,
        buf.plens,
        buf.kinds,
        compress=False,
        gen_tokens=buf.gen_tokens,
        gen_tokens_greedy=buf.gen_tokens_greedy,
    )
    if transport_dir:
        write_parts(path.read_bytes(), Path(transport_dir), "data.npz", chunk_mib)


def write_parts(data: bytes, folder: Path, stem: str, chunk_mib: float) -> None:
    """``data`` as ``<stem>.partNN`` files of at most ``chunk_mib`` MiB, each atomically."""
    chunk = int(chunk_mib * 2**20)
    for j in range(math.ceil(len(data) / chunk)):
        write_atomic(folder / f"{stem}.part{j:02d}", data[j * chunk : (j + 1) * chunk])


def load_data(path: str, buf: Buffer) -> None:
    ids = read_ids(path)
    buf.seqs += ids.lists()
    buf.plens += ids.plens
    buf.kinds += ids.kinds
    buf.teach += [None] * len(ids.seqs)
    buf.teach_prompt += [None] * len(ids.seqs)
    buf.gen_tokens += int(ids.extra["gen_tokens"])
    buf.gen_tokens_greedy += int(ids.extra["gen_tokens_greedy"])
