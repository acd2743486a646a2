"""Method registry: each method module registers its class under the class's ``name``.

    @register_method(ARParams)
    class AutoregressiveSampling(DecodingMethod):
        name = "ar"

        def draft_depth(self) -> DraftDepth | None:
            return None

:mod:`mtad.methods` imports every module of its package, so a new method is its params
dataclass in :mod:`mtad.methods.params`, one module here and ``conf/method/<name>.yaml``;
nothing else lists the methods.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from mtad.engine.loop import DraftDepth
from mtad.methods.params import build_params

if TYPE_CHECKING:
    from mtad.engine import DecodingMethod

M = TypeVar("M", bound="type[DecodingMethod]")

__all__ = [
    "METHODS",
    "DraftDepth",
    "build_method",
    "build_params",
    "make_method",
    "register_method",
]

# name -> (params dataclass, method class)
METHODS: dict[str, tuple[type, type[DecodingMethod]]] = {}


def register_method(params: type) -> Callable[[M], M]:
    """Class decorator: register a :class:`~mtad.engine.DecodingMethod` subclass, built from
    the ``params`` dataclass (validated in its ``__post_init__``), under ``cls.name``. The
    class says how deep it drafts (``draft_depth()``, abstract on ``DecodingMethod``: a
    :class:`DraftDepth`, None for a method that drafts nothing); refused here, at import,
    rather than at its first run."""

    def register(cls: M) -> M:
        name = cls.__dict__.get("name")
        if not isinstance(name, str) or not name:
            raise TypeError(f"{cls.__qualname__}: a registered method sets its own `name`")
        if "draft_depth" in getattr(cls, "__abstractmethods__", ()):
            raise TypeError(
                f"{cls.__qualname__}: a registered method says how deep it drafts "
                "(def draft_depth(self) -> DraftDepth | None)"
            )
        known = METHODS.get(name)
        if known is not None and _origin(known[1]) != _origin(cls):
            raise ValueError(f"method {name!r}: registered twice ({known[1]} and {cls})")
        METHODS[name] = (params, cls)
        return cls

    return register


def _origin(cls: type) -> tuple[str, str]:
    return cls.__module__, cls.__qualname__  # a reloaded module registers the same method again


def make_method(name: str, params: Any) -> DecodingMethod:
    """Method ``name`` built from an already validated params dataclass (:func:`build_params`)."""
    return METHODS[name][1](params)


def build_method(name: str, **params: Any) -> DecodingMethod:
    """Method ``name`` from keyword params (defaults: the params dataclass's)."""
    return make_method(name, build_params(name, **params))
