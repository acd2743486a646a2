"""lm-eval: the registered ``mtad`` model runs local YAML tasks offline through
``lm_eval.simple_evaluate`` on the tiny pair; generate_until runs our decoders, log-likelihoods
the target."""

from __future__ import annotations

import os

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import math  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402
from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.api.registry import get_model  # noqa: E402

from mtad.tasks import build_task, score_outputs  # noqa: E402
from mtad.tasks.lmeval import LOCAL_TASKS_DIR, materialize_local_tasks  # noqa: E402
from mtad.tasks.lmeval_model import MTADLM  # noqa: E402
from mtad.tasks.quality import continuation_logprobs  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def lm() -> MTADLM:
    return MTADLM(pair="tiny", method="ar", temperature=0.0)


def _req(kind: str, args: tuple, idx: int = 0) -> Instance:
    return Instance(kind, {}, args, idx, ("t", idx, 1))


def test_registered_under_mtad() -> None:
    assert get_model("mtad") is MTADLM


def test_local_yaml_tasks_run_through_simple_evaluate(lm: MTADLM) -> None:
    task = build_task(
        {"name": "lm_eval", "tasks": ["mtad_local_arith", "mtad_local_mc"], "limit": 3}
    )
    samples = task.samples()
    assert [s.id for s in samples][:3] == [f"mtad_local_arith/{i}" for i in range(3)]
    assert samples[0].turns == ["Question: What is 2 plus 3?\nAnswer:"]

    outputs = task.generate(lm.generator, progress=lambda done, total: None)
    result = score_outputs(task, outputs, lm.target_model)
    m = result.metrics
    assert 0.0 <= m["mtad_local_arith/exact_match"] <= 1.0
    assert 0.0 <= m["mtad_local_mc/acc"] <= 1.0
    assert task.primary_metric == "mtad_local_arith/exact_match"
    assert len(result.records) == 6
    arith = [o for o in outputs if o.sample.reference["task"] == "mtad_local_arith"]
    # generate_until went through our decoder: stop at "\n" or max_gen_toks (8) of the YAML
    assert all(len(o.generations) == 1 for o in arith)
    assert all(len(o.generations[0].output_ids) <= 8 for o in arith)
    assert all("\n" not in o.text for o in arith)
    # perplexity covers the generated answers only (multiple choice generates nothing)
    assert m["ppl_samples"] == 3 and math.isfinite(m["ppl"])


def test_offset_selects_documents_per_task() -> None:
    task = build_task({"name": "lm_eval", "tasks": ["mtad_local_mc"], "limit": 2, "offset": 5})
    assert [s.id for s in task.samples()] == ["mtad_local_mc/5", "mtad_local_mc/6"]
    assert task._subset() == {"samples": {"mtad_local_mc": [5, 6]}}


def test_generate_until_honours_until_and_max_gen_toks() -> None:
    lm = MTADLM(pair="tiny", method="mtad", temperature=0.0, gamma=3, beam_width=2)
    first = lm.generate_until([_req("generate_until", ("Hello", {"max_gen_toks": 12}))])[0]
    assert first  # the tiny random model writes something
    stop = first[3]
    (text,) = lm.generate_until(
        [_req("generate_until", ("Hello", {"until": [stop], "max_gen_toks": 12}), idx=1)]
    )
    assert stop not in text and first.startswith(text)
    gens = list(lm.generations.values())
    assert len(gens[0][0].output_ids) <= 12 and gens[0][0].stats.iterations >= 1


def test_loglikelihoods_use_the_target(lm: MTADLM) -> None:
    tok = lm.tokenizer
    ((ll, greedy),) = lm.loglikelihood([_req("loglikelihood", ("The cat", " sat"))])
    ctx, cont = tok("The cat")["input_ids"], tok(" sat")["input_ids"]
    expected, _ = continuation_logprobs(lm.target_model, ctx, cont)
    assert ll == pytest.approx(float(expected.sum()), abs=1e-4)
    assert isinstance(greedy, bool)

    (rolling,) = lm.loglikelihood_rolling([_req("loglikelihood_rolling", ("a short text",))])
    ids = tok("a short text", add_special_tokens=False)["input_ids"]
    full, _ = continuation_logprobs(lm.target_model, [lm.prefix_token_id], ids)
    assert rolling == pytest.approx(float(full.sum()), abs=1e-4)
    # windows longer than the context: every token is still scored once
    short = MTADLM(lm.generator, lm.target_model, max_length=4)
    (chunked,) = short.loglikelihood_rolling([_req("loglikelihood_rolling", ("a short text",))])
    assert math.isfinite(chunked) and chunked < 0


def test_relative_data_files_resolve_against_the_yaml(tmp_path: Path) -> None:
    copy = materialize_local_tasks(LOCAL_TASKS_DIR, tmp_path)
    assert copy != LOCAL_TASKS_DIR
    cfg = yaml.safe_load((copy / "mtad_local_arith.yaml").read_text())
    path = Path(cfg["dataset_kwargs"]["data_files"]["test"])
    assert path.is_absolute() and path == LOCAL_TASKS_DIR / "mtad_local_arith.jsonl"
    # a YAML with a custom tag (lm-eval's !function) survives the rewrite
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "t.yaml").write_text(
        "task: t\nprocess_docs: !function utils.process\ndataset_kwargs:\n  data_files: d.jsonl\n"
    )
    out = materialize_local_tasks(tmp_path / "src", tmp_path / "out")
    text = (out / "t.yaml").read_text()
    assert "!function 'utils.process'" in text or "!function utils.process" in text
    assert str(tmp_path / "src" / "d.jsonl") in text
