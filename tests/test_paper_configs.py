"""Paper presets and sweeps: every swept value composes into a valid run (Hydra's own override
parser expands the sweep strings), and the v1 MJSD preset says what the v1 code ran."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser

from mtad.harness.config import validate

CONF = Path(__file__).resolve().parents[1] / "conf"
SWEEPS = sorted(p.stem for p in (CONF / "sweep").glob("*.yaml"))


def compose_cfg(*overrides: str, hydra: bool = False):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=hydra)


def expand(key: str, values: str) -> list[str]:
    override = OverridesParser.create().parse_override(f"{key}={values}")
    if override.is_sweep_override():
        return list(override.sweep_string_iterator())
    return [override.get_value_element_as_str()]


@pytest.mark.parametrize("name", SWEEPS)
def test_every_swept_value_validates(name: str) -> None:
    params = compose_cfg(f"+sweep={name}", hydra=True).hydra.sweeper.params
    for key, values in params.items():
        for value in expand(key, str(values)):
            spec = validate(compose_cfg("+experiment=smoke", f"+sweep={name}", f"{key}={value}"))
            if key.startswith("method."):
                got = spec.method_params[key.removeprefix("method.")]
                assert str(got).replace(" ", "") == value or float(got) == float(value)


def test_new_sweeps_cover_the_published_settings() -> None:
    def values(name: str, key: str) -> list[str]:
        return expand(key, str(compose_cfg(f"+sweep={name}", hydra=True).hydra.sweeper.params[key]))

    fall = [float(v) for v in values("bild_thresholds", "method.fallback_threshold")]
    roll = [float(v) for v in values("bild_thresholds", "method.rollback_threshold")]
    for pair in ((0.3, 2), (0.9, 1), (0.9, 2), (0.9, 3)):  # ZongyueQin/MJSD BiLD_params
        assert pair[0] in fall and pair[1] in roll
    assert "8" in values("mtad_beam_width", "method.beam_width")
    assert "[4,2,2]" in values("specinfer_branching", "method.branching")


def test_mjsd_v1_preset() -> None:
    spec = validate(compose_cfg("+experiment=mjsd_v1"))
    p = spec.method_params
    assert (spec.method_name, p["gamma"], p["beam_width"], p["tau"]) == ("mtad", 4, 8, 0.9)
    assert (p["top_k"], p["top_p"]) == (20, 0.9)
    assert spec.task_name == "chatalpaca" and spec.cfg.task["max_new_tokens"] == 128
    assert spec.target.path == "meta-llama/Llama-2-13b-hf"
    assert spec.draft is not None and spec.draft.path == "JackFram/llama-68m"


RECIPE_SWEEPER = "hydra_plugins.mtad_recipes.recipe_sweeper.RecipeSweeper"


@pytest.mark.parametrize("name", SWEEPS)
def test_every_sweep_usage_line_is_a_command_that_sweeps(name: str) -> None:
    """Each ``#   python run.py -m ...`` line of a sweep file composes, and its grid reaches
    the basic sweeper: a paper preset's recipe sweeper refuses ``hydra.sweeper.params``."""
    lines = [
        line.removeprefix("#").split("#")[0].split()
        for line in (CONF / "sweep" / f"{name}.yaml").read_text().splitlines()
        if line.startswith("#   python run.py")
    ]
    assert lines, f"conf/sweep/{name}.yaml has no usage line"
    for words in lines:
        overrides = [w for w in words[2:] if not w.startswith("-")]
        assert f"+sweep={name}" in overrides
        cfg = compose_cfg(*overrides, hydra=True)
        assert cfg.hydra.sweeper.params, words
        assert cfg.hydra.sweeper._target_ != RECIPE_SWEEPER, " ".join(words)
