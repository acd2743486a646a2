"""Text in, :class:`~mtad.tasks.samples.Generation` out: the engine's ``Decoder`` behind a prompt
string, with stop strings, per-sample seeds and context-aware detokenization."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from mtad.tasks.samples import Generation

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class _DecoderLike(Protocol):
    def generate(
        self,
        prompt_ids: list[int],
        max_new_tokens: int,
        seed: int | None = None,
        should_stop: Callable[[list[int]], bool] | None = None,
    ) -> Any: ...


def derive_seed(seed: int, key: str) -> int:
    """A per-sample seed: the same sample gets the same seed whatever subset it runs in."""
    return zlib.crc32(f"{seed}/{key}".encode()) & 0x7FFFFFFF


def first_stop(text: str, stop: Sequence[str]) -> int:
    """Index of the earliest stop string in ``text`` (``-1`` if none)."""
    hits = [i for i in (text.find(s) for s in stop if s) if i >= 0]
    return min(hits) if hits else -1


class TextGenerator:
    """Text in, :class:`Generation` out, around the engine's ``Decoder``.

    Tokenizes the prompt, stops the decoder as soon as a stop string appears in the decoded
    continuation, cuts the text at the stop string, and decodes continuations in the context of
    the last prompt tokens (SentencePiece tokenizers drop a leading space when a continuation is
    decoded alone, which would break Python indentation).
    """

    def __init__(
        self, decoder: _DecoderLike, tokenizer: PreTrainedTokenizerBase, seed: int = 0
    ) -> None:
        self.decoder = decoder
        self.tokenizer = tokenizer
        self.seed = seed

    def decode(self, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> str:
        ctx = list(prompt_ids[-4:])
        if not ctx:
            return self.tokenizer.decode(list(output_ids), skip_special_tokens=True)
        head = self.tokenizer.decode(ctx, skip_special_tokens=True)
        full = self.tokenizer.decode(ctx + list(output_ids), skip_special_tokens=True)
        if full.startswith(head):
            return full[len(head) :]
        return self.tokenizer.decode(list(output_ids), skip_special_tokens=True)

    def __call__(
        self,
        prompt: str,
        *,
        max_new_tokens: int,
        stop: Sequence[str] = (),
        add_special_tokens: bool = True,
        key: str = "",
        max_prompt_tokens: int | None = None,
    ) -> Generation:
        """Decode a reply to ``prompt``; ``key`` names the sample (its seed derives from it) and
        ``max_prompt_tokens`` keeps only the prompt's last tokens."""
        prompt_ids = self.tokenizer(prompt, add_special_tokens=add_special_tokens)["input_ids"]
        if max_prompt_tokens is not None:
            prompt_ids = prompt_ids[-max_prompt_tokens:]
        stop = tuple(s for s in stop if s)
        should_stop = None
        if stop:
            # Decode only the tokens added since the last check plus enough before them to hold
            # a stop string (a character can take up to 4 byte tokens): a constant cost per
            # iteration, so one-token-per-iteration methods pay no more per token than others.
            reach = 4 * max(len(s) for s in stop) + 2
            checked = 0

            def should_stop(new_ids: list[int]) -> bool:
                nonlocal checked
                start = max(0, checked - reach)
                context = new_ids[:start] if start else prompt_ids
                checked = len(new_ids)
                return first_stop(self.decode(context, new_ids[start:]), stop) >= 0

        out = self.decoder.generate(
            prompt_ids,
            max_new_tokens,
            seed=derive_seed(self.seed, key),
            should_stop=should_stop,
        )
        ids = list(out.token_ids)
        text = self.decode(prompt_ids, ids)
        cut = first_stop(text, stop)
        kept = ids
        if cut >= 0:
            text = text[:cut]
            # Drop tokens past the one that completes the stop string.
            while len(kept) > 1 and first_stop(self.decode(prompt_ids, kept[:-1]), stop) >= 0:
                kept = kept[:-1]
        return Generation(
            prompt=prompt,
            text=text,
            prompt_ids=list(prompt_ids),
            output_ids=kept,
            stopped_by="stop" if cut >= 0 else out.stopped_by,
            n_generated=len(ids),
            stats=out.stats,
        )
