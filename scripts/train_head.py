"""Train a feature-level draft head (EAGLE-style) for a pair: data, teacher pass, training, report.

    python scripts/train_head.py corpus   --out assets/drafts/smollm2-head/corpus.npz
    python scripts/train_head.py features --data assets/drafts/smollm2-draft/data.npz \
        --out .dev/head/features/onpolicy [--part 0/2]
    python scripts/train_head.py train    ... (see --help)
    python scripts/train_head.py cumulative   (go on training the committed head)

Each stage is resumable: the teacher pass writes complete shards atomically, training saves a
checkpoint every few minutes and resumes from it to the same weights. The sub-commands are
:data:`mtad_train.head_commands.COMMANDS`; each one's options are the fields of its dataclass.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mtad_train.cli import subcommands  # noqa: E402
from mtad_train.head_commands import COMMANDS  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    subcommands(ap, COMMANDS, argv)


if __name__ == "__main__":
    main()
