#!/usr/bin/env python
"""The paper's tables from a study, each a pandas group-by over its runs.

    python analysis/make_tables.py smoke                # print, and write results/smoke/tables/
    python analysis/make_tables.py llama13b --out paper/tables

Tables (rows: pair, task, method label; values averaged over seeds, ``seeds`` counts them):

* ``speed``: ms/token, speed-up versus ``ar`` and versus ``sps``, acceptance rate, tokens per
  target forward. A ratio is taken within runs of one study sharing pair, task, seed and device
  (so: same hardware, same prompts), then averaged over seeds; it is empty when the study has
  no baseline run (add one: ``python run.py -m ... +sweep=methods``).
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

from mtad.harness.tables import add_ratios, load_study

ROWS = ["pair", "task", "label"]
TABLES: dict[str, dict[str, str]] = {
    "speed": {
        "ms_per_token": "ms/token",
        "speedup_vs_ar": "speed-up vs AR",
        "speedup_vs_sps": "speed-up vs SpS",
        "acceptance_rate": "acceptance",
        "node_acceptance_rate": "acceptance per node",
        "block_efficiency": "tokens/target fwd",
        "mean_accepted": "mean accepted",
    },
    "quality": {
        "ppl": "ppl",
        "ppl_token_weighted": "ppl (token-weighted)",
        "ppl_change_vs_ar": "ppl change vs AR",
        "score": "score",
        "score_change_vs_ar": "score change vs AR",
    },
    "energy": {
        "energy.j_per_token": "J/token",
        "energy.kwh": "kWh",
        "energy_ratio_vs_sps": "SpS J / J",
        "energy.cpu_mode": "CPU energy by",
        "energy.gpu_mode": "GPU energy by",
    },
}


def make_tables(runs: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """``{name: table}``: one row per (pair, task, method label), averaged over seeds."""
    if runs.empty:
        return {}
    runs = add_ratios(runs)
    tables = {}
    for name, columns in TABLES.items():
        present = [c for c in columns if c in runs.columns and runs[c].notna().any()]
        numeric = [c for c in present if pd.api.types.is_numeric_dtype(runs[c])]
        text = [c for c in present if c not in numeric]
        grouped = runs.groupby(ROWS, dropna=False)
        table = grouped[numeric].mean()
        for c in text:
            table[c] = grouped[c].agg(lambda s: ",".join(sorted(set(map(str, s.dropna())))))
        table["seeds"] = grouped["seed"].nunique()
        tables[name] = table[[*present, "seeds"]].rename(columns=columns)
    return tables


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
