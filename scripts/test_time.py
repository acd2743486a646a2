#!/usr/bin/env python
"""The test command's wall time on the AVX2 machine, estimated on this one (issue 36).

    python scripts/test_time.py              # the default suite, one worker on one core, capped
    python scripts/test_time.py --cpu 1 -- tests/test_paper.py     # pytest arguments after --

Runs the README's test command with one xdist worker pinned to one core and torch's kernels
capped to AVX2 (``ATEN_CPU_CAPABILITY=avx2``, ``ONEDNN_MAX_CPU_ISA=AVX2``,
``MKL_ENABLE_INSTRUCTIONS=AVX2``: bfloat16 products are emulated, and ``auto`` picks float32, as
on the AVX2 host, :func:`mtad.runs.hardware.kernels_capped_below_avx512`), then scales its wall
time by the calibration below: the same measurement of an older commit's suite here, against
that suite's wall times on the AVX2 machine (2 cores, the README's command). The two machines
were never both at hand: the AVX2 figures are the ones issue 36 quotes.

What it prints: the capped one-core wall time, the estimate (a range: the AVX2 machine's three
walls over the calibration run), and the slowest tests (``--durations``).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CAP = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
}
# Calibration: commit 27f90bc's default suite (784 tests) measured by this script's method on a
# 2-core Intel Xeon (AVX-512, AMX) on 2026-12-05: 826.9 s; the same suite's test command on the
# 2-core AMD EPYC (AVX2) took 11:41, 17:11 and 19:04 (issue 36).
CALIBRATION_CAPPED_S = 826.9
AVX2_WALLS_S = (701.0, 1031.0, 1144.0)


def estimate(capped_s: float) -> tuple[float, float]:
    """The AVX2 machine's wall time for a suite that takes ``capped_s`` here, capped, one core:
    the lowest and highest of the calibration's ratios."""
    ratios = [wall / CALIBRATION_CAPPED_S for wall in AVX2_WALLS_S]
    return capped_s * min(ratios), capped_s * max(ratios)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", type=int, default=0, help="the core the worker is pinned to")
    parser.add_argument("--durations", type=int, default=20)
    parser.add_argument("pytest_args", nargs="*", help="after --: passed to pytest")
    args = parser.parse_args(argv)
    cmd = [sys.executable, "-m", "pytest", "-q", "-n", "1", f"--durations={args.durations}"]
    cmd += args.pytest_args
    if hasattr(os, "sched_setaffinity"):
        cmd = ["taskset", "-c", str(args.cpu), *cmd]
    print("running: " + " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    out = subprocess.run(cmd, cwd=REPO, env={**os.environ, **CAP}, text=True, capture_output=True)
    wall = time.perf_counter() - t0
    # the durations table and the summary line (the progress dots before it are noise)
    start = out.stdout.find("slowest")
    print(out.stdout[out.stdout.rfind("\n", 0, start) + 1 :] if start >= 0 else out.stdout[-6000:])
    found = re.search(r" in ([\d.]+)s", out.stdout.strip().splitlines()[-1] if out.stdout else "")
    suite = float(found.group(1)) if found else wall
    low, high = estimate(suite)
    print(
        f"capped to AVX2, one worker on core {args.cpu}: {suite:.0f} s ({suite / 60:.1f} min); "
        f"the AVX2 machine's test command, estimated: {low / 60:.1f}-{high / 60:.1f} min "
        f"(calibration: {CALIBRATION_CAPPED_S:.0f} s here for walls of "
        f"{', '.join(f'{w / 60:.1f}' for w in AVX2_WALLS_S)} min there)"
    )
    return out.returncode


if __name__ == "__main__":
    sys.exit(main())
