"""Read-only SQL execution for execution accuracy (Spider): queries that cannot write, attach,
run past a time limit or return unbounded rows, and result comparison as Spider's plain
execution match does it (multiset of rows, or list when the gold query orders them)."""

from __future__ import annotations

import sqlite3
import time
import urllib.parse
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

_READ_ACTIONS = {
    sqlite3.SQLITE_SELECT,
    sqlite3.SQLITE_READ,
    sqlite3.SQLITE_FUNCTION,
    getattr(sqlite3, "SQLITE_RECURSIVE", 33),
}


class QueryRefused(Exception):
    """The query tried to do something other than read."""


def _authorizer(action: int, *_: Any) -> int:
    return sqlite3.SQLITE_OK if action in _READ_ACTIONS else sqlite3.SQLITE_DENY


def connect_readonly(db_path: str | Path) -> sqlite3.Connection:
    """A connection that cannot change the database file, nor attach or create another one."""
    uri = "file:" + urllib.parse.quote(str(Path(db_path).resolve())) + "?mode=ro"
    conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
    conn.execute("PRAGMA query_only = ON")
    conn.set_authorizer(_authorizer)
    return conn


def execute_readonly(
    db_path: str | Path, sql: str, timeout_s: float = 5.0, max_rows: int = 100_000
) -> list[tuple[Any, ...]]:
    """Rows of ``sql`` on ``db_path``; raises :class:`QueryRefused` for anything but one read-only
    statement, ``TimeoutError`` past ``timeout_s``, and ``sqlite3.Error`` for invalid SQL."""
    conn = connect_readonly(db_path)
    deadline = time.monotonic() + timeout_s
    conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 1000)
    try:
        try:
            cursor = conn.execute(sql)
        except sqlite3.ProgrammingError as e:  # several statements
            raise QueryRefused(f"refused: {e}") from e
        except sqlite3.DatabaseError as e:
            if "not authorized" in str(e):
                raise QueryRefused(f"refused (not a read-only query): {e}") from e
            raise
        rows = cursor.fetchmany(max_rows + 1)
        if len(rows) > max_rows:
            raise sqlite3.OperationalError(f"more than {max_rows} rows")
        return rows
    except sqlite3.OperationalError as e:
        if "interrupted" in str(e):
            raise TimeoutError(f"query ran past {timeout_s}s") from e
        raise
    finally:
        conn.close()


def _normalize(value: Any) -> Any:
    return round(value, 6) if isinstance(value, float) else value


def results_match(gold: Sequence[tuple], pred: Sequence[tuple], ordered: bool) -> bool:
    g = [tuple(_normalize(v) for v in row) for row in gold]
    p = [tuple(_normalize(v) for v in row) for row in pred]
    return g == p if ordered else Counter(g) == Counter(p)


def schema_ddl(db_path: Path) -> str:
    """The ``CREATE TABLE`` statements of a database, as stored in it."""
    conn = connect_readonly(db_path)
    try:
        rows = conn.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND sql IS NOT NULL "
            "AND name NOT LIKE 'sqlite_%' ORDER BY rowid"
        ).fetchall()
    finally:
        conn.close()
    return "\n\n".join(r[0].strip() + ";" for r in rows)
