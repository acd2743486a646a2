"""Hydra callbacks: the summary table at the end of a sweep (``-m``).

Every job leaves ``result.json`` (signature, result folder, status) in its Hydra output folder;
``on_multirun_end`` gathers them from the sweep folder, so the table covers exactly this sweep's
runs, including the ones skipped as already complete, whatever launcher ran them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

POINTER_FILE = "result.json"


def write_pointer(output_dir: str | Path, info: dict[str, Any]) -> None:
    from mtad.harness.results import write_json

    write_json(Path(output_dir) / POINTER_FILE, info)


def read_pointers(sweep_dir: str | Path) -> list[dict[str, Any]]:
    pointers = []
    for path in sorted(Path(sweep_dir).rglob(POINTER_FILE)):
        try:
            pointers.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return pointers


class SweepSummary(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from mtad.harness.results import METRICS_FILE
        from mtad.harness.summary import print_runs
        from mtad.harness.tables import load_runs

        pointers = read_pointers(config.hydra.sweep.dir)
        done = [p for p in pointers if p.get("status") in ("done", "skipped")]
        runs = load_runs({Path(p["result_dir"]) / METRICS_FILE for p in done})
        counts = {s: sum(p.get("status") == s for p in pointers) for s in ("done", "skipped")}
        studies = sorted({str(Path(p["result_dir"]).parent) for p in done})
        title = (
            f"sweep: {counts['done']} run, {counts['skipped']} skipped (already complete)"
            f" -> {', '.join(studies) or 'no results'}"
        )
        print_runs(runs, title)
        signatures = [p.get("signature") for p in done]
        repeated = len(signatures) - len(set(signatures))
        if repeated:
            print(
                f"note: {repeated} job(s) repeated another job's signature: they differ only in "
                "keys the signature ignores (mtad/harness/signature.py: EXCLUDED), so they were "
                "skipped. Sweep those keys in separate studies."
            )
        launcher = str(config.hydra.launcher.get("_target_", ""))
        if counts["done"] > 1 and "BasicLauncher" not in launcher:
            print(
                f"note: {launcher.rsplit('.', 1)[-1]} may run jobs side by side; timings and "
                "energy of jobs sharing a machine are not comparable (time with the basic "
                "launcher, or one job per node)."
            )
