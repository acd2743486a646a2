"""Recipes -> runs -> the paper's tables: expansion, the smoke reproduction end to end, cells
checked against the runs' metrics.json, hardware separation, and a re-render that loads no model.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from reproduce_here import reproduce_here, script

from mtad.paper.expansion import expand, merge_overrides
from mtad.paper.recipes import RecipeError, load_profile, load_recipe, load_recipes, recipe_names
from mtad.runs.labels import run_labels

REPO = Path(__file__).resolve().parents[1]
SMOKE_BUDGET_S = 180.0  # the bar for `reproduce.py all --profile smoke` on 2 cores


def test_every_recipe_loads_and_expands_under_every_profile() -> None:
    names = recipe_names()
    assert {
        "main",
        "perplexity",
        "energy",
        "ablation_tau",
        "ablation_beam",
        "ablation_gamma",
        "time_split",
        "claims",
    } <= set(names)
    for profile in ("paper", "cpu", "smoke"):
        prof = load_profile(profile)
        for recipe in load_recipes(["all"]):
            runs = expand(recipe, prof)
            assert runs, (recipe.name, profile)
            for run in runs:
                assert f"results.study={prof.study}" in run.overrides
                assert f"runtime.seed={run.seed}" in run.overrides
                assert run.pair in prof.pairs


def test_main_recipe_covers_every_method_and_task() -> None:
    runs = expand(load_recipe("main"), load_profile("paper"))
    methods = {"ar", "sps", "blockverify", "specinfer", "bild", "mtjd", "mtad", "mmtad"}
    assert {r.method for r in runs} == methods
    assert {r.task for r in runs} == {"prompts", "instruct", "humaneval", "spider", "mtbench"}
    prof = load_profile("paper")
    assert {"llama2_13b", "llama2_70b", "opt_13b", "opt_66b", "llama3_8b"} <= set(prof.pairs)
    # pairs x seeds x methods x 5 tasks; the tasks as the authors ran them (instruct: theirs
    # has no IFEval protocol)
    assert len(runs) == len(prof.pairs) * len(prof.seeds) * len(methods) * 5
    authors = [r for r in runs if r.task not in ("prompts", "instruct")]
    assert all("task.protocol=authors" in r.overrides for r in authors)


def test_user_overrides_win_over_the_profile_but_not_over_the_recipe() -> None:
    prof = load_profile("cpu")
    runs = expand(load_recipe("ablation_tau"), prof, user_overrides=["task.limit=2"])
    assert all("task.limit=2" in r.overrides and "task.limit=6" not in r.overrides for r in runs)
    with pytest.raises(RecipeError, match="^method: set by the recipes"):
        expand(load_recipe("ablation_tau"), prof, user_overrides=["method=sps"])
    with pytest.raises(RecipeError, match="pair 'llama2_13b' is not in profile 'cpu'"):
        expand(load_recipe("main"), prof, pairs=["llama2_13b"])


def test_merge_overrides_keeps_one_value_per_key() -> None:
    merged = merge_overrides(["+experiment=a", "task.limit=1"], ["experiment=b", "task.limit=3"])
    assert merged == ("experiment=b", "task.limit=3")


def test_a_planned_run_and_its_run_folder_get_one_label(tmp_path: Path) -> None:
    """The paper labels a grid point as the tables label the run folder it makes (one rule,
    mtad.runs.labels): a whole float is written as a whole number (the frame holds a parameter
    only some methods have as a float), while the override keeps the recipe's type."""
    recipe = {
        "title": "t",
        "runs": [{"method": ["mtad"], "task": ["prompts"], "method.tau": [1.0, 0.5],
                  "method.gamma": [2], "method.replacement": [True]}],
    }  # fmt: skip
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    planned = [r for r in expand(load_recipe("r", tmp_path), load_profile("smoke")) if r.seed == 0]
    assert [r.label for r in planned] == [
        "mtad(tau=1,gamma=2,replacement=true)",
        "mtad(tau=0.5,gamma=2,replacement=true)",
    ]
    assert "method.tau=1.0" in planned[0].overrides and "method.gamma=2" in planned[0].overrides
    # the same runs read back from disk: params as metrics.json holds them, beside an ar run
    # without any (so every params column is a float column, NaN for ar)
    frame = pd.DataFrame(
        [{"method": "ar"}] + [{"method": "mtad", **{f"params.{k}": v for k, v in r.params.items()}}
                              for r in planned]
    )  # fmt: skip
    frame["params.replacement"] = [math.nan, True, True]
    assert run_labels(frame) == ["ar", "mtad(tau=1)", "mtad(tau=0.5)"]
    assert run_labels(frame.assign(**{"params.gamma": [math.nan, 2.0, 3.0]}))[1] == (
        "mtad(tau=1,gamma=2)"
    )


