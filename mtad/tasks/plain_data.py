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
refuses self-containing lists. Decoding a message from untrusted code is bounded before it
starts (the frame's size) and while it runs (nesting, a time budget, and at most
:data:`MAX_SAME_HASH` distinct numbers or keys of one hash, against hash flooding).

Standard library only and free of package imports: the sandboxed child and the trusted checker
load this file by its path (they run with ``python -I``), the harness imports it as a module.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

MAX_DEPTH = 64
FRAME_HEADER = 4
# One call's arguments or result (HumanEval's are a few KB). Parsing is linear in it (~0.1 s
# for 1 MB on a loaded 2-core machine) and runs before the time budget can be checked: this
# bound is what keeps that part short.
MAX_FRAME_BYTES = 1 << 20
DECODE_BUDGET_S = 0.5  # the trusted checker's time to decode one reply, parsing included
MAX_SAME_HASH = 64  # distinct numbers / keys of one hash in one message (see _Decoder)

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


class _Values(list):
    """The distinct values of one hash (never a decoded value: those are hashable)."""


class _Decoder:
    """One message's decoding under a budget: nesting (:data:`MAX_DEPTH`), time (``deadline``,
    checked at every node) and hash flooding: at most :data:`MAX_SAME_HASH` distinct values of
    one hash among the message's numbers, dict keys and set members. Numbers (and tuples of
    them) hash alike by construction (``hash(n) == hash(n + 2**61 - 1)``), so 190k such dict
    keys make building the dict quadratic (minutes), and so would ``set()`` over such a list in
    the tests afterwards; strings and bytes hash with the process's random seed. Legitimate
    data never has 64 distinct numbers of one hash."""

    def __init__(self, deadline: float | None) -> None:
        self.deadline = deadline
        # hash -> its one value so far, or a _Values list of its distinct values
        self.by_hash: dict[int, Any] = {}

    def _tick(self) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise NotPlainData("decoding took longer than its time budget")

    def _distinct(self, value: Any) -> Any:
        """``value``, counted among the distinct values of its hash."""
        h = hash(value)
        seen = self.by_hash.setdefault(h, value)
        if seen is value or (type(seen) is not _Values and seen == value):
            return value
        same = seen if type(seen) is _Values else _Values([seen])
        if value not in same:  # at most MAX_SAME_HASH comparisons
            same.append(value)
            if len(same) > MAX_SAME_HASH:
                raise NotPlainData(
                    f"more than {MAX_SAME_HASH} distinct values share one hash (hash flooding)"
                )
        self.by_hash[h] = same
        return value

    def value(self, node: Any, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise NotPlainData(f"nested deeper than {MAX_DEPTH} levels")
        self._tick()
        if type(node) is not list or not node or type(node[0]) is not str:
            raise NotPlainData("malformed value")
        tag, rest = node[0], node[1:]
        if tag in ("n", "T", "F") and not rest:
            return {"n": None, "T": True, "F": False}[tag]
        if tag in ("i", "f", "c") and _strings(rest, 2 if tag == "c" else 1):
            if tag == "i":
                return self._distinct(int(rest[0], 16))
            if tag == "f":
                return self._distinct(float.fromhex(rest[0]))
            return self._distinct(complex(float.fromhex(rest[0]), float.fromhex(rest[1])))
        if tag == "s" and _strings(rest, 1):
            return rest[0]
        if tag == "b" and _strings(rest, 1):
            return bytes.fromhex(rest[0])
        if tag in ("l", "t") and len(rest) == 1 and type(rest[0]) is list:
            items = [self.value(v, depth + 1) for v in rest[0]]
            return items if tag == "l" else tuple(items)
        if tag in ("set", "fs") and len(rest) == 1 and type(rest[0]) is list:
            members = set()
            for v in rest[0]:  # one at a time: each insertion is cheap, the budget is checked
                members.add(self._distinct(self.value(v, depth + 1)))
            return members if tag == "set" else frozenset(members)
        if tag == "d" and len(rest) == 1 and type(rest[0]) is list:
            out = {}
            for pair in rest[0]:
                if type(pair) is not list or len(pair) != 2:
                    raise NotPlainData("malformed dict")
                key = self._distinct(self.value(pair[0], depth + 1))
                out[key] = self.value(pair[1], depth + 1)
            return out
        raise NotPlainData(f"malformed value (tag {tag[:20]!r})")


def from_wire(node: Any, depth: int = 0, deadline: float | None = None) -> Any:
    """The plain value of a tagged form; :class:`NotPlainData` for anything malformed, nested
    too deep, hash-flooded or (with a ``deadline``, ``time.monotonic()``) too slow to build."""
    try:
        return _Decoder(deadline).value(node, depth)
    except NotPlainData:
        raise
    except (TypeError, ValueError, OverflowError) as err:  # unhashable key, bad hex ...
        raise NotPlainData(f"malformed value ({err})") from err


def _strings(items: list, n: int) -> bool:
    return len(items) == n and all(type(s) is str for s in items)


def encode(value: object) -> bytes:
    """``value`` as bytes on the wire (UTF-8 JSON, ASCII only)."""
    return json.dumps(to_wire(value), separators=(",", ":")).encode("ascii")


def decode(data: bytes, budget_s: float | None = None) -> Any:
    """The plain value in ``data``; :class:`NotPlainData` when it is not a valid message.

    ``budget_s``: the seconds decoding may take, for messages from untrusted code (the
    caller bounds the size first: :data:`MAX_FRAME_BYTES`); parsing the JSON is linear in
    the size, building the values is checked as it goes (:class:`_Decoder`)."""
    deadline = None if budget_s is None else time.monotonic() + budget_s
    try:
        node = json.loads(data.decode("ascii"))
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise NotPlainData(f"not a valid message ({type(err).__name__})") from err
    return from_wire(node, deadline=deadline)


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
