"""The run label, one rule for every table: the method and the parameters that tell its runs
apart, written as they would be typed on the command line: ``mtad(gamma=2,tau=0.3)``,
``mtad(replacement=true)``, ``specinfer(branching=[4,2,2])``. The paper's planned runs
(:mod:`mtad.paper.expansion`, from a recipe's grid) and the runs read from disk
(:func:`run_labels`, from ``metrics.json``'s ``params``) are labelled by :func:`run_label`, so
a table's row is one label whichever way its runs came."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd


def _text(value: Any, whole_floats: bool) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_text(v, whole_floats) for v in value) + "]"
    if whole_floats and isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def param_text(value: Any) -> str:
    """One parameter value as a label writes it (an override's text, :func:`override_text`),
    but a float that is a whole number written as one: a parameter that only some methods of a
    frame have is a float column in pandas, so ``2`` and ``2.0`` must give one label."""
    return _text(value, whole_floats=True)


def override_text(value: Any) -> str:
    """One value as a Hydra override writes it: ``true``, ``[4,2,2]``, ``0.3``; a float keeps
    its point (``1.0``), so the composed config holds the type the recipe wrote."""
    return _text(value, whole_floats=False)


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


__all__ = ["override_text", "param_text", "run_label", "run_labels"]
