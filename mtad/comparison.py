"""Runs as one pandas frame, and the one rule that compares them.

Every table of the project goes through here: the quick per-study tables
(``analysis/make_tables.py``), the summary printed after a sweep (:mod:`mtad.harness.summary`),
the paper's tables, figures and claims (:mod:`mtad.paper.render`) and the W&B analysis run.

**The rule.** A run is compared with a baseline run (:data:`COMPARISONS`: ``ar`` for speed-up
and quality changes, ``sps`` for speed and energy) when both have the same
:func:`comparison_key`: the resolved config minus the method (so the same pair with its
dtypes, task and its data, seed, warping and runtime settings), the same study, and the same
hardware (device *kind*, GPU model and count, CPU model; ``cuda:0`` and ``cuda:1`` are the
same hardware). The baseline is the run labelled with the bare baseline method name: in a
paper plan, the baseline planned at its defaults; in a study read from disk, the baseline
method when its parameters do not vary in the study (``sps`` swept over gamma has no run
called ``sps``, so nothing is compared with an arbitrary one of them). Several baseline runs
under one key are averaged. A ratio is taken per run (so per seed) and averaged over seeds by
the tables. This is the spec's "same pair, task, hardware and seed set, measured in the same
sweep", and audiocraft's config signature (a hash of the config minus what does not change
the result) applied to the config minus the method.

**Pairing.** :func:`paired_runs` yields, for one comparison, each run with its baseline run
(same key, hence same seed); :func:`paired_samples` joins two paired runs' per-prompt records
(``samples.jsonl`` and ``timings.jsonl``) by prompt id. Interval estimates over prompts and
seeds start from these two functions.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import yaml

from mtad.harness.energy import J_PER_KWH
from mtad.harness.results import CONFIG_FILE, METRICS_FILE, SAMPLES_FILE, TIMINGS_FILE
from mtad.harness.signature import relevant_config
from mtad.intervals import (
    BOOTSTRAP_METHOD,
    Interval,
    PairedValues,
    identity,
    paired_bootstrap,
    perplexity,
    seed_interval,
)

# --------------------------------------------------------------------------------------------
# what is compared with what

# The hardware two compared runs must share (metrics.json, mtad.harness.results.hardware_identity).
HARDWARE_KEYS: tuple[str, ...] = ("device_kind", "gpu_model", "gpu_count", "cpu_model")
# The run identity read from metrics.json besides the config (a folder without a readable
# config is still kept apart by these).
IDENTITY_KEYS: tuple[str, ...] = ("study", "pair", "task", "seed")


@dataclass(frozen=True)
class Comparison:
    """One cross-run figure: ``column`` compares ``metric`` of a run with the baseline's.

    ``factor``: ``baseline / run``, for metrics where lower is better (ms/token, J/token), so
    > 1 means the run is faster or uses less energy. ``change``: ``run / baseline - 1``, the
    relative change (PPL, downstream score); undefined (NaN) at a zero baseline.
    """

    column: str
    metric: str
    baseline: str
    kind: Literal["factor", "change"]

    def of(self, run: Any, base: Any) -> float:
        r, b = _number(run), _number(base)
        if r is None or b is None:
            return math.nan
        if self.kind == "change":
            return r / b - 1.0 if b != 0 else math.nan
        return b / r if r != 0 else math.nan


COMPARISONS: tuple[Comparison, ...] = (
    Comparison("speedup_vs_ar", "ms_per_token", "ar", "factor"),
    Comparison("speedup_vs_sps", "ms_per_token", "sps", "factor"),
    Comparison("energy_ratio_vs_sps", "j_per_token", "sps", "factor"),
    Comparison("gpu_energy_ratio_vs_sps", "gpu_j_per_token", "sps", "factor"),
    Comparison("ppl_change_vs_ar", "ppl", "ar", "change"),
    Comparison("score_change_vs_ar", "score", "ar", "change"),
)
COMPARISON_COLUMNS: tuple[str, ...] = tuple(c.column for c in COMPARISONS)
FACTOR_COLUMNS: tuple[str, ...] = tuple(c.column for c in COMPARISONS if c.kind == "factor")
CHANGE_COLUMNS: tuple[str, ...] = tuple(c.column for c in COMPARISONS if c.kind == "change")


def comparison_key(config: dict[str, Any], metrics: dict[str, Any]) -> str:
    """Hash of everything that must match for two runs to be compared, except the method."""
    tree = relevant_config(config or {})
    tree.pop("method", None)
    tree.pop("signature", None)
    tree["identity"] = {k: metrics.get(k) for k in IDENTITY_KEYS}
    hardware = {k: metrics.get(k) for k in HARDWARE_KEYS}
    if hardware["device_kind"] is None and metrics.get("device") is not None:
        hardware["device_kind"] = str(metrics["device"]).split(":", 1)[0]
    tree["hardware"] = hardware
    canonical = json.dumps(tree, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha1(canonical.encode()).hexdigest()[:12]


# --------------------------------------------------------------------------------------------
# one run as one row


def per_token(metrics: dict[str, Any]) -> dict[str, float]:
    """Figures per generated token derived from ``metrics.json``: the time split
    (``draft_ms_per_token``, ...), ``j_per_token`` and the GPU-only ``gpu_j_per_token``."""
    tokens = float(metrics.get("new_tokens") or 0)
    out: dict[str, float] = {}
    if tokens <= 0:
        return out
    for name, key in (("draft", "time_draft"), ("verify", "time_verify"), ("other", "time_other")):
        if metrics.get(key) is not None:
            out[f"{name}_ms_per_token"] = 1000.0 * float(metrics[key]) / tokens
    energy = metrics.get("energy") or {}
    if energy.get("j_per_token") is not None:
        out["j_per_token"] = float(energy["j_per_token"])
    if energy.get("gpu_kwh") is not None and energy.get("gpu_mode", "none") != "none":
        out["gpu_j_per_token"] = float(energy["gpu_kwh"]) * J_PER_KWH / tokens
    return out


def pending_note(metrics: dict[str, Any]) -> str | None:
    """A task's own "pending: ..." note (MT-Bench without a judge) stands in for its score."""
    for value in metrics.values():
        if isinstance(value, str) and value.startswith("pending"):
            return value
    return None


