"""Recipes (``experiments/*.yaml``) and profiles (``experiments/profiles.yaml``), loaded and
checked; :mod:`mtad.paper.expansion` expands them into the harness runs behind each paper table
or figure.

A recipe says what it reproduces, its runs as grids of Hydra overrides (each grid a cartesian
product, run for every pair and seed of the profile) and how they aggregate (table columns,
figures, claims). A profile says where and at what size: the study, the pairs with the overrides
that select them, the seeds, overrides for every run and per task, and the tasks it does not run
(with why and the override that enables them). Recipes overlap on purpose: a run shared by two
recipes has one signature, so it runs once and both recipes read it.

The same expansion feeds ``scripts/reproduce.py`` (which runs and renders) and the Hydra sweeper
``hydra_plugins.mtad_recipes`` (which lets ``python run.py +experiment=llama70b`` launch a pair's
paper runs through any Hydra launcher): one source of truth for what a paper table needs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mtad.cpu import DTYPE_CHOICES

REPO = Path(__file__).resolve().parents[2]
EXPERIMENTS = REPO / "experiments"
PROFILES_FILE = "profiles.yaml"
PROFILES = ("paper", "cpu", "smoke")
# Every key a recipe may hold, and each is read (a key outside these is refused, not ignored).
RECIPE_KEYS = ("title", "reproduces", "runs", "table", "figures", "claims", "profiles")
TABLE_KEYS = ("columns",)  # rows are always pair, task, method label
CLAIM_KEYS = ("claim", "source", "paper", "method", "metric", "holds_if")


class RecipeError(ValueError):
    """A recipe or profile that cannot be used; the message is one line."""


@dataclass(frozen=True)
class Unavailable:
    why: str
    enable: str

    def text(self) -> str:
        return f"not run: {self.why} (enable: {self.enable})"


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    study: str
    pairs: dict[str, tuple[str, ...]]
    seeds: tuple[int, ...]
    overrides: tuple[str, ...]
    task_overrides: dict[str, tuple[str, ...]]
    unavailable: dict[str, Unavailable]
    overhead_s: float
    s_per_token: dict[str, float]
    # The wall time one recipe of this profile should take, predicted from scratch by the cost
    # model (None: no budget); describe() prints each recipe's prediction beside it.
    budget_s: float | None = None
    # The cost model of runs in another dtype (``cost.<dtype>`` in profiles.yaml): "auto" runs
    # a CPU pair in float32 where the CPU has no native bfloat16, 2-4x slower per token.
    dtype_costs: dict[str, tuple[float, dict[str, float]]] = field(default_factory=dict)

    def overhead_seconds(self, dtype: str | None = None) -> float:
        return self.dtype_costs[dtype][0] if dtype in self.dtype_costs else self.overhead_s

    def seconds_per_token(self, method: str, dtype: str | None = None) -> float:
        table = self.dtype_costs[dtype][1] if dtype in self.dtype_costs else self.s_per_token
        return float(table.get(method, table.get("default", 0.1)))


@dataclass(frozen=True)
class Recipe:
    name: str
    title: str
    reproduces: str
    runs: tuple[dict[str, tuple[Any, ...]], ...]
    table: dict[str, Any]
    figures: tuple[dict[str, Any], ...]
    claims: tuple[dict[str, Any], ...]
    profiles: dict[str, dict[str, Any]]

    def grids(self, profile: str) -> tuple[dict[str, tuple[Any, ...]], ...]:
        custom = self.profiles.get(profile, {}).get("runs")
        return _grids(custom, self.name) if custom else self.runs

    def seeds(self, profile: Profile) -> tuple[int, ...]:
        custom = self.profiles.get(profile.name, {}).get("seeds")
        return tuple(int(s) for s in custom) if custom else profile.seeds


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as err:
        raise RecipeError(f"{path}: cannot read ({err.strerror})") from err
    except yaml.YAMLError as err:
        raise RecipeError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from err
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: expected a mapping at the top level")
    return data


def recipe_names(root: Path = EXPERIMENTS) -> list[str]:
    return sorted(p.stem for p in root.glob("*.yaml") if p.name != PROFILES_FILE)


def load_profile(name: str, root: Path = EXPERIMENTS) -> Profile:
    profiles = _read_yaml(root / PROFILES_FILE)
    if name not in profiles:
        raise RecipeError(
            f"profile {name!r} is not in {root / PROFILES_FILE}; choose from {', '.join(profiles)}"
        )
    p = profiles[name]
    try:
        unavailable = {
            task: Unavailable(str(u["why"]), str(u["enable"]))
            for task, u in (p.get("unavailable") or {}).items()
        }
        cost = p.get("cost") or {}
        return Profile(
            name=name,
            description=" ".join(str(p.get("description", "")).split()),
            study=str(p["study"]),
            pairs={str(k): tuple(map(str, v or ())) for k, v in p["pairs"].items()},
            seeds=tuple(int(s) for s in p["seeds"]),
            overrides=tuple(map(str, p.get("overrides") or ())),
            task_overrides={
                str(k): tuple(map(str, v or ())) for k, v in (p.get("task_overrides") or {}).items()
            },
            unavailable=unavailable,
            overhead_s=float(cost.get("overhead_s", 0.0)),
            s_per_token=_per_token(cost),
            budget_s=float(cost["budget_s"]) if cost.get("budget_s") is not None else None,
            dtype_costs={
                str(dtype): (float(cost[dtype].get("overhead_s", 0.0)), _per_token(cost[dtype]))
                for dtype in DTYPE_CHOICES
                if dtype in cost
            },
        )
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise RecipeError(f"profile {name!r}: bad or missing field ({err})") from err


def _per_token(cost: dict[str, Any]) -> dict[str, float]:
    return {str(k): float(v) for k, v in (cost.get("s_per_token") or {}).items()}


def _grids(raw: Any, recipe: str) -> tuple[dict[str, tuple[Any, ...]], ...]:
    if not isinstance(raw, list) or not raw:
        raise RecipeError(f"recipe {recipe!r}: 'runs' must be a non-empty list of grids")
    grids = []
    for grid in raw:
        if not isinstance(grid, dict) or "method" not in grid or "task" not in grid:
            raise RecipeError(f"recipe {recipe!r}: every grid needs 'method' and 'task' lists")
        grids.append({str(k): tuple(v) if isinstance(v, list) else (v,) for k, v in grid.items()})
    return tuple(grids)


def load_recipe(name: str, root: Path = EXPERIMENTS) -> Recipe:
    path = root / f"{name}.yaml"
    if not path.is_file():
        raise RecipeError(
            f"unknown recipe {name!r}; choose from all, {', '.join(recipe_names(root))}"
        )
    data = _read_yaml(path)
    _check_keys(name, data)
    return Recipe(
        name=name,
        title=str(data.get("title", name)),
        reproduces=" ".join(str(data.get("reproduces", "")).split()),
        runs=_grids(data.get("runs"), name),
        table=dict(data.get("table") or {}),
        figures=tuple(data.get("figures") or ()),
        claims=tuple(data.get("claims") or ()),
        profiles=dict(data.get("profiles") or {}),
    )


def _unknown(found: Iterable[Any], allowed: tuple[str, ...]) -> list[str]:
    return sorted(str(k) for k in found if k not in allowed)


def _check_keys(name: str, data: dict[str, Any]) -> None:
    """Refuse keys nothing reads, and a recipe whose outputs would share one file stem."""
    where = f"recipe {name!r}"
    if bad := _unknown(data, RECIPE_KEYS):
        raise RecipeError(
            f"{where}: unknown key {bad[0]!r}; a recipe holds {', '.join(RECIPE_KEYS)}"
        )
    if bad := _unknown(data.get("table") or {}, TABLE_KEYS):
        raise RecipeError(f"{where}: unknown key table.{bad[0]}; a table holds only 'columns'")
    for claim in data.get("claims") or ():
        if bad := _unknown(claim, CLAIM_KEYS):
            raise RecipeError(
                f"{where}: unknown claim key {bad[0]!r}; a claim holds {', '.join(CLAIM_KEYS)}"
            )
    if (data.get("table") or {}).get("columns") and data.get("claims"):
        raise RecipeError(
            f"{where}: a table and claims would both write tables/{name}.*; "
            "put the claims in a recipe of their own"
        )


def load_recipes(names: Iterable[str], root: Path = EXPERIMENTS) -> list[Recipe]:
    """``all`` (alone or among others) means every recipe file."""
    wanted = list(names)
    if not wanted or "all" in wanted:
        wanted = recipe_names(root)
    return [load_recipe(n, root) for n in dict.fromkeys(wanted)]


__all__ = [
    "EXPERIMENTS",
    "PROFILES",
    "Profile",
    "Recipe",
    "RecipeError",
    "Unavailable",
    "load_profile",
    "load_recipe",
    "load_recipes",
    "recipe_names",
]
