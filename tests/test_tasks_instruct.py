"""The ``instruct`` task: IFEval's verifiers on the generated prompt set (rebuilt identically,
disjoint from every shipped draft's training text) and on IFEval-format files and hub rows."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mtad.tasks import build_task, ifeval_rules, instruct_data
from mtad.tasks.instruct import InstructTask, instruct_metrics
from mtad.tasks.samples import SampleOutput

REPO = Path(__file__).resolve().parents[1]
# Every shipped draft's training ids (the data.npz layout: tokens, lens, plens).
TRAINING_IDS = (
    REPO / "assets" / "drafts" / "smollm2-draft" / "data.npz",
    REPO / "assets" / "drafts" / "smollm2-head" / "corpus.npz",
)


def _ifeval_row(key, prompt, ids, kwargs):
    return {"key": key, "prompt": prompt, "instruction_id_list": ids, "kwargs": kwargs}


def test_generated_set_rebuilds_identically_and_is_big_enough():
    text = instruct_data.render(instruct_data.build())
    assert instruct_data.DATA_FILE.read_text(encoding="utf-8") == text
    rows = [json.loads(line) for line in text.splitlines()]
    assert len(rows) >= 300 and len({r["prompt"] for r in rows}) == len(rows)
    kinds = {k for r in rows for k in r["instruction_id_list"]}
    assert kinds == set(instruct_data.INSTRUCTION_TYPES)
    assert not kinds & ifeval_rules.PUNKT_INSTRUCTIONS  # checkable without nltk data
    assert sum(len(r["instruction_id_list"]) == 2 for r in rows) > len(rows) // 5


def test_the_command_line_check_mode_agrees(tmp_path):
    """``scripts/instruct_data.py`` (the package has no command line, it imports no argparse)
    writes the set and --check compares a file with a rebuild."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "instruct_data_script", REPO / "scripts" / "instruct_data.py"
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / "p.jsonl"
    assert script.main(["--out", str(out)]) == 0
    assert out.read_bytes() == instruct_data.DATA_FILE.read_bytes()
    assert script.main(["--check", "--out", str(out)]) == 0
    out.write_text(out.read_text()[:-2] + "\n")
    assert script.main(["--check", "--out", str(out)]) == 1


def _training_texts():
    from transformers import AutoTokenizer

    from mtad.engine import smollm2

    try:
        folder = smollm2.convert_gguf(verbose=False)
    except smollm2.SmolLM2Unavailable as err:
        pytest.skip(f"SmolLM2 tokenizer unavailable: {err}")
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    for path in TRAINING_IDS:
        with np.load(path) as z:  # an NpzFile reads an array again at every z[key]
            tokens, lens = z["tokens"], z["lens"]
        starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
        seqs = [tokens[s : s + n].tolist() for s, n in zip(starts, lens, strict=True)]
        yield path, tokenizer.batch_decode(seqs, skip_special_tokens=True)


def test_generated_set_shares_no_8gram_with_any_drafts_training_text():
    from mtad_train.overlap import overlap_report

    prompts = [json.loads(line)["prompt"] for line in instruct_data.DATA_FILE.open()]
    for path, texts in _training_texts():
        assert len(texts) > 1000  # the real files, not pointers
        report = overlap_report(texts, {"instruct": prompts}, n=8)
        assert report["disjoint"], (path, report["examples"])


