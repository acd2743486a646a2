"""The task interface: samples in, text generations out, scores back.

A run does three things with a :class:`Task`, in two phases so that speed and energy are measured
over decoding only:

1. ``outputs = task.generate(generator, tokenizer)``: every sample of the selected subset
   (``limit`` / ``offset``) is rendered to a prompt (the tokenizer's chat template for chat
   models, raw text otherwise) and decoded by a :class:`~mtad.tasks.generator.TextGenerator`
   wrapping the engine's ``Decoder``; multi-turn samples (MT-Bench) run one generation per turn
   with the history.
2. ``result = score_outputs(task, outputs, target_model)``: the task's downstream score
   (:meth:`Task.score`) plus perplexity under the target
   (:func:`mtad.tasks.quality.score_perplexity`).

Records are flat dicts (one per sample) and metrics a flat dict, so a results table is one
``pandas.DataFrame(result.records)`` away. The samples, generations and results themselves are
:mod:`mtad.tasks.samples`.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from mtad.tasks.params import TaskParams
from mtad.tasks.samples import Generation, Sample, SampleOutput, TaskResult

# mtad.engine and mtad.tasks.quality import torch (seconds): the functions that need them import
# them, because this module is imported where torch is not wanted yet (mtad.harness.config,
# which run.py imports before Hydra composes anything).
if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from mtad.engine import DecodeStats
    from mtad.tasks.generator import TextGenerator


DATA_DIR = Path(__file__).resolve().parent / "data"
CHAT_MODES = ("auto", True, False)
# ``task.protocol`` of the tasks the paper reports: ``authors`` runs a task as the MTAD authors'
# code does (prompt text, data subset, token budget; GitHub ZongyueQin/MTAD src/evaluation.py),
# ``harness`` is this harness's own protocol (chat templates, stop strings, full data sets).
PROTOCOLS = ("authors", "harness")


def check_positive(**values: float) -> None:
    """``task.<key> must be > 0`` for the first of ``values`` that is not, named as the user
    wrote it (not as the code it configures calls it)."""
    for key, value in values.items():
        if not value > 0:
            raise ValueError(f"task.{key} must be > 0, got {value!r}")


def check_protocol(protocol: str) -> str:
    if protocol not in PROTOCOLS:
        raise ValueError(f"task.protocol must be one of {PROTOCOLS}, got {protocol!r}")
    return protocol


def plain_conversation(turns: Sequence[str], answers: Sequence[str], system: str | None) -> str:
    """A chat rendered as plain text, for models without a chat template (base models)."""
    parts = [system.strip() + "\n\n"] if system else []
    for i, turn in enumerate(turns):
        parts.append(f"### User:\n{turn}\n\n### Assistant:\n")
        if i < len(answers):
            parts.append(f"{answers[i]}\n\n")
    return "".join(parts)


class Task(abc.ABC):
    """A downstream task. Subclasses set ``name`` and implement :meth:`load_samples` and
    :meth:`score`; :meth:`run_sample` is the hook for tasks that drive generation differently.

    Common options (every ``conf/task/*.yaml``): ``limit`` / ``offset`` select the subset
    ``samples[offset : offset + limit]`` (part of the run signature), ``chat_template``
    (``auto``: use the tokenizer's chat template when it has one), ``max_new_tokens``.
    """

    name: ClassVar[str]
    # The metrics key of the task's headline score (None: perplexity only), and the field of
    # its per-prompt records whose mean that score is (the paired intervals resample it; None:
    # the score is no per-prompt mean, and its interval is over seeds).
    primary_metric: str | None = None
    score_record: ClassVar[str | None] = None
    # Whether generate() scores with the target model itself (lm-eval's log-likelihoods): the
    # harness then passes it as ``target_model``.
    needs_target_model: ClassVar[bool] = False

    def __init__(
        self,
        *,
        limit: int | None = TaskParams.limit,
        offset: int = TaskParams.offset,
        chat_template: str | bool = TaskParams.chat_template,
        max_new_tokens: int = TaskParams.max_new_tokens,
    ) -> None:
        if limit is not None and limit < 1:
            raise ValueError(f"task.limit must be >= 1 or null (all samples), got {limit}")
        if offset < 0:
            raise ValueError(f"task.offset must be >= 0, got {offset}")
        if chat_template not in CHAT_MODES:
            raise ValueError(f"task.chat_template must be auto, true or false: {chat_template!r}")
        if max_new_tokens < 1:
            raise ValueError(f"task.max_new_tokens must be >= 1, got {max_new_tokens}")
        self.limit = limit
        self.offset = offset
        self.chat_template = chat_template
        self.max_new_tokens = max_new_tokens
        self._samples: list[Sample] | None = None

    # ----------------------------------------------------------------------------- samples

    @abc.abstractmethod
    def load_samples(self) -> list[Sample]:
        """Every sample of the task, in a fixed order."""

    def samples(self) -> list[Sample]:
        """The selected subset (``offset`` / ``limit``)."""
        if self._samples is None:
            everything = self.load_samples()
            end = None if self.limit is None else self.offset + self.limit
            self._samples = everything[self.offset : end]
            if self.offset and not self._samples:
                raise ValueError(
                    f"task.offset: {self.offset} is past the end of {self.name} "
                    f"({len(everything)} samples)"
                )
        return self._samples

    def check_host(self) -> None:  # noqa: B027 - an optional hook, not abstract
        """Checks that need this machine (an interpreter, a tool), run before any model loads
        and skipped when planning runs for another machine. Raise ``ValueError("task.KEY:
        ...")`` naming the key; the default has nothing to check."""

    def signature(self) -> dict[str, Any]:
        """What identifies the evaluated data (goes into the run signature)."""
        return {"task": self.name, "limit": self.limit, "offset": self.offset}

    # ------------------------------------------------------------------------------ prompts

    def use_chat(self, tokenizer: PreTrainedTokenizerBase) -> bool:
        if self.chat_template == "auto":
            return bool(getattr(tokenizer, "chat_template", None))
        if self.chat_template and not getattr(tokenizer, "chat_template", None):
            raise ValueError("task.chat_template is true but the tokenizer has no chat template")
        return bool(self.chat_template)

    def build_prompt(
        self,
        sample: Sample,
        tokenizer: PreTrainedTokenizerBase,
        answers: Sequence[str] = (),
    ) -> tuple[str, bool]:
        """The prompt text for the next turn after ``answers``, and whether the tokenizer should
        add its special tokens (False for chat-templated text, which already carries them)."""
        n = len(answers) + 1
        if self.use_chat(tokenizer):
            messages: list[dict[str, str]] = []
            if sample.system:
                messages.append({"role": "system", "content": sample.system})
            for i, turn in enumerate(sample.turns[:n]):
                messages.append({"role": "user", "content": turn})
                if i < len(answers):
                    messages.append({"role": "assistant", "content": answers[i]})
            text = tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True
            )
            return text + (sample.assistant_prefix if n == len(sample.turns) else ""), False
        if len(sample.turns) == 1:
            return sample.raw_prompt if sample.raw_prompt is not None else sample.turns[0], True
        return plain_conversation(sample.turns[:n], answers, sample.system), True

    # --------------------------------------------------------------------------- generation

    def run_sample(
        self, sample: Sample, generator: TextGenerator, tokenizer: PreTrainedTokenizerBase
    ) -> SampleOutput:
        """Generate every turn of ``sample`` (each turn sees the previous answers)."""
        generations: list[Generation] = []
        for turn in range(len(sample.turns)):
            prompt, special = self.build_prompt(sample, tokenizer, [g.text for g in generations])
            generations.append(
                generator(
                    prompt,
                    max_new_tokens=sample.max_new_tokens,
                    stop=sample.stop,
                    add_special_tokens=special,
                    key=f"{self.name}/{sample.id}/{turn}",
                )
            )
        return SampleOutput(sample, generations)

    def generate(
        self,
        generator: TextGenerator,
        tokenizer: PreTrainedTokenizerBase | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> list[SampleOutput]:
        tokenizer = tokenizer if tokenizer is not None else generator.tokenizer
        samples = self.samples()
        outputs = []
        for i, sample in enumerate(samples):
            outputs.append(self.run_sample(sample, generator, tokenizer))
            if progress is not None:
                progress(i + 1, len(samples))
        return outputs

    # ------------------------------------------------------------------------------ scoring

    @abc.abstractmethod
    def score(self, outputs: Sequence[SampleOutput]) -> TaskResult:
        """Downstream score: one flat record per sample and the aggregate metrics."""

    @staticmethod
    def base_record(output: SampleOutput) -> dict[str, Any]:
        """Id, output text and ``output_tokens``: the tokens kept up to the stop string, what
        is scored (the decoder's ``new_tokens`` count every generated token)."""
        gens = output.generations
        return {
            "id": output.sample.id,
            "output": output.text,
            "output_tokens": sum(len(g.output_ids) for g in gens),
            "stopped_by": gens[-1].stopped_by if gens else "",
        }


def score_outputs(
    task: Task,
    outputs: Sequence[SampleOutput],
    target_model: PreTrainedModel | None = None,
) -> TaskResult:
    """The task's downstream score plus perplexity of every generation under ``target_model``.

    Perplexity counts each generation (each turn of a multi-turn sample) as one sample of the
    authors' per-sample mean; a record's ``mean_logprob`` is the mean over its generations.
    """
    result = task.score(outputs)
    if target_model is None:
        return result
    from mtad.tasks.quality import score_perplexity

    gens = [g for o in outputs for g in o.generations]
    ppl = score_perplexity(target_model, [g.prompt_ids for g in gens], [g.output_ids for g in gens])
    per_gen = iter(ppl.pop("mean_logprob"))
    ppl.pop("n_tokens")
    for record, output in zip(result.records, outputs, strict=True):
        values = [next(per_gen) for _ in output.generations]
        finite = [v for v in values if v == v]  # drop NaN (no generated tokens)
        record["mean_logprob"] = sum(finite) / len(finite) if finite else float("nan")
    result.metrics.update(ppl)
    return result


def total_stats(outputs: Sequence[SampleOutput]) -> DecodeStats:
    """All generations' decoder counters summed."""
    from mtad.engine import DecodeStats

    return DecodeStats.total([g.stats for o in outputs for g in o.generations if g.stats])


def resolve_data_path(path: str | Path) -> Path:
    """``path`` as given when it exists (absolute or relative to the working directory),
    else relative to the shipped data folder ``mtad/tasks/data``."""
    p = Path(path).expanduser()
    if p.is_absolute() or p.exists():
        return p
    return DATA_DIR / p
