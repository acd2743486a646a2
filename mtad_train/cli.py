"""Command lines made from dataclasses: one ``--name`` option per field, its default the field's.

A training command's configuration is a dataclass (:mod:`mtad_train.config`,
:class:`mtad_train.cumulative.CumulativeConfig`): the one place of every default and every help
text. :func:`dataclass_options` adds its options to an ``argparse`` parser and
:func:`config_from` builds the dataclass back from the parsed namespace, once, at the command
line; the run reads typed fields, never a namespace. This module is the only one of the
training package that imports ``argparse`` (nothing under ``mtad/`` does).

Field types decide the option: ``bool`` is ``--x`` / ``--no-x``; ``list[T]`` takes one or more
values (``nargs`` in the field's metadata to change that; numbers may also be given comma
separated, ``--depth-weights 1,1,0.5``); ``T | None`` takes a ``T``; a field whose type is a
dataclass contributes that dataclass's options (flattened: names must not clash). Metadata
(:func:`opt`): ``help``, ``choices``, ``required``, ``parse`` (the value parser, default the
type), ``nargs``, and ``cli=False`` for a field that is no option (derived at run time).
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


def opt(
    default: Any = dataclasses.MISSING,
    *,
    default_factory: Any = dataclasses.MISSING,
    help: str | None = None,  # noqa: A002 (argparse's word)
    choices: Sequence[Any] | None = None,
    required: bool = False,
    parse: Callable[[str], Any] | None = None,
    nargs: str | None = None,
    cli: bool = True,
) -> Any:
    """A dataclass field with its command-line metadata."""
    meta = {
        "help": help,
        "choices": choices,
        "required": required,
        "parse": parse,
        "nargs": nargs,
        "cli": cli,
    }
    return dataclasses.field(default=default, default_factory=default_factory, metadata=meta)


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _unwrap(tp: Any) -> tuple[Any, bool]:
    """``(scalar type, is a list)`` of a field's type, ``X | None`` read as ``X``."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    if typing.get_origin(tp) is list:
        return typing.get_args(tp)[0], True
    return tp, False


class _Numbers(argparse.Action):
    """A list of numbers, space or comma separated (``1 1 0.5`` or ``1,1,0.5``)."""

    def __init__(self, *args: Any, convert: Callable[[str], Any], **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.convert = convert

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        parts = [p for v in values for p in str(v).split(",") if p]
        try:
            setattr(namespace, self.dest, [self.convert(p) for p in parts])
        except ValueError as e:
            parser.error(f"{option_string}: {e}")


def _cli_fields(cls: type) -> list[tuple[dataclasses.Field, Any]]:
    hints = typing.get_type_hints(cls)
    return [(f, hints[f.name]) for f in dataclasses.fields(cls) if f.metadata.get("cli", True)]


def dataclass_options(parser: argparse.ArgumentParser, cls: type, _seen: set | None = None) -> None:
    """One ``--name`` option per field of the dataclass ``cls`` (and of the dataclasses it
    nests), its default the field's: the dataclass is the one place of each default."""
    seen = set() if _seen is None else _seen
    for f, tp in _cli_fields(cls):
        if dataclasses.is_dataclass(tp):
            dataclass_options(parser, tp, seen)
            continue
        if f.name in seen:
            raise ValueError(f"{cls.__name__}.{f.name}: an option of that name already exists")
        seen.add(f.name)
        meta, (elem, is_list) = f.metadata, _unwrap(tp)
        kw: dict[str, Any] = {"dest": f.name, "help": meta.get("help")}
        if meta.get("required"):
            kw["required"] = True
        else:
            kw["default"] = _default(f)
        if meta.get("choices"):
            kw["choices"] = meta["choices"]
        parse = meta.get("parse") or elem
        if is_list:
            kw["nargs"] = meta.get("nargs") or "+"
            if elem in (int, float):
                kw.update(action=_Numbers, convert=elem)
            else:
                kw["type"] = parse
        elif elem is bool:
            kw["action"] = argparse.BooleanOptionalAction
        else:
            kw["type"] = parse
        parser.add_argument("--" + f.name.replace("_", "-"), **kw)


def config_from(cls: type[T], ns: argparse.Namespace) -> T:
    """The dataclass ``cls`` of a namespace parsed with :func:`dataclass_options`' options."""
    kw: dict[str, Any] = {}
    for f, tp in _cli_fields(cls):
        kw[f.name] = config_from(tp, ns) if dataclasses.is_dataclass(tp) else getattr(ns, f.name)
    return cls(**kw)


def parse_config(
    cls: type[T], argv: Sequence[str] | None = None, parser: argparse.ArgumentParser | None = None
) -> T:
    """Parse ``argv`` into ``cls``; a ``ValueError`` of the dataclass's own checks
    (``__post_init__``) is the parser's one-line usage error."""
    parser = parser or argparse.ArgumentParser(description=(cls.__doc__ or "").split("\n\n")[0])
    dataclass_options(parser, cls)
    return checked(parser, cls, parser.parse_args(argv))


def checked(parser: argparse.ArgumentParser, cls: type[T], ns: argparse.Namespace) -> T:
    try:
        return config_from(cls, ns)
    except ValueError as e:
        parser.error(str(e))
        raise  # parser.error exits; for type checkers


def subcommands(
    parser: argparse.ArgumentParser,
    commands: dict[str, tuple[type, Callable[[Any], Any], str]],
    argv: Sequence[str] | None = None,
) -> Any:
    """Sub-commands ``name -> (config dataclass, run, help)``: parse ``argv``, build the chosen
    command's config once and return ``run(config)``."""
    sub = parser.add_subparsers(dest="cmd", required=True)
    parsers = {}
    for name, (cls, _, text) in commands.items():
        parsers[name] = sub.add_parser(name, help=text, description=text)
        dataclass_options(parsers[name], cls)
    ns = parser.parse_args(argv)
    cls, run, _ = commands[ns.cmd]
    return run(checked(parsers[ns.cmd], cls, ns))
