#!/usr/bin/env python
"""The ``instruct`` task's generated prompt set (:mod:`mtad.tasks.instruct_data`), rebuilt.

python scripts/instruct_data.py                  # (re)write mtad/tasks/data/instruct_prompts.jsonl
python scripts/instruct_data.py --check          # exit 1 when the file differs from a rebuild
python scripts/instruct_data.py --out FILE       # another file
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file from a checkout
    sys.path.insert(0, str(REPO))

from mtad.tasks import instruct_data  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, write nothing")
    parser.add_argument("--out", type=Path, default=instruct_data.DATA_FILE)
    args = parser.parse_args(argv)
    if args.check:
        same = instruct_data.matches(args.out)
        print(f"{args.out}: {'identical to a rebuild' if same else 'DIFFERS from a rebuild'}")
        return 0 if same else 1
    n = instruct_data.write(args.out)
    print(f"wrote {n} prompts -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
