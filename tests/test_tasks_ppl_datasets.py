"""The v1 perplexity data sets (ChatAlpaca, ChatGPT-prompts, CNN/DailyMail) through ``datasets``:
local fixture files load, ROUGE equals rouge-score's own numbers, and offline without data the
error is one line naming ``task.path``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from scripted import ScriptedDecoder

from mtad.engine.tiny import build_tiny_tokenizer
from mtad.tasks import build_task
from mtad.tasks.generator import TextGenerator
from mtad.tasks.ppl_datasets import DatasetUnavailable, rouge_scores
from mtad.tasks.samples import SampleOutput

FIXTURES = Path(__file__).resolve().parent / "data" / "ppl"
NAMES = ("chatalpaca", "chatgpt_prompts", "cnn_dailymail")


def make(name: str, tmp_path: Path, **options) -> object:
    return build_task(
        {
            "name": name,
            "path": str(FIXTURES / f"{name}.jsonl"),
            "cache_dir": str(tmp_path / "hf"),
            "chat_template": False,
            **options,
        }
    )


def rows(name: str) -> list[dict]:
    return [json.loads(x) for x in (FIXTURES / f"{name}.jsonl").read_text().splitlines()]


def test_chatalpaca_one_sample_per_reply_with_the_chat_so_far(tmp_path: Path) -> None:
    samples = make("chatalpaca", tmp_path).samples()
    assert [s.id for s in samples] == ["c1/1", "c1/3", "c2/1"]
    conv = rows("chatalpaca")[0]["conversations"]
    assert samples[0].turns == [conv[0]["value"] + "\n"]
    assert samples[1].turns == ["".join(t["value"] + "\n" for t in conv[:3])]
    assert samples[1].reference == {"text": conv[3]["value"]}
    assert all(s.max_new_tokens == 128 for s in samples)


def test_chatgpt_prompts_and_cnn_dailymail_load_from_local_files(tmp_path: Path) -> None:
    gpt = make("chatgpt_prompts", tmp_path).samples()
    assert [s.turns[0] for s in gpt] == [r["human_prompt"] for r in rows("chatgpt_prompts")]
    cnn = make("cnn_dailymail", tmp_path, limit=2).samples()
    first = rows("cnn_dailymail")[0]
    assert cnn[0].id == "a1" and len(cnn) == 2
    assert cnn[0].turns == ["Summarize: " + first["article"]]
    assert cnn[0].reference == {"text": first["highlights"]}


@pytest.mark.parametrize("name", NAMES)
def test_offline_without_data_is_one_line_naming_the_override(name: str, tmp_path: Path) -> None:
    # conftest sets HF_DATASETS_OFFLINE / HF_HUB_OFFLINE; the cache here is empty
    task = build_task({"name": name, "cache_dir": str(tmp_path / "empty")})
    with pytest.raises(DatasetUnavailable) as info:
        task.samples()
    msg = str(info.value)
    assert msg.startswith("task.path: ") and "\n" not in msg and "offline" in msg


def test_missing_or_malformed_local_copy(tmp_path: Path) -> None:
    with pytest.raises(DatasetUnavailable, match="does not exist"):
        build_task({"name": "cnn_dailymail", "path": str(tmp_path / "no.jsonl")}).samples()
    wrong = tmp_path / "wrong.jsonl"
    wrong.write_text('{"text": "hi"}\n')
    with pytest.raises(DatasetUnavailable, match="highlights"):
        build_task(
            {"name": "cnn_dailymail", "path": str(wrong), "cache_dir": str(tmp_path / "c")}
        ).samples()


def test_save_to_disk_folder_loads(tmp_path: Path) -> None:
    import datasets

    folder = tmp_path / "saved"
    datasets.Dataset.from_list(rows("chatgpt_prompts")).save_to_disk(str(folder))
    task = build_task({"name": "chatgpt_prompts", "path": str(folder)})
    assert len(task.samples()) == 3


def test_rouge_equals_rouge_score_on_the_fixture(tmp_path: Path) -> None:
    from rouge_score import rouge_scorer

    task = make("cnn_dailymail", tmp_path)
    samples = task.samples()
    preds = [
        "The council voted to open a new library by the river next spring.",
        "A runner beat her record in the marathon.",
        "",
    ]
    outputs = [SampleOutput.from_texts(s, [p]) for s, p in zip(samples, preds, strict=True)]
    res = task.score(outputs)
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=False)
    theirs = [scorer.score(s.reference["text"], p) for s, p in zip(samples, preds, strict=True)]
    for key in ("rouge1", "rouge2", "rougeL"):
        expected = sum(t[key].fmeasure for t in theirs) / len(theirs)
        assert res.metrics[key] == expected  # the same computation, not merely close
        assert [r[key] for r in res.records] == [t[key].fmeasure for t in theirs]
    assert 0 < res.metrics["rouge1"] < 1 and res.records[2]["rouge1"] == 0.0
    assert rouge_scores(["a b"], ["a b"])[0]["rougeL"] == 1.0


def test_prompt_is_cut_to_its_head_and_generated(tmp_path: Path) -> None:
    tok = build_tiny_tokenizer()
    task = make("cnn_dailymail", tmp_path, max_prompt_tokens=20, limit=1)
    decoder = ScriptedDecoder(tok, "A summary.")
    out = task.generate(TextGenerator(decoder, tok), tok)
    full = tok("Summarize: " + rows("cnn_dailymail")[0]["article"])["input_ids"]
    assert decoder.calls[0]["prompt_ids"] == full[:20]  # the head, as truncation=True keeps
    assert out[0].text == "A summary."
    with pytest.raises(ValueError, match="chat_template"):
        chat = make("cnn_dailymail", tmp_path, max_prompt_tokens=20, chat_template=True)
        chat.generate(TextGenerator(decoder, tok), tok)
