"""Result folders -> DataFrame -> paper tables (pure pandas, no models)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from mtad.harness.callbacks import read_pointers, write_pointer
from mtad.runs.comparison import add_comparisons
from mtad.runs.folder import is_complete, write_atomic, write_json
from mtad.runs.frame import load_study
from mtad.runs.tables import STUDY_TABLES, study_tables, summary_frame

REPO = Path(__file__).resolve().parents[1]


def fake_run(
    root: Path,
    study: str,
    method: str,
    seed: int,
    ms: float,
    jpt: float,
    ppl: float,
    pair: str = "tiny",
    **params: Any,
) -> None:
    sig = f"{method}-{pair}-{seed}-{'-'.join(f'{k}{v}' for k, v in params.items())}"
    metrics = {
        "study": study,
        "signature": sig,
        "pair": pair,
        "method": method,
        "task": "prompts",
        "seed": seed,
        "device": "cpu",
        "params": params,
        "n_samples": 3,
        "new_tokens": 30,
        "ms_per_token": ms,
        "acceptance_rate": None if method == "ar" else 0.5,
        "ppl": ppl,
        "energy": {
            "tracker": "offline",
            "j_per_token": jpt,
            "kwh": jpt * 30 / 3.6e6,
            "cpu_mode": "load_estimate",
        },
    }
    folder = root / study / sig
    for name in ("config.yaml", "samples.jsonl", "environment.json"):
        write_atomic(folder / name, "{}\n")
    write_json(folder / "metrics.json", metrics)


@pytest.fixture
def study(tmp_path: Path) -> Path:
    for seed, slow in ((0, 1.0), (1, 1.2)):  # seed 1 ran on a busier machine: all 20% slower
        fake_run(tmp_path, "s", "ar", seed, 40 * slow, 4.0, 10.0)
        fake_run(tmp_path, "s", "sps", seed, 25 * slow, 3.0, 10.5, gamma=4)
        fake_run(tmp_path, "s", "mtad", seed, 20 * slow, 2.0, 8.0, gamma=4, tau=0.5)
        fake_run(tmp_path, "s", "mtad", seed, 16 * slow, 1.5, 9.0, gamma=4, tau=0.1)
    fake_run(tmp_path, "s", "mtad", 0, 5.0, 1.0, 8.0, pair="other", gamma=4, tau=0.5)  # no AR
    (tmp_path / "s" / "half-written").mkdir()  # no metrics.json: not a run
    fake_run(tmp_path, "t", "ar", 0, 1.0, 1.0, 1.0)  # another study
    return tmp_path


def test_load_study_has_one_row_per_complete_run(study: Path) -> None:
    df = load_study(study, "s")
    assert len(df) == 9 and set(df["study"]) == {"s"}
    assert {"params.gamma", "params.tau", "energy.j_per_token", "label"} <= set(df.columns)
    assert set(df["label"]) == {"ar", "sps", "mtad(tau=0.5)", "mtad(tau=0.1)"}
    assert len(load_study(study)) == 10  # every study


def test_ratios_are_taken_within_pair_task_seed(study: Path) -> None:
    df = add_comparisons(load_study(study, "s"))
    mtad = df[(df["label"] == "mtad(tau=0.5)") & (df["pair"] == "tiny")]
    assert list(mtad["speedup_vs_ar"]) == pytest.approx([2.0, 2.0])  # 40/20 on both seeds
    assert list(mtad["speedup_vs_sps"]) == pytest.approx([1.25, 1.25])
    assert list(mtad["energy_ratio_vs_sps"]) == pytest.approx([1.5, 1.5])
    assert list(mtad["ppl_change_vs_ar"]) == pytest.approx([-0.2, -0.2])
    other = df[df["pair"] == "other"]
    assert math.isnan(other["speedup_vs_ar"].iloc[0])  # no AR for that pair: no ratio


def test_make_tables_groups_by_pair_task_method(study: Path, capsys) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_tables", REPO / "analysis/make_tables.py")
    assert spec and spec.loader
    make_tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_tables)

    tables = make_tables.make_tables(load_study(study, "s"))
    speed = tables["speed"]
    assert speed.loc[("tiny", "prompts", "mtad(tau=0.1)"), "speed-up vs AR"] == pytest.approx(2.5)
    assert speed.loc[("tiny", "prompts", "ar"), "seeds"] == 2
    energy = tables["energy"]
    assert energy.loc[("tiny", "prompts", "mtad(tau=0.1)"), "SpS J / J"] == pytest.approx(2.0)
    assert energy.loc[("tiny", "prompts", "ar"), "CPU energy by"] == "load_estimate"

    assert make_tables.main(["s", "--root", str(study)]) == 0
    assert (study / "s" / "tables" / "speed.csv").is_file()
    assert "speed-up vs AR" in capsys.readouterr().out


def test_the_paper_and_a_study_table_give_one_figure(study: Path) -> None:
    """One table path: the paper's cells (mtad.paper.render.aggregate, a plan's rows keyed by
    their label) and a study's table (mtad.runs.tables.study_tables) are the same figures of
    the same runs: mean, interval and seeds."""
    from mtad.paper.render import aggregate

    runs = load_study(study, "s")
    speed = study_tables(runs)["speed"]
    planned = add_comparisons(runs).assign(state="done", cell="")
    planned["method"] = planned["label"]  # the paper's rows: "method" holds the label
    display, numeric = aggregate(planned, ["ms_per_token", "speedup_vs_ar"])
    assert len(numeric) == 2 * len(speed) - 1  # no AR on pair "other": no speed-up there
    for rec in numeric.to_dict("records"):
        row = speed.loc[(rec["pair"], rec["task"], rec["method"])]
        header = STUDY_TABLES["speed"][rec["metric"]]
        assert row[header] == pytest.approx(rec["mean"])
        if rec["metric"] == "speedup_vs_ar":
            for part, bound in (("lo", "lo"), ("hi", "hi"), ("n_prompts", "prompts")):
                assert row[f"{header} [95%: {bound}]"] == pytest.approx(rec[part], nan_ok=True)
    assert list(display["seeds"]) == [speed.loc[tuple(k), "seeds"] for k in
                                      display[["pair", "task", "method"]].to_numpy()]  # fmt: skip


def test_collect_cli(study: Path, tmp_path: Path, capsys) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("collect", REPO / "analysis/collect.py")
    assert spec and spec.loader
    collect = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(collect)
    assert collect.main(["s", "--root", str(study), "--csv", str(tmp_path / "runs.csv")]) == 0
    assert len((tmp_path / "runs.csv").read_text().splitlines()) == 10  # header + 9 runs
    assert collect.main(["nothing", "--root", str(study)]) == 1


def test_summary_frame_sorts_and_names_columns(study: Path) -> None:
    frame = summary_frame(load_study(study, "s"))
    assert list(frame.columns[:3]) == ["pair", "task", "method"]
    assert "x AR" in frame.columns and "SpS J / J" in frame.columns


def test_atomic_writes_leave_no_temporaries(tmp_path: Path) -> None:
    write_json(tmp_path / "a" / "metrics.json", {"x": float("nan"), "y": [1.5]})
    assert json.loads((tmp_path / "a" / "metrics.json").read_text()) == {"x": None, "y": [1.5]}
    assert [p.name for p in (tmp_path / "a").iterdir()] == ["metrics.json"]
    assert not is_complete(tmp_path / "a")  # the other files are missing


def test_pointers_round_trip(tmp_path: Path) -> None:
    write_pointer(tmp_path / "0", {"status": "done", "result_dir": "/r/s/x"})
    write_pointer(tmp_path / "1", {"status": "skipped", "result_dir": "/r/s/y"})
    assert [p["status"] for p in read_pointers(tmp_path)] == ["done", "skipped"]


def test_score_change_vs_ar_sits_next_to_ppl_change() -> None:
    import pandas as pd

    rows = [
        {"study": "s", "pair": "p", "task": "humaneval", "seed": 0, "method": m, "score": sc}
        for m, sc in (("ar", 0.2), ("mtad", 0.3), ("sps", 0.2))
    ]
    rows += [  # a pending judge (None) and an AR score of 0 give NaN, never inf
        {"study": "s", "pair": "p", "task": "mtbench", "seed": 0, "method": "ar", "score": None},
        {"study": "s", "pair": "p", "task": "mtbench", "seed": 0, "method": "mtad", "score": 7},
        {"study": "s", "pair": "p", "task": "spider", "seed": 0, "method": "ar", "score": 0.0},
        {"study": "s", "pair": "p", "task": "spider", "seed": 0, "method": "mtad", "score": 0.5},
    ]
    for r in rows:
        r.update(ppl=10.0, ms_per_token=1.0)
    df = add_comparisons(pd.DataFrame(rows)).set_index(["task", "method"])
    assert df.loc[("humaneval", "mtad"), "score_change_vs_ar"] == pytest.approx(0.5)
    assert df.loc[("humaneval", "sps"), "score_change_vs_ar"] == pytest.approx(0.0)
    assert math.isnan(df.loc[("mtbench", "mtad"), "score_change_vs_ar"])
    assert math.isnan(df.loc[("spider", "mtad"), "score_change_vs_ar"])
    assert df.loc[("humaneval", "mtad"), "ppl_change_vs_ar"] == pytest.approx(0.0)
