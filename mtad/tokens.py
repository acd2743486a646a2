"""Token-id helpers shared by the harness and the benchmarks."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def eos_token_ids(tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel) -> list[int]:
    """The tokenizer's EOS plus the model's generation-config EOS ids (chat models add
    end-of-turn tokens there), sorted."""
    ids: set[int] = set()
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is not None:
        ids.add(int(eos))
    extra = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(extra, int):
        ids.add(extra)
    elif isinstance(extra, (list, tuple)):
        ids.update(int(e) for e in extra)
    return sorted(ids)
