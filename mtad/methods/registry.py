"""Method registry: each method module registers its class under the class's ``name``.

    @register_method(ARParams)
    class AutoregressiveSampling(DecodingMethod):
        name = "ar"

:mod:`mtad.methods` imports every module of its package, so a new method is one module there
plus ``conf/method/<name>.yaml``; nothing else lists the methods.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from mtad.config_types import conform, hints, type_problem

if TYPE_CHECKING:
    from mtad.engine import DecodingMethod

M = TypeVar("M", bound="type[DecodingMethod]")

# name -> (params dataclass, method class)
METHODS: dict[str, tuple[type, type[DecodingMethod]]] = {}


def register_method(params: type) -> Callable[[M], M]:
    """Class decorator: register a :class:`~mtad.engine.DecodingMethod` subclass, built from
    the ``params`` dataclass (validated in its ``__post_init__``), under ``cls.name``."""

    def register(cls: M) -> M:
        name = cls.__dict__.get("name")
        if not isinstance(name, str) or not name:
            raise TypeError(f"{cls.__qualname__}: a registered method sets its own `name`")
        known = METHODS.get(name)
        if known is not None and _origin(known[1]) != _origin(cls):
            raise ValueError(f"method {name!r}: registered twice ({known[1]} and {cls})")
        METHODS[name] = (params, cls)
        return cls

    return register


def _origin(cls: type) -> tuple[str, str]:
    return cls.__module__, cls.__qualname__  # a reloaded module registers the same method again


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
    types = hints(cls)
    for key, value in params.items():
        problem = type_problem(value, types.get(key, Any))
        if problem:
            raise ValueError(f"method.{key}: {problem}")
    return cls(**{k: conform(v, types.get(k, Any)) for k, v in params.items()})


def make_method(name: str, params: Any) -> DecodingMethod:
    """Method ``name`` built from an already validated params dataclass (:func:`build_params`)."""
    return METHODS[name][1](params)


def build_method(name: str, **params: Any) -> DecodingMethod:
    """Method ``name`` from keyword params (defaults: the params dataclass's)."""
    return make_method(name, build_params(name, **params))
