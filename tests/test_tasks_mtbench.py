"""MT-Bench: 80 two-turn questions from the package, both turns generated with the history,
single-answer grading through an OpenAI-compatible endpoint, never a made-up score."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from scripted import ScriptedDecoder

from mtad.engine.tiny import build_tiny_tokenizer
from mtad.tasks.generator import TextGenerator
from mtad.tasks.mtbench import MTBenchTask, parse_rating
from mtad.tasks.samples import SampleOutput


@pytest.fixture(scope="module")
def task() -> MTBenchTask:
    return MTBenchTask()


def test_questions_and_references(task: MTBenchTask) -> None:
    samples = task.samples()
    assert len(samples) == 80
    assert all(len(s.turns) == 2 for s in samples)
    math_q = next(s for s in samples if s.reference["category"] == "math")
    assert len(math_q.reference["ref_answers"]) == 2
    assert {s.reference["category"] for s in MTBenchTask(categories=["coding"]).samples()} == {
        "coding"
    }


def test_both_turns_are_generated_with_history(task: MTBenchTask) -> None:
    tok = build_tiny_tokenizer()
    decoder = ScriptedDecoder(tok, ["first answer", "second answer"])
    sample = task.samples()[0]
    out = task.run_sample(sample, TextGenerator(decoder, tok), tok)
    assert [g.text for g in out.generations] == ["first answer", "second answer"]
    second = out.generations[1].prompt
    assert sample.turns[0] in second and "first answer" in second and sample.turns[1] in second
    assert second.endswith("<|assistant|>")


def _outputs(task: MTBenchTask, categories: tuple[str, ...]) -> list[SampleOutput]:
    chosen = [next(s for s in task.samples() if s.reference["category"] == c) for c in categories]
    return [SampleOutput.from_texts(s, ["answer one", "answer two"]) for s in chosen]


def test_no_endpoint_records_answers_and_reports_pending(task: MTBenchTask) -> None:
    res = task.score(_outputs(task, ("writing",)))
    assert res.metrics["mtbench_score"] is None
    assert res.metrics["mtbench_judge"].startswith("pending")
    rec = res.records[0]
    assert rec["turn_1"] == "answer one" and rec["turn_2"] == "answer two"
    assert rec["rating_1"] is None and rec["rating_2"] is None


@pytest.fixture
def judge_server() -> Iterator[dict[str, Any]]:
    """A fake OpenAI-compatible endpoint: 7 for first turns, 4 for second turns, nonsense for
    a marked answer."""
    seen: dict[str, Any] = {"requests": [], "auth": []}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen["requests"].append(body)
            seen["auth"].append(self.headers.get("Authorization"))
            user = body["messages"][1]["content"]
            if "UNRATEABLE" in user:
                content = "I cannot say."
            elif "### User:" in user:  # the multi-turn template
                content = "Second turn is weaker. Rating: [[4]]"
            else:
                content = "Good. Rating: [[7]]"
            reply = json.dumps({"choices": [{"message": {"content": content}}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    seen["url"] = f"http://127.0.0.1:{server.server_address[1]}/v1"
    yield seen
    server.shutdown()
    server.server_close()


def test_judge_grades_every_turn(judge_server: dict[str, Any], monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("MTAD_TEST_JUDGE_KEY", "sk-test")
    task = MTBenchTask(
        judge={
            "base_url": judge_server["url"],
            "model": "judge-x",
            "api_key_env": "MTAD_TEST_JUDGE_KEY",
        }
    )
    res = task.score(_outputs(task, ("writing", "math")))
    assert res.metrics["mtbench_turn1"] == 7.0 and res.metrics["mtbench_turn2"] == 4.0
    assert res.metrics["mtbench_score"] == 5.5 and res.metrics["mtbench_unparsed"] == 0
    reqs = judge_server["requests"]
    assert len(reqs) == 4 and {r["model"] for r in reqs} == {"judge-x"}
    assert set(judge_server["auth"]) == {"Bearer sk-test"}
    # math is graded against the reference answer
    math_ref = task._judge_prompts()["single-math-v1"]
    math_req = reqs[2]["messages"]
    assert math_req[0]["content"] == math_ref["system_prompt"]
    assert "[The Start of Reference Answer]" in math_req[1]["content"]
    assert "answer one" in math_req[1]["content"]


def test_unparseable_judgment_is_not_a_score(judge_server: dict[str, Any]) -> None:
    task = MTBenchTask(judge={"base_url": judge_server["url"], "api_key_env": None})
    sample = next(s for s in task.samples() if s.reference["category"] == "writing")
    res = task.score([SampleOutput.from_texts(sample, ["fine", "UNRATEABLE"])])
    assert res.records[0]["rating_1"] == 7.0 and res.records[0]["rating_2"] is None
    assert res.metrics["mtbench_unparsed"] == 1 and res.metrics["mtbench_score"] == 7.0
    assert res.metrics["mtbench_turn2"] is None


def test_parse_rating_and_config_errors() -> None:
    assert parse_rating("Rating: [[8.5]]") == 8.5
    assert parse_rating("score [6]") == 6.0
    assert parse_rating("no number") is None
    with pytest.raises(ValueError, match="task.judge.bogus"):
        MTBenchTask(judge={"bogus": 1})
