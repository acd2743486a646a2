"""What rendering one study's recipes produces, handed to the W&B publisher as one object."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd


@dataclass
class Rendered:
    """A study's rendered recipes.

    ``tables`` are the display tables (cells such as ``"1.23 ± 0.04 (n=2)"`` or
    ``"not run: no Spider data (task.data_dir=...)"``), ``numeric`` the same content as long
    numeric frames (``pair, task, method, metric, mean, std, n``) for machines, ``figures`` PNG
    paths (a PDF lies beside each), ``ratios`` the cross-run ratios per method (``pair, task,
    method, speedup_vs_ar, speedup_vs_sps, energy_ratio_vs_sps, ppl_change_vs_ar,
    score_change_vs_ar``: means over seeds), ``claims`` the paper's headline claims beside our
    figures (``claim, source, paper, ours, holds``), ``markdown`` the whole rendering as one
    Markdown document, ``run_ids`` the W&B run ids the runs behind it logged under (their
    ``metrics.json``), ``unlogged_runs`` how many of those runs logged nothing to W&B
    (``logger=none``) and ``commands`` the commands that produced it.
    """

    study: str
    profile: str
    out_dir: Path
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    numeric: dict[str, pd.DataFrame] = field(default_factory=dict)
    figures: dict[str, Path] = field(default_factory=dict)
    ratios: pd.DataFrame = field(default_factory=pd.DataFrame)
    claims: pd.DataFrame = field(default_factory=pd.DataFrame)
    markdown: str = ""
    run_ids: list[str] = field(default_factory=list)
    unlogged_runs: int = 0
    commands: list[str] = field(default_factory=list)