def test_cached_composition_equals_hydra_composition() -> None:
    """The planner composes each group-choice set once and applies value overrides itself;
    the result must be what Hydra composes from the full override list."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from mtad.paper.status import CONF, SharedLoads, hydra_composer

    runs = expand(load_recipe("ablation_tau"), load_profile("cpu"), user_overrides=["task.limit=3"])
    runs += expand(load_recipe("main"), load_profile("paper"), pairs=["opt_13b"])[:6]
    with hydra_composer() as cached:
        # every composition after the first reads the config files the first one read
        loader = GlobalHydra.instance().config_loader()
        assert isinstance(loader.repository, SharedLoads)  # type: ignore[attr-defined]
        mine = [OmegaConf.to_container(cached(r.overrides), resolve=True) for r in runs]
        assert loader.repository.loads  # type: ignore[attr-defined]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        direct = [
            OmegaConf.to_container(compose("config", overrides=list(r.overrides)), resolve=True)
            for r in runs
        ]
    assert mine == direct


def test_unknown_recipe_and_profile_are_one_line_errors() -> None:
    with pytest.raises(RecipeError, match="unknown recipe 'nope'; choose from all, "):
        load_recipe("nope")
    with pytest.raises(RecipeError, match="profile 'gpu' is not in"):
        load_profile("gpu")


# --------------------------------------------------------------------------------------------
# the smoke profile end to end (one reproduction shared by the tests below)


def _reproduce(
    root: Path, *args: str, timeout: float = 600
) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    cmd = [
        sys.executable,
        "scripts/reproduce.py",
        *args,
        "--root",
        str(root),
        "--wandb-dir",
        str(root),
        f"hydra.sweep.dir={root}/multirun",
    ]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)
    return out, time.perf_counter() - t0


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float, str]:
    root = tmp_path_factory.mktemp("paper")
    out, wall = _reproduce(root, "all", "--profile", "smoke")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    print(f"reproduce all --profile smoke: {wall:.0f} s")
    return root / "paper_smoke", wall, out.stdout


def _metrics(study: Path) -> pd.DataFrame:
    rows = []
    for path in study.glob("*/metrics.json"):
        m = json.loads(path.read_text())
        rows.append(
            {
                "method": m["method"],
                "task": m["task"],
                "seed": m["seed"],
                "ms_per_token": m["ms_per_token"],
                "ppl": m["ppl"],
                "params": json.dumps(m["params"], sort_keys=True),
                "dir": path.parent,
            }
        )
    return pd.DataFrame(rows)


def test_smoke_renders_every_table_and_figure_within_budget(smoke: tuple[Path, float, str]) -> None:
    study, wall, stdout = smoke
    assert wall < SMOKE_BUDGET_S, f"{wall:.0f} s"
    for recipe in recipe_names():
        for ext in ("md", "tex", "csv"):
            assert (study / "tables" / f"{recipe}.{ext}").is_file(), (recipe, ext)
    tex = (study / "tables" / "main.tex").read_text()
    assert "\\toprule" in tex and "\\bottomrule" in tex  # booktabs
    figures = sorted(p.stem for p in (study / "figures").glob("*.png"))
    assert figures == sorted(p.stem for p in (study / "figures").glob("*.pdf"))
    assert {
        "ablation_tau_tau",
        "ablation_beam_beam_width",
        "ablation_gamma_gamma",
        "time_split_time_split",
        "main_speedup",
    } <= set(figures)
    paper = (study / "paper.md").read_text()
    assert "## Headline claims" in paper and "## Main results" in paper
    # Spider has no data here: a labelled cell with the override that enables it, not a gap.
    main = (study / "tables" / "main.md").read_text()
    assert "not run: task.data_dir" in main
    # W&B (offline): one analysis run beside the runs, and the report definition + Markdown
    assert len(list((study.parent / "wandb").glob("offline-run-*-analysis-*"))) == 1
    for name in ("report.json", "report.md", "PUBLISH.md"):
        assert (study / "report" / name).is_file(), name


def test_smoke_profile_says_it_logs_no_harness_run_to_wandb(smoke: tuple[Path, float, str]) -> None:
    """The smoke profile sets logger=none: its output and PUBLISH.md say so, and the report
    references no harness run id (tests/test_reproduce_wandb.py: a profile run that logs)."""
    study, _, stdout = smoke
    n = len(list(study.glob("*/metrics.json")))
    assert f"W&B: the {n} harness runs logged nothing (profile smoke sets logger=none)" in stdout
    publish = (study / "report" / "PUBLISH.md").read_text()
    assert "Harness runs: 0 ids" in publish
    assert f"{n} harness runs behind the tables logged nothing to W&B (`logger=none`)" in publish
    filters = [
        rs["filters"]
        for rs in json.loads((study / "report" / "report.json").read_text())["runsets"]
    ]
    assert filters and not any('Metric("ID") in' in f for f in filters)


def test_speedup_cell_is_the_ratio_of_the_two_runs(smoke: tuple[Path, float, str]) -> None:
    study, _, _ = smoke
    runs = _metrics(study)
    numeric = pd.read_csv(study / "tables" / "main.csv")
    ratios = []
    for seed in (0, 1):
        ar = runs[(runs["method"] == "ar") & (runs["task"] == "prompts") & (runs["seed"] == seed)]
        mtad = _main_run(study, "mtad", seed)
        assert len(ar) == 1
        ratios.append(float(ar["ms_per_token"].iloc[0]) / mtad["ms_per_token"])
    row = numeric[
        (numeric["task"] == "prompts")
        & (numeric["method"] == "mtad")
        & (numeric["metric"] == "speedup_vs_ar")
    ]
    assert row["n"].item() == 2
    # a ratio is averaged over seeds on the log scale (mtad.runs.intervals): geometric mean
    assert row["mean"].item() == pytest.approx(math.sqrt(ratios[0] * ratios[1]), rel=1e-9)
    assert row["std"].item() == pytest.approx(pd.Series(ratios).std(ddof=1), rel=1e-9)


def _main_run(study: Path, method: str, seed: int) -> dict:
    """The main recipe's run of ``method`` on prompts at ``seed``: the one whose resolved method
    config is the method's defaults (ablation runs of the same method differ there)."""
    import dataclasses

    import yaml

    from mtad.methods import build_params

    defaults = {"name": method, **dataclasses.asdict(build_params(method))}
    for path in study.glob(f"{method}-tiny-prompts-*/config.yaml"):
        cfg = yaml.safe_load(path.read_text())
        if cfg["runtime"]["seed"] == seed and cfg["method"] == defaults:
            return json.loads((path.parent / "metrics.json").read_text())
    raise AssertionError(f"no default {method} run for seed {seed}")