def test_verifiers_import_without_a_download(tmp_path):
    """lm-eval's ifeval import calls nltk.download when punkt is missing: never reached."""
    code = (
        "import nltk\n"
        "def refuse(*a, **k):\n"
        "    raise SystemExit('nltk.download reached')\n"
        "nltk.download = refuse\n"
        "from mtad.tasks import ifeval_rules\n"
        "ifeval_rules.verifiers()\n"
        "assert nltk.download is refuse\n"
        "print('ok')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_strict_and_loose_verdicts_and_the_four_accuracies():
    task = InstructTask(limit=None)
    samples = task.samples()
    by_kind = {s.reference["instruction_id_list"][0]: s for s in reversed(samples)}
    comma = by_kind["punctuation:no_comma"]
    lower = by_kind["change_case:english_lowercase"]
    comma.reference = {"instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]}
    lower.reference = {"instruction_id_list": ["change_case:english_lowercase"], "kwargs": [{}]}
    outputs = [
        SampleOutput.from_texts(comma, ["plants need light and water every week"]),
        SampleOutput.from_texts(comma, ["plants need light, water and care"]),
        # the first line breaks the rule: strict fails, loose (without the first line) passes
        SampleOutput.from_texts(lower, ["Sure!\nthis is a quiet note about my garden and seeds"]),
    ]
    result = task.score(outputs)
    got = [(r["prompt_strict"], r["prompt_loose"]) for r in result.records]
    assert got == [(True, True), (False, False), (False, True)]
    m = result.metrics
    assert m["prompt_level_strict_acc"] == pytest.approx(1 / 3)
    assert m["prompt_level_loose_acc"] == pytest.approx(2 / 3)
    assert m["instruct_n"] == 3 and m["instruct_instructions"] == 3
    assert task.primary_metric == "prompt_level_strict_acc" and task.score_record == "prompt_strict"


def test_instruction_level_counts_every_instruction():
    records = [
        {"prompt_strict": False, "prompt_loose": True, "inst_strict": [True, False],
         "inst_loose": [True, True]},
        {"prompt_strict": True, "prompt_loose": True, "inst_strict": [True], "inst_loose": [True]},
    ]  # fmt: skip
    m = instruct_metrics(records)
    assert m["inst_level_strict_acc"] == pytest.approx(2 / 3)
    assert m["inst_level_loose_acc"] == 1.0 and m["prompt_level_strict_acc"] == 0.5


def test_language_verdicts_are_seeded():
    ids, kwargs = ["language:response_language"], [{"language": "es"}]
    text = "hola amigo, esta es una nota corta sobre mi jardin y las plantas"
    verdicts = {ifeval_rules.score("p", ids, kwargs, text).strict for _ in range(5)}
    assert verdicts == {(True,)}


def test_ifeval_data_dir_reads_its_rows_and_hub_style_null_kwargs(tmp_path):
    rows = [
        _ifeval_row(1000, "Write about tea. Do not use commas.", ["punctuation:no_comma"], [{}]),
        _ifeval_row(
            1001,
            "Write about tea in capitals, with the word tea at least twice.",
            ["change_case:english_capital", "keywords:frequency"],
            [
                {"keyword": None, "frequency": None, "relation": None},
                {"keyword": "tea", "frequency": 2, "relation": "at least", "num_words": None},
            ],
        ),
    ]
    (tmp_path / "input_data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = build_task({"name": "instruct", "data": "ifeval", "data_dir": str(tmp_path)})
    samples = task.samples()
    assert [s.id for s in samples] == ["1000", "1001"]
    assert samples[1].reference["kwargs"] == [{}, {"keyword": "tea", "frequency": 2,
                                                   "relation": "at least"}]  # fmt: skip
    result = task.score([SampleOutput.from_texts(samples[1], ["I LIKE TEA. TEA IS GOOD."])])
    assert result.records[0]["inst_strict"] == [True, True]
    assert task.signature()["files"][0].startswith("input_data.jsonl:")


def test_ifeval_rows_are_checked(tmp_path):
    bad = _ifeval_row(1, "x", ["punctuation:no_comma"], [{}, {}])
    (tmp_path / "input_data.jsonl").write_text(json.dumps(bad) + "\n")
    task = InstructTask(data="ifeval", data_dir=str(tmp_path))
    with pytest.raises(ValueError, match=r"input_data.jsonl line 1: kwargs must be a list"):
        task.samples()
    unknown = _ifeval_row(1, "x", ["keywords:nonsense"], [{}])
    (tmp_path / "input_data.jsonl").write_text(json.dumps(unknown) + "\n")
    with pytest.raises(ValueError, match="unknown IFEval instruction 'keywords:nonsense'"):
        InstructTask(data="ifeval", data_dir=str(tmp_path)).samples()


def test_punkt_instructions_are_refused_without_the_data(tmp_path, monkeypatch):
    row = _ifeval_row(
        1, "Answer in 3 sentences.", ["length_constraints:number_sentences"],
        [{"num_sentences": 3, "relation": "less than"}],
    )  # fmt: skip
    (tmp_path / "input_data.jsonl").write_text(json.dumps(row) + "\n")
    monkeypatch.setattr(ifeval_rules, "punkt_available", lambda: False)
    with pytest.raises(ValueError, match="needs nltk's punkt data"):
        InstructTask(data="ifeval", data_dir=str(tmp_path)).samples()


def test_hub_rows_and_an_unreachable_hub(monkeypatch):
    import datasets

    hub = [_ifeval_row(7, "Write in lowercase.", ["change_case:english_lowercase"], [{}])]
    monkeypatch.setattr(datasets, "load_dataset", lambda name, split: hub)
    task = InstructTask(data="ifeval")
    assert [s.id for s in task.samples()] == ["7"]
    assert task.signature()["files"] == ["google/IFEval"]

    def offline(name, split):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(FileNotFoundError, match="point task.data_dir at a folder"):
        InstructTask(data="ifeval").samples()


def test_bad_options_name_their_key(tmp_path):
    with pytest.raises(ValueError, match="task.data must be one of"):
        InstructTask(data="other")
    with pytest.raises(ValueError, match="task.data_dir: only read with task.data=ifeval"):
        InstructTask(data_dir=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="no input_data.jsonl"):
        InstructTask(data="ifeval", data_dir=str(tmp_path)).samples()
