"""Shared fixtures: tiny random models, one torch thread (tests share a 2-core machine)."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_llama():
    from mtad.engine.tiny import build_tiny_pair

    return build_tiny_pair("llama", vocab_size=320, seed=0)


@pytest.fixture(scope="session")
def tiny_opt():
    from mtad.engine.tiny import build_tiny_pair

    return build_tiny_pair("opt", vocab_size=320, seed=0)
