"""A command line's overrides composed in-process as ``run.py``'s Hydra composes them, with
Hydra's error made the one-line :class:`~mtad.harness.config.ConfigError` ``run.py`` prints
(:func:`mtad.harness.cli.composition_error`), without starting a Hydra app."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.types import RunMode
from omegaconf import DictConfig

from mtad.harness.cli import COMPOSITION_ERRORS, command_line_overrides, composition_error
from mtad.harness.config import register_configs

CONF = Path(__file__).resolve().parents[1] / "conf"


def check_command_line(
    overrides: Sequence[str], conf_dir: Path = CONF, multirun: bool = False
) -> DictConfig:
    """Compose ``overrides`` as ``python run.py [-m] <overrides>`` does: first for the run mode
    (a preset may sweep), then in that mode; raise the :class:`ConfigError` run.py prints."""
    register_configs()
    with initialize_config_dir(config_dir=str(conf_dir.resolve()), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        try:
            cfg = loader.load_configuration(
                "config", list(overrides), RunMode.MULTIRUN, validate_sweep_overrides=False
            )
            if not multirun and cfg.hydra.mode != RunMode.MULTIRUN:
                cfg = loader.load_configuration("config", list(overrides), RunMode.RUN)
        except COMPOSITION_ERRORS as err:
            raise composition_error(err, command_line_overrides(overrides), conf_dir) from err
    return cfg
