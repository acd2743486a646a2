"""EOS ids: the tokenizer's plus the generation config's, one sorted list."""

from __future__ import annotations

from types import SimpleNamespace as NS

from mtad.tokens import eos_token_ids


def test_eos_ids_join_the_tokenizer_and_the_generation_config() -> None:
    chat = NS(generation_config=NS(eos_token_id=[7, 2]))  # end-of-turn ids live here
    assert eos_token_ids(NS(eos_token_id=2), chat) == [2, 7]
    assert eos_token_ids(NS(eos_token_id=None), NS(generation_config=NS(eos_token_id=5))) == [5]
    assert eos_token_ids(NS(eos_token_id=3), NS(generation_config=None)) == [3]
    assert eos_token_ids(NS(), NS()) == []
