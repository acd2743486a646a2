"""Record every forward of a :class:`~mtad.engine.runner.ModelRunner` (test helper).

``traced(runner)`` wraps the runner's ``forward`` and ``feed_tree`` on that instance only (``feed``
goes through ``forward``) and returns the list the records are appended to; ``untraced(runner)``
restores the class methods. Tests compare each record's logits with a fresh no-cache forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mtad.engine.runner import ModelRunner


@dataclass
class ForwardRecord:
    """One traced forward: every row's full context after the forward, and the kept logits.

    For a tree forward, ``paths[i]`` is the context (root to node) of kept position ``i``.
    """

    context_ids: torch.Tensor  # [rows, cache_len_after]
    logits: torch.Tensor  # [rows, kept, vocab]
    paths: list[torch.Tensor] | None = None


def traced(runner: ModelRunner) -> list[ForwardRecord]:
    records: list[ForwardRecord] = []
    forward, feed_tree = runner.forward, runner.feed_tree

    def traced_forward(
        input_ids: torch.Tensor, keep: int = 0, compact: bool = False
    ) -> torch.Tensor:
        logits = forward(input_ids, keep, compact)
        records.append(ForwardRecord(runner.cached_ids.clone(), logits.detach().clone()))
        return logits

    def traced_feed_tree(ids, tokens, parents, depths) -> torch.Tensor:
        logits = feed_tree(ids, tokens, parents, depths)
        n = tokens.numel()
        committed = runner.cached_ids[0, : runner.cache_len - n]
        paths = [committed]
        for i in range(n):  # root-to-node path of node i, from the parent links
            chain, j = [], i
            while j >= 0:
                chain.append(tokens[j])
                j = int(parents[j])
            paths.append(torch.cat([committed, torch.stack(chain[::-1])]))
        records.append(ForwardRecord(runner.cached_ids.clone(), logits[None].clone(), paths))
        return logits

    runner.forward = traced_forward  # type: ignore[method-assign]
    runner.feed_tree = traced_feed_tree  # type: ignore[method-assign]
    return records


def untraced(runner: ModelRunner) -> None:
    for name in ("forward", "feed_tree"):
        runner.__dict__.pop(name, None)
