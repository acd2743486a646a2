"""Shared fixtures: tiny random models, one torch thread per test process.

The suite runs on every core (pytest-xdist, ``-n logical --dist loadscope`` in pyproject.toml),
one torch thread per worker. A test module runs on one worker, so a module-scoped fixture (a
study rendered once, every method run once) is built once. The tests are independent: results,
W&B and Hydra sweep folders are temporary folders, the GGUF conversion cache under
``~/.cache/mtad`` is written once under a lock, servers bind port 0. ``-n 0`` runs them all in
one process.
"""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(1)


@pytest.fixture(scope="session", autouse=True)
def kernel_cache(tmp_path_factory):
    """Kernel choices measured by the tests go to a scratch file, not the user's cache."""
    from mtad.engine.kernels import CACHE_ENV

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(CACHE_ENV, str(tmp_path_factory.mktemp("kernels") / "kernels.json"))
        yield


@pytest.fixture(scope="session")
def tiny_llama():
    from mtad.engine.tiny import build_tiny_pair

    return build_tiny_pair("llama", vocab_size=320, seed=0)


@pytest.fixture(scope="session")
def tiny_opt():
    from mtad.engine.tiny import build_tiny_pair

    return build_tiny_pair("opt", vocab_size=320, seed=0)
