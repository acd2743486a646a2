#!/usr/bin/env python
"""Join a device run's split outputs (``<draft>.st.partNN`` + ``meta.tar``) back into folders.

    python scripts/assemble_draft.py <device files dir> <dest dir>
        -> <dest>/<draft>/{config.json, model.safetensors, recipe.json, report.md, ...}
    python scripts/assemble_draft.py <device files dir> <dest dir> --ship L4 \
        --ship-to assets/drafts/smollm2-draft

``--ship`` copies one assembled draft (its model, config, recipe, report, metrics and loss curve)
into the shipped asset folder after checking that the model loads as a ``LlamaForCausalLM``.
"""

from __future__ import annotations

import argparse
import re
import shutil
import tarfile
from pathlib import Path

SHIPPED = (
    "config.json",
    "model.safetensors",
    "recipe.json",
    "report.md",
    "metrics.json",
    "loss_curve.png",
)


def assemble(src: Path, dest: Path) -> list[str]:
    dest.mkdir(parents=True, exist_ok=True)
    meta = src / "meta.tar"
    if meta.is_file():
        with tarfile.open(meta) as tf:
            tf.extractall(dest, filter="data")
    parts: dict[str, list[Path]] = {}
    for p in sorted(src.iterdir()):
        m = re.fullmatch(r"(.+)\.st\.part(\d+)", p.name)
        if m:
            parts.setdefault(m.group(1), []).append(p)
    for name, files in parts.items():
        (dest / name).mkdir(parents=True, exist_ok=True)
        with open(dest / name / "model.safetensors", "wb") as f:
            for p in sorted(files):
                f.write(p.read_bytes())
    return sorted(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src")
    ap.add_argument("dest")
    ap.add_argument("--ship", default=None, help="draft name to copy into --ship-to")
    ap.add_argument("--ship-to", default="assets/drafts/smollm2-draft")
    args = ap.parse_args()
    names = assemble(Path(args.src), Path(args.dest))
    print("assembled:", names)
    if args.ship:
        from transformers import LlamaForCausalLM

        folder = Path(args.dest) / args.ship
        LlamaForCausalLM.from_pretrained(str(folder))  # must load
        to = Path(args.ship_to)
        to.mkdir(parents=True, exist_ok=True)
        for f in SHIPPED:
            if (folder / f).is_file():
                shutil.copy2(folder / f, to / f)
        print(f"shipped {folder} -> {to}")


if __name__ == "__main__":
    main()
