"""The run label, one rule for every table: the method and the parameters that tell its runs
apart, written as they would be typed on the command line: ``mtad(gamma=2,tau=0.3)``,
``mtad(replacement=true)``, ``specinfer(branching=[4,2,2])``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd


def param_text(value: Any) -> str:
    """One parameter value as an override writes it. A float that is a whole number is written
    as one: a parameter that only some methods of a frame have is a float column in pandas."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(param_text(v) for v in value) + "]"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def run_label(method: str, params: Mapping[str, Any]) -> str:
    """``method(k=v,...)`` over ``params`` in their order; the bare name without any."""
    if not params:
        return str(method)
    inner = ",".join(f"{k}={param_text(v)}" for k, v in params.items())
    return f"{method}({inner})"


def run_labels(runs: pd.DataFrame) -> list[str]:
    """A label per row of ``runs`` (rows of :func:`mtad.runs.frame.load_runs`): the method and
    the ``params.*`` that vary among that method's runs."""
    param_cols = [c for c in runs.columns if c.startswith("params.")]
    labels = []
    for _, row in runs.iterrows():
        same = runs[runs["method"] == row["method"]]
        # as text: list-valued params (specinfer's branching) are unhashable
        varying = [c for c in param_cols if same[c].dropna().astype(str).nunique() > 1]
        labels.append(
            run_label(row["method"], {c.removeprefix("params."): row[c] for c in varying})
        )
    return labels


__all__ = ["param_text", "run_label", "run_labels"]
