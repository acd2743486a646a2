"""Every row of docs/bad_inputs.md: the input stops the run before any model loads, with one
line naming the key (or, for rows marked *accepted*, means what the table says).

Rows are checked in-process through what ``run.py`` runs before Hydra's task function loads
anything (Hydra's composition, its error made one line, :func:`mtad.harness.job.prepare`),
with model loading patched to fail; a few rows also go through ``run.py`` itself (exit status
2, one line on stderr, nothing written), including a sweep whose second job is bad.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from command_line import check_command_line
from hydra import compose, initialize_config_dir

from mtad.harness.config import ConfigError

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"
TABLE = REPO / "docs" / "bad_inputs.md"
DRAFT = REPO / "assets" / "drafts" / "smollm2-draft"
CODE = re.compile(r"`([^`]*)`")


def table_rows() -> list[tuple[str, str, str]]:
    """(input, key, message) of every row; key ``accepted`` for accepted inputs."""
    text = TABLE.read_text()
    body = text.split("<!-- rows:", 1)[1]
    rows = []
    for line in body.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        inp = CODE.search(cells[0])
        key = CODE.search(cells[1])
        msg = CODE.search(cells[2])
        assert inp, line
        rows.append(
            (
                inp.group(1),
                key.group(1) if key else "accepted",
                msg.group(1) if msg else cells[2],
            )
        )
    return rows


ROWS = table_rows()
FULL_DISK = "fault_injection.FullDisk"


def test_the_table_has_the_inputs_of_the_issue() -> None:
    inputs = " ".join(r[0] for r in ROWS)
    for needle in (
        "results.root=/proc/nope",
        "runtime.device=cuda",
        "+foo=1",
        "method.top_k=null",
        "task.limit=0",
        "method.gamma=1000",
        "vocab_size",
        "drafts/nothing",
        "truncated",
        "task.files=",
    ):
        assert needle in inputs, needle
    assert len(ROWS) >= 20


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Model folders for the weights rows: no weights, truncated weights, corrupt config."""
    tmp = tmp_path_factory.mktemp("bad")
    (tmp / "no_weights").mkdir()
    shutil.copy(DRAFT / "config.json", tmp / "no_weights")
    (tmp / "truncated").mkdir()
    shutil.copy(DRAFT / "config.json", tmp / "truncated")
    with open(DRAFT / "model.safetensors", "rb") as src:
        (tmp / "truncated" / "model.safetensors").write_bytes(src.read(1 << 20))
    (tmp / "bad_config").mkdir()
    (tmp / "bad_config" / "config.json").write_text("")
    shutil.copy(DRAFT / "model.safetensors", tmp / "bad_config")
    (tmp / "broken.jsonl").write_text('{"id": "a", "prompt": "hi"}\n{"id": "b", "prompt": }\n')
    (tmp / "null_prompt.jsonl").write_text(
        '{"id": "a", "prompt": "hi"}\n{"id": "b", "prompt": null}\n'
    )
    (tmp / "negative_budget.jsonl").write_text(
        '{"id": "a", "prompt": "hi", "max_new_tokens": -3}\n'
    )
    (tmp / "latin1.jsonl").write_bytes(
        '{"id": "a", "prompt": "hi"}\n{"id": "b", "prompt": "café"}\n'.encode("latin-1")
    )
    return tmp


def fill(text: str, tmp: Path) -> str:
    return (
        text.replace("<tmp>", str(tmp))
        .replace("<repo>", str(REPO))
        .replace("<torch>", torch.__version__)
    )


def prepare_inputs(overrides: list[str]):  # noqa: ANN201 - Prepared
    """What run.py does before the task function loads a model."""
    from mtad.harness.job import prepare

    check_command_line(["+experiment=smoke", *overrides], CONF)
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=["+experiment=smoke", *overrides])
    return prepare(cfg)


def _no_model(*args: object, **kwargs: object) -> None:
    raise AssertionError("a model was loaded")


@pytest.mark.parametrize(("inp", "key", "message"), ROWS, ids=[r[0][:60] for r in ROWS])
def test_row(inp: str, key: str, message: str, scratch: Path, monkeypatch) -> None:
    import mtad.engine.loading

    if inp.startswith("-m "):
        pytest.skip("a sweep row: test_sweep_with_one_bad_job_runs_nothing")
    if FULL_DISK in inp:
        pytest.skip("a row of the run itself: test_full_results_disk_is_one_line")
    if inp == "runtime.device=cuda" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    monkeypatch.setattr(mtad.engine.loading, "load_pair", _no_model)
    monkeypatch.setattr(mtad.engine.loading, "load_model", _no_model)
    overrides = fill(inp, scratch).split()
    if key == "accepted":
        prep = prepare_inputs(overrides)
        name, _ = overrides[0].split("=")
        param = name.split(".")[-1]
        off = {"top_k": 0, "top_p": 1.0}[param]
        assert prep.spec.method_params[param] == off
        same = prepare_inputs([f"{name}={off}"])
        assert prep.signature == same.signature
        return
    with pytest.raises(ConfigError) as info:
        prepare_inputs(overrides)
    err = info.value
    assert err.key == key
    assert str(err) == f"{key}: {fill(message, scratch)}"
    assert "\n" not in str(err)


