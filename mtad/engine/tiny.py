"""Tiny random-init Llama / OPT models and a byte-level tokenizer, for tests and smoke runs.

Not for experiments: the ``tiny`` pair (``conf/pair/tiny.yaml``, loader ``tiny``) builds them
through :func:`mtad.engine.loading.load_model`, which is why they live in the package and not
under ``tests/``; ``tests/conftest.py`` builds its fixtures with :func:`build_tiny_pair`.
"""

from __future__ import annotations

import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    OPTConfig,
    OPTForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
)

# Byte-level tiny tokenizer: ids 0..255 are bytes, then the special tokens.
TINY_BOS, TINY_EOS, TINY_PAD = 256, 257, 258


TINY_TARGET = {"hidden": 64, "layers": 4, "heads": 4, "kv_heads": 2, "ffn": 128}
TINY_DRAFT_LAYERS = 1
TINY_MAX_POSITIONS = 2048  # like OPT's learned positions: the context guard's test case
TINY_SIZES = ("target", "draft")


def _tiny_config(family: str, vocab_size: int, layers: int) -> PretrainedConfig:
    s = TINY_TARGET
    common = dict(
        vocab_size=vocab_size,
        hidden_size=s["hidden"],
        num_hidden_layers=layers,
        num_attention_heads=s["heads"],
        max_position_embeddings=TINY_MAX_POSITIONS,
    )
    if vocab_size > TINY_PAD:  # the byte tokenizer's specials exist only in full-size vocabularies
        common.update(bos_token_id=TINY_BOS, eos_token_id=TINY_EOS, pad_token_id=TINY_PAD)
    else:
        common.update(bos_token_id=None, eos_token_id=None, pad_token_id=None)
    if family == "llama":
        return LlamaConfig(num_key_value_heads=s["kv_heads"], intermediate_size=s["ffn"], **common)
    if family == "opt":
        return OPTConfig(ffn_dim=s["ffn"], word_embed_proj_dim=s["hidden"], **common)
    raise ValueError(f"tiny family must be 'llama' or 'opt', got {family!r}")


def build_tiny_model(
    family: str = "llama", size: str = "target", vocab_size: int = 320, seed: int = 0
) -> PreTrainedModel:
    """A random-init Llama or OPT model for tests; deterministic given ``seed``.

    The ``draft`` of a seed is the ``target`` of that seed cut to its first layer: random layers
    only nudge the residual stream, so the cut model's distributions resemble the target's and
    drafts get accepted at realistic, non-trivial rates (an independent random draft almost
    never agrees with the target).
    """
    if size not in TINY_SIZES:
        raise ValueError(f"tiny size must be one of {TINY_SIZES}, got {size!r}")
    torch.manual_seed(seed)
    cls = LlamaForCausalLM if family == "llama" else OPTForCausalLM
    target = cls(_tiny_config(family, vocab_size, TINY_TARGET["layers"]))
    # Random-init logits are nearly uniform; sharpen them so tests see peaked distributions.
    with torch.no_grad():
        target.get_output_embeddings().weight.mul_(4.0)
    if size == "target":
        return target.eval()
    draft = cls(_tiny_config(family, vocab_size, TINY_DRAFT_LAYERS))
    draft.load_state_dict(target.state_dict(), strict=False)  # layers >= 1 are simply dropped
    return draft.eval()


def build_tiny_pair(
    family: str = "llama", vocab_size: int = 320, seed: int = 0
) -> tuple[PreTrainedModel, PreTrainedModel]:
    """``(target, draft)`` tiny random models of one family sharing a vocabulary."""
    return (
        build_tiny_model(family, "target", vocab_size, seed),
        build_tiny_model(family, "draft", vocab_size, seed),
    )


TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """An offline byte-level tokenizer (259 ids) for the ``tiny`` pair."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_chars = sorted(alphabet, key=lambda ch: _byte_of(ch))
    vocab = {ch: i for i, ch in enumerate(byte_chars)}
    vocab.update({"<s>": TINY_BOS, "</s>": TINY_EOS, "<pad>": TINY_PAD})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    fast.chat_template = TINY_CHAT_TEMPLATE
    return fast


def _byte_of(ch: str) -> int:
    """Inverse of the GPT-2 byte-level alphabet: printable bytes stand for themselves, the
    others for ``chr(256 + n)`` in byte order (Radford et al., 2019)."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    if ord(ch) in printable:
        return ord(ch)
    others = [b for b in range(256) if b not in printable]
    return others[ord(ch) - 256]
