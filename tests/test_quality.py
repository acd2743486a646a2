"""Perplexity: the authors' per-sample mean and the token-weighted variant, raw target
distribution, one teacher-forced forward per sample."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from mtad.tasks.quality import continuation_logprobs, score_perplexity

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=50,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    m = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        m.lm_head.weight.mul_(5.0)  # peaked distributions, so errors would show
    return m


def _reference_logprobs(model: LlamaForCausalLM, prompt: list[int], out: list[int]) -> list[float]:
    """Token by token, from the full logits of the whole sequence."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + out])).logits[0].double()
    logp = torch.log_softmax(logits, -1)
    return [float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(out)]


def test_continuation_logprobs_match_full_forward(model: LlamaForCausalLM) -> None:
    prompt, out = [1, 5, 7, 9], [3, 4, 11, 2]
    logp, greedy = continuation_logprobs(model, prompt, out)
    assert logp.tolist() == pytest.approx(_reference_logprobs(model, prompt, out), abs=1e-5)
    with torch.no_grad():
        argmax = model(torch.tensor([prompt])).logits[0, -1].argmax().item()
    assert continuation_logprobs(model, prompt, [argmax])[1] is True
    assert isinstance(greedy, bool)


def test_both_definitions_and_skipped_samples(model: LlamaForCausalLM) -> None:
    prompts = [[1, 2, 3], [4, 5], [6], [7, 8]]
    outputs = [[10, 11], [12, 13, 14, 15, 16, 17], [], [20]]
    res = score_perplexity(model, prompts, outputs)
    per = [_reference_logprobs(model, p, o) for p, o in zip(prompts, outputs, strict=True) if o]
    means = [sum(lp) / len(lp) for lp in per]
    assert res["ppl"] == pytest.approx(math.exp(-sum(means) / len(means)), rel=1e-5)
    flat = [x for lp in per for x in lp]
    assert res["ppl_token_weighted"] == pytest.approx(math.exp(-sum(flat) / len(flat)), rel=1e-5)
    assert res["ppl"] != pytest.approx(res["ppl_token_weighted"], rel=1e-3)
    assert res["ppl_samples"] == 3 and res["ppl_skipped"] == 1
    assert math.isnan(res["mean_logprob"][2]) and res["n_tokens"] == [2, 6, 0, 1]


def test_context_overflow_cuts_the_prompt_from_the_left(model: LlamaForCausalLM) -> None:
    prompt, out = list(range(1, 40)), [3, 4, 5]
    logp, _ = continuation_logprobs(model, prompt, out, max_length=10)
    expected = _reference_logprobs(model, prompt[-(10 - len(out) + 1) :], out)
    assert logp.tolist() == pytest.approx(expected, abs=1e-5)
    with pytest.raises(ValueError, match="does not fit"):
        continuation_logprobs(model, prompt, list(range(20)), max_length=10)


def test_no_scored_tokens_gives_nan(model: LlamaForCausalLM) -> None:
    res = score_perplexity(model, [[1]], [[]])
    assert math.isnan(res["ppl"]) and res["ppl_skipped"] == 1
