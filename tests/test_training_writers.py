"""Every training writer replaces its file whole or not at all (issue 38 item 4): a save
killed half-way (a real SIGKILL, in a subprocess: tests/save_fault.py) or stopped by a full
disk (ENOSPC) leaves the last good file, readable, with no temporary file behind after ENOSPC.

The writers: the head's and the distillation's checkpoints, the ids files (``data.npz``,
corpora), the prompt pool, and the transport parts. The cumulative session's checkpoint and
export are cut inside a real session in tests/test_head_cumulative.py, the distillation's in
tests/test_distill_resume.py, the head training's in tests/test_feature_head.py; both resume
to the uninterrupted run's end."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


def _head_ckpt(folder: Path, version: int) -> Path:
    from mtad_train.head_train import TrainState, save_checkpoint

    torch.manual_seed(version)
    head = torch.nn.Linear(64, 64)
    opt = torch.optim.AdamW(head.parameters())
    save_checkpoint(folder, head, opt, TrainState(step=version))  # type: ignore[arg-type]
    return folder / "ckpt.pt"


def _distill_ckpt(folder: Path, version: int) -> Path:
    from mtad_train.train import save_ckpt

    save_ckpt(folder, {"step": version, "w": torch.full((256, 64), float(version))})
    return folder / "state.pt"


def _ids(folder: Path, version: int) -> Path:
    from mtad_train.ids import write_ids

    seqs = [[version] * 50 + list(range(200)) for _ in range(20)]
    write_ids(folder / "data.npz", seqs, [5] * 20, ["x"] * 20)
    return folder / "data.npz"


def _pool(folder: Path, version: int) -> Path:
    from mtad_train.pool import save_pool

    save_pool([{"kind": "chat", "n": version, "i": i} for i in range(500)], folder / "p.jsonl.gz")
    return folder / "p.jsonl.gz"


def _parts(folder: Path, version: int) -> Path:
    from mtad_train.data import write_parts

    write_parts(bytes([version]) * 3000, folder, "data.npz", chunk_mib=1.0)
    return folder / "data.npz.part00"


def _read(path: Path) -> Any:
    """The file's content as its reader sees it (so a torn file fails here, not later)."""
    if path.suffix == ".pt":
        ck = torch.load(path, weights_only=False)
        return ck["state"]["step"] if "state" in ck else ck["step"]
    if path.suffix == ".npz":
        from mtad_train.ids import read_ids

        return int(read_ids(path).seqs[0][0])
    if path.name.endswith(".gz"):
        from mtad_train.pool import load_pool

        return load_pool(path)[0]["n"]
    return path.read_bytes()[0]


WRITERS: dict[str, Callable[[Path, int], Path]] = {
    "head checkpoint": _head_ckpt,
    "distillation checkpoint": _distill_ckpt,
    "ids": _ids,
    "pool": _pool,
    "transport parts": _parts,
}


class _FullDisk:
    """``os`` on a full disk: ``fsync`` of the written file fails (write-back error)."""

    def __init__(self) -> None:
        self._real = os

    def fsync(self, fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_a_full_disk_at_the_save_keeps_the_last_good_file(tmp_path, monkeypatch, writer):
    from mtad.runs import atomic

    path = WRITERS[writer](tmp_path, 1)
    before = path.read_bytes()
    monkeypatch.setattr(atomic, "os", _FullDisk())
    with pytest.raises(OSError) as err:
        WRITERS[writer](tmp_path, 2)
    monkeypatch.undo()
    assert err.value.errno == errno.ENOSPC and err.value.filename == str(path)
    assert path.read_bytes() == before and _read(path) == 1
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary left


KILLED = """
import sys
from pathlib import Path
sys.path.insert(0, {tests!r})
import save_fault, test_training_writers as t
save_fault.install({name!r}, 1, "kill")
t.WRITERS[{writer!r}](Path({folder!r}), 2)
print("not killed")
"""


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_a_kill_in_the_middle_of_the_save_keeps_the_last_good_file(tmp_path, writer):
    path = WRITERS[writer](tmp_path, 1)
    before = path.read_bytes()
    code = KILLED.format(
        tests=str(REPO / "tests"), name=path.name, writer=writer, folder=str(tmp_path)
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == -9, out.stdout + out.stderr  # killed by the fault, mid-save
    assert path.read_bytes() == before and _read(path) == 1
    torn = [p for p in tmp_path.iterdir() if p != path]
    assert len(torn) == 1 and torn[0].name.startswith(f".{path.name}.")  # the half-written one
    WRITERS[writer](tmp_path, 3)  # the next save goes through
    assert _read(path) == 3
