"""Rows of JSON-lines data files, checked as they are read: every problem names the key the user
set, the file and the line (``task.files: data.jsonl line 3: prompt must be a non-empty string,
got null``), so a bad row stops the run before any model loads instead of as a traceback after
generation.

Each line is decoded as UTF-8 on its own, so a stray Latin-1 byte names its line too; ``.gz``
files are read through gzip.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def shown(value: Any) -> str:
    """``value`` as it is written in the file (``null``, ``-3``, ``"x"``)."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class RowError(ValueError):
    """A bad row or file, on one line: ``KEY: FILE line N: FIELD must be ...`` or
    ``KEY: FILE line N is not ...`` (a problem that starts with a verb follows without a colon)."""

    def __init__(self, key: str, path: Path, line: int | None, problem: str) -> None:
        where = f"{path} line {line}" if line is not None else str(path)
        joint = " " if problem.startswith(("is ", "does ", "cannot ")) else ": "
        super().__init__(f"{key}: {where}{joint}{problem}")


def rows(path: Path, key: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) of every non-blank line of ``path`` (``.gz``: gzip-compressed).
    Raises :class:`RowError` (``key`` is the config key that named the file) for a missing or
    unreadable file, a line that is not UTF-8 text, not JSON, or not a JSON object."""
    if not path.is_file():
        raise RowError(key, path, None, "does not exist")
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            for n, raw in enumerate(f, 1):
                row = _parse(raw, key, path, n)
                if row is not None:
                    yield n, row
    except (OSError, EOFError, zlib.error) as err:  # unreadable, or not gzip data
        raise RowError(key, path, None, f"cannot be read as JSON lines ({err})") from None


def _parse(raw: bytes, key: str, path: Path, n: int) -> dict[str, Any] | None:
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        byte = raw[err.start]
        raise RowError(
            key, path, n, f"is not UTF-8 text (byte 0x{byte:02x} at column {err.start + 1})"
        ) from None
    if not line.strip():
        return None
    try:
        row = json.loads(line)
    except json.JSONDecodeError as err:
        raise RowError(
            key, path, n, f"is not valid JSON ({err.msg} at column {err.colno})"
        ) from None
    if not isinstance(row, dict):
        raise RowError(key, path, n, f"is not a JSON object (got {shown(row)})")
    return row


def text(row: dict[str, Any], field: str, where: tuple[str, Path, int]) -> str:
    """``row[field]``, a non-empty string."""
    value = row.get(field)
    if type(value) is not str or not value.strip():
        raise RowError(*where, f"{field} must be a non-empty string, got {shown(value)}")
    return value


def optional_text(row: dict[str, Any], field: str, where: tuple[str, Path, int]) -> str | None:
    value = row.get(field)
    if value is not None and type(value) is not str:
        raise RowError(*where, f"{field} must be a string or null, got {shown(value)}")
    return value


def positive_int(row: dict[str, Any], field: str, where: tuple[str, Path, int]) -> int | None:
    """``row[field]`` when present: an integer >= 1 (not a bool, not 5.0)."""
    if field not in row:
        return None
    value = row[field]
    if type(value) is not int or value < 1:
        raise RowError(*where, f"{field} must be an integer >= 1, got {shown(value)}")
    return value


def identifier(row: dict[str, Any], field: str, where: tuple[str, Path, int]) -> str | None:
    """``row[field]`` when present: a string or an integer, as a string."""
    if field not in row:
        return None
    value = row[field]
    if type(value) not in (str, int) or value == "":
        raise RowError(*where, f"{field} must be a string or an integer, got {shown(value)}")
    return str(value)
