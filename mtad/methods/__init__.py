"""Decoding methods and their registry: one small module per method, built by name.

Adding a method: write a :class:`mtad.engine.DecodingMethod` subclass with a params dataclass
that validates itself in ``__post_init__``, register both in :data:`METHODS`, add
``conf/method/<name>.yaml``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mtad.engine import DecodingMethod
from mtad.methods.ar import ARParams, AutoregressiveSampling
from mtad.methods.bild import BigLittleDecoder, BiLDParams
from mtad.methods.mmtad import MMTAD, MMTADParams
from mtad.methods.mtad import MTAD, MTADParams
from mtad.methods.mtjd import MTJDParams, TargetBeamSampling
from mtad.methods.specinfer import SpecInferParams, TreeSpeculativeSampling
from mtad.methods.sps import SpeculativeSampling, SpSParams

# name -> (params dataclass, method class)
METHODS: dict[str, tuple[type, type[DecodingMethod]]] = {
    "ar": (ARParams, AutoregressiveSampling),
    "mtjd": (MTJDParams, TargetBeamSampling),
    "sps": (SpSParams, SpeculativeSampling),
    "specinfer": (SpecInferParams, TreeSpeculativeSampling),
    "bild": (BiLDParams, BigLittleDecoder),
    "mtad": (MTADParams, MTAD),
    "mmtad": (MMTADParams, MMTAD),
}


def build_params(name: str, **params: Any) -> Any:
    """Validated params dataclass for method ``name``; unknown keys or bad values raise
    ``ValueError`` naming them."""
    if name not in METHODS:
        raise ValueError(f"method: unknown method {name!r}; choose from {sorted(METHODS)}")
    cls = METHODS[name][0]
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(params) - known)
    if unknown:
        raise ValueError(f"method.{unknown[0]}: not a parameter of {name!r} (has {sorted(known)})")
    return cls(**params)


def build_method(name: str, **params: Any) -> DecodingMethod:
    params_obj = build_params(name, **params)
    return METHODS[name][1](params_obj)


__all__ = ["METHODS", "build_method", "build_params"]
