"""Test doubles for task code: a decoder that replays a fixed text (no model needed)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass
class ScriptedOutput:
    token_ids: list[int]
    stopped_by: str
    stats: Any = None


class ScriptedDecoder:
    """Emits ``text`` (or the next of ``texts``, one per call) in blocks of ``block`` tokens, as
    a multi-token method would, asking ``should_stop`` after every block as the engine's
    ``Decoder.generate`` does. Records each call's prompt ids and seed in ``calls``."""

    def __init__(self, tokenizer: Any, texts: str | Sequence[str], block: int = 3) -> None:
        self.tokenizer = tokenizer
        self.texts = [texts] if isinstance(texts, str) else list(texts)
        self.block = block
        self.calls: list[dict[str, Any]] = []

    def generate(
        self,
        prompt_ids: Sequence[int],
        max_new_tokens: int,
        seed: int | None = None,
        should_stop: Callable[[list[int]], bool] | None = None,
    ) -> ScriptedOutput:
        text = self.texts[len(self.calls) % len(self.texts)]
        self.calls.append({"prompt_ids": list(prompt_ids), "seed": seed})
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"][:max_new_tokens]
        new: list[int] = []
        while len(new) < len(ids):
            new = ids[: len(new) + self.block]
            if should_stop is not None and should_stop(new):
                return ScriptedOutput(new, "stop")
        return ScriptedOutput(new, "max_new_tokens")
