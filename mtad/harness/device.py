"""``runtime.device`` against this machine: the one check that needs torch but not the engine.

Kept apart from :mod:`mtad.harness.preflight` (which imports the engine and transformers) so
that a GPU preset started on a CPU host is refused after importing torch alone (seconds), before
any sweep is expanded or composed.
"""

from __future__ import annotations

import torch

from mtad.harness.config import ConfigError


def check_device(device: str) -> None:
    """``runtime.device`` names a device this torch build can use."""
    kind, _, index = device.partition(":")
    if kind == "cuda":
        if not torch.cuda.is_available():
            why = (
                f"torch {torch.__version__} is built without CUDA"
                if torch.version.cuda is None
                else "no GPU is visible (CUDA_VISIBLE_DEVICES, driver)"
            )
            raise ConfigError("runtime.device", f"{device} is not available: {why}; use cpu")
        count = torch.cuda.device_count()
        if index and int(index) >= count:
            raise ConfigError("runtime.device", f"{device} is not available: {count} GPU(s) seen")
    elif kind == "mps" and not torch.backends.mps.is_available():
        raise ConfigError("runtime.device", "mps is not available on this machine; use cpu")
