"""The decoding loop every method shares: counters, time split, EOS / length handling.

A method is a :class:`DecodingMethod` whose :meth:`~DecodingMethod.step` proposes and verifies one
block and returns the tokens it commits (accepted draft tokens plus one token from the target).
The :class:`Decoder` owns everything else, written once: the committed-id buffer, the seeded
generator, the cache resets, truncation at EOS and ``max_new_tokens``, and the statistics that
Spec-Bench-style reports need (``new_tokens``, ``wall_time``, ``accept_lengths``).

Hot-path rule (after gpt-fast's ``speculative_decode``): a step computes acceptance and the next
token on tensors and reads them with a single host sync (the accepted length and the committed
tokens together, handed over as :attr:`StepResult.token_ids`, so that the commit reads nothing
again); rollbacks are cache crops, never copies. ``tests/host_syncs.py`` counts the reads.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, NamedTuple, get_args

import torch

from mtad.engine.loading import model_devices
from mtad.engine.runner import ModelRunner, check_same_vocab

if TYPE_CHECKING:
    from mtad.engine.draft_runner import DraftRunner


# The phases a step's wall time is split into (SPEC: draft / verify / other, "other" being the
# rest of the wall time), and the DecodeStats field each one is booked to. A closed type, checked
# at the call: a misspelt phase raises instead of landing in another phase's time.
Phase = Literal["draft", "verify"]
PHASE_TIMES: dict[str, str] = {"draft": "time_draft", "verify": "time_verify"}
assert set(PHASE_TIMES) == set(get_args(Phase))


@dataclass
class StepResult:
    """What one iteration commits: ``tokens`` = ``accepted`` draft tokens + 1 target token.

    ``drafted`` and ``accepted`` are *depths*: the number of draft positions proposed along one
    path and how many of them the target accepted (for a tree, the tree depth and the depth of
    the accepted node). ``drafted_nodes`` is the number of draft tokens the target scored (the
    tree size; ``None`` means a single path, ``== drafted``). Depths make ``acceptance_rate``
    comparable across linear and tree methods; nodes give the tree methods' per-node rate.
    """

    tokens: torch.Tensor  # 1-D
    drafted: int
    accepted: int
    drafted_nodes: int | None = None
    # ``tokens`` as host ints, when the step has read them already (with its accepted length,
    # in its one host read): the commit then reads the device no second time
    token_ids: list[int] | None = None


@dataclass
class DecodeStats:
    """Counters and times of one or more generations (sum them with :meth:`total`).

    ``drafted`` / ``accepted`` sum each iteration's drafted and accepted *depth* (see
    :class:`StepResult`), ``accepted`` counted *before* EOS / token-budget truncation, as the
    reference implementation counts it (ZongyueQin/MTAD ``src/inference/generate.py``:
    ``acceptance_count`` sums the verifier's accepted lengths, ``draft_token_count`` is
    iterations x the draft depth ``max_draft_len``, for chains and trees alike): an accepted
    draft token that the budget or an EOS cuts off was still accepted by the target.
    ``accept_lengths`` are the *committed* lengths (after truncation), so that
    ``new_tokens == sum(a + 1 for a in accept_lengths)`` holds for every method.
    ``drafted_nodes`` counts every drafted token the target scored (tree size for SpecInfer /
    MMTAD), for :attr:`node_acceptance_rate`.
    """

    new_tokens: int = 0
    iterations: int = 0
    target_forwards: int = 0
    draft_forwards: int = 0
    drafted: int = 0
    accepted: int = 0
    drafted_nodes: int = 0
    time_draft: float = 0.0
    time_verify: float = 0.0
    wall_time: float = 0.0
    accept_lengths: list[int] = field(default_factory=list)
    # per iteration, before truncation: drafted and accepted depth (the per-depth view)
    draft_depths: list[int] = field(default_factory=list)
    accept_depths: list[int] = field(default_factory=list)

    @property
    def time_other(self) -> float:
        return max(0.0, self.wall_time - self.time_draft - self.time_verify)

    @property
    def acceptance_rate(self) -> float:
        """Accepted depth / drafted depth (NaN for methods that draft nothing)."""
        return self.accepted / self.drafted if self.drafted else float("nan")

    @property
    def node_acceptance_rate(self) -> float:
        """Accepted tokens / drafted tokens scored by the target: the tree methods' per-node
        rate (equals :attr:`acceptance_rate` for single-path methods)."""
        return self.accepted / self.drafted_nodes if self.drafted_nodes else float("nan")

    @property
    def block_efficiency(self) -> float:
        return self.new_tokens / self.target_forwards if self.target_forwards else float("nan")

    @property
    def mean_accepted(self) -> float:
        """Mean accepted depth per iteration (before truncation, like ``accepted``)."""
        return self.accepted / self.iterations if self.iterations else float("nan")

    @property
    def accept_histogram(self) -> list[int]:
        """Iterations by accepted depth: ``[n accepting 0, n accepting 1, ...]`` (before
        EOS / budget truncation), up to the deepest drafted depth."""
        top = max(self.draft_depths, default=0)
        hist = [0] * (top + 1)
        for a in self.accept_depths:
            hist[a] += 1
        return hist

    @property
    def depth_acceptance(self) -> list[float]:
        """Acceptance at each draft depth ``d = 1, 2, ...``: of the iterations that drafted at
        least ``d`` positions and accepted the first ``d - 1``, the share that accepted the
        ``d``-th too -- where along the block a draft fails (NaN where no iteration got there)."""
        top = max(self.draft_depths, default=0)
        out = []
        for d in range(1, top + 1):
            reached = sum(
                1
                for g, a in zip(self.draft_depths, self.accept_depths, strict=True)
                if g >= d and a >= d - 1
            )
            passed = sum(1 for a in self.accept_depths if a >= d)
            out.append(passed / reached if reached else float("nan"))
        return out

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_time if self.wall_time else float("nan")

    @property
    def ms_per_token(self) -> float:
        return 1e3 * self.wall_time / self.new_tokens if self.new_tokens else float("nan")

    def as_dict(self, with_lengths: bool = False) -> dict[str, Any]:
        d = asdict(self)
        if not with_lengths:
            for name in ("accept_lengths", "draft_depths", "accept_depths"):
                d.pop(name)
        for name in (
            "accept_histogram",
            "depth_acceptance",
            "time_other",
            "acceptance_rate",
            "node_acceptance_rate",
            "block_efficiency",
            "mean_accepted",
            "tokens_per_s",
            "ms_per_token",
        ):
            d[name] = getattr(self, name)
        return d

    @classmethod
    def total(cls, parts: Sequence[DecodeStats]) -> DecodeStats:
        out = cls()
        for p in parts:
            for name in (
                "new_tokens",
                "iterations",
                "target_forwards",
                "draft_forwards",
                "drafted",
                "accepted",
                "drafted_nodes",
                "time_draft",
                "time_verify",
                "wall_time",
            ):
                setattr(out, name, getattr(out, name) + getattr(p, name))
            out.accept_lengths.extend(p.accept_lengths)
            out.draft_depths.extend(p.draft_depths)
            out.accept_depths.extend(p.accept_depths)
        return out


@dataclass
class GenerationOutput:
    token_ids: list[int]
    stats: DecodeStats
    stopped_by: str  # "eos" | "max_new_tokens" | "stop"


def cuda_devices(*runners: DraftRunner | None) -> tuple[torch.device, ...]:
    """The GPUs holding the runners' weights (:func:`mtad.engine.loading.model_devices`)."""
    found = {d for r in runners if r is not None for d in model_devices(r.model)}
    return tuple(torch.device(d) for d in sorted(found) if d.startswith("cuda"))


