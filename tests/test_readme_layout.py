"""README's layout section names what the tree holds: every top-level folder and every package
and module directly under mtad/ (and nothing that is gone)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
UNLISTED = {"README.md", "pyproject.toml", ".gitignore"}  # the files a reader starts from


def tracked() -> list[str]:
    """The repository's files (run outputs such as outputs/ or wandb/ are not the tree)."""
    out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def layout_names() -> set[str]:
    readme = (REPO / "README.md").read_text()
    block = readme.split("## Layout", 1)[1].split("```", 2)[1]
    return {m.group(1) for m in re.finditer(r"^(\S+)\s", block, flags=re.M)}


def test_readme_layout_matches_the_tree() -> None:
    listed = layout_names()
    files = [f for f in tracked() if (REPO / f).exists()]
    top = {f.split("/")[0] + ("/" if "/" in f else "") for f in files}
    inner = {
        "/".join(f.split("/")[:2]) + ("/" if f.count("/") > 1 else "")
        for f in files
        if f.startswith("mtad/") and f.endswith(".py") and f != "mtad/__init__.py"
    }
    wanted = (top - UNLISTED - {"mtad/"}) | inner
    assert wanted - listed == set(), "in the tree, not in README's layout"
    assert {n for n in listed if not (REPO / n).exists()} == set(), (
        "in README's layout, not in the tree"
    )
