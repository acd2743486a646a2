"""Output perplexity under the target model, as SPEC.md defines it.

``ppl`` is the authors' definition (Qin et al., MTAD): for every sample, the mean over its
generated tokens of ``log p_target(token | everything before)``; then
``exp(-mean over samples)``. ``ppl_token_weighted`` is ``exp(-total log-prob / total tokens)``,
which weights long outputs more. Both use the *raw* target distribution (temperature 1, no top-k
or top-p), from one separate teacher-forced forward per sample over prompt + output, whatever
the decoding method did. Samples with no generated token are skipped and counted.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Sequence
from typing import Any

import torch
from transformers import PreTrainedModel


@functools.cache
def _accepts_logits_to_keep(cls: type) -> bool:
    return "logits_to_keep" in inspect.signature(cls.forward).parameters


def max_context(model: PreTrainedModel) -> int | None:
    n = getattr(model.config, "max_position_embeddings", None)
    return int(n) if n else None


@torch.inference_mode()
def continuation_logprobs(
    model: PreTrainedModel,
    context_ids: Sequence[int],
    continuation_ids: Sequence[int],
    max_length: int | None = None,
) -> tuple[torch.Tensor, bool]:
    """Per-token ``log p(cont_i | context, cont_<i)`` under the raw model distribution, and
    whether every continuation token is the model's argmax (lm-eval's ``is_greedy``).

    One forward over ``context + continuation[:-1]``; only the positions that predict the
    continuation are projected to the vocabulary when the model supports ``logits_to_keep``.
    When the sequence exceeds ``max_length`` (default: the model's context) the context is cut
    from the left; a continuation longer than that is an error.
    """
    context = list(context_ids)
    cont = list(continuation_ids)
    if not context:
        raise ValueError("context_ids: at least one token (e.g. BOS) must precede the scored ones")
    if not cont:
        return torch.empty(0), True
    max_length = max_length or max_context(model)
    if max_length is not None and len(context) + len(cont) - 1 > max_length:
        keep = max_length - len(cont) + 1
        if keep < 1:
            raise ValueError(
                f"continuation of {len(cont)} tokens does not fit the model context {max_length}"
            )
        context = context[-keep:]
    device = next(model.parameters()).device
    ids = torch.tensor([context + cont[:-1]], dtype=torch.long, device=device)
    kwargs: dict[str, Any] = {"use_cache": False}
    if _accepts_logits_to_keep(type(model)):
        kwargs["logits_to_keep"] = len(cont)
    logits = model(input_ids=ids, **kwargs).logits[0, -len(cont) :].float()
    logp = torch.log_softmax(logits, dim=-1)
    target = torch.tensor(cont, dtype=torch.long, device=device)
    token_logp = logp.gather(1, target[:, None]).squeeze(1)
    greedy = bool((logits.argmax(-1) == target).all())
    return token_logp.cpu(), greedy


def score_perplexity(
    target_model: PreTrainedModel,
    prompt_ids_list: Sequence[Sequence[int]],
    output_ids_list: Sequence[Sequence[int]],
    max_length: int | None = None,
) -> dict[str, Any]:
    """Perplexity of generated outputs under the target (see the module docstring).

    Returns ``ppl`` (authors' per-sample mean), ``ppl_token_weighted``, ``ppl_samples`` (scored),
    ``ppl_skipped`` (no generated token, or no prompt), and per sample ``mean_logprob`` (NaN when
    skipped) and ``n_tokens``.
    """
    if len(prompt_ids_list) != len(output_ids_list):
        raise ValueError(
            f"{len(prompt_ids_list)} prompts but {len(output_ids_list)} outputs to score"
        )
    means: list[float] = []
    counts: list[int] = []
    total_logp = 0.0
    for prompt_ids, output_ids in zip(prompt_ids_list, output_ids_list, strict=True):
        if not output_ids or not prompt_ids:
            means.append(float("nan"))
            counts.append(0)
            continue
        logp, _ = continuation_logprobs(target_model, prompt_ids, output_ids, max_length)
        means.append(float(logp.double().mean()))
        counts.append(len(output_ids))
        total_logp += float(logp.double().sum())
    scored = [m for m in means if not math.isnan(m)]
    n_tokens = sum(counts)
    return {
        "ppl": math.exp(-sum(scored) / len(scored)) if scored else float("nan"),
        "ppl_token_weighted": math.exp(-total_logp / n_tokens) if n_tokens else float("nan"),
        "ppl_samples": len(scored),
        "ppl_skipped": len(means) - len(scored),
        "mean_logprob": means,
        "n_tokens": counts,
    }
