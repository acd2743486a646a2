#!/usr/bin/env python
"""Write a draft's frequency-ranked vocabulary (``draft_vocab.json``, FR-Spec) from the target's
own text: the ``--k`` most frequent token ids of the responses in a distillation's ``data.npz``
(the target's generations on the training pool, disjoint from every evaluation prompt), plus the
tokenizer's special tokens. The draft then projects onto those ids only
(:mod:`mtad.engine.subvocab`); coverage (the share of response tokens inside) is printed and
written into the file.

    python scripts/draft_vocab.py assets/drafts/smollm2-draft/data.npz \
        assets/drafts/smollm2-draft --k 8192
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from mtad.engine.subvocab import VOCAB_FILE, frequency_ranked_ids  # noqa: E402
from mtad_train.ids import read_ids  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data", type=Path, help="data.npz of a distillation (--save-data)")
    ap.add_argument("draft", type=Path, help="draft folder (config.json) to write into")
    ap.add_argument("--k", type=int, default=8192)
    args = ap.parse_args(argv)
    cfg = json.loads((args.draft / "config.json").read_text())
    vocab = int(cfg["vocab_size"])
    resp = read_ids(args.data).responses()
    specials = sorted(
        {
            int(t)
            for key in ("bos_token_id", "eos_token_id", "pad_token_id")
            for t in np.atleast_1d(cfg.get(key) if cfg.get(key) is not None else [])
        }
    )
    ids = frequency_ranked_ids(resp, vocab, args.k, always=specials)
    kept = np.zeros(vocab, dtype=bool)
    kept[ids] = True
    total = sum(len(r) for r in resp)
    covered = sum(int(kept[r].sum()) for r in resp)
    info = {
        "ids": ids,
        "k": args.k,
        "specials": specials,
        "source": f"most frequent response tokens of {args.data.name} "
        f"({len(resp)} target generations, {total} tokens)",
        "coverage": round(covered / max(1, total), 5),
    }
    (args.draft / VOCAB_FILE).write_text(json.dumps(info) + "\n")
    print(
        f"{len(ids)} ids -> {args.draft / VOCAB_FILE}; response-token coverage "
        f"{info['coverage']:.4f} of {total}"
    )
    return info


if __name__ == "__main__":
    main()
