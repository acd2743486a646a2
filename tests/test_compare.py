"""``python run.py +experiment=compare``: AR, SpS and MTAD on the same prompts, one table with
intervals and one verdict per claim, decided by the paper's rule (mtad.runs.claims).

On result folders with a known answer the table and sentences printed by the real renderer
(:func:`mtad.harness.summary.print_compare`) carry the expected verdicts and the very estimates
of the paper's claims table; end to end, the preset runs on the tiny random pair as a user
types it and prints the table, its intervals and the three sentences."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf
from rich.console import Console

from mtad.harness.summary import print_compare
from mtad.paper.recipes import Recipe
from mtad.paper.render import claims_table
from mtad.runs.claims import Claim
from mtad.runs.comparison import add_comparisons
from mtad.runs.frame import load_runs
from mtad.runs.intervals import DOES_NOT_HOLD, HOLDS, VERDICTS
from mtad.runs.tables import COMPARE_COLUMNS

REPO = Path(__file__).resolve().parents[1]
PRESET = REPO / "conf" / "experiment" / "compare.yaml"
PROMPTS = 12


def preset_claims() -> list[dict]:
    raw = OmegaConf.load(PRESET).hydra.callbacks.sweep_summary.claims
    return [dict(c) for c in OmegaConf.to_container(raw)]


def _write_run(root: Path, method: str, lp: np.ndarray, tok: np.ndarray, sec: np.ndarray) -> None:
    folder = root / f"{method}-fake-prompts"
    folder.mkdir(parents=True)
    ids = [f"p{i}" for i in range(len(lp))]
    samples = [
        {"id": i, "mean_logprob": float(x), "new_tokens": int(n)}
        for i, x, n in zip(ids, lp, tok, strict=True)
    ]
    timings = [{"id": i, "wall_time": float(s)} for i, s in zip(ids, sec, strict=True)]
    (folder / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in samples))
    (folder / "timings.jsonl").write_text("".join(json.dumps(r) + "\n" for r in timings))
    metrics = {
        "study": "fake",
        "pair": "fake",
        "task": "prompts",
        "method": method,
        "seed": 0,
        "params": {},
        "device": "cpu",
        "cpu_model": "test CPU",
        "cpu_bf16": "none",
        "threads": 1,
        "dtypes": {"target": {"dtype": "float32"}, "draft": {"dtype": "float32"}},
        "n_samples": len(lp),
        "new_tokens": int(tok.sum()),
        "tokens_per_s": float(tok.sum() / sec.sum()),
        "ms_per_token": 1000.0 * float(sec.sum()) / float(tok.sum()),
        "block_efficiency": 1.0 if method == "ar" else 1.4,
        "ppl": float(np.exp(-lp.mean())),
    }
    (folder / "metrics.json").write_text(json.dumps(metrics))


@pytest.fixture(scope="module")
def known_runs(tmp_path_factory: pytest.TempPathFactory):
    """One seed, 12 prompts whose speeds differ ten-fold. SpS 2x faster than AR; MTAD 1.3x
    slower than SpS (so 2 / 1.3 = 1.54x faster than AR), log-probs +0.1 over AR (PPL -9.5%)."""
    root = tmp_path_factory.mktemp("compare")
    rng = np.random.default_rng(3)
    tok = rng.integers(20, 40, PROMPTS).astype(float)
    sps = tok * rng.lognormal(np.log(0.05), 1.0, PROMPTS)
    lp = rng.normal(-2.0, 0.5, PROMPTS)
    _write_run(root, "ar", lp, tok, 2.0 * sps * rng.lognormal(0.0, 0.02, PROMPTS))
    _write_run(root, "sps", lp + rng.normal(0.0, 0.05, PROMPTS), tok, sps)
    mtad = 1.3 * sps * rng.lognormal(0.0, 0.02, PROMPTS)
    _write_run(root, "mtad", lp + 0.1 + rng.normal(0.0, 0.01, PROMPTS), tok, mtad)
    return load_runs(root.glob("*/metrics.json"))


def rendered(runs, claims: list[Claim]) -> str:
    out = Console(record=True, width=250, color_system=None)
    print_compare(runs, claims, "compare: 3 run", out)
    return out.export_text()


def test_the_table_has_intervals_and_the_paper_verdicts(known_runs) -> None:
    claims = [Claim.of(c) for c in preset_claims()]
    text = rendered(known_runs, claims)
    lines = text.splitlines()
    header = next(ln for ln in lines if "tok/s" in ln)
    for name in COMPARE_COLUMNS.values():
        assert name in header, (name, header)
    mtad = next(ln for ln in lines if ln.startswith("mtad "))
    # x AR, x SpS, PPL change: each an estimate with its interval over the 12 prompts, 1 seed
    cells = re.findall(r"([-+\d.]+[x%]) \[([-+\d.]+[x%]), ([-+\d.]+[x%])\] \((\d+) x (\d+)\)", mtad)
    assert len(cells) == 3 and all(c[3:] == (str(PROMPTS), "1") for c in cells), mtad
    assert [ln.split()[0] for ln in lines if ln.split()[:1] in (["ar"], ["sps"])] == ["ar", "sps"]
    assert "test CPU" in text and "target float32, draft float32" in text
    sentences = [ln[2:] for ln in lines if ln.startswith("- ")]
    expected = {
        "MTAD is faster than AR": HOLDS,  # 1.54x
        "MTAD is faster than SpS": DOES_NOT_HOLD,  # 0.77x
        "MTAD's perplexity is lower (better) than AR's": HOLDS,  # -9.5%
    }
    assert [s.split(": ")[:2] for s in sentences] == [[k, v] for k, v in expected.items()]
    assert "Verdict: holds" in text and "paired bootstrap over prompts" in text

    # no second rule: the paper's claims table gives the same verdicts and estimates
    recipe = Recipe("compare", "", "", (), {}, (), tuple(preset_claims()), {})
    paper = claims_table(recipe, add_comparisons(known_runs).assign(state="done"))
    assert [f"{r.claim}: {r.verdict}: {r.ours}" for r in paper.itertuples()] == sentences


def test_a_missing_method_leaves_its_claims_unresolved_and_says_why(known_runs) -> None:
    claims = [Claim.of(c) for c in preset_claims()]
    text = rendered(known_runs[known_runs["label"] != "sps"], claims)
    sps_claim = next(ln for ln in text.splitlines() if ln.startswith("- MTAD is faster than SpS"))
    assert (
        sps_claim
        == "- MTAD is faster than SpS: unresolved: no mtad run with a sps run to compare it with"
    )
    assert "- MTAD is faster than AR: holds: " in text


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [("metric", "tokens_per_s", "comparison column"), ("holds_if", "above one", "holds_if")],
)
def test_a_bad_claim_is_refused(field: str, value: str, message: str) -> None:
    claim = {**preset_claims()[0], field: value}
    with pytest.raises(ValueError, match=message):
        Claim.of(claim)


def test_the_preset_runs_and_prints_the_table(tmp_path: Path) -> None:
    """The one-liner as a user types it, on the tiny random pair with 6 prompts of 8 tokens
    (the interval needs MIN_PROMPTS = 5): three runs, the table, the three sentences."""
    cmd = [
        sys.executable,
        str(REPO / "run.py"),
        "+experiment=compare",
        "pair=tiny",
        "task.limit=6",
        "task.max_new_tokens=8",
        "runtime.warmup_tokens=2",
        f"results.root={tmp_path / 'results'}",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "250"}
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    folders = sorted(p.name.split("-")[0] for p in (tmp_path / "results" / "compare").iterdir())
    assert folders == ["ar", "mtad", "sps"]
    text = out.stdout
    assert "x AR [95%]" in text and "tiny / prompts: 6 prompts, seed 0" in text
    mtad = next(ln for ln in text.splitlines() if ln.startswith("mtad "))
    assert len(re.findall(r"\[[-+\d.]+[x%], [-+\d.]+[x%]\] \(6 x 1\)", mtad)) == 3, mtad
    sentences = [ln[2:] for ln in text.splitlines() if ln.startswith("- MTAD")]
    assert len(sentences) == 3, text[-3000:]
    for sentence in sentences:
        assert sentence.split(": ")[1] in VERDICTS, sentence
        assert sentence.endswith("(6 x 1)"), sentence