def run_py(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, str(REPO / "run.py"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


@pytest.mark.parametrize(
    "inp",
    [
        "results.root=/proc/nope",
        "runtime.device=mps",
        "+foo=1",
        "method=sps method.gamma=1000",
        "runtime.seed=abc",  # Hydra's own error spans lines
        "method.gama=4",  # a typo: Hydra's error spans lines
        "method.gamma=2,3",  # a sweep without -m: Hydra's error spans lines
        "energy.measure_power_secs=nan",
        "task=humaneval task.python=/nonexistent/python3",  # was: after generation, at scoring
        "logger.project=team/mtad",  # was: W&B's error once the models had loaded
    ],
)
def test_run_py_exits_2_with_the_table_line(inp: str, tmp_path: Path) -> None:
    (row,) = [r for r in ROWS if r[0] == inp]
    where = [] if "results.root" in inp else [f"results.root={tmp_path / 'results'}"]
    out = run_py("+experiment=smoke", *inp.split(), *where, f"logger.dir={tmp_path}", cwd=tmp_path)
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.splitlines() == [f"error: {row[1]}: {row[2]}"]
    assert not (tmp_path / "results").exists() and not (tmp_path / "wandb").exists()


def test_cfg_job_with_several_values_is_one_line(tmp_path: Path) -> None:
    """``--cfg job`` composes as a single run: a sweep there is Hydra's multi-line error too."""
    out = run_py("+experiment=smoke", "method.tau=0.1,0.2", "--cfg", "job", cwd=tmp_path)
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.splitlines() == [
        "error: method.tau: 0.1,0.2 is several values: add -m to run each, or [0.1,0.2] for a list"
    ]


def test_sweep_with_one_bad_job_runs_nothing(tmp_path: Path) -> None:
    """The second job is bad: the sweep stops before the first job runs."""
    (row,) = [r for r in ROWS if r[0].startswith("-m ")]
    args = row[0].split()
    out = run_py(
        *args,
        "+experiment=smoke",
        f"results.root={tmp_path / 'results'}",
        f"logger.dir={tmp_path}",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        cwd=tmp_path,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    (line,) = out.stderr.splitlines()
    expected_start = f"error: {row[1]}: {row[2].split(' [job')[0]} [job 0: "
    assert line.startswith(expected_start) and "method=ar method.gamma=4" in line, line
    assert not (tmp_path / "results" / "smoke").exists() or not any(
        (tmp_path / "results" / "smoke").iterdir()
    )
    assert not (tmp_path / "wandb").exists()

    # a value error in the second job (the first is fine): nothing runs either
    out = run_py(
        "-m",
        "+experiment=smoke",
        "method=sps",
        "method.gamma=4,1000",
        f"results.root={tmp_path / 'results'}",
        f"logger.dir={tmp_path}",
        f"hydra.sweep.dir={tmp_path / 'sweep2'}",
        cwd=tmp_path,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    (line,) = out.stderr.splitlines()
    assert line.startswith("error: method.gamma: block of 1000 tokens") and "[job 1: " in line
    assert not (tmp_path / "sweep2").exists()  # Hydra never reached the launcher
    assert not (tmp_path / "wandb").exists()

    # an unknown choice in the second job: nothing runs either
    out = run_py(
        "-m",
        "+experiment=smoke",
        "method=ar,foo",
        f"results.root={tmp_path / 'results'}",
        f"logger.dir={tmp_path}",
        f"hydra.sweep.dir={tmp_path / 'sweep3'}",
        cwd=tmp_path,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    (line,) = out.stderr.splitlines()
    assert line.startswith("error: method: unknown method 'foo'; choose from ar, "), line
    assert "[job 1: " in line and " method=foo " in line, line


def test_the_table_has_the_inputs_of_issue_19() -> None:
    inputs = " ".join(r[0] for r in ROWS)
    for needle in (
        "pair.target.path=/etc",
        "runtime.seed=abc",
        "task.limit=abc",
        "broken.jsonl",
        FULL_DISK,
    ):
        assert needle in inputs, needle


def test_the_table_has_the_inputs_of_issue_28() -> None:
    inputs = " ".join(r[0] for r in ROWS)
    for needle in (
        "null_prompt.jsonl",
        "negative_budget.jsonl",
        "latin1.jsonl",
        "task.python=",
        "task=humaneval task.data_path=",
        "logger.project=team/mtad",
    ):
        assert needle in inputs, needle


def test_full_results_disk_is_one_line(tmp_path: Path) -> None:
    """The disk fills up when the finished run writes its folder: one line saying what could not
    be written and that nothing counts as complete, exit status 1, and the folder is not
    complete (no metrics.json), so the next run redoes it."""
    from mtad.runs.folder import is_complete

    (row,) = [r for r in ROWS if FULL_DISK in r[0]]
    results = tmp_path / "results"
    common = ["+experiment=smoke", f"results.root={results}", "logger.name=none"]
    env_path = f"{REPO / 'tests'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    env = {**os.environ, "PYTHONPATH": env_path, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, str(REPO / "run.py"), *common, row[0], f"hydra.run.dir={tmp_path / 'h'}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 1, out.stderr[-2000:]
    (line,) = out.stderr.splitlines()
    (folder,) = (results / "smoke").iterdir()
    expected = row[2].replace("<tmp>", str(tmp_path)).replace("<signature>", folder.name)
    assert line == f"error: {row[1]}: {expected}"
    assert not (folder / "metrics.json").exists() and not is_complete(folder)
