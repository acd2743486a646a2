"""A plan: every recipe's runs under a profile, where each stands, and the jobs still to run.

Jobs are the runnable runs (missing, or failed before) deduplicated by signature: recipes share
runs, and two override sets can name one configuration (``method.tau=0.5`` is MTAD's default).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mtad.paper.expansion import PlannedRun, expand_all, unique_runs
from mtad.paper.recipes import Profile, Recipe, RecipeError, load_profile, load_recipes
from mtad.paper.status import Composer, RunStatus, estimate_seconds, resolve_all
from mtad.runs.store import StoredRun, read_records, stored_run, write_records


@dataclass
class Plan:
    profile: Profile
    recipes: list[Recipe]
    planned: dict[str, list[PlannedRun]]  # recipe -> its runs
    status: dict[tuple[str, ...], RunStatus]  # PlannedRun.key -> status
    jobs: list[RunStatus] = field(default_factory=list)  # runnable, one per signature
    pairs: list[str] = field(default_factory=list)  # the pairs planned (the profile's or a subset)
    overrides: list[str] = field(default_factory=list)  # the user's, for every run

    def statuses(self, recipe: str) -> list[RunStatus]:
        return [self.status[run.key] for run in self.planned[recipe]]

    def counts(self, recipe: str | None = None) -> Counter[str]:
        """Distinct runs (by signature; not-run entries by override set) per state."""
        pool = self.statuses(recipe) if recipe else list(self.status.values())
        seen: dict[object, str] = {}
        for s in pool:
            seen[s.signature or s.planned.key] = s.state
        return Counter(seen.values())

    def recipe_estimate_s(self, recipe: str) -> float:
        """The predicted wall time of ``recipe`` from scratch: each of its distinct runnable
        configurations (done or not; not the not-run ones) at the profile's cost model."""
        distinct = {s.signature: s for s in self.statuses(recipe) if s.state != "not_run"}
        return self.estimate_s(list(distinct.values()))

    def estimate_s(self, statuses: Sequence[RunStatus] | None = None) -> float:
        pool = self.jobs if statuses is None else statuses
        return sum(
            estimate_seconds(
                s,
                self.profile.overhead_seconds(s.dtype),
                self.profile.seconds_per_token(s.planned.method, s.dtype),
            )
            for s in pool
        )


def make_plan(
    recipe_names: Sequence[str],
    profile_name: str,
    compose: Composer,
    pairs: Sequence[str] | None = None,
    user_overrides: Sequence[str] = (),
) -> Plan:
    profile = load_profile(profile_name)
    recipes = load_recipes(recipe_names)
    planned = expand_all(recipes, profile, pairs, user_overrides)
    status = resolve_all(unique_runs(planned), compose)
    jobs: dict[str, RunStatus] = {}
    for s in status.values():
        if s.runnable and s.signature not in jobs:
            jobs[str(s.signature)] = s
    chosen = list(pairs) if pairs else list(profile.pairs)
    return Plan(
        profile, recipes, planned, status, list(jobs.values()), chosen, list(user_overrides)
    )


# --------------------------------------------------------------------------------------------
# records: a plan kept without its result folders (mtad.runs.store)


def write_plan_records(plan: Plan, folder: Path) -> int:
    """``plan``'s statuses and the compact records of its done runs under ``folder``
    (:func:`mtad.runs.store.write_records`); returns the number of runs written."""
    header: dict[str, Any] = {
        "profile": plan.profile.name,
        "recipes": [r.name for r in plan.recipes],
        "pairs": plan.pairs,
        "overrides": plan.overrides,
    }
    runs: dict[str, StoredRun] = {}
    for s in plan.status.values():
        if s.state == "done" and s.signature not in runs:
            runs[str(s.signature)] = s.stored or stored_run(s.result_dir)  # type: ignore[arg-type]
    write_records(folder, header, [s.as_record() for s in plan.status.values()], runs.values())
    return len(runs)


def plan_from_records(folder: Path) -> Plan:
    """The plan a records folder was written from (:func:`write_plan_records`): the recipes
    expanded again under its profile, pairs and overrides, each run's status as recorded, done
    runs read from their stored records. Nothing is composed or looked up on disk; a run the
    recipes plan today that the records do not hold is ``missing``. Nothing is to run."""
    records = read_records(folder)
    head = records.header
    profile = load_profile(str(head["profile"]))
    recipes = load_recipes(head["recipes"])
    planned = expand_all(recipes, profile, head["pairs"], head["overrides"])
    status: dict[tuple[str, ...], RunStatus] = {}
    for run in unique_runs(planned):
        kept = records.statuses.get(run.key)
        if kept is None:
            status[run.key] = RunStatus(run, "missing")
            continue
        stored = None
        if kept["state"] == "done":
            stored = records.runs.get(str(kept["signature"]))
            if stored is None:
                raise RecipeError(f"{folder}: run {kept['signature']} is done but not recorded")
        status[run.key] = RunStatus(
            run,
            kept["state"],
            signature=kept.get("signature"),
            reason=kept.get("reason"),
            n_samples=int(kept.get("n_samples") or 0),
            max_new_tokens=int(kept.get("max_new_tokens") or 0),
            dtype=kept.get("dtype"),
            stored=stored,
        )
    return Plan(profile, recipes, planned, status, [], list(head["pairs"]), list(head["overrides"]))


def describe(plan: Plan, verbose: bool = False) -> str:
    """Runs per recipe (distinct configurations) with their states and the recipe's predicted
    wall time from scratch against the profile's budget, and the cost of what is left."""
    lines = [
        f"profile {plan.profile.name!r} -> results/{plan.profile.study}/ "
        f"(pairs: {', '.join(plan.pairs)})"
    ]
    for recipe in plan.recipes:
        c = plan.counts(recipe.name)
        total = sum(c.values())
        parts = ", ".join(
            f"{c[k]} {k.replace('_', ' ')}"
            for k in ("done", "missing", "failed", "not_run")
            if c[k]
        )
        predicted = plan.recipe_estimate_s(recipe.name)
        budget = plan.profile.budget_s
        fits = "" if budget is None else f" (budget {budget / 60:.0f} min)"
        if budget is not None and predicted > budget:
            fits += ": over the profile's budget"
        lines.append(
            f"  {recipe.name:<15} {total:>4} runs ({parts}); ~{predicted / 60:.1f} min "
            f"predicted{fits}"
        )
        if verbose:
            for s in {id(s): s for s in plan.statuses(recipe.name)}.values():
                where = s.signature or (s.reason or "")
                lines.append(f"      {s.state:<8} {' '.join(s.planned.overrides)}  [{where}]")
    for note in sorted({s.host_note for s in plan.status.values() if s.host_note}):
        lines.append(
            f"  note: this host cannot run them itself ({note}): launch them where it "
            "can (e.g. hydra/launcher=slurm_1gpu)"
        )
    c = plan.counts()
    est = plan.estimate_s()
    dtypes = sorted({s.dtype for s in plan.status.values() if s.dtype})
    lines.append(
        f"  all recipes: {sum(c.values())} distinct runs; {len(plan.jobs)} to run "
        f"(~{est / 60:.0f} min at the profile's cost model, {'/'.join(dtypes) or 'no'} runs), "
        f"{c['done']} done, "
        f"{c['not_run']} not runnable here"
    )
    return "\n".join(lines)


__all__ = ["Plan", "describe", "make_plan", "plan_from_records", "write_plan_records"]