def read_config(result_dir: Path) -> dict[str, Any]:
    """The run's resolved ``config.yaml`` ({} when it cannot be read)."""
    try:
        config = yaml.safe_load((result_dir / CONFIG_FILE).read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return config if isinstance(config, dict) else {}


def run_record(result_dir: Path) -> dict[str, Any] | None:
    """One complete run as a flat row: ``metrics.json`` (nested blocks as dotted columns), the
    :func:`per_token` figures, ``comparison_key``, ``pending`` and ``result_dir``; None when
    ``metrics.json`` cannot be read (a half-written folder is not a result)."""
    try:
        metrics = json.loads((result_dir / METRICS_FILE).read_text())
    except (OSError, ValueError):
        return None
    row = pd.json_normalize(metrics, sep=".").iloc[0].to_dict()
    row.update(per_token(metrics))
    row["comparison_key"] = comparison_key(read_config(result_dir), metrics)
    row["pending"] = pending_note(metrics)
    row["result_dir"] = str(result_dir)
    return row


def load_runs(metrics_files: Iterable[Path]) -> pd.DataFrame:
    """One row per metrics.json (:func:`run_record`) plus a readable ``label`` per run."""
    records = [run_record(Path(p).parent) for p in sorted(Path(p) for p in metrics_files)]
    records = [r for r in records if r is not None]
    if not records:
        return pd.DataFrame()
    df = pd.DataFrame(records)
    df["label"] = run_labels(df)
    return df


def load_study(root: str | Path, study: str | None = None) -> pd.DataFrame:
    """All runs of ``<root>/<study>/`` (or of every study under ``root`` when study is None)."""
    base = Path(root) / study if study else Path(root)
    pattern = f"*/{METRICS_FILE}" if study else f"*/*/{METRICS_FILE}"
    return load_runs(base.glob(pattern))


def run_labels(df: pd.DataFrame) -> list[str]:
    """``method`` plus the params that vary among that method's runs: ``mtad(gamma=2,tau=0.3)``."""
    param_cols = [c for c in df.columns if c.startswith("params.")]
    labels = []
    for _, row in df.iterrows():
        same = df[df["method"] == row["method"]]
        # as text: list-valued params (specinfer's branching) are unhashable
        varying = [c for c in param_cols if same[c].dropna().astype(str).nunique() > 1]
        inner = ",".join(f"{c.removeprefix('params.')}={_param_text(row[c])}" for c in varying)
        labels.append(f"{row['method']}({inner})" if inner else str(row["method"]))
    return labels


def _param_text(value: object) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _number(value: Any) -> float | None:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


# --------------------------------------------------------------------------------------------
# pairing and the comparison columns


@dataclass(frozen=True)
class PairedRuns:
    """A run and the baseline run it is compared with under ``comparison`` (rows as dicts)."""

    comparison: Comparison
    run: dict[str, Any]
    baseline: dict[str, Any]

    @property
    def seed(self) -> Any:
        return self.run.get("seed")


def _key_column(frame: pd.DataFrame) -> list[Any]:
    return list(frame["comparison_key"]) if "comparison_key" in frame else [None] * len(frame)


def baseline_runs(baselines: pd.DataFrame, comparison: Comparison) -> dict[str, list[dict]]:
    """``comparison key -> baseline rows`` (label exactly the baseline method's name)."""
    out: dict[str, list[dict[str, Any]]] = {}
    if baselines.empty or "label" not in baselines:
        return out
    done = baselines["state"] == "done" if "state" in baselines else True
    chosen = baselines[(baselines["label"] == comparison.baseline) & done]
    seen: set[str] = set()
    for key, row in zip(_key_column(chosen), chosen.to_dict("records"), strict=True):
        run = str(row.get("result_dir") or row.get("signature") or id(row))
        if key is not None and run not in seen:  # a run planned by two recipes counts once
            seen.add(run)
            out.setdefault(str(key), []).append(row)
    return out


def paired_runs(
    runs: pd.DataFrame, comparison: Comparison, baselines: pd.DataFrame | None = None
) -> Iterator[PairedRuns]:
    """Each row of ``runs`` with each baseline run of ``baselines`` (default: ``runs``) that
    shares its comparison key; rows without a baseline yield nothing."""
    by_key = baseline_runs(runs if baselines is None else baselines, comparison)
    for key, row in zip(_key_column(runs), runs.to_dict("records"), strict=True):
        for base in by_key.get(str(key), []) if key is not None else []:
            yield PairedRuns(comparison, row, base)


def compare_runs(
    runs: pd.DataFrame, comparison: Comparison, baselines: pd.DataFrame | None = None
) -> list[float]:
    """``comparison`` for every row of ``runs`` (NaN without a baseline or a value): the
    baseline's metric averaged over its runs under the key, then :meth:`Comparison.of`."""
    by_key = baseline_runs(runs if baselines is None else baselines, comparison)
    values = []
    for key, row in zip(_key_column(runs), runs.to_dict("records"), strict=True):
        bases = [_number(b.get(comparison.metric)) for b in by_key.get(str(key), [])]
        bases = [b for b in bases if b is not None]
        base = sum(bases) / len(bases) if bases else None
        values.append(comparison.of(row.get(comparison.metric), base))
    return values


def add_comparisons(runs: pd.DataFrame, baselines: pd.DataFrame | None = None) -> pd.DataFrame:
    """``runs`` with one column per :data:`COMPARISONS` entry (``speedup_vs_ar``, ...,
    ``score_change_vs_ar``). Baselines are looked up in ``baselines`` (default ``runs``): the
    paper passes every run of its plan, since any recipe may hold a baseline."""
    if runs.empty:
        return runs
    runs = with_identity(runs)
    baselines = runs if baselines is None else with_identity(baselines)
    for comparison in COMPARISONS:
        runs[comparison.column] = compare_runs(runs, comparison, baselines)
    return runs


def with_identity(frame: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``frame`` with ``comparison_key`` and ``label`` filled in where a frame built
    by hand lacks them: the key from the row's own identity and hardware columns (no config),
    the label from the method."""
    frame = frame.copy()
    if "comparison_key" not in frame.columns:
        frame["comparison_key"] = [comparison_key({}, row) for row in frame.to_dict("records")]
    if "label" not in frame.columns and "method" in frame.columns:
        frame["label"] = frame["method"].astype(str)
    return frame


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def paired_samples(pair: PairedRuns) -> Iterator[tuple[Any, dict[str, Any], dict[str, Any]]]:
    """``(prompt id, run record, baseline record)`` for every prompt both runs decoded, in the
    run's order; a record is the prompt's ``samples.jsonl`` line merged with its
    ``timings.jsonl`` line (``mean_logprob``, ``new_tokens``, ``wall_time``, ...)."""
    run = _per_prompt(Path(str(pair.run["result_dir"])))
    base = _per_prompt(Path(str(pair.baseline["result_dir"])))
    for prompt_id, record in run.items():
        if prompt_id in base:
            yield prompt_id, record, base[prompt_id]


def _per_prompt(result_dir: Path) -> dict[Any, dict[str, Any]]:
    records: dict[Any, dict[str, Any]] = {}
    for row in read_jsonl(result_dir / SAMPLES_FILE):
        records[row.get("id")] = dict(row)
    for row in read_jsonl(result_dir / TIMINGS_FILE):
        records.setdefault(row.get("id"), {}).update(row)
    return records


# --------------------------------------------------------------------------------------------
# intervals (the statistics: mtad.intervals)


@dataclass(frozen=True)
class PerPrompt:
    """How a run's ``metric`` is made of its per-prompt records: ``scale * sum(numerator) /
    sum(denominator)`` (denominator None: a mean over prompts), then ``transform``."""

    numerator: str
    denominator: str | None = None
    scale: float = 1.0
    transform: Any = identity


PER_PROMPT: dict[str, PerPrompt] = {
    "ms_per_token": PerPrompt("wall_time", "new_tokens", scale=1000.0),  # timings / samples
    "ppl": PerPrompt("mean_logprob", transform=perplexity),  # exp(-mean log-prob)
}
# A task's score (metrics.json ``score_name``) -> the per-prompt record field it is the mean of.
SCORE_RECORDS: dict[str, str] = {"pass@1": "passed", "execution_accuracy": "exec_match"}


def _per_prompt_form(comparison: Comparison, pairs: list[PairedRuns]) -> PerPrompt | None:
    if comparison.metric != "score":
        return PER_PROMPT.get(comparison.metric)
    names = {str(p.run.get("score_name")) for p in pairs} | {
        str(p.baseline.get("score_name")) for p in pairs
    }
    field = SCORE_RECORDS.get(names.pop()) if len(names) == 1 else None
    return PerPrompt(field) if field else None


def paired_values(pairs: list[PairedRuns], form: PerPrompt) -> PairedValues | None:
    """The per-prompt numerators and denominators of every pair (one row per pair, so per
    seed), over the prompts that every pair decoded under both methods; None without any."""
    rows = [{pid: (r, b) for pid, r, b in paired_samples(pair)} for pair in pairs]
    if not rows:
        return None
    common = [pid for pid in rows[0] if all(pid in row for row in rows[1:])]
    if not common:
        return None

    def grid(side: int, key: str | None, scale: float) -> np.ndarray:
        def value(record: dict[str, Any]) -> float:
            if key is None:
                return 1.0
            x = _number(record.get(key))
            return math.nan if x is None else x

        return scale * np.array([[value(row[pid][side]) for pid in common] for row in rows])

    return PairedValues(
        run_num=grid(0, form.numerator, form.scale),
        run_den=grid(0, form.denominator, 1.0),
        base_num=grid(1, form.numerator, form.scale),
        base_den=grid(1, form.denominator, 1.0),
    )


def comparison_interval(pairs: Iterable[PairedRuns]) -> Interval:
    """The comparison of paired runs (one :class:`Comparison`) with its 95% interval: the
    paired, seed-stratified bootstrap over prompts of :mod:`mtad.intervals` where the metric
    is made of per-prompt records (:data:`PER_PROMPT`, :data:`SCORE_RECORDS`), else (energy:
    measured per run) a Student-t interval over the per-seed comparisons."""
    pairs = list(pairs)
    if not pairs:
        return seed_interval([])
    comparison = pairs[0].comparison
    form = _per_prompt_form(comparison, pairs)
    if form is not None:
        values = paired_values(pairs, form)
        if values is None:  # no prompt decoded by every pair: nothing to resample
            return Interval(math.nan, math.nan, math.nan, 0, len(pairs), BOOTSTRAP_METHOD)
        return paired_bootstrap(values, comparison.kind, form.transform)
    metric = comparison.metric
    per_seed = [comparison.of(p.run.get(metric), p.baseline.get(metric)) for p in pairs]
    prompts = {int(n) for p in pairs if (n := _number(p.run.get("n_samples"))) is not None}
    return seed_interval(per_seed, min(prompts) if prompts else 0)


# --------------------------------------------------------------------------------------------
# the quick tables of a study (analysis/make_tables.py) and the sweep summary

TABLE_ROWS = ["pair", "task", "label"]
STUDY_TABLES: dict[str, dict[str, str]] = {
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


def _numeric_scores(runs: pd.DataFrame) -> pd.DataFrame:
    """``score`` as numbers: None (a pending judge) must not make the column text."""
    if "score" not in runs.columns:
        return runs
    runs = runs.copy()
    runs["score"] = pd.to_numeric(runs["score"], errors="coerce")
    return runs


def study_tables(runs: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """``{name: table}`` of :data:`STUDY_TABLES`: one row per (pair, task, method label),
    values averaged over seeds (``seeds`` counts them); each comparison column is followed by
    its 95% interval (``... [95%: lo]``, ``[95%: hi]``, ``[95%: prompts]``:
    :func:`comparison_interval`)."""
    if runs.empty:
        return {}
    runs = add_comparisons(_numeric_scores(runs))
    tables = {}
    for name, columns in STUDY_TABLES.items():
        columns = dict(columns)  # gains the interval headers
        present = [c for c in columns if c in runs.columns and runs[c].notna().any()]
        numeric = [c for c in present if pd.api.types.is_numeric_dtype(runs[c])]
        text = [c for c in present if c not in numeric]
        grouped = runs.groupby(TABLE_ROWS, dropna=False)
        table = grouped[numeric].mean()
        for c in text:
            table[c] = grouped[c].agg(lambda s: ",".join(sorted(set(map(str, s.dropna())))))
        table["seeds"] = grouped["seed"].nunique()
        order = [*present, "seeds"]
        for c in [c for c in present if c in COMPARISON_COLUMNS]:
            order[order.index(c) + 1 : order.index(c) + 1] = _add_bounds(table, runs, c, columns)
        tables[name] = table[order].rename(columns=columns)
    return tables


def _add_bounds(
    table: pd.DataFrame, runs: pd.DataFrame, column: str, headers: dict[str, str]
) -> list[str]:
    """Columns ``<column>_lo``, ``_hi``, ``_prompts`` of ``table`` (one row per
    :data:`TABLE_ROWS` group): :func:`comparison_interval` of the group's runs; their names."""
    comparison = next(c for c in COMPARISONS if c.column == column)
    names = [f"{column}_{part}" for part in ("lo", "hi", "prompts")]
    bounds = {
        key: comparison_interval(paired_runs(group, comparison, runs))
        for key, group in runs.groupby(TABLE_ROWS, dropna=False)
    }
    for name, part in zip(names, ("lo", "hi", "n_prompts"), strict=True):
        table[name] = [getattr(bounds.get(key), part, math.nan) for key in table.index]
        headers[name] = f"{headers[column]} [95%: {part.removeprefix('n_')}]"
    return names


# The columns of the sweep summary, in order, with their headers.
SUMMARY_COLUMNS: dict[str, str] = {
    "pair": "pair",
    "task": "task",
    "label": "method",
    "n_samples": "n",
    "new_tokens": "tokens",
    "ms_per_token": "ms/tok",
    "tokens_per_s": "tok/s",
    "speedup_vs_ar": "x AR",
    "speedup_vs_sps": "x SpS",
    "acceptance_rate": "accept",
    "block_efficiency": "tok/fwd",
    "ppl": "ppl",
    "score": "score",
    "energy.j_per_token": "J/tok",
    "energy_ratio_vs_sps": "SpS J / J",
    "energy.cpu_mode": "energy by",
    "energy.warning": "energy warning",
}


def summary_frame(runs: pd.DataFrame) -> pd.DataFrame:
    """The sweep summary: one row per run, sorted by pair, task and method label."""
    if runs.empty:
        return runs
    runs = add_comparisons(_numeric_scores(runs))
    cols = [c for c in SUMMARY_COLUMNS if c in runs.columns]
    out = runs.sort_values([c for c in TABLE_ROWS if c in runs.columns])[cols]
    out = out.dropna(axis=1, how="all")
    return out.rename(columns=SUMMARY_COLUMNS).reset_index(drop=True)


__all__ = [
    "CHANGE_COLUMNS",
    "COMPARISONS",
    "COMPARISON_COLUMNS",
    "FACTOR_COLUMNS",
    "Comparison",
    "PairedRuns",
    "add_comparisons",
    "comparison_interval",
    "comparison_key",
    "load_runs",
    "load_study",
    "paired_runs",
    "paired_samples",
    "run_record",
    "study_tables",
    "summary_frame",
]
