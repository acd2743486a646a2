"""A recipe under a profile expanded into the harness runs it needs (:class:`PlannedRun`).

Every grid of the recipe (:mod:`mtad.paper.recipes`) is a cartesian product, run for every pair
and seed of the profile. A run's overrides are layered, later layers winning per key: the
pair's, the study, the profile's, the profile's for the task, the user's, the grid point's, the
seed. The user may not set what the recipes compare (:data:`RUN_KEYS`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mtad.paper.recipes import Profile, Recipe, RecipeError, Unavailable
from mtad.runs.labels import override_text, run_label

# Keys a recipe grid sets per run; a user override of one of them would silently change what
# the recipe compares, so it is refused.
RUN_KEYS = ("method", "task", "runtime.seed")
# A grid key that is no override: the seeds that grid runs (default: the recipe's or profile's).
GRID_SEEDS = "seeds"


@dataclass(frozen=True)
class PlannedRun:
    """One harness run a recipe needs: its overrides for ``run.py`` and what it stands for."""

    recipe: str
    pair: str
    method: str
    task: str
    label: str  # the method and the method params the grid sets: "mtad(tau=0.3)"
    seed: int
    overrides: tuple[str, ...]
    params: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    unavailable: Unavailable | None = None

    @property
    def key(self) -> tuple[str, ...]:
        """Identity before composing: the same overrides are the same run."""
        return tuple(sorted(self.overrides))


def override_key(override: str) -> str:
    """The key an override sets: ``+experiment=x`` -> ``experiment``, ``~a.b`` -> ``a.b``."""
    head = override.split("=", 1)[0]
    return head.lstrip("+~")


def merge_overrides(*layers: Sequence[str]) -> tuple[str, ...]:
    """Later layers win per key; order of first appearance is kept (Hydra applies group
    choices before values whatever the order, and a repeated group choice is an error)."""
    merged: dict[str, str] = {}
    for layer in layers:
        for ov in layer:
            merged[override_key(ov)] = ov
    return tuple(merged.values())


def expand(
    recipe: Recipe,
    profile: Profile,
    pairs: Sequence[str] | None = None,
    user_overrides: Sequence[str] = (),
) -> list[PlannedRun]:
    """Every run ``recipe`` needs under ``profile`` (optionally only ``pairs``), with the
    user's overrides applied after the profile's and before the recipe's own keys."""
    clash = [ov for ov in user_overrides if override_key(ov) in RUN_KEYS]
    if clash:
        raise RecipeError(
            f"{override_key(clash[0])}: set by the recipes (method, task and seed are what they "
            f"compare); drop {clash[0]!r} or run one configuration with run.py"
        )
    chosen = list(profile.pairs) if not pairs else list(pairs)
    unknown = [p for p in chosen if p not in profile.pairs]
    if unknown:
        raise RecipeError(
            f"pair {unknown[0]!r} is not in profile {profile.name!r}; choose from "
            f"{', '.join(profile.pairs)}"
        )
    runs: list[PlannedRun] = []
    for pair in chosen:
        for grid in recipe.grids(profile.name):
            # a grid's own ``seeds`` (a task sized by prompts rather than seeds) win
            seeds = grid.get(GRID_SEEDS) or recipe.seeds(profile)
            keys = [k for k in grid if k != GRID_SEEDS]
            for seed in seeds:
                for values in itertools.product(*(grid[k] for k in keys)):
                    point = dict(zip(keys, values, strict=True))
                    runs.append(_planned(recipe, profile, pair, point, user_overrides, int(seed)))
    return runs


def _planned(
    recipe: Recipe,
    profile: Profile,
    pair: str,
    point: dict[str, Any],
    user_overrides: Sequence[str],
    seed: int,
) -> PlannedRun:
    """The run of one grid point (``method``, ``task`` and the other keys it sets) on ``pair``
    with ``seed``: its overrides layered as the module docstring says, its label the one rule
    (:func:`mtad.runs.labels.run_label`) over the method params the point sets."""
    point = dict(point)
    method, task = str(point.pop("method")), str(point.pop("task"))
    params = {k.removeprefix("method."): v for k, v in point.items() if k.startswith("method.")}
    own = [f"method={method}", f"task={task}"]
    own += [f"{k}={override_text(v)}" for k, v in point.items()]
    overrides = merge_overrides(
        profile.pairs[pair],
        [f"results.study={profile.study}"],
        profile.overrides,
        profile.task_overrides.get(task, ()),
        user_overrides,
        own,
        [f"runtime.seed={seed}"],
    )
    return PlannedRun(
        recipe=recipe.name,
        pair=pair,
        method=method,
        task=task,
        label=run_label(method, params),
        seed=seed,
        overrides=overrides,
        params=params,
        unavailable=profile.unavailable.get(task),
    )


def expand_all(
    recipes: Sequence[Recipe],
    profile: Profile,
    pairs: Sequence[str] | None = None,
    user_overrides: Sequence[str] = (),
) -> dict[str, list[PlannedRun]]:
    return {r.name: expand(r, profile, pairs, user_overrides) for r in recipes}


def unique_runs(planned: dict[str, list[PlannedRun]]) -> list[PlannedRun]:
    """Each distinct override set once, in recipe order (recipes share runs)."""
    seen: dict[tuple[str, ...], PlannedRun] = {}
    for runs in planned.values():
        for run in runs:
            seen.setdefault(run.key, run)
    return list(seen.values())


__all__ = [
    "RUN_KEYS",
    "PlannedRun",
    "expand",
    "expand_all",
    "merge_overrides",
    "override_key",
    "unique_runs",
]