def test_mean_std_cell_equals_the_seeds_values(smoke: tuple[Path, float, str]) -> None:
    study, _, _ = smoke
    ppls = [_main_run(study, "mtad", seed)["ppl"] for seed in (0, 1)]
    table = (study / "tables" / "perplexity.md").read_text()
    mean, std = sum(ppls) / 2, pd.Series(ppls).std(ddof=1)
    from mtad.paper.render import _fmt

    expected = f"{_fmt(mean, 'ppl')} ± {_fmt(std, 'ppl')} (n=2)"
    line = next(ln for ln in table.splitlines() if "| prompts " in ln and "| mtad " in ln)
    assert expected in line, (expected, line)


def test_rerender_loads_no_model_and_other_hardware_shares_no_ratio(
    smoke: tuple[Path, float, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    study, _, _ = smoke
    # One AR baseline run "moves" to other hardware: its ratios must disappear, not mix.
    ar0 = next(
        p
        for p in study.glob("ar-tiny-prompts-*/metrics.json")
        if json.loads(p.read_text())["seed"] == 0
    )
    metrics = json.loads(ar0.read_text())
    metrics["cpu_model"] = "Some Other CPU"
    ar0.write_text(json.dumps(metrics))

    import mtad.engine.loading

    reproduce = script()

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a model was loaded / a run launched during a re-render")

    monkeypatch.setattr(mtad.engine.loading, "load_pair", refuse)
    monkeypatch.setattr(reproduce.subprocess, "run", refuse)
    args = ["all", "--profile", "smoke", "--root", str(study.parent), "--no-wandb"]
    code = reproduce.main([*args, "--render-only"])
    assert code == 0
    # the moved run is no run of this machine: the plan would run it again here
    assert "--render-only: 1 runs missing" in capsys.readouterr().out
    numeric = pd.read_csv(study / "tables" / "main.csv")
    row = numeric[
        (numeric["task"] == "prompts")
        & (numeric["method"] == "mtad")
        & (numeric["metric"] == "speedup_vs_ar")
    ]
    assert row["n"].item() == 1  # only seed 1 shares the hardware of its AR run
    ar1 = next(
        json.loads(p.read_text())
        for p in study.glob("ar-tiny-prompts-*/metrics.json")
        if json.loads(p.read_text())["seed"] == 1
    )
    assert row["mean"].item() == pytest.approx(
        ar1["ms_per_token"] / _main_run(study, "mtad", 1)["ms_per_token"], rel=1e-9
    )
    assert not math.isnan(row["mean"].item())


def test_a_preset_with_a_grid_says_what_to_do(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "run.py",
            "+experiment=opt13b",
            "+sweep=methods",
            f"hydra.sweep.dir={tmp_path}/ms",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode != 0
    assert "hydra.sweeper.params: a paper preset runs the experiments/ recipes" in out.stderr


@pytest.fixture(scope="module")
def export(smoke: tuple[Path, float, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``--render-only --export`` of the smoke study, its W&B analysis run included (in a
    subprocess: W&B stays out of the test process); the tests of an export share it."""
    study, _, _ = smoke
    dest = tmp_path_factory.mktemp("export") / "reference"
    out, _ = _reproduce(
        study.parent, "all", "--profile", "smoke", "--render-only", "--export", str(dest)
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return dest


def test_an_export_names_no_folder_of_this_machine(
    smoke: tuple[Path, float, str], export: Path
) -> None:
    study, _, _ = smoke
    dest = export
    texts = {p: p.read_text() for p in dest.rglob("*") if p.suffix in (".md", ".txt", ".json")}
    assert "--root <wandb-dir> --wandb-dir <wandb-dir>" in texts[dest / "command.txt"]  # one folder
    leaks = [p.name for p, text in texts.items() if str(study.parent) in text or str(REPO) in text]
    assert not leaks
    # the committed reference: no absolute folder after --root, --wandb-dir, cd or logger.dir
    machine = re.compile(r"(--root |--wandb-dir |cd |`logger.dir`: `)/")
    committed = [
        p
        for p in (REPO / "results" / "reference").rglob("*")
        if p.suffix in (".md", ".txt", ".json")
    ]
    assert not [p.name for p in committed if machine.search(p.read_text())]
    # nor any absolute folder of a usual machine root anywhere (URLs' paths are not matched)
    absolute = re.compile(r"(?<![\w.<>-])/(?:work|home|root|tmp|Users|scratch|mnt|data)/")
    assert not [p.name for p in committed if absolute.search(p.read_text())]


def test_readme_main_table_is_the_committed_cpu_reference() -> None:
    """The README's CPU tables (main and claims) are the reference files, not hand-edited
    copies."""
    readme = (REPO / "README.md").read_text()
    for table in ("main", "claims"):
        start, end = f"<!-- reference:{table} -->\n", f"\n<!-- /reference:{table} -->"
        inline = readme[readme.index(start) + len(start) : readme.index(end)]
        reference = REPO / "results" / "reference" / "cpu" / "tables" / f"{table}.md"
        assert inline.strip() == reference.read_text().strip(), table
    for name in (
        "paper.md",
        "command.txt",
        "environment.json",
        "report/report.md",
        "report/report.json",
        "figures/main_speedup.png",
        "figures/main_speedup.pdf",
    ):
        assert (REPO / "results" / "reference" / "cpu" / name).is_file(), name


def test_gpu_runs_written_on_gpu_nodes_are_found_by_a_planner_without_one(
    smoke: tuple[Path, float, str], tmp_path: Path
) -> None:
    """A login node plans GPU runs that GPU nodes write: the GPU model is part of their
    identity but the planner cannot know it, so it takes the study's runs of the machine that
    ran them (all of one GPU model, hence comparable). A CPU run is a run of this machine: one
    written on another CPU is run again here (its speed-ups must pair runs of one CPU)."""
    import shutil

    import yaml

    from mtad.paper.plan import make_plan
    from mtad.paper.status import hydra_composer

    study, _, _ = smoke
    root = tmp_path / "results"
    shutil.copytree(study, root / study.name, ignore=shutil.ignore_patterns("wandb"))
    gpu = {"device_kind": "cuda", "gpu_model": "Some GPU", "gpu_count": 1}
    for i, folder in enumerate(sorted(p for p in (root / study.name).iterdir() if p.is_dir())):
        if not (folder / "metrics.json").is_file():
            continue
        cfg = yaml.safe_load((folder / "config.yaml").read_text())
        cfg["hardware"], cfg["runtime"]["device"] = gpu, "cuda"
        (folder / "config.yaml").write_text(yaml.safe_dump(cfg))
        metrics = json.loads((folder / "metrics.json").read_text())
        (folder / "metrics.json").write_text(json.dumps({**metrics, **gpu, "device": "cuda"}))
        folder.rename(folder.with_name(f"{folder.name.rsplit('-', 1)[0]}-gpu{i:07d}"))
    overrides = [f"results.root={root}", "runtime.device=cuda"]
    with hydra_composer() as compose:
        plan = make_plan(["ablation_tau"], "smoke", compose, None, overrides)
        assert not plan.jobs
        assert all(s.result_dir.name.split("-")[-1].startswith("gpu") for s in plan.status.values())
        # planned for this CPU, nothing of the study is a run of this machine
        plan = make_plan(["ablation_tau"], "smoke", compose, None, overrides[:1])
    assert {s.state for s in plan.status.values()} == {"missing"} and plan.jobs


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"tabel": {}}, "unknown key 'tabel'"),
        ({"table": {"rows": ["pair"], "columns": {"ppl": "PPL"}}}, "unknown key table.rows"),
        ({"claims": [{"claim": "c", "format": "ratio"}]}, "unknown claim key 'format'"),
        (
            {"table": {"columns": {"ppl": "PPL"}}, "claims": [{"claim": "c"}]},
            r"a table and claims would both write tables/r\.\*",
        ),
    ],
)
def test_recipe_keys_are_read_or_refused(tmp_path: Path, extra: dict, message: str) -> None:
    recipe = {"title": "t", "runs": [{"method": ["ar"], "task": ["prompts"]}], **extra}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    with pytest.raises(RecipeError, match=message):
        load_recipe("r", tmp_path)


# --------------------------------------------------------------------------------------------
# the quality-speed frontier, and ratio intervals in rendered tables

# A factor cell's interval as the renderer writes it: "1.38x [1.02x, 1.87x]" (mtad.paper.render)
FACTOR_INTERVAL = re.compile(r"\[(-?\d+(?:\.\d+)?)x, (-?\d+(?:\.\d+)?)x\]")


def factor_bounds(folder: Path) -> list[tuple[str, float, float]]:
    """Every factor interval in the Markdown under ``folder``: (file, lo, hi)."""
    return [
        (p.name, float(lo), float(hi))
        for p in sorted(folder.rglob("*.md"))
        for lo, hi in FACTOR_INTERVAL.findall(p.read_text())
    ]


@pytest.fixture(scope="module")
def frontier_smoke(smoke: tuple[Path, float, str]) -> tuple[Path, str]:
    """The frontier of ``reproduce.py all --profile smoke`` (the profile's 2 prompts and 2
    seeds; most of its runs are the main recipe's), from the one smoke run of this module."""
    study, _, stdout = smoke
    return study, stdout


def test_smoke_frontier_draws_the_tables_comparisons(frontier_smoke: tuple[Path, str]) -> None:
    """The frontier figure renders, and its points and error bars (the CSV beside it, what it
    drew) are the frontier table's own comparisons: the same estimates and intervals."""
    study, stdout = frontier_smoke
    assert "frontier" in stdout and "predicted (budget" in stdout
    figure = study / "figures" / "frontier_frontier"
    assert figure.with_suffix(".png").is_file() and figure.with_suffix(".pdf").is_file()
    points = pd.read_csv(figure.with_suffix(".csv"))
    table = pd.read_csv(study / "tables" / "frontier.csv")
    labels = set(points["method"])
    assert {"ar", "sps", "blockverify", "mtjd", "mmtad", "mtad(tau=0.1)"} <= labels
    assert {"mtad", "bild"} <= set(points["method_name"])
    for column in ("speedup_vs_ar", "ppl_change_vs_ar"):
        rows = table[table["metric"] == column].set_index("method")
        for _, point in points[points["method"] != "ar"].iterrows():  # AR: the baseline
            row = rows.loc[point["method"]]
            for mine, theirs in ((column, "mean"), (f"{column}_lo", "lo"), (f"{column}_hi", "hi")):
                assert point[mine] == pytest.approx(row[theirs], rel=1e-12, nan_ok=True)
    # the smoke profile's 2 prompts give no intervals: error bars drawn from intervals are
    # tested on known data (tests/test_intervals.py::test_frontier_points_are_the_tables_...)
    ar = points[points["method"] == "ar"].iloc[0]
    assert (ar["speedup_vs_ar"], ar["ppl_change_vs_ar"]) == pytest.approx((1.0, 0.0))
    bounds = factor_bounds(study)  # whatever intervals the smoke tables have
    assert all(lo > 0 and hi > 0 for _, lo, hi in bounds), bounds


def test_frontier_fits_the_cpu_profile_budget() -> None:
    """The cost model's prediction of the frontier recipe from scratch, under the cpu
    profile, is printed by the plan and within the profile's budget."""
    from mtad.paper.plan import describe, make_plan
    from mtad.paper.status import hydra_composer

    with hydra_composer() as compose:
        plan = make_plan(["frontier"], "cpu", compose)
    budget = plan.profile.budget_s
    predicted = plan.recipe_estimate_s("frontier")
    assert budget is not None and 0 < predicted <= budget, (predicted, budget)
    line = next(ln for ln in describe(plan).splitlines() if ln.strip().startswith("frontier"))
    assert f"~{predicted / 60:.1f} min predicted (budget {budget / 60:.0f} min)" in line
    assert "over the profile's budget" not in line


def test_the_cost_model_follows_the_dtype_the_host_runs(tmp_path: Path) -> None:
    """A profile's ``cost.<dtype>`` block prices the runs this host runs in that dtype (float32
    on a CPU without native bfloat16); runs in any other dtype keep the profile's own figures."""
    from mtad.cpu import choose_dtype
    from mtad.paper.plan import make_plan
    from mtad.paper.status import hydra_composer

    profiles = yaml.safe_load((REPO / "experiments" / "profiles.yaml").read_text())
    cost = profiles["cpu"]["cost"]
    assert cost["float32"]["s_per_token"]["default"] > cost["s_per_token"]["default"]
    cost["float32"] = {"overhead_s": 7.0, "s_per_token": {"default": 0.5, "ar": 0.25}}
    (tmp_path / "profiles.yaml").write_text(yaml.safe_dump(profiles))
    prof = load_profile("cpu", tmp_path)
    assert (prof.overhead_seconds("float32"), prof.overhead_seconds("bfloat16")) == (7.0, 20.0)
    assert prof.seconds_per_token("mtad", "float32") == 0.5
    assert prof.seconds_per_token("ar", "float32") == 0.25
    assert prof.seconds_per_token("ar", "bfloat16") == cost["s_per_token"]["ar"]
    assert prof.seconds_per_token("mtad", None) == cost["s_per_token"]["default"]

    with hydra_composer() as compose:
        plan = make_plan(["ablation_gamma"], "cpu", compose)
    host_dtype = choose_dtype("auto", "cpu")[0]
    assert {s.dtype for s in plan.jobs} == {host_dtype}
    committed = plan.profile
    expected = sum(
        committed.overhead_seconds(host_dtype)
        + s.n_samples * s.max_new_tokens * committed.seconds_per_token(s.planned.method, host_dtype)
        for s in plan.jobs
    )
    assert plan.estimate_s() == pytest.approx(expected)


def test_the_committed_reference_has_no_non_positive_ratio_bound() -> None:
    bounds = factor_bounds(REPO / "results" / "reference")
    assert bounds
    assert not [b for b in bounds if b[1] <= 0 or b[2] <= 0], bounds


# --------------------------------------------------------------------------------------------
# a reference re-rendered from its records alone (mtad.runs.store)


def _rendered_files(study: Path) -> dict[str, bytes]:
    """The tables (Markdown, LaTeX, CSV) and the numbers drawn beside figures, by name."""
    files = {p.relative_to(study).as_posix(): p for p in (study / "tables").glob("*")}
    files.update({p.relative_to(study).as_posix(): p for p in (study / "figures").glob("*.csv")})
    return {name: path.read_bytes() for name, path in sorted(files.items())}


def test_an_export_rerenders_from_its_records_with_no_run_folder(
    smoke: tuple[Path, float, str], export: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """``--export`` writes records/; ``--records`` renders every table, figure and claim of
    the export again while the study's run folders are out of reach, and the tables are the
    exported ones, byte for byte (the re-render in this process: it launches nothing)."""
    study, _, _ = smoke
    dest = export
    assert (dest / "records" / "runs.jsonl").is_file() and (
        dest / "records" / "plan.jsonl"
    ).is_file()
    hidden = study.with_name(study.name + ".hidden")
    study.rename(hidden)  # no run folder where the study was
    try:
        code, stdout = reproduce_here(
            capsys, tmp_path / "again", "--records", str(dest / "records"), "--no-wandb"
        )
    finally:
        hidden.rename(study)
    assert code == 0, stdout[-2000:]
    rerendered = tmp_path / "again" / study.name
    expected = _rendered_files(dest)
    assert {f"tables/{r}.{e}" for r in recipe_names() for e in ("md", "tex", "csv")} <= set(
        expected
    )
    assert _rendered_files(rerendered) == expected
    figures = {p.name for p in (dest / "figures").glob("*.png")}
    assert figures and figures == {p.name for p in (rerendered / "figures").glob("*.png")}


def test_the_committed_reference_rerenders_to_its_tables(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    reference = REPO / "results" / "reference" / "cpu"
    code, stdout = reproduce_here(
        capsys, tmp_path, "--records", str(reference / "records"), "--no-wandb"
    )
    assert code == 0, stdout[-2000:]
    study = next(p for p in tmp_path.iterdir() if (p / "tables").is_dir())
    assert _rendered_files(study) == _rendered_files(reference)


def test_a_grid_sized_by_prompts_runs_its_own_seeds() -> None:
    """The cpu claims: instruct on all its prompts with one seed (AR's accuracy interval comes
    from prompts), the prompt set with the profile's three seeds."""
    runs = expand(load_recipe("claims"), load_profile("cpu"))
    instruct = [r for r in runs if r.task == "instruct"]
    assert {r.seed for r in instruct} == {0} and {r.method for r in instruct} == {
        "ar", "mtad", "mmtad"
    }  # fmt: skip
    assert {r.seed for r in runs if r.task == "prompts"} == {0, 1, 2}
    assert all(r.unavailable is not None for r in runs if r.task == "humaneval")
