"""bench.cost_model: the prediction's arithmetic, and the bench end to end on the tiny pair."""

from __future__ import annotations

import pytest

from bench import cost_model

COST = {"t1": 10.0, "tv": 11.0, "tree": 14.0, "d1": 1.0, "dB": 1.5}


def test_prediction_arithmetic():
    assert cost_model.predicted_ms_per_token("ar", COST, 4, 4, 1.0) == 10.0
    # sps: 4 draft steps + one 5-token verification per iteration, 2 tokens per iteration
    assert cost_model.predicted_ms_per_token("sps", COST, 4, 4, 2.0) == pytest.approx(7.5)
    # mtad: one 1-row step, three 4-row steps, one verification
    assert cost_model.predicted_ms_per_token("mtad", COST, 4, 4, 2.0) == pytest.approx(8.25)
    assert cost_model.predicted_ms_per_token("mmtad", COST, 4, 4, 2.0) == pytest.approx(9.75)


def test_cost_model_bench_on_the_tiny_pair(capsys):
    rows = cost_model.main(
        [
            "--pair",
            "tiny",
            "--prompts",
            "2",
            "--max-new",
            "8",
            "--reps",
            "2",
            "--dtypes",
            "float32,bfloat16",
            "--methods",
            "ar,sps,mtad",
        ]
    )
    assert [(r[0], r[1]) for r in rows] == [
        (dt, m) for dt in ("float32", "bfloat16") for m in ("ar", "sps", "mtad")
    ]
    for r in rows:
        assert float(r[3]) >= 1.0 and float(r[4]) > 0 and float(r[5]) > 0
    assert "pred x ar" in capsys.readouterr().out
