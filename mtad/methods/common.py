"""Parameters and tensor helpers shared by several methods."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mtad.engine import WarpConfig
from mtad.methods.beam import BeamSpec


@dataclass
class SamplingParams:
    """Warping shared by target and draft; the authors' defaults (T=1, top-k 10, top-p 0.9)."""

    temperature: float = 1.0
    top_k: int = 10
    top_p: float = 0.9

    def __post_init__(self) -> None:
        self.warp = WarpConfig(self.temperature, self.top_k, self.top_p)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class BeamParams(SamplingParams):
    """Block size and beam width of beam-sampled blocks (MTJD, MTAD, MMTAD)."""

    gamma: int = 4
    beam_width: int = 4
    replacement: bool = False  # beam sampling with replacement (the paper's default is without)

    def __post_init__(self) -> None:
        check_gamma(self.gamma)
        check_beam_width(self.beam_width)
        super().__post_init__()

    @property
    def beam(self) -> BeamSpec:
        """The beam draft's parameters as one object (:func:`mtad.methods.beam.beam_sample`)."""
        return BeamSpec(self.gamma, self.beam_width, self.warp, self.replacement)


def check_gamma(gamma: int) -> None:
    if not isinstance(gamma, int) or gamma < 1:
        raise ValueError(f"gamma must be an integer >= 1, got {gamma!r}")


def check_beam_width(beam_width: int) -> None:
    if not isinstance(beam_width, int) or beam_width < 1:
        raise ValueError(f"beam_width must be an integer >= 1, got {beam_width!r}")


def check_tau(tau: float) -> None:
    if not 0.0 < tau <= 1.0:
        raise ValueError(f"tau must be in (0, 1], got {tau!r}")


def leading_true_count(mask: torch.Tensor) -> torch.Tensor:
    """Length of the all-True prefix of a 1-D bool mask, as a 0-d tensor (no host sync)."""
    return mask.to(torch.long).cumprod(dim=0).sum()


def read_block(
    k: torch.Tensor, x: torch.Tensor, next_token: torch.Tensor
) -> tuple[int, torch.Tensor, list[int]]:
    """The iteration's one host read, for a block ``x`` ``[g]`` of which ``k`` (0-d tensor) were
    accepted and the target's ``next_token`` (one token, computed from ``k`` on the device):
    ``(k, tokens, token_ids)``, the committed ``x[:k] + next_token`` on the device and as host
    ints (:attr:`mtad.engine.loop.StepResult.token_ids`)."""
    nxt = next_token.reshape(1)
    vals = torch.cat([k.reshape(1).to(x.dtype), x, nxt.to(x.dtype)]).tolist()
    n = int(vals[0])
    return n, torch.cat([x[:n], nxt]), [*vals[1 : 1 + n], vals[-1]]
