"""Decoding methods: one small module per method, registered by name and built by name.

A new method needs its parameters, its module and its config, nothing else
(``tests/test_method_registry.py`` adds one in a copy of the tree and runs it through the
preflight, the harness and the tables):

1. :mod:`mtad.methods.params`: a params dataclass (its defaults, the only place they are
   written, and value checks in ``__post_init__`` that raise ``ValueError("<param> must be
   ...")``) and its entry in :data:`~mtad.methods.params.PARAMS`;
2. ``mtad/methods/<name>.py``: a :class:`mtad.engine.DecodingMethod` subclass decorated
   ``@register_method(Params)`` that sets ``name = "<name>"`` (and ``uses_draft = True`` when
   it drafts), says how deep it drafts (``draft_depth()``, abstract on ``DecodingMethod``: a
   :class:`mtad.engine.DraftDepth` naming the parameter, so the preflight refuses a depth past
   the token budget; None when it drafts nothing; ``max_step_tokens``, the most tokens one
   step commits, is derived from it) and implements ``step``. Every module of this package is
   imported on the first use of :data:`METHODS` or a ``build_*`` function, so nothing lists it;
3. ``conf/method/<name>.yaml``: ``defaults: [params/<name>@_here_, _self_]`` (the name and
   every parameter at the dataclass's default, from Hydra's ConfigStore:
   :func:`mtad.harness.config.register_configs`), its comments and any value that differs
   from the default on purpose;
4. tests for its rule (the acceptance test as a named function, exactness where it claims it).

Then ``python run.py method=<name> method.<param>=...`` runs it, ``-m method=ar,<name>`` sweeps
it beside the baseline, and ``analysis/make_tables.py`` and the paper's recipes compare it as
any other method (its comparison key is its run's identity without the method).

The package imports its modules (and torch) on first use (PEP 562 module ``__getattr__``, as
:mod:`mtad.engine`), so ``import mtad.methods.params`` does not import torch.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mtad.methods.registry import METHODS, build_method, build_params, make_method

__all__ = ["METHODS", "build_method", "build_params", "make_method"]


def _import_all() -> None:
    """Import every module of the package (each registers its method), then order the
    registry by name, whatever order the modules imported each other in."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
    from mtad.methods.registry import METHODS

    for name in sorted(METHODS):
        METHODS[name] = METHODS.pop(name)


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    _import_all()
    from mtad.methods import registry

    for public in __all__:  # found directly from now on
        globals()[public] = getattr(registry, public)
    return globals()[name]
