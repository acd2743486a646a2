#!/usr/bin/env python
"""The paper's tables from a study, each a pandas group-by over its runs.

    python analysis/make_tables.py smoke                # print, and write results/smoke/tables/
    python analysis/make_tables.py llama13b --out paper/tables

Tables (rows: pair, task, method label; values averaged over seeds, ``seeds`` counts them):

* ``speed``: ms/token, speed-up versus ``ar`` and versus ``sps``, acceptance rate, tokens per
  target forward. A ratio is taken between runs whose configs differ only in the method, on the
  same machine (the one rule of :mod:`mtad.runs.comparison`, which the paper's tables use too), then
  averaged over seeds; it is empty when the study has no baseline run (add one:
  ``python run.py -m ... +sweep=methods``).
* ``quality``: perplexity (the authors' per-sample mean and the token-weighted one), its change
  versus ``ar``, and the task score.
* ``energy``: J/token and kWh from codecarbon, the ratio ``sps J/token / run J/token`` (> 1: less
  energy than speculative sampling), and how the CPU energy was obtained (``rapl`` measured,
  ``load_estimate`` / ``tdp_estimate`` estimated).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from mtad.runs.frame import load_study
from mtad.runs.tables import study_tables


def make_tables(runs: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """``{name: table}``: one row per (pair, task, method label), averaged over seeds
    (:func:`mtad.runs.tables.study_tables`)."""
    return study_tables(runs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study")
    parser.add_argument("--root", default="results")
    parser.add_argument("--out", type=Path, help="CSV folder (default <root>/<study>/tables)")
    args = parser.parse_args(argv)
    runs = load_study(args.root, args.study)
    if runs.empty:
        print(f"no complete runs under {Path(args.root) / args.study}")
        return 1
    out = args.out or Path(args.root) / args.study / "tables"
    out.mkdir(parents=True, exist_ok=True)
    with pd.option_context(
        "display.width", 200, "display.max_columns", None, "display.float_format", "{:.4g}".format
    ):
        for name, table in make_tables(runs).items():
            print(f"\n== {name} ({args.study}, {len(runs)} runs)")
            print(table.to_string())
            table.to_csv(out / f"{name}.csv")
    print(f"\ntables -> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