def synchronize(gpus: Sequence[torch.device]) -> None:
    """Wait for the work queued on each of ``gpus`` (no-op on the CPU)."""
    for gpu in gpus:
        torch.cuda.synchronize(gpu)


class DecodeContext:
    """Per-generation state handed to :meth:`DecodingMethod.step`."""

    def __init__(
        self,
        target: ModelRunner,
        draft: DraftRunner | None,
        prompt: torch.Tensor,
        capacity: int,
        generator: torch.Generator,
        stats: DecodeStats,
    ) -> None:
        self.target = target
        self.draft = draft
        self.generator = generator
        self.stats = stats
        self.buffer = torch.empty(capacity, dtype=torch.long, device=target.device)
        self.buffer[: prompt.numel()] = prompt
        self.n = prompt.numel()
        # every GPU either model runs on (a target spread by device_map holds several; the
        # draft may sit on another): the time split waits for each, not torch's current device
        self.gpus = cuda_devices(target, draft)

    @property
    def ids(self) -> torch.Tensor:
        """The committed sequence (prompt + generated so far), 1-D."""
        return self.buffer[: self.n]

    @contextmanager
    def timed(self, phase: Phase) -> Iterator[None]:
        """Attribute the enclosed wall time to ``phase`` (:data:`Phase`); any other name raises
        ``ValueError`` before the block runs."""
        booked = PHASE_TIMES.get(phase)
        if booked is None:
            raise ValueError(f"phase must be one of {tuple(PHASE_TIMES)}, got {phase!r}")
        start = time.perf_counter()
        try:
            yield
        finally:
            synchronize(self.gpus)
            elapsed = time.perf_counter() - start
            setattr(self.stats, booked, getattr(self.stats, booked) + elapsed)


