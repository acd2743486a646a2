"""Every method's parameters: a dataclass per method, the one place of its defaults, free of torch.

Each field's default is the method's default (the authors' where they have one: see
``conf/method/<name>.yaml``); ``__post_init__`` checks values and raises
``ValueError("<param> must be ...")``. :data:`PARAMS` names each method's dataclass:
:func:`mtad.harness.config.register_configs` stores each one's defaults in Hydra's ConfigStore
as ``method/params/<name>`` (the method's name and every field at its default), the node that
``conf/method/<name>.yaml`` composes first, so the YAML holds only comments and the values that
differ on purpose, and ``method.<param>=...`` overrides a key that exists. Torch-free because
``run.py --cfg job`` composes configs without torch; the method modules take their dataclass
from here (``from mtad.methods.mtad import MTADParams`` still works).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from mtad.config_types import conform, hints, type_problem, unknown_key
from mtad.engine.spec import WarpConfig


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


@dataclass(frozen=True)
class BeamSpec:
    """What a beam-sampled block is drawn with: ``gamma`` steps on ``beam_width`` beams from
    the ``warp``-ed distribution, pairs drawn without replacement unless ``replacement``
    (:attr:`BeamParams.beam` makes one from a method's parameters;
    :func:`mtad.methods.beam.beam_sample` draws with it)."""

    gamma: int
    beam_width: int
    warp: WarpConfig
    replacement: bool = False


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


@dataclass
class ARParams(SamplingParams):
    pass


@dataclass
class SpSParams(SamplingParams):
    gamma: int = 4

    def __post_init__(self) -> None:
        check_gamma(self.gamma)
        super().__post_init__()


@dataclass
class BlockVerifyParams(SpSParams):
    """SpS's parameters: block size ``gamma`` and the warping."""


@dataclass
class MTJDParams(BeamParams):
    """Block size, beam width and warping of target beam sampling."""


@dataclass
class MTADParams(BeamParams):
    tau: float = 0.5

    def __post_init__(self) -> None:
        check_tau(self.tau)
        super().__post_init__()


@dataclass
class MMTADParams(MTADParams):
    """Same parameters as MTAD: the difference is in verification."""


@dataclass
class SpecInferParams(SamplingParams):
    branching: list[int] = field(default_factory=lambda: [4, 2, 2])

    def __post_init__(self) -> None:
        given = self.branching
        try:
            if isinstance(self.branching, str):
                self.branching = [int(b) for b in self.branching.split(",")]
            self.branching = [int(b) for b in self.branching]
        except (TypeError, ValueError):
            self.branching = []
        if not self.branching or any(b < 1 for b in self.branching):
            raise ValueError(f"branching must be a non-empty list of ints >= 1, got {given!r}")
        super().__post_init__()


@dataclass
class BiLDParams(SamplingParams):
    fallback_threshold: float = 0.5
    rollback_threshold: float = 3.0
    max_draft: int = 8

    def __post_init__(self) -> None:
        if not 0.0 <= self.fallback_threshold <= 1.0:
            raise ValueError(f"fallback_threshold must be in [0, 1], got {self.fallback_threshold}")
        if self.rollback_threshold <= 0:
            raise ValueError(f"rollback_threshold must be > 0, got {self.rollback_threshold}")
        try:
            check_gamma(self.max_draft)
        except ValueError as err:
            raise ValueError(str(err).replace("gamma", "max_draft")) from None
        super().__post_init__()


# method name -> its params dataclass (each method module registers its class with the same
# dataclass: @register_method(PARAMS's entry); tests/test_configs.py checks the pairs agree)
PARAMS: dict[str, type] = {
    "ar": ARParams,
    "bild": BiLDParams,
    "blockverify": BlockVerifyParams,
    "mmtad": MMTADParams,
    "mtad": MTADParams,
    "mtjd": MTJDParams,
    "specinfer": SpecInferParams,
    "sps": SpSParams,
}


def build_params(name: str, **params: Any) -> Any:
    """Validated params dataclass for method ``name``; unknown keys or bad values raise
    ``ValueError`` naming them. Here, beside :data:`PARAMS`, so that a config is checked
    without importing the methods' modules (torch, transformers: seconds before a bad value's
    one line)."""
    if name not in PARAMS:
        raise ValueError(f"method: unknown method {name!r}; choose from {sorted(PARAMS)}")
    cls = PARAMS[name]
    known = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(params) - set(known))
    if unknown:
        message = unknown_key(f"method.{unknown[0]}", known, f"a parameter of {name!r}")
        raise ValueError(f"method.{unknown[0]}: {message}")
    types = hints(cls)
    for key, value in params.items():
        problem = type_problem(value, types.get(key, Any))
        if problem:
            raise ValueError(f"method.{key}: {problem}")
    return cls(**{k: conform(v, types.get(k, Any)) for k, v in params.items()})
