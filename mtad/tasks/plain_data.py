"""A data-only codec for values that cross between the HumanEval checker and the sandbox.

Carries exactly ``None, bool, int, float, complex, str, bytes, list, tuple, dict, set,
frozenset`` (nested), and nothing else: a value is accepted only when its type *is* one of
these (``type(v) is int``, never a subclass, so an ``int`` subclass with a rigged ``__eq__`` is
refused), and decoding builds only these types from JSON, so no byte of a message can run code
in the decoding process (unlike ``pickle`` or ``marshal`` of code objects). The wire format is
JSON in which every value is a list whose first item is a tag::

    ["n"]  ["T"]  ["F"]  ["i", hex]  ["f", float.hex]  ["c", re.hex, im.hex]  ["s", str]
    ["b", hex]  ["l", [...]]  ["t", [...]]  ["d", [[k, v], ...]]  ["set", [...]]  ["fs", [...]]

Integers travel in hex (no limit on digits, unlike ``int(str)``); floats as ``float.hex`` (exact,
``inf`` and ``nan`` included). Nesting is bounded (:data:`MAX_DEPTH`) on both sides, which also
refuses self-containing lists.

Standard library only and free of package imports: the sandboxed child and the trusted checker
load this file by its path (they run with ``python -I``), the harness imports it as a module.
"""

from __future__ import annotations

import json
import os
from typing import Any

MAX_DEPTH = 64
FRAME_HEADER = 4
MAX_FRAME_BYTES = 8 << 20  # one call's arguments or result

_SCALARS = {
    type(None): lambda v: ["n"],
    bool: lambda v: ["T"] if v else ["F"],
    int: lambda v: ["i", hex(v)],
    float: lambda v: ["f", v.hex()],
    complex: lambda v: ["c", v.real.hex(), v.imag.hex()],
    str: lambda v: ["s", v],
    bytes: lambda v: ["b", v.hex()],
}
_SEQUENCES = {list: "l", tuple: "t", set: "set", frozenset: "fs"}
_BUILD = {"l": list, "t": tuple, "set": set, "fs": frozenset}


class NotPlainData(ValueError):
    """The value (or message) is not plain data; the message says what was found."""


def describe(value: object) -> str:
    """The type of ``value`` as a reader wants to see it: ``int subclass Rigged`` etc."""
    kind = type(value)
    for base in (*_SCALARS, *_SEQUENCES, dict):
        if isinstance(value, base) and kind is not base:
            return f"{base.__name__} subclass {kind.__qualname__}"
    return kind.__qualname__


def to_wire(value: object, depth: int = 0) -> Any:
    """``value`` as the JSON-ready tagged form; :class:`NotPlainData` for anything else."""
    if depth > MAX_DEPTH:
        raise NotPlainData(f"nested deeper than {MAX_DEPTH} levels")
    kind = type(value)
    if kind in _SCALARS:
        return _SCALARS[kind](value)
    if kind in _SEQUENCES:
        return [_SEQUENCES[kind], [to_wire(v, depth + 1) for v in value]]  # type: ignore[attr-defined]
    if kind is dict:
        items = value.items()  # type: ignore[attr-defined]
        return ["d", [[to_wire(k, depth + 1), to_wire(v, depth + 1)] for k, v in items]]
    raise NotPlainData(f"a value of type {describe(value)}")


def from_wire(node: Any, depth: int = 0) -> Any:
    """The plain value of a tagged form; :class:`NotPlainData` for anything malformed."""
    if depth > MAX_DEPTH:
        raise NotPlainData(f"nested deeper than {MAX_DEPTH} levels")
    if type(node) is not list or not node or type(node[0]) is not str:
        raise NotPlainData("malformed value")
    tag, rest = node[0], node[1:]
    try:
        if tag in ("n", "T", "F") and not rest:
            return {"n": None, "T": True, "F": False}[tag]
        if tag == "i" and _strings(rest, 1):
            return int(rest[0], 16)
        if tag == "f" and _strings(rest, 1):
            return float.fromhex(rest[0])
        if tag == "c" and _strings(rest, 2):
            return complex(float.fromhex(rest[0]), float.fromhex(rest[1]))
        if tag == "s" and _strings(rest, 1):
            return rest[0]
        if tag == "b" and _strings(rest, 1):
            return bytes.fromhex(rest[0])
        if tag in _BUILD and len(rest) == 1 and type(rest[0]) is list:
            return _BUILD[tag](from_wire(v, depth + 1) for v in rest[0])
        if tag == "d" and len(rest) == 1 and type(rest[0]) is list:
            pairs = rest[0]
            if not all(type(p) is list and len(p) == 2 for p in pairs):
                raise NotPlainData("malformed dict")
            return {from_wire(k, depth + 1): from_wire(v, depth + 1) for k, v in pairs}
    except (TypeError, ValueError, OverflowError) as err:  # unhashable key, bad hex ...
        if isinstance(err, NotPlainData):
            raise
        raise NotPlainData(f"malformed value ({err})") from err
    raise NotPlainData(f"malformed value (tag {tag[:20]!r})")


def _strings(items: list, n: int) -> bool:
    return len(items) == n and all(type(s) is str for s in items)


def encode(value: object) -> bytes:
    """``value`` as bytes on the wire (UTF-8 JSON, ASCII only)."""
    return json.dumps(to_wire(value), separators=(",", ":")).encode("ascii")


def decode(data: bytes) -> Any:
    """The plain value in ``data``; :class:`NotPlainData` when it is not a valid message."""
    try:
        node = json.loads(data.decode("ascii"))
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise NotPlainData(f"not a valid message ({type(err).__name__})") from err
    return from_wire(node)


# --------------------------------------------------------------------------------------------
# framing: one message = 4-byte big-endian length + the encoded value


def frame(value: object) -> bytes:
    """``value`` encoded and prefixed with its length, ready for one ``write`` on a pipe."""
    payload = encode(value)
    return len(payload).to_bytes(FRAME_HEADER, "big") + payload


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def read_exactly(fd: int, n: int) -> bytes | None:
    """``n`` bytes from ``fd`` (blocking); None at end of file."""
    chunks, got = [], 0
    while got < n:
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_frame(fd: int, max_bytes: int = MAX_FRAME_BYTES) -> Any:
    """The next message on ``fd`` (blocking), decoded; None at end of file."""
    head = read_exactly(fd, FRAME_HEADER)
    if head is None:
        return None
    n = int.from_bytes(head, "big")
    if n > max_bytes:
        raise NotPlainData(f"message of {n} bytes exceeds {max_bytes}")
    payload = read_exactly(fd, n)
    if payload is None:
        return None
    return decode(payload)