class DraftDepth(NamedTuple):
    """How deep a method drafts per step, and the parameter (``method.<key>``) that sets it:
    the preflight refuses a depth past the task's token budget (drafted tokens that can never
    be kept, and minutes of work for a large one)."""

    key: str
    tokens: int


class DecodingMethod(ABC):
    """One decoding algorithm. Subclasses set ``name``/``uses_draft``, say how deep they draft
    (:meth:`draft_depth`) and implement ``step``."""

    name: ClassVar[str]
    uses_draft: ClassVar[bool] = False
    # Tokens a step commits after its drafted depth: the target's own token (the bonus or the
    # resampled one). MTJD sets 0: its block is drawn from the target itself and kept whole.
    tokens_after_draft: ClassVar[int] = 1

    @abstractmethod
    def draft_depth(self) -> DraftDepth | None:
        """The depth one step drafts (None: nothing drafted, one target token per step)."""

    @property
    def max_step_tokens(self) -> int:
        """Upper bound on tokens one step can commit (sizes the id buffer and the context
        check): the drafted depth plus :attr:`tokens_after_draft`."""
        depth = self.draft_depth()
        return (0 if depth is None else depth.tokens) + self.tokens_after_draft

    @abstractmethod
    def step(self, ctx: DecodeContext) -> StepResult: ...

    def check_models(self, target: ModelRunner, draft: DraftRunner | None) -> None:
        if self.uses_draft:
            if draft is None:
                raise ValueError(f"draft: method {self.name!r} needs a draft model")
            check_same_vocab(target.vocab_size, draft.vocab_size)


class ContextOverflow(ValueError):
    """A prompt plus its token budget does not fit a model's context (positions)."""


