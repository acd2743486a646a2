"""Command-line checks that run before Hydra composes anything.

Hydra reports an unknown group choice (``method=foo``) and a value of the wrong type for a key
of the structured config (``runtime.seed=abc``) as multi-line errors; the harness promises one
line naming the key, so ``run.py`` checks both first (:func:`check_command_line`).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any, NoReturn

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, Override
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from mtad.config_types import describe, hints
from mtad.harness.config import ConfigError, RunConfig

EXIT_CONFIG_ERROR = 2


def report_config_error(err: ConfigError) -> NoReturn:
    print(f"error: {err}", file=sys.stderr)
    sys.exit(EXIT_CONFIG_ERROR)


def group_options(conf_dir: Path, group: str) -> list[str]:
    return sorted(p.stem for p in (conf_dir / group).glob("*.yaml"))


def check_command_line(argv: list[str], conf_dir: Path) -> None:
    """Everything :mod:`run.py` checks before Hydra composes: group choices, typed values."""
    check_group_choices(argv, conf_dir)
    check_typed_overrides(argv, conf_dir)


def _parse(argv: list[str]) -> list[Override]:
    overrides = [a for a in argv if "=" in a and not a.startswith("-")]
    try:
        return OverridesParser.create().parse_overrides(overrides)
    except Exception:  # noqa: BLE001 - let Hydra report its own syntax errors
        return []


def _choices(ov: Override) -> list[Any] | None:
    value = ov.value()
    if isinstance(value, ChoiceSweep):
        return list(value.list)
    if isinstance(value, (str, int, float, bool, list, dict)) or value is None:
        return [value]
    return None  # other sweep forms (ranges, globs): left to Hydra


def _typed_field(key: str) -> tuple[type, str] | None:
    """(dataclass, field) of the structured config that holds the dotted ``key``; None for keys
    outside it (``method.*``, ``task.*``: checked against their own code in ``validate``) and
    inside free-form mappings (``pair.target.tiny.*``)."""
    owner: Any = RunConfig
    parts = key.split(".")
    for i, name in enumerate(parts):
        if not dataclasses.is_dataclass(owner):
            return None
        kind = hints(owner).get(name)
        if kind is None:
            return None
        inner = [k for k in (kind, *getattr(kind, "__args__", ())) if dataclasses.is_dataclass(k)]
        if i == len(parts) - 1:  # a section itself (pair=smollm2) is a group choice
            return None if inner else (owner, name)
        owner = inner[0] if inner else None
    return None


def check_typed_overrides(argv: list[str], conf_dir: Path) -> None:
    """``runtime.seed=abc`` and the like: :class:`ConfigError` naming the key and the type it
    takes, where Hydra would print its multi-line structured-config error. The conversion is
    OmegaConf's own (``true``/``yes``, ``"3"`` for an int ... are accepted as Hydra would)."""
    for ov in _parse(argv):
        if ov.is_delete() or (conf_dir / ov.key_or_group).is_dir():  # a group choice
            continue
        found = _typed_field(ov.key_or_group)
        values = _choices(ov)
        if found is None or values is None:
            continue
        owner, name = found
        for value in values:
            node = OmegaConf.structured(owner)
            try:
                OmegaConf.update(node, name, value, merge=True)
            except OmegaConfBaseException:
                expected = describe(hints(owner)[name])
                raise ConfigError(ov.key_or_group, f"must be {expected}, got {value!r}") from None


def check_group_choices(argv: list[str], conf_dir: Path) -> None:
    """Raise :class:`ConfigError` for ``group=choice`` overrides naming no file in ``conf/``.

    Sweeps (``method=ar,mtad``) are checked choice by choice; globs and other sweep forms are
    left to Hydra.
    """
    for ov in _parse(argv):
        group = ov.key_or_group
        if "." in group or "/" in group or not (conf_dir / group).is_dir() or ov.is_delete():
            continue
        value = ov.value()
        if isinstance(value, ChoiceSweep):
            choices = [str(v) for v in value.list]
        elif isinstance(value, (str, int, float)):
            choices = [str(value)]
        else:
            continue
        options = group_options(conf_dir, group)
        for choice in choices:
            if choice not in options:
                raise ConfigError(
                    group, f"unknown {group} {choice!r}; choose from {', '.join(options)}"
                )
