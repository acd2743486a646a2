"""Type checks of config values against the annotations of the code that takes them.

Method params dataclasses and task constructors are typed (``gamma: int``, ``limit: int |
None``), but ``method`` and ``task`` reach them as free-form mappings, so ``task.limit=abc``
used to fail deep inside with "'<' not supported between instances of 'str' and 'int'". Here
each value is checked against its annotation first, and the message says the expected type:
``must be an integer or null, got 'abc'``. Lenient where the code is: ``float`` takes ints, a
``Sequence`` takes a list or a tuple (of strings: also one string, made a one-item list by
:func:`conform`), unknown annotations take anything.

No torch, no package imports: :mod:`mtad.harness.config` (imported before Hydra composes) and
:mod:`mtad.tasks` use it.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import difflib
import inspect
import types
import typing
from collections.abc import Callable
from typing import Any

_NAMES = {
    bool: "true or false",
    int: "an integer",
    float: "a number",
    str: "a string",
    type(None): "null",
}
_SEQUENCES = (list, tuple, collections.abc.Sequence, collections.abc.Iterable)
_MAPPINGS = (dict, collections.abc.Mapping)


def _members(annotation: Any) -> tuple[Any, ...]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def _accepts(kind: Any, value: Any) -> bool | None:
    """Whether ``value`` fits ``kind`` (None: this check does not know ``kind``)."""
    origin = typing.get_origin(kind) or kind
    if kind is Any:
        return True
    if kind in (bool, int, str, type(None)):
        return type(value) is kind
    if kind is float:
        return type(value) in (int, float)
    if origin in _SEQUENCES:
        if isinstance(value, str):  # one string for a list of strings (see conform); for
            # a list of numbers the code's own check says more ("a list of ints >= 1")
            return True if _of_strings(kind) else None
        return isinstance(value, (list, tuple))
    if origin in _MAPPINGS:
        return isinstance(value, dict)
    if origin is typing.Literal:
        return value in typing.get_args(kind)
    return None


def _of_strings(kind: Any) -> bool:
    """A sequence annotation whose items may be strings (``Sequence[str]``, bare ``list``)."""
    args = [a for a in typing.get_args(kind) if a is not Ellipsis]
    return not args or all(a in (str, Any) for a in args)


def conform(value: Any, annotation: Any) -> Any:
    """``value`` as the code expects it: one string given for a list of strings becomes a
    one-item list (``task.stop=###`` is the stop string ``'###'``, not ``'#', '#', '#'``)."""
    if isinstance(value, str):
        members = _members(annotation)
        if str not in members and any(
            (typing.get_origin(k) or k) in _SEQUENCES and _of_strings(k) for k in members
        ):
            return [value]
    return value


def describe(annotation: Any) -> str:
    """``int | None`` -> ``an integer or null``."""
    names = []
    for kind in _members(annotation):
        origin = typing.get_origin(kind) or kind
        if kind in _NAMES:
            names.append(_NAMES[kind])
        elif origin in _SEQUENCES:
            names.append("a list")
        elif origin in _MAPPINGS:
            names.append("a mapping")
        elif origin is typing.Literal:
            names.append(" or ".join(repr(a) for a in typing.get_args(kind)))
        else:
            names.append(getattr(kind, "__name__", str(kind)))
    return " or ".join(dict.fromkeys(names))


def type_problem(value: Any, annotation: Any) -> str | None:
    """``"must be <type>, got <value>"`` when ``value`` does not fit ``annotation``, else None."""
    verdicts = [_accepts(kind, value) for kind in _members(annotation)]
    if any(v is None for v in verdicts) or any(verdicts):
        return None
    return f"must be {describe(annotation)}, got {value!r}"


def hints(obj: Callable[..., Any] | type) -> dict[str, Any]:
    """Resolved annotations of a dataclass or a function ({} when they cannot be resolved)."""
    try:
        found = typing.get_type_hints(obj)
    except Exception:  # noqa: BLE001 - names only imported under TYPE_CHECKING: no check
        return {}
    found.pop("return", None)
    return found


def keyword_hints(cls: type) -> dict[str, Any]:
    """Annotations of the keyword-only ``__init__`` parameters along ``cls``'s MRO (the
    subclass's own annotation wins), as :func:`mtad.tasks.build_task` passes options."""
    out: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        found = hints(init)
        for p in inspect.signature(init).parameters.values():
            if p.kind is p.KEYWORD_ONLY and p.name in found:
                out[p.name] = found[p.name]
    return out


def field_defaults(cls: type) -> dict[str, Any]:
    """Every field of the dataclass ``cls`` at its default, in field order (the values Hydra's
    ConfigStore holds for a method's or a task's config: :mod:`mtad.harness.config`)."""
    return {
        f.name: f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
        for f in dataclasses.fields(cls)
    }


def unknown_key(key: str, known: list[str], where: str) -> str:
    """The message for a key that is not among ``known``: the closest one when there is one
    (``method.gama`` -> ``did you mean method.gamma?``), else the list."""
    section, _, name = key.rpartition(".")
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    if close:
        return f"not {where}; did you mean {section + '.' if section else ''}{close[0]}?"
    return f"not {where} (has {', '.join(sorted(known))})" if known else f"not {where}"
