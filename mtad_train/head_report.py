"""What a trained feature-level head ships with: its report (held-out acceptance by depth and
evaluation kind, data, objective, schedule, step cost, disjointness), its curve of held-out
acceptance against training positions and CPU-hours, and its recipe."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

EVAL_KINDS = ("humaneval", "mtbench", "default", "mtbench-turn2")
ALL = "all"  # the row pooling every kind's positions
# issue 39's bar: held-out expected acceptance at depths 1..3 of all kinds pooled, and at depth 1
# of each kind; the goal is ACCEPT_GOAL at every depth
ACCEPT_BAR_POOLED = (0.5, 0.45, 0.4)
ACCEPT_BAR_EACH_KIND_D1 = 0.4
ACCEPT_BAR, ACCEPT_GOAL = ACCEPT_BAR_POOLED[0], 0.6


def read_curve(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_curve(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    """Held-out acceptance (all kinds, position-weighted) per depth against training positions
    (left) and per kind at depth 1 (right), with CPU-hours on a secondary axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r.get("heldout")]
    if not rows:
        return
    xs = [r["positions"] / 1e6 for r in rows]
    fig, ax = plt.subplots(1, 2, figsize=(11, 3.8))
    depths = sorted(k for k in rows[-1]["heldout"][ALL] if k.startswith("d"))
    for d in depths:
        ax[0].plot(xs, [r["heldout"][ALL][d] for r in rows], marker="o", label=f"depth {d[1:]}")
    for kind in EVAL_KINDS:
        if kind in rows[-1]["heldout"]:
            ax[1].plot(
                xs, [r["heldout"].get(kind, {}).get("d1") for r in rows], marker=".", label=kind
            )
    starts = [
        (x, r.get("session"))
        for i, (x, r) in enumerate(zip(xs, rows, strict=True))
        if r.get("session") and (i == 0 or r.get("session") != rows[i - 1].get("session"))
    ]
    for a in ax:
        for x, _ in starts[1:]:  # where a session (a machine, a day) took over
            a.axvline(x, color="lightgrey", ls=":", lw=0.8)
        a.axhline(ACCEPT_BAR, color="grey", ls="--", lw=0.8)
        a.set_xlabel("training token-positions (millions, depth 1)")
        a.set_ylabel("held-out expected acceptance")
        a.grid(alpha=0.3)
        a.legend(fontsize=8)
    ax[0].set_title(f"{title}: all kinds, by depth")
    ax[1].set_title("depth 1, by evaluation kind")
    hours = [r["seconds"] / 3600 for r in rows]
    top = ax[0].secondary_xaxis(
        "top",
        functions=(
            lambda x: _interp(x, xs, hours),
            lambda h: _interp(h, hours, xs),
        ),
    )
    top.set_xlabel("CPU-hours of training (1 thread)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _interp(x, xs, ys):
    import numpy as np

    if len(xs) < 2:
        return np.asarray(x) * (ys[0] / xs[0] if xs and xs[0] else 1.0)
    return np.interp(x, xs, ys)


def heldout_table(
    res: dict[str, dict[str, float]],
    depths: int,
    se: dict[str, dict[str, float]] | None = None,
) -> list[str]:
    """The held-out figures by kind and depth; with ``se``, each with its standard error."""
    head = (
        "| kind | prompts | positions | "
        + " | ".join(f"depth {d}" for d in range(1, depths + 1))
        + " |"
    )
    lines = [head, "|" + "---|" * (3 + depths)]
    for kind in (*EVAL_KINDS, ALL):
        row = res.get(kind)
        if row is None:
            continue
        cells = " | ".join(
            f"{row[f'd{d}']:.3f}" + (f" ({se[kind][f'd{d}']:.3f})" if se else "")
            for d in range(1, depths + 1)
        )
        label = "all four (position-weighted)" if kind == ALL else kind
        lines.append(f"| {label} | {row['prompts']} | {row['positions']} | {cells} |")
    if se:
        lines += [
            "",
            "(In brackets: the standard error, responses as clusters: a response's positions are "
            "not independent of each other.)",
        ]
    return lines


def gain_table(against: dict[str, Any], depths: int) -> list[str]:
    """The head's gain over another head on the same responses, by kind and depth, each with
    its paired bootstrap interval (``train_head.py compare``'s figures)."""
    gains = against["gain"]
    level = next(iter(next(iter(gains.values())).values()))["confidence"]
    lines = [
        f"Against `{against['head']}` on the same responses: this head minus that one "
        f"[{100 * level:g}% paired bootstrap interval over responses, BCa]:",
        "",
        "| kind | " + " | ".join(f"depth {d}" for d in range(1, depths + 1)) + " |",
        "|" + "---|" * (1 + depths),
    ]
    for kind in (*EVAL_KINDS, ALL):
        if kind not in gains:
            continue
        cells = " | ".join(
            f"{g['gain']:+.3f} [{g['low']:+.3f}, {g['high']:+.3f}]"
            for g in (gains[kind][f"d{d}"] for d in range(1, depths + 1))
        )
        label = "all four (position-weighted)" if kind == ALL else kind
        lines.append(f"| {label} | {cells} |")
    return lines


def verdict(res: dict[str, dict[str, float]], depths: int) -> str:
    """Issue 39's bar, figure by figure: pooled depths 1..3 and depth 1 of every kind."""
    checks = [
        (f"all kinds, depth {d}", res[ALL][f"d{d}"], bar)
        for d, bar in enumerate(ACCEPT_BAR_POOLED[:depths], start=1)
    ] + [(f"{k}, depth 1", res[k]["d1"], ACCEPT_BAR_EACH_KIND_D1) for k in EVAL_KINDS if k in res]
    short = [f"{name} {got:.3f} < {bar}" for name, got, bar in checks if got < bar]
    if not short:
        return f"Meets issue 39's bar on every figure (goal {ACCEPT_GOAL} at every depth)."
    return (
        f"Below issue 39's bar on {len(short)} of {len(checks)} figures: "
        + "; ".join(short)
        + f" (goal {ACCEPT_GOAL} at every depth)."
    )
