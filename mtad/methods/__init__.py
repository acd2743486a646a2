"""Decoding methods: one small module per method, registered by name and built by name.

A new method needs its module and its config, nothing else (``tests/test_method_registry.py``
adds one in a copy of the tree and runs it through the preflight, the harness and the tables):

1. ``mtad/methods/<name>.py``: a params dataclass (its defaults, and value checks in
   ``__post_init__`` that raise ``ValueError("<param> must be ...")``) and a
   :class:`mtad.engine.DecodingMethod` subclass decorated ``@register_method(Params)`` that
   sets ``name = "<name>"`` (and ``uses_draft = True`` when it drafts), says how deep it
   drafts (``draft_depth()``, abstract on ``DecodingMethod``: a :class:`mtad.engine.DraftDepth`
   naming the parameter, so the preflight refuses a depth past the token budget; None when it
   drafts nothing; ``max_step_tokens``, the most tokens one step commits, is derived from it)
   and implements ``step``. Every module of this package is imported here, so nothing lists it.
2. ``conf/method/<name>.yaml``: ``name: <name>`` and every parameter at the dataclass's
   default (Hydra overrides only keys that exist; ``tests/test_configs.py`` keeps the two
   equal), with ``defaults: [base/warping@_here_, _self_]`` when it samples.
3. Tests for its rule (the acceptance test as a named function, exactness where it claims it).

Then ``python run.py method=<name> method.<param>=...`` runs it, ``-m method=ar,<name>`` sweeps
it beside the baseline, and ``analysis/make_tables.py`` and the paper's recipes compare it as
any other method (its comparison key is its run's identity without the method).
"""

from __future__ import annotations

import importlib
import pkgutil

from mtad.methods.registry import METHODS, build_method, build_params, make_method

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
for _name in sorted(METHODS):  # name order, whatever order the modules imported each other in
    METHODS[_name] = METHODS.pop(_name)

__all__ = ["METHODS", "build_method", "build_params", "make_method"]
