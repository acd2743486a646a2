"""The perplexity data sets of the paper's first version (Qin et al., arXiv 2407.09722 v1, the
"MJSD" code, GitHub ZongyueQin/MJSD ``evaluation.py``): ChatAlpaca, ChatGPT-prompts and
CNN/DailyMail, loaded through Hugging Face ``datasets``, scored by perplexity and ROUGE.

Where the data comes from (``task.path`` overrides it):

* online: the hub (``MohamedRashad/ChatGPT-prompts``; ``abisee/cnn_dailymail`` 3.0.0, the
  current home of the ``cnn_dailymail`` set the authors load) or, for
  ChatAlpaca, which has no official hub copy, the file the authors' README names
  (``chatalpaca-10k.json`` from GitHub cascip/ChatAlpaca) fetched by ``datasets``' json loader;
* offline (``HF_DATASETS_OFFLINE=1`` / ``HF_HUB_OFFLINE=1``): the same through the HF cache
  (``task.cache_dir`` or the default one), when an earlier online run put it there;
* anywhere: ``task.path``, a local ``.jsonl`` / ``.json`` / ``.parquet`` / ``.csv`` file with
  the source's fields, or a ``save_to_disk`` folder.

When none of these has the data, loading fails with one line that names ``task.path``.

Samples follow the authors' construction: every assistant turn of a ChatAlpaca conversation is
one sample whose prompt is the conversation so far (each turn followed by a newline); a
ChatGPT-prompts sample is its ``human_prompt``; a CNN/DM sample is ``"Summarize: " + article``
(their OPT prefix; ``task.template`` holds their Llama-2 variant in its comment). They feed raw
text (no chat template), 128 new tokens, the first 100 samples, and truncate the prompt to its
first 512 tokens for ChatGPT-prompts and CNN/DM (``max_length=512, truncation=True``).

ROUGE-1/2/L come from Google's ``rouge-score`` package (the implementation behind the
``evaluate`` "rouge" metric the authors call), F-measure, no stemming (``evaluate``'s default),
averaged over samples. ``evaluate`` reports a bootstrap median of that mean; we report the mean
itself, which is deterministic.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import datasets
from rouge_score import rouge_scorer

from mtad.tasks.base import Task
from mtad.tasks.generator import TextGenerator
from mtad.tasks.params import (
    ChatAlpacaParams,
    ChatGPTPromptsParams,
    CNNDailyMailParams,
    PerplexityParams,
)
from mtad.tasks.samples import Sample, SampleOutput, TaskResult

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")
LOCAL_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}


def rouge_scores(predictions: Sequence[str], references: Sequence[str]) -> list[dict[str, float]]:
    """Per-pair ROUGE-1/2/L F-measures by ``rouge_score.rouge_scorer`` (no stemming)."""
    scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=False)
    return [
        {k: s.fmeasure for k, s in scorer.score(ref, pred).items()}
        for pred, ref in zip(predictions, references, strict=True)
    ]


def hf_offline() -> bool:
    """Whether ``datasets`` / the hub client run offline (the variables they read)."""
    flags = ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    return any(os.environ.get(f, "").strip().lower() in ("1", "true", "yes", "on") for f in flags)


class DatasetUnavailable(ValueError):
    """The data set is neither reachable nor cached nor given as ``task.path`` (one line)."""


class HFPerplexityTask(Task):
    """A perplexity data set read through ``datasets``; subclasses name the source and turn its
    rows into samples. The score is ROUGE against the data set's reference text."""

    label: ClassVar[str]
    hub_path: ClassVar[str]  # load_dataset(path=...): a hub name or a builder ("json")
    hub_config: ClassVar[str | None] = None
    hub_data_files: ClassVar[str | None] = None
    # the data set's split, template and truncation (when the options leave them unset)
    params: ClassVar[type[PerplexityParams]] = PerplexityParams
    fields: ClassVar[tuple[str, ...]]  # what a local copy must hold
    primary_metric = "rougeL"
    score_record = "rougeL"

    def __init__(
        self,
        *,
        path: str | None = PerplexityParams.path,
        cache_dir: str | None = PerplexityParams.cache_dir,
        split: str | None = None,  # None: the data set's (self.params)
        template: str | None = None,  # None: the data set's
        max_prompt_tokens: int | None | str = "default",  # "default": the data set's
        max_new_tokens: int = PerplexityParams.max_new_tokens,
        **common: Any,
    ) -> None:
        super().__init__(max_new_tokens=max_new_tokens, **common)
        self.path = path
        self.cache_dir = cache_dir
        self.split = split or self.params.split
        self.template = template if template is not None else self.params.template
        if "{input}" not in self.template:
            raise ValueError(f"task.template must contain {{input}}, got {self.template!r}")
        if max_prompt_tokens == "default":
            max_prompt_tokens = self.params.max_prompt_tokens
        if max_prompt_tokens is not None and int(max_prompt_tokens) < 1:
            raise ValueError(f"task.max_prompt_tokens must be >= 1 or null: {max_prompt_tokens}")
        self.max_prompt_tokens = None if max_prompt_tokens is None else int(max_prompt_tokens)

    # ---------------------------------------------------------------------------- loading

    def load_rows(self) -> list[dict[str, Any]]:
        """The rows of the split, from ``task.path`` or the hub / HF cache."""
        if self.path:
            return self._local_rows(Path(self.path).expanduser())
        try:
            ds = datasets.load_dataset(
                self.hub_path,
                self.hub_config,
                data_files=self.hub_data_files,
                split=self.split,
                cache_dir=self.cache_dir,
            )
        except Exception as err:  # noqa: BLE001 - datasets raises many kinds for "not there"
            where = self.hub_data_files or self.hub_path
            reason = " ".join(str(err).split())[:160] or type(err).__name__
            mode = (
                "offline (HF_DATASETS_OFFLINE/HF_HUB_OFFLINE set) and not in the HF cache"
                if hf_offline()
                else "could not be loaded"
            )
            raise DatasetUnavailable(
                f"task.path: {self.label} ({where}) is {mode} [{type(err).__name__}: {reason}]; "
                f"set task.path to a local copy (.jsonl/.json/.parquet/.csv with fields "
                f"{', '.join(self.fields)}, or a save_to_disk folder)"
            ) from err
        return [dict(row) for row in ds]

    def _local_rows(self, path: Path) -> list[dict[str, Any]]:
        if not path.exists():
            raise DatasetUnavailable(f"task.path: {path} does not exist (a copy of {self.label})")
        if path.is_dir():
            ds = datasets.load_from_disk(str(path))
            if isinstance(ds, datasets.DatasetDict):
                ds = ds[self.split]
        else:
            builder = LOCAL_BUILDERS.get(path.suffix.lower())
            if builder is None:
                raise DatasetUnavailable(
                    f"task.path: {path.name} is not one of {sorted(LOCAL_BUILDERS)} "
                    "nor a save_to_disk folder"
                )
            ds = datasets.load_dataset(
                builder, data_files=str(path), split="train", cache_dir=self.cache_dir
            )
        missing = [f for f in self.fields if f not in ds.column_names]
        if missing:
            raise DatasetUnavailable(
                f"task.path: {path} lacks field(s) {missing} of {self.label} "
                f"(has {ds.column_names})"
            )
        return [dict(row) for row in ds]

    def load_samples(self) -> list[Sample]:
        return self.rows_to_samples(self.load_rows())

    def rows_to_samples(self, rows: list[dict[str, Any]]) -> list[Sample]:
        raise NotImplementedError

    def sample(self, sid: str, text: str, reference: str) -> Sample:
        return Sample(
            id=sid,
            turns=[self.template.format(input=text)],
            max_new_tokens=self.max_new_tokens,
            reference={"text": reference},
        )

    def signature(self) -> dict[str, Any]:
        source = self.path or self.hub_data_files or self.hub_path
        return {
            **super().signature(),
            "source": str(source),
            "split": self.split,
            "template": self.template,
            "max_prompt_tokens": self.max_prompt_tokens,
        }

    # ------------------------------------------------------------------------- generation

    def run_sample(self, sample: Sample, generator: TextGenerator, tokenizer: Any) -> SampleOutput:
        """As :meth:`Task.run_sample`, with the prompt cut to its first ``max_prompt_tokens``
        tokens the way the authors' ``tokenizer.encode(..., max_length=512, truncation=True)``
        cuts it (the head is kept). The cut prompt is decoded back to text, so the kept part
        is re-tokenized: identical for the usual tokenizers, not guaranteed for every one."""
        if self.max_prompt_tokens is not None:
            if self.use_chat(tokenizer):  # a template would wrap the cut text again
                raise ValueError("task.max_prompt_tokens: cutting needs chat_template=false")
            prompt, special = self.build_prompt(sample, tokenizer)
            ids = tokenizer(prompt, add_special_tokens=special)["input_ids"]
            if len(ids) > self.max_prompt_tokens:
                head = tokenizer.decode(ids[: self.max_prompt_tokens], skip_special_tokens=True)
                sample = Sample(
                    id=sample.id,
                    turns=[head],
                    max_new_tokens=sample.max_new_tokens,
                    reference=sample.reference,
                )
        return super().run_sample(sample, generator, tokenizer)

    # ---------------------------------------------------------------------------- scoring

    def score(self, outputs: Sequence[SampleOutput]) -> TaskResult:
        refs = [o.sample.reference["text"] for o in outputs]
        per = rouge_scores([o.text for o in outputs], refs)
        records = [{**self.base_record(o), **s} for o, s in zip(outputs, per, strict=True)]
        n = len(records)
        metrics: dict[str, Any] = {f"{self.name}_n": n}
        for key in ROUGE_TYPES:
            metrics[key] = sum(s[key] for s in per) / n if n else float("nan")
        return TaskResult(records, metrics)


