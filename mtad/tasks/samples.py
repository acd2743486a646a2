"""What flows through a task: a :class:`Sample` (one prompt, one or more turns) in, one
:class:`Generation` per turn out (a :class:`SampleOutput`), and a :class:`TaskResult` (flat
records and metrics) back. :mod:`mtad.tasks.base` is the interface that moves them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Sample:
    """One prompt of a task.

    ``turns`` are the user messages (one for most tasks, two for MT-Bench). ``raw_prompt`` is the
    plain-text prompt used without a chat template (defaults to the first turn), and
    ``assistant_prefix`` is text the assistant's reply starts with in chat mode (e.g. an opened
    code fence), generated from rather than by the model.
    """

    id: str
    turns: list[str]
    raw_prompt: str | None = None
    assistant_prefix: str = ""
    system: str | None = None
    stop: tuple[str, ...] = ()
    max_new_tokens: int = 256
    reference: dict[str, Any] = field(default_factory=dict)


@dataclass
class Generation:
    """One decoded reply.

    ``output_ids`` are the generated tokens up to the one that completes the first stop string
    (or up to EOS / the length limit): what perplexity scores. Tokens a block method emitted past
    the stop string are dropped here so that every method is scored on the same text; they still
    count in ``stats`` (the decoder's speed counters) and in ``n_generated``.
    """

    prompt: str
    text: str
    prompt_ids: list[int]
    output_ids: list[int]
    stopped_by: str
    n_generated: int
    stats: Any = None  # mtad.engine.DecodeStats

    @classmethod
    def from_text(cls, text: str, prompt: str = "") -> Generation:
        """A generation known only by its text (re-scoring saved outputs, tests)."""
        return cls(prompt, text, [], [], "unknown", 0)


@dataclass
class SampleOutput:
    sample: Sample
    generations: list[Generation]

    @property
    def text(self) -> str:
        """The final reply (the last turn's)."""
        return self.generations[-1].text if self.generations else ""

    @classmethod
    def from_texts(cls, sample: Sample, texts: Sequence[str]) -> SampleOutput:
        return cls(sample, [Generation.from_text(t) for t in texts])


@dataclass
class TaskResult:
    records: list[dict[str, Any]]
    metrics: dict[str, Any]
