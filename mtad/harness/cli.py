"""The command line checked before Hydra runs anything: one line naming the key, exit status 2.

Hydra reports a bad command line (an unknown group choice, a typo in a key, a value of the
wrong type for a key of the structured config, a sweep without ``-m``) as multi-line errors,
some only after the job started. ``run.py`` first composes the config exactly as Hydra will
(its own argument parser and config loader, :func:`check_command_line`) and turns the first
error into a :class:`ConfigError` naming the key the user wrote (:func:`composition_error`);
the sweep callback does the same for every job of a sweep
(:func:`mtad.harness.callbacks.validate_sweep`).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from hydra import initialize_config_dir
from hydra._internal.utils import get_args_parser
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import MissingConfigException
from hydra.types import RunMode
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from mtad.config_types import describe, hints, unknown_key
from mtad.harness.config import ConfigError, RunConfig, register_configs

EXIT_CONFIG_ERROR = 2
CONF = Path(__file__).resolve().parents[2] / "conf"


def report_config_error(err: ConfigError) -> NoReturn:
    print(f"error: {err}", file=sys.stderr)
    sys.exit(EXIT_CONFIG_ERROR)


def group_options(conf_dir: Path, group: str) -> list[str]:
    return sorted(p.stem for p in (conf_dir / group).glob("*.yaml"))


def check_command_line(argv: list[str], conf_dir: Path) -> None:
    """Compose ``argv`` as ``run.py``'s Hydra will and raise :class:`ConfigError` for its first
    error; a sweep (several values for one key) needs ``-m`` (or a preset that sweeps).
    Commands that compose nothing (``--help``, ``--info``, another config) are left to Hydra;
    the jobs of a sweep are checked by the sweep callback before any starts."""
    args = get_args_parser().parse_args(argv)
    elsewhere = (args.config_path, args.config_name, args.config_dir, args.experimental_rerun)
    if args.help or args.hydra_help or args.shell_completion or args.info or any(elsewhere):
        return
    overrides = parse_overrides(list(args.overrides))
    register_configs()
    with initialize_config_dir(config_dir=str(conf_dir.resolve()), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        try:  # what Hydra composes to learn the run mode, with the same errors as the run
            cfg = loader.load_configuration(
                "config",
                list(args.overrides),
                run_mode=RunMode.MULTIRUN,
                validate_sweep_overrides=False,
            )
        except Exception as err:  # noqa: BLE001 - Hydra and OmegaConf raise many kinds
            raise composition_error(err, overrides, conf_dir) from err
    if args.multirun or cfg.hydra.mode == RunMode.MULTIRUN:
        return  # the sweep callback checks every job before any starts
    for ov in overrides:
        if ov.is_sweep_override():
            value = ov.input_line.split("=", 1)[1]
            as_list = "" if (conf_dir / ov.key_or_group).is_dir() else f", or [{value}] for a list"
            raise ConfigError(
                ov.key_or_group, f"{value} is several values: add -m to run each{as_list}"
            )


def parse_overrides(overrides: Sequence[str]) -> list[Override]:
    """Hydra's parse of ``key=value`` overrides; a syntax error is a :class:`ConfigError`."""
    try:
        return OverridesParser.create().parse_overrides(list(overrides))
    except Exception as err:  # noqa: BLE001 - Hydra's parser raises several kinds
        raise ConfigError("overrides", _first_line(err)) from err


def composition_error(
    err: BaseException, overrides: Sequence[Override], conf_dir: Path = CONF
) -> ConfigError:
    """Hydra's composition error ``err`` (for ``overrides``) as one line naming the key."""
    if isinstance(err, MissingConfigException) and err.missing_cfg_file:
        group, _, choice = err.missing_cfg_file.rpartition("/")
        options = list(err.options or group_options(conf_dir, group))
        return ConfigError(group, f"unknown {group} {choice!r}; choose from {', '.join(options)}")
    cause = _omegaconf_cause(err)
    key = getattr(cause, "full_key", None)
    if cause is None or not key:
        return ConfigError("overrides", _first_line(err))
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)):
        return _unknown_key_error(str(key), getattr(cause, "parent_node", None))
    value = next((ov.value() for ov in overrides if ov.key_or_group == key), None)
    annotation = _annotation(str(key))
    if annotation is not None and value is not None:
        return ConfigError(str(key), f"must be {describe(annotation)}, got {value!r}")
    return ConfigError(str(key), _first_line(cause))


def _omegaconf_cause(err: BaseException) -> OmegaConfBaseException | None:
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OmegaConfBaseException) and getattr(current, "full_key", None):
            return current
        current = current.__cause__ or current.__context__
    return None


def _unknown_key_error(key: str, parent: Any) -> ConfigError:
    """A key that is not in its section: the closest valid key, or the section's keys."""
    # keys(): a section set to null (pair.draft.tiny: null) has none, and cannot be iterated
    known = [str(k) for k in parent.keys()] if parent is not None else []  # noqa: SIM118
    section = key.rpartition(".")[0]
    if section == "method" and parent is not None and "name" in parent:
        known.remove("name")
        return ConfigError(key, unknown_key(key, known, f"a parameter of {parent['name']!r}"))
    return ConfigError(key, unknown_key(key, known, f"a key of {section or 'the config'}"))


def _annotation(key: str) -> Any:
    """The annotation of the structured config's field at dotted ``key`` (None outside it:
    ``method.*`` and ``task.*`` are checked against their code in ``validate``)."""
    owner: Any = RunConfig
    kind: Any = None
    for name in key.split("."):
        if not dataclasses.is_dataclass(owner):
            return None
        kind = hints(owner).get(name)
        if kind is None:
            return None
        inner = [k for k in (kind, *getattr(kind, "__args__", ())) if dataclasses.is_dataclass(k)]
        owner = inner[0] if inner else None
    return kind


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__