class Decoder:
    """Runs a :class:`DecodingMethod` on a target (and draft) for one prompt at a time."""

    def __init__(
        self,
        method: DecodingMethod,
        target: ModelRunner,
        draft: DraftRunner | None = None,
        eos_token_ids: Sequence[int] = (),
        seed: int = 0,
    ) -> None:
        method.check_models(target, draft)
        self.method = method
        self.target = target
        self.draft = draft if method.uses_draft else None
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self.seed = seed

    def generate(
        self,
        prompt_ids: Sequence[int] | torch.Tensor,
        max_new_tokens: int,
        seed: int | None = None,
        should_stop: Callable[[list[int]], bool] | None = None,
    ) -> GenerationOutput:
        prompt = torch.as_tensor(prompt_ids, dtype=torch.long).flatten().to(self.target.device)
        if prompt.numel() == 0:
            raise ValueError("prompt_ids: the prompt is empty; at least one token is needed")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        generator = torch.Generator(device=self.target.device)
        generator.manual_seed(self.seed if seed is None else seed)
        for runner in (self.target, self.draft):
            if runner is not None:
                runner.reset()
        stats = DecodeStats()
        capacity = prompt.numel() + max_new_tokens + self.method.max_step_tokens
        self._check_context(prompt.numel(), max_new_tokens, capacity)
        ctx = DecodeContext(self.target, self.draft, prompt, capacity, generator, stats)
        new: list[int] = []
        stopped_by = "max_new_tokens"
        start = time.perf_counter()
        if self.draft is not None and self.draft.reads_target_features and prompt.numel() > 1:
            # A feature-level head drafts from the target's hidden states: the target reads the
            # prompt (all but its last token, as every first forward would) before the first
            # draft, as EAGLE's generation starts. One more target forward per generation, counted.
            with ctx.timed("verify"):
                self.target.feed(prompt[:-1])
        while len(new) < max_new_tokens:
            result = self.method.step(ctx)
            committed = self._commit(ctx, result, new, max_new_tokens)
            if committed and committed[-1] in self.eos_token_ids:
                stopped_by = "eos"
                break
            if should_stop is not None and should_stop(new):
                stopped_by = "stop"
                break
        synchronize(ctx.gpus)
        stats.wall_time = time.perf_counter() - start
        stats.target_forwards = self.target.forwards
        stats.draft_forwards = self.draft.forwards if self.draft is not None else 0
        return GenerationOutput(new, stats, stopped_by)

    def _check_context(self, prompt_len: int, max_new_tokens: int, capacity: int) -> None:
        """Refuse, before any forward, a generation that could run past a model's context."""
        for runner in (self.target, self.draft):
            limit = None if runner is None else runner.context_limit
            if limit is not None and capacity > limit:
                raise ContextOverflow(
                    f"prompt of {prompt_len} tokens + max_new_tokens={max_new_tokens} + a block "
                    f"of {self.method.max_step_tokens} exceed the {limit}-position context of "
                    f"the {runner.role}"
                )

    def _commit(
        self, ctx: DecodeContext, result: StepResult, new: list[int], max_new_tokens: int
    ) -> list[int]:
        """Append a step's tokens, cut at the first EOS and at ``max_new_tokens``.

        Every method goes through here, so EOS and length limits mean the same for all. When a
        cut drops tokens, ``new_tokens`` and ``accept_lengths`` keep only what was committed
        (``committed - 1`` accepted, so ``new_tokens == sum(a + 1)`` holds per iteration), while
        ``accepted`` keeps the verifier's accepted depth: acceptance is a property of draft and
        target, not of where the output happened to end.
        """
        ids = result.token_ids if result.token_ids is not None else result.tokens.tolist()
        tokens = ids[: max_new_tokens - len(new)]
        for i, tok in enumerate(tokens):
            if tok in self.eos_token_ids:
                tokens = tokens[: i + 1]
                break
        m = len(tokens)
        ctx.buffer[ctx.n : ctx.n + m] = result.tokens[:m]
        ctx.n += m
        new.extend(tokens)
        s = ctx.stats
        s.iterations += 1
        s.new_tokens += m
        s.drafted += result.drafted
        s.accepted += result.accepted
        s.drafted_nodes += result.drafted if result.drafted_nodes is None else result.drafted_nodes
        s.accept_lengths.append(min(result.accepted, m - 1))
        s.draft_depths.append(result.drafted)
        s.accept_depths.append(result.accepted)
        return tokens
