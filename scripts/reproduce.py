#!/usr/bin/env python
"""Regenerate the paper's tables and figures: run what is missing, then render.

    python scripts/reproduce.py all --profile smoke                 # tiny pair, seconds
    python scripts/reproduce.py all --profile cpu                   # smollm2 on CPU, hours
    python scripts/reproduce.py main ablation_tau --profile paper --pairs llama2_13b \\
        hydra/launcher=slurm_1gpu                                    # GPUs via SLURM
    python scripts/reproduce.py all --profile paper --dry-run       # every run, its state, cost
    python scripts/reproduce.py --records results/reference/cpu/records --root /tmp/re
                                                                     # re-render a reference

Recipes are ``experiments/*.yaml``, profiles ``experiments/profiles.yaml``. Missing runs are
launched as one Hydra multirun (``run.py -m hydra/sweeper=recipes ...``) so any Hydra launcher
override applies; complete runs are skipped by signature, and with every run done nothing is
launched and no model loads. Then each recipe renders to ``results/<study>/``: ``tables/``
(Markdown, LaTeX, CSV), ``figures/`` (PNG, PDF), ``paper.md``, a W&B analysis run and a W&B
report definition under ``report/`` (``--publish`` saves the report when W&B is online). The
harness runs launched and the analysis run log to one folder, ``--wandb-dir`` (their
``logger.dir``), which ``report/PUBLISH.md``'s sync command uploads; a profile with
``logger=none`` (smoke) logs no harness run, and the output says so.
Other ``key=value`` arguments are Hydra overrides for every run (``task.limit=2``); method, task
and seed belong to the recipes and are refused. ``--export DIR`` copies the rendering without
samples, with the compact per-run records the rendering rests on (``records/``,
:mod:`mtad.runs.store`; the committed CPU reference: ``--export results/reference/cpu``).
``--records DIR`` renders such a records folder again, on any machine: no run folder is read
and nothing is launched (the recipes, profile, pairs and overrides are the recorded ones).
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere: the repository's packages

from mtad.harness.results import environment  # noqa: E402
from mtad.paper import wandb_publish  # noqa: E402
from mtad.paper.plan import (  # noqa: E402
    Plan,
    describe,
    make_plan,
    plan_from_records,
    write_plan_records,
)
from mtad.paper.recipes import PROFILES, RecipeError  # noqa: E402
from mtad.paper.render import render  # noqa: E402
from mtad.paper.rendered import Rendered  # noqa: E402
from mtad.paper.status import Composer, hydra_composer  # noqa: E402
from mtad.runs.folder import write_json  # noqa: E402
from mtad.runs.store import RECORDS_DIR  # noqa: E402

EXIT_USAGE = 2


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "recipes",
        nargs="*",
        help="recipe names (experiments/*.yaml) or 'all'",
        metavar="RECIPE|all|OVERRIDE",
    )
    parser.add_argument("--profile", choices=PROFILES, default="cpu")
    parser.add_argument("--pairs", help="comma-separated subset of the profile's pairs")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="list the runs per recipe, their state and the cost; run nothing",
    )
    parser.add_argument("--verbose", "-v", action="store_true", help="list every run")
    parser.add_argument("--render-only", action="store_true", help="launch nothing")
    parser.add_argument("--root", default="results", help="results root (results.root)")
    parser.add_argument("--no-wandb", action="store_true", help="no W&B analysis run / report")
    parser.add_argument(
        "--wandb-dir",
        default=str(REPO),
        help="the one folder every W&B run of the study is logged in: the harness runs "
        "launched here (their logger.dir) and the analysis run; PUBLISH.md's sync command "
        "uploads them from there",
    )
    parser.add_argument(
        "--publish", action="store_true", help="save the W&B report (W&B online) and print its URL"
    )
    parser.add_argument("--export", type=Path, help="copy the rendering (no samples) here")
    parser.add_argument(
        "--records",
        type=Path,
        help="render this records folder (an export's records/) instead of run folders",
    )
    args = parser.parse_intermixed_args(argv)
    # Positional words with "=" (or starting with "+"/"~") are Hydra overrides.
    words = args.recipes
    args.overrides = [w for w in words if "=" in w or w.startswith(("+", "~"))]
    args.recipes = [w for w in words if w not in args.overrides]
    if args.records is not None:
        runs = [o for o in args.overrides if not o.lstrip("+~").startswith("hydra")]
        if args.recipes or runs or args.dry_run or args.pairs:
            parser.error("--records renders the recipes, pairs and overrides it records: no more")
        args.render_only = True
    elif not args.recipes:
        parser.error("name at least one recipe, or 'all'")
    if any(o.lstrip("+~").startswith("logger.dir=") for o in args.overrides):
        parser.error("logger.dir: set by --wandb-dir (one folder holds every run the report shows)")
    args.hydra_overrides = [o for o in args.overrides if o.lstrip("+~").startswith("hydra")]
    args.run_overrides = [o for o in args.overrides if o not in args.hydra_overrides]
    if args.root != "results":
        args.run_overrides.append(f"results.root={args.root}")
    return args


def plan_runs(args: argparse.Namespace, compose: Composer) -> Plan:
    if args.records is not None:
        return plan_from_records(args.records)
    pairs = args.pairs.split(",") if args.pairs else None
    return make_plan(args.recipes, args.profile, compose, pairs, args.run_overrides)


def launch_command(args: argparse.Namespace) -> list[str]:
    cmd = [
        sys.executable,
        str(REPO / "run.py"),
        "-m",
        "hydra/sweeper=recipes",
        f"hydra.sweeper.recipes=[{','.join(args.recipes)}]",
        f"hydra.sweeper.profile={args.profile}",
    ]
    if args.pairs:
        cmd.append(f"hydra.sweeper.pairs=[{args.pairs}]")
    # The harness runs log where the analysis run does (run.py runs in the repository).
    logger_dir = f"logger.dir={Path(args.wandb_dir).resolve()}"
    return cmd + args.hydra_overrides + args.run_overrides + [logger_dir]


def shell_line(argv: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    # one composer for the plan before and after the sweep: its cache composes each set of
    # config-group choices once
    with hydra_composer() as compose:
        return _reproduce(args, argv, compose)


def _reproduce(args: argparse.Namespace, argv: list[str] | None, compose: Composer) -> int:
    t0 = time.perf_counter()
    try:
        plan = plan_runs(args, compose)
    except RecipeError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE
    print(describe(plan, verbose=args.verbose or args.dry_run))
    if args.dry_run:
        print("launch: " + shell_line(launch_command(args)))
        return 0
    launched_ok = True
    if plan.jobs and not args.render_only:
        cmd = launch_command(args)
        print(f"running {len(plan.jobs)} runs: {shell_line(cmd)}", flush=True)
        launched_ok = subprocess.run(cmd, cwd=REPO).returncode == 0
        plan = plan_runs(args, compose)  # the states after the sweep
    elif plan.jobs:
        print(f"--render-only: {len(plan.jobs)} runs missing; their cells say so")
    out_dir = Path(args.root) / plan.profile.study
    command = shell_line(
        ["python", "scripts/reproduce.py", *sys.argv[1:]]
        if argv is None
        else ["python", "scripts/reproduce.py", *argv]
    )
    rendered = render(plan, out_dir, commands=[command])
    print(
        f"rendered {len(rendered.tables)} tables, {len(rendered.figures)} figures -> "
        f"{out_dir}/paper.md"
    )
    if not args.no_wandb:
        publish_wandb(rendered, args.publish, args.wandb_dir, plan)
    if args.export:
        export(out_dir, args.export, command, plan)
        portable(args.export, {args.root: "<root>", args.wandb_dir: "<wandb-dir>"})
    failed = plan.counts()["failed"] + plan.counts()["missing"]
    print(f"reproduce: {time.perf_counter() - t0:.0f} s wall")
    if failed and not args.render_only:
        print(f"{failed} runs failed or missing: their cells say so; rerun to retry them")
    return 0 if launched_ok and (not failed or args.render_only) else 1


def publish_wandb(rendered: Rendered, publish: bool, wandb_dir: str, plan: Plan) -> None:
    """The study's W&B analysis run (tables, figures, ratios) and its report definition under
    ``report/``; ``publish`` saves the report when W&B is online (mtad.paper.wandb_publish)."""
    print(wandb_runs_line(rendered, plan, wandb_dir))
    analysis = wandb_publish.log_analysis_run(rendered, dir=wandb_dir)
    try:
        info = wandb_publish.write_report(
            rendered, publish=publish, wandb_dir=wandb_dir, analysis=analysis
        )
    except wandb_publish.PublishError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from err
    print(f"W&B analysis run {analysis['id']} ({analysis['mode']}) -> {analysis['dir']}")
    print(
        f"report definition -> {info['definition']}"
        + (f"; published: {info['url']}" if info.get("url") else "")
    )


def wandb_runs_line(rendered: Rendered, plan: Plan, wandb_dir: str) -> str:
    """Which harness runs behind the tables are on W&B: logged (their folders in
    ``wandb_dir``), or none, saying why (a profile that sets ``logger=none``)."""
    where = Path(wandb_dir) / "wandb"
    if not rendered.run_ids:
        why = (
            f"profile {plan.profile.name} sets logger=none"
            if "logger=none" in plan.profile.overrides
            else "logger=none"
        )
        return (
            f"W&B: the {rendered.unlogged_runs} harness runs logged nothing ({why}); "
            f"only the analysis run is logged, to {where}"
        )
    found, missing = wandb_publish.find_run_dirs(wandb_dir, rendered.run_ids)
    line = f"W&B: {len(rendered.run_ids)} harness runs logged, {len(found)} folders in {where}"
    if missing:
        line += f" ({len(missing)} not there: see PUBLISH.md)"
    if rendered.unlogged_runs:
        line += f"; {rendered.unlogged_runs} more logged nothing (logger=none)"
    return line


def export(out_dir: Path, dest: Path, command: str, plan: Plan) -> None:
    """Tables, figures, paper.md and the report (no samples, no W&B folders) to ``dest``."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for name in ("tables", "figures"):
        if (out_dir / name).is_dir():
            shutil.copytree(out_dir / name, dest / name)
    report = out_dir / "report"
    if report.is_dir():
        shutil.copytree(report, dest / "report", ignore=shutil.ignore_patterns("wandb", "*.wandb"))
    shutil.copy2(out_dir / "paper.md", dest / "paper.md")
    (dest / "command.txt").write_text(command + "\n")
    env = environment()
    summary = {k: env[k] for k in ("git", "python", "packages", "hardware")}
    # The commit(s) the runs ran at (each run's environment.json), beside the rendering's own.
    run_commits = set()
    for s in plan.status.values():
        if s.state == "done" and s.stored is not None:
            run_commits.add(str(s.stored.commit))
        elif s.state == "done" and s.result_dir is not None:
            run_env = json.loads((s.result_dir / "environment.json").read_text())
            run_commits.add(str((run_env.get("git") or {}).get("commit")))
    summary["run_commits"] = sorted(run_commits)
    summary["runs"] = {
        s.signature: s.planned.label + f" {s.planned.task} seed {s.planned.seed}"
        for s in plan.status.values()
        if s.state == "done"
    }
    write_json(dest / "environment.json", summary)
    n_runs = write_plan_records(plan, dest / RECORDS_DIR)
    print(f"records of {n_runs} runs -> {dest / RECORDS_DIR}")
    size = sum(f.stat().st_size for f in dest.rglob("*") if f.is_file())
    print(f"exported -> {dest} ({size // 1024} KiB)")


# The exported files that may quote this machine's folders (the command, the publishing notes).
TEXT_SUFFIXES = (".md", ".txt", ".json", ".jsonl", ".tex", ".csv")


def portable(dest: Path, folders: dict[str, str]) -> None:
    """Replace this machine's absolute ``folders`` in the exported text files by placeholders
    (``--root <root>``, ``cd <wandb-dir>``): a committed reference names no machine's paths."""
    names = {}
    for folder, placeholder in folders.items():
        for form in {str(folder), str(Path(folder).resolve())}:
            if Path(form).is_absolute() and form != "/":
                names[form] = placeholder
    for path in sorted(dest.rglob("*")):
        if not path.is_file() or path.suffix not in TEXT_SUFFIXES:
            continue
        text = original = path.read_text()
        for form in sorted(names, key=len, reverse=True):  # /x/results before /x
            text = text.replace(form, names[form])
        if text != original:
            path.write_text(text)


if __name__ == "__main__":
    raise SystemExit(main())
