"""Hydra's own errors about a command line, made one line naming the key: exit status 2.

Hydra composes the command line itself (``run.py``'s ``@hydra.main``); a bad one (an unknown
group choice, a typo in a key, a value of the wrong type for a key of the structured config,
a sweep without ``-m``, an override that does not parse) is a
:class:`~hydra.errors.ConfigCompositionException` or an
:class:`~hydra.errors.OverrideParseException`, which Hydra would print over several lines.
:func:`run_app` has Hydra raise them instead and :func:`composition_error` names the key the
user wrote. The sweep callback does the same for every job of a sweep
(:func:`mtad.harness.callbacks.validate_sweep`).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import (
    CompactHydraException,
    ConfigCompositionException,
    MissingConfigException,
    OverrideParseException,
)
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from mtad.config_types import describe, hints, unknown_key
from mtad.harness.config import ConfigError, RunConfig

EXIT_CONFIG_ERROR = 2
CONF = Path(__file__).resolve().parents[2] / "conf"
# What Hydra raises for a command line it cannot compose (before the task function runs)
COMPOSITION_ERRORS = (ConfigCompositionException, OverrideParseException)


def report_config_error(err: ConfigError) -> NoReturn:
    print(f"error: {err}", file=sys.stderr)
    sys.exit(EXIT_CONFIG_ERROR)


def group_options(conf_dir: Path, group: str) -> list[str]:
    return sorted(p.stem for p in (conf_dir / group).glob("*.yaml"))


def run_app(main: Callable[[], Any], argv: Sequence[str], conf_dir: Path = CONF) -> None:
    """Run the ``@hydra.main`` function ``main`` on the command line ``argv``; a command line
    Hydra cannot compose ends with one line naming the key and exit status 2."""
    # Hydra prints a composition error over several lines and exits 1 unless its documented
    # switch HYDRA_FULL_ERROR is set; set, it raises the error, to be named here on one line.
    # (Errors of the run itself then show their full traceback, Hydra's frames included.)
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        main()
    except COMPOSITION_ERRORS as err:
        report_config_error(composition_error(err, command_line_overrides(argv), conf_dir))
    except CompactHydraException as err:  # e.g. a callback that cannot be built: as Hydra
        print(err, file=sys.stderr)  # prints these, without a traceback, and exits 1
        sys.exit(1)


def command_line_overrides(argv: Sequence[str]) -> list[Override]:
    """The ``key=value`` overrides of ``argv`` that parse (Hydra's parser), to name their values
    in messages: flags (``-m``, ``--cfg job``) and their values are no overrides."""
    parser = OverridesParser.create()
    found = []
    for arg in argv:
        try:
            found.append(parser.parse_override(arg))
        except Exception:  # noqa: BLE001, S112 - not an override (a flag, a flag's value)
            continue
    return found


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
        several = _several_values(err, overrides, conf_dir)
        return several or ConfigError("overrides", _first_line(err))
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)):
        return _unknown_key_error(str(key), getattr(cause, "parent_node", None))
    value = next((ov.value() for ov in overrides if ov.key_or_group == key), None)
    annotation = _annotation(str(key))
    if annotation is not None and value is not None:
        return ConfigError(str(key), f"must be {describe(annotation)}, got {value!r}")
    return ConfigError(str(key), _first_line(cause))


def _several_values(
    err: BaseException, overrides: Sequence[Override], conf_dir: Path
) -> ConfigError | None:
    """Hydra refuses a sweep (``key=a,b``) outside ``-m`` with a composition error of its own,
    caused by no config value, that quotes the override."""
    if not isinstance(err, ConfigCompositionException) or isinstance(err, MissingConfigException):
        return None
    for ov in overrides:
        if ov.is_sweep_override() and f"'{ov.input_line}'" in str(err):
            value = ov.input_line.split("=", 1)[1]
            as_list = "" if (conf_dir / ov.key_or_group).is_dir() else f", or [{value}] for a list"
            return ConfigError(
                ov.key_or_group, f"{value} is several values: add -m to run each{as_list}"
            )
    return None


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
