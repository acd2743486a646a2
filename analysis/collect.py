#!/usr/bin/env python
"""Every run of a study as one pandas DataFrame (one row per ``metrics.json``).

    python analysis/collect.py smoke                 # print the runs of results/smoke/
    python analysis/collect.py smoke --csv runs.csv  # all columns to a CSV
    python analysis/collect.py --all                 # every study under results/

Columns: the flat metrics (``ms_per_token``, ``acceptance_rate``, ``ppl``, ...), the run's
identity (``study``, ``pair``, ``method``, ``task``, ``seed``, ``signature``), nested blocks as
dotted columns (``params.gamma``, ``energy.j_per_token``, ``overhead_s.load_models``), plus
``label`` (method and the params that vary in the study) and ``result_dir``.
In Python: ``from analysis.collect import collect`` or ``mtad.runs.frame.load_study``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from mtad.runs.frame import load_study

SHOW = [
    "study",
    "pair",
    "task",
    "label",
    "seed",
    "n_samples",
    "new_tokens",
    "ms_per_token",
    "acceptance_rate",
    "node_acceptance_rate",
    "block_efficiency",
    "ppl",
    "energy.j_per_token",
    "signature",
]


def collect(study: str | None, root: str | Path = "results") -> pd.DataFrame:
    """The runs of ``<root>/<study>/`` (every study when ``study`` is None)."""
    return load_study(root, study)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study", nargs="?", help="folder under --root")
    parser.add_argument("--all", action="store_true", help="every study under --root")
    parser.add_argument("--root", default="results")
    parser.add_argument("--csv", type=Path, help="write every column here")
    args = parser.parse_args(argv)
    if not args.study and not args.all:
        parser.error("give a study name or --all")
    df = collect(None if args.all else args.study, args.root)
    if df.empty:
        print(f"no complete runs under {Path(args.root) / (args.study or '')}")
        return 1
    if args.csv:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(args.csv, index=False)
        print(f"{len(df)} runs -> {args.csv}")
    with pd.option_context("display.width", 200, "display.max_columns", None):
        print(df[[c for c in SHOW if c in df.columns]].to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
