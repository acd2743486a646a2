"""Command-line checks that run before Hydra composes anything.

Hydra reports an unknown group choice (``method=foo``) as a multi-line error; the harness
promises one line naming the key, so ``run.py`` checks group choices against ``conf/`` first.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep

from mtad.harness.config import ConfigError

EXIT_CONFIG_ERROR = 2


def report_config_error(err: ConfigError) -> NoReturn:
    print(f"error: {err}", file=sys.stderr)
    sys.exit(EXIT_CONFIG_ERROR)


def group_options(conf_dir: Path, group: str) -> list[str]:
    return sorted(p.stem for p in (conf_dir / group).glob("*.yaml"))


def check_group_choices(argv: list[str], conf_dir: Path) -> None:
    """Raise :class:`ConfigError` for ``group=choice`` overrides naming no file in ``conf/``.

    Sweeps (``method=ar,mtad``) are checked choice by choice; globs and other sweep forms are
    left to Hydra.
    """
    overrides = [a for a in argv if "=" in a and not a.startswith("-")]
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception:  # noqa: BLE001 - let Hydra report its own syntax errors
        return
    for ov in parsed:
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
