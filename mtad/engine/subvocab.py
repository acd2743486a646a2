"""A draft whose output projection covers only a frequency-ranked part of the vocabulary.

After FR-Spec (Zhao et al., "FR-Spec: Accelerating Large-Vocabulary Language Models via
Frequency-Ranked Speculative Sampling", 2025): a small draft spends most of a step in its
output projection (SmolLM2's 49152 x 256 head is ~80% of a 4-layer draft's multiply-adds), while
the target's text is almost always made of a few thousand frequent tokens. Projecting onto the
``k`` most frequent tokens only, and giving every other token probability zero, cuts the step
and keeps every lossless method exact: speculative sampling accepts with ``min(1, p/q)`` and
resamples from ``max(0, p - q)``, so tokens the draft never proposes are still produced by the
target at their own probability.

A draft folder opts in with ``draft_vocab.json``: ``{"ids": [...], "source": "..."}`` (token ids,
most frequent first). :func:`restrict_vocab` swaps the model's ``lm_head`` for a
:class:`SubVocabHead` that still returns full-width logits (``-inf`` outside the subset), so the
engine, the warping and the methods see an ordinary model.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from mtad.engine.packed import PackedWeight, linear

VOCAB_FILE = "draft_vocab.json"


class SubVocabHead(torch.nn.Module):
    """``logits[..., ids] = hidden @ W[ids].T``, ``-inf`` elsewhere (full vocabulary width).

    ``ids`` are kept in ascending order, so column ``j`` of the compact logits
    (:meth:`compact`) is token ``ids[j]`` and equal values order by token id there as in the
    full-width row: warping the compact row (:func:`mtad.engine.warping.compact_candidates`)
    gives the full-width row's candidates exactly, without the 3x wider row.
    """

    def __init__(self, weight: torch.Tensor, ids: torch.Tensor) -> None:
        super().__init__()
        self.vocab_size = int(weight.shape[0])
        self.register_buffer("ids", ids.to(torch.long).sort().values, persistent=False)
        # a copy of the kept rows: the full matrix stays as the input embedding
        self.weight = torch.nn.Parameter(weight.detach()[self.ids].clone(), requires_grad=False)
        self.pack: PackedWeight | None = None  # set by mtad.engine.packed.set_linears

    packs_projection = True

    @property
    def projection_weight(self) -> torch.Tensor:
        return self.weight

    def compact(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits of the kept tokens only, ``[..., len(ids)]`` (column ``j``: ``ids[j]``), on
        this head's device: after a ``device_map`` load the body's last layer may sit on another
        GPU, and this module replaced the head that carried accelerate's device hook."""
        return linear(hidden.to(self.weight.device), self.weight, pack=self.pack)

    def widen(self, sub: torch.Tensor) -> torch.Tensor:
        """Compact logits as the full-width row (``-inf`` off the kept tokens)."""
        out = sub.new_full((*sub.shape[:-1], self.vocab_size), float("-inf"))
        return out.index_copy_(-1, self.ids, sub)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.widen(self.compact(hidden))


class SubVocabLM(torch.nn.Module):
    """What a :class:`~mtad.engine.runner.ModelRunner` calls for a model with a
    :class:`SubVocabHead`: its body, then the compact projection (``compact=True``: logits of
    the kept tokens, for warping) or the full-width one."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.lm = model
        self.head = model.get_output_embeddings()
        assert isinstance(self.head, SubVocabHead)

    def forward(
        self, input_ids: torch.Tensor, logits_to_keep: int = 0, compact: bool = False, **kwargs
    ) -> torch.Tensor:
        hidden = self.lm.base_model(input_ids=input_ids, **kwargs).last_hidden_state
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        sub = self.head.compact(hidden)
        return sub if compact else self.head.widen(sub)


def read_vocab(folder: str | Path) -> list[int] | None:
    """The token ids of a draft folder's ``draft_vocab.json``, or None when it has none."""
    path = Path(folder) / VOCAB_FILE
    if not path.is_file():
        return None
    ids = json.loads(path.read_text())["ids"]
    if not ids or len(set(ids)) != len(ids) or min(ids) < 0:
        raise ValueError(f"{path}: ids must be distinct non-negative token ids")
    return [int(i) for i in ids]


def restrict_vocab(model: torch.nn.Module, ids: list[int]) -> torch.nn.Module:
    """``model`` with its output projection restricted to ``ids`` (in place; returned)."""
    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear) or head.bias is not None:
        raise ValueError("draft_vocab.json needs a model with a bias-free linear head")
    if max(ids) >= head.weight.shape[0]:
        raise ValueError(
            f"draft_vocab.json: id {max(ids)} beyond the vocabulary ({head.weight.shape[0]})"
        )
    model.config.tie_word_embeddings = False  # the head is now its own (smaller) matrix
    # ids beside the weight: a device_map load leaves the head on its GPU, and no later
    # ``model.to(device)`` moves this buffer there (widen / vocab_token index with it)
    ids_t = torch.tensor(ids, device=head.weight.device)
    model.set_output_embeddings(SubVocabHead(head.weight, ids_t))
    return model


def frequency_ranked_ids(token_lists, vocab_size: int, k: int, always=()) -> list[int]:
    """The ``k`` most frequent ids of ``token_lists`` (ties by id), plus ``always`` (special
    tokens such as EOS, which must stay proposable) -- FR-Spec's vocabulary selection."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for toks in token_lists:
        counts += torch.bincount(torch.as_tensor(toks, dtype=torch.long), minlength=vocab_size)
    order = torch.argsort(-counts * vocab_size + torch.arange(vocab_size))  # stable by id
    chosen = [int(i) for i in order[:k]]
    for t in always:
        if t is not None and t not in chosen:
            chosen.append(int(t))
    return chosen
