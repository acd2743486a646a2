"""Decoding methods: one small module per method, registered by name and built by name.

Adding a method: a module in this package with a :class:`mtad.engine.DecodingMethod` subclass
that sets ``name`` and is decorated ``@register_method(ParamsClass)`` (a dataclass that
validates itself in ``__post_init__``; see :mod:`mtad.methods.registry`), and
``conf/method/<name>.yaml``. Every module of this package is imported here, so nothing else
needs to list it.
"""

from __future__ import annotations

import importlib
import pkgutil

from mtad.methods.registry import METHODS, build_method, build_params

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
for _name in sorted(METHODS):  # name order, whatever order the modules imported each other in
    METHODS[_name] = METHODS.pop(_name)

__all__ = ["METHODS", "build_method", "build_params"]