class ChatAlpacaTask(HFPerplexityTask):
    """ChatAlpaca 10k (multi-turn chats): one sample per assistant turn, prompted with the
    conversation so far, the turn's reply as ROUGE reference."""

    name = "chatalpaca"
    label = "ChatAlpaca-10k"
    hub_path = "json"
    hub_data_files = (
        "https://raw.githubusercontent.com/cascip/ChatAlpaca/main/data/chatalpaca-10k.json"
    )
    params = ChatAlpacaParams
    fields = ("conversations",)
    primary_metric = None  # the v1 paper reports perplexity on it; ROUGE is recorded
    score_record = None

    def rows_to_samples(self, rows: list[dict[str, Any]]) -> list[Sample]:
        samples = []
        for c, row in enumerate(rows):
            history = ""
            for t, turn in enumerate(row["conversations"]):
                if turn["from"] != "human":
                    samples.append(self.sample(f"{row.get('id', c)}/{t}", history, turn["value"]))
                history += turn["value"] + "\n"
        return samples


class ChatGPTPromptsTask(HFPerplexityTask):
    """ChatGPT-prompts (``MohamedRashad/ChatGPT-prompts``): a human prompt, ChatGPT's answer as
    ROUGE reference."""

    name = "chatgpt_prompts"
    label = "ChatGPT-prompts"
    hub_path = "MohamedRashad/ChatGPT-prompts"
    params = ChatGPTPromptsParams
    fields = ("human_prompt", "chatgpt_response")
    primary_metric = None
    score_record = None

    def rows_to_samples(self, rows: list[dict[str, Any]]) -> list[Sample]:
        return [
            self.sample(str(i), row["human_prompt"], row["chatgpt_response"])
            for i, row in enumerate(rows)
        ]


class CNNDailyMailTask(HFPerplexityTask):
    """CNN/DailyMail 3.0.0 test split: summarise the article, highlights as ROUGE reference."""

    name = "cnn_dailymail"
    label = "CNN/DailyMail 3.0.0"
    hub_path = "abisee/cnn_dailymail"
    hub_config = "3.0.0"
    params = CNNDailyMailParams
    fields = ("article", "highlights")

    def rows_to_samples(self, rows: list[dict[str, Any]]) -> list[Sample]:
        return [
            self.sample(str(row.get("id", i)), row["article"], row["highlights"])
            for i, row in enumerate(rows)
        ]
