"""Read-only SQL execution for execution accuracy (Spider): queries that cannot write, attach,
run past a time limit, nor build or return more than a bounded number of bytes, and result
comparison as Spider's plain execution match does it (multiset of rows, or list when the gold
query orders them).

Queries run in a worker process (:mod:`mtad.tasks._sqlite_child`), never in the harness: one
VM step of SQLite can take seconds and gigabytes (``zeroblob``, ``printf`` widths, ``replace``
chains, ``instr`` over megabyte strings), which the progress handler, counting VM steps, never
sees. So every limit below is enforced where the query runs: the kernel's (``RLIMIT_AS``,
``RLIMIT_CPU``, no file growth), SQLite's (``SQLITE_LIMIT_LENGTH`` for every string and blob,
``hard_heap_limit``), the progress handler's deadline, and the parent's wall-clock kill. The
worker's reply is bounded in bytes; one worker serves a whole :class:`SqlExecutor` and is
restarted after it is killed. Functions that hand SQL a pointer into the library
(``fts3_tokenizer``: reading it leaks an address, writing it installs a tokenizer the library
will call) are denied by the authorizer.

Failures are exceptions of their own (:class:`QueryFailed` and its subclasses),
``TimeoutError``, or ``sqlite3.Error`` subclasses carrying SQLite's message (as text even when
SQLite's bytes are not UTF-8); nothing a query does raises anything else here.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import select
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

_CHILD = Path(__file__).resolve().with_name("_sqlite_child.py")

_READ_ACTIONS = {
    sqlite3.SQLITE_SELECT,
    sqlite3.SQLITE_READ,
    sqlite3.SQLITE_FUNCTION,
    getattr(sqlite3, "SQLITE_RECURSIVE", 33),
}
# SQL functions the authorizer refuses. fts3_tokenizer(name) returns the address of a
# tokenizer module and fts3_tokenizer(name, blob) installs one from an address (code the
# library then calls); fts5(ptr) is the C API's handle to the fts5 module, never meant for SQL;
# load_extension loads a shared library (off by default; denied in case a build enables it).
DENIED_FUNCTIONS = ("fts3_tokenizer", "fts5", "load_extension")

FRAME_HEADER = 8  # the worker's reply: an 8-byte big-endian length, then the JSON body
ERROR_SLACK = 64 << 10  # room in a reply beyond its rows (a failure's message)


@dataclass(frozen=True)
class SqlLimits:
    """Every bound on one query, in one place. ``timeout_s`` and ``max_rows`` are the task's
    (``task.timeout_s``, ``task.max_rows``); the others are fixed here, generous for Spider's
    databases (values of a few KB, results of at most thousands of short rows)."""

    timeout_s: float = 5.0  # the progress handler's deadline
    max_rows: int = 100_000
    kill_grace_s: float = 2.0  # past timeout_s: the parent kills the worker; CPU limit too
    start_s: float = 60.0  # for a worker to start (not a query's time; seconds on a busy host)
    memory_bytes: int = 1 << 30  # the worker's RLIMIT_AS
    heap_bytes: int = 512 << 20  # SQLite's hard_heap_limit, below RLIMIT_AS: a clean error
    value_bytes: int = 4 << 20  # SQLITE_LIMIT_LENGTH: the largest string or blob built or read
    sql_bytes: int = 1 << 20  # SQLITE_LIMIT_SQL_LENGTH
    result_bytes: int = 16 << 20  # a result's JSON encoding (blobs in base64)

    def worker_spec(self) -> dict[str, Any]:
        return {
            "memory_bytes": self.memory_bytes,
            "heap_bytes": self.heap_bytes,
            "result_bytes": self.result_bytes,
            "kill_grace_s": self.kill_grace_s,
            "sqlite_limits": {
                "SQLITE_LIMIT_LENGTH": self.value_bytes,
                "SQLITE_LIMIT_SQL_LENGTH": self.sql_bytes,
                "SQLITE_LIMIT_ATTACHED": 0,
                "SQLITE_LIMIT_WORKER_THREADS": 0,
            },
            "allowed_actions": sorted(_READ_ACTIONS),
            "function_action": sqlite3.SQLITE_FUNCTION,
            "denied_functions": list(DENIED_FUNCTIONS),
        }


class QueryFailed(Exception):
    """The query did not produce a result, for a reason other than SQLite's own error."""


class QueryRefused(QueryFailed):
    """The query tried to do something other than read (or called a denied function)."""


class ResultTooLarge(QueryFailed):
    """The result has more rows or bytes than the limits allow."""


class QueryOutOfMemory(QueryFailed):
    """The query needed more memory than the worker's limits."""


class WorkerDied(QueryFailed):
    """The worker process ended while running the query (a crash, a kernel limit)."""


_KINDS: dict[str, type[Exception]] = {
    "refused": QueryRefused,
    "timeout": TimeoutError,
    "memory": QueryOutOfMemory,
    "too_large": ResultTooLarge,
    "error": QueryFailed,
}


def _authorizer(action: int, arg1: Any, arg2: Any, *_: Any) -> int:
    if action not in _READ_ACTIONS:
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_FUNCTION and str(arg2).lower() in DENIED_FUNCTIONS:
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


def connect_readonly(db_path: str | Path) -> sqlite3.Connection:
    """An in-process connection that cannot change the database file, nor attach or create
    another one: for trusted statements only (the schema); model SQL goes to
    :class:`SqlExecutor`."""
    uri = "file:" + urllib.parse.quote(str(Path(db_path).resolve())) + "?mode=ro"
    conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
    conn.execute("PRAGMA query_only = ON")
    conn.set_authorizer(_authorizer)
    return conn


class SqlExecutor:
    """Runs queries in one worker process under :class:`SqlLimits`; a worker that is killed
    (wall clock) or dies is replaced at the next query. Use as a context manager, or call
    :meth:`close`: the worker is reaped before it returns."""

    def __init__(self, limits: SqlLimits | None = None) -> None:
        self.limits = limits or SqlLimits()
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None
        self.starts = 0  # workers started (one, unless some were killed)
        self._last_words = ""  # the end of a killed worker's stderr

    def __enter__(self) -> SqlExecutor:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _start(self) -> subprocess.Popen[bytes]:
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the worker
        self._proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-B", str(_CHILD), json.dumps(self.limits.worker_spec())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            cwd=tempfile.gettempdir(),
            env={},
            start_new_session=True,  # a kill reaches the worker only, never the harness
        )
        self.starts += 1
        assert self._proc.stdout is not None
        try:  # a worker's start is not its first query's time: wait for it apart
            ready = json.loads(
                self._read_reply(self._proc.stdout.fileno(), time.monotonic() + self.limits.start_s)
            )
        except (_Killed, ValueError):
            ready = {}
        if not ready.get("ready"):
            code = self._kill()
            raise WorkerDied(f"the SQL worker did not start ({_ended(code)}){self._last_words}")
        return self._proc

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            with contextlib.suppress(OSError):
                assert proc.stdin is not None
                proc.stdin.close()  # the worker's loop ends at end of input
            try:
                proc.wait(timeout=self.limits.kill_grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def _kill(self) -> int:
        """Kill the worker, reap it, and return its exit status."""
        proc = self._proc
        assert proc is not None
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        code = proc.wait()
        self._last_words = self._stderr_tail()  # before close() drops the file
        self.close()
        return code

    def execute(
        self,
        db_path: str | Path,
        sql: str,
        timeout_s: float | None = None,
        max_rows: int | None = None,
    ) -> list[tuple[Any, ...]]:
        """Rows of ``sql`` on ``db_path``. Raises :class:`QueryRefused` for anything but one
        read-only statement, ``TimeoutError`` past ``timeout_s`` (the limits' unless given),
        :class:`ResultTooLarge`, :class:`QueryOutOfMemory`, :class:`WorkerDied`, and the
        ``sqlite3.Error`` subclass SQLite's error maps to (e.g. invalid SQL)."""
        timeout = self.limits.timeout_s if timeout_s is None else float(timeout_s)
        rows_cap = self.limits.max_rows if max_rows is None else int(max_rows)
        request = {
            "db": str(Path(db_path).resolve()),
            "sql": sql,
            "timeout_s": timeout,
            "max_rows": rows_cap,
        }
        proc = self._proc if self._proc is not None and self._proc.poll() is None else None
        if proc is None:
            self.close()  # a worker that died between queries
            proc = self._start()
        deadline = time.monotonic() + timeout + self.limits.kill_grace_s
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(json.dumps(request).encode() + b"\n")
            proc.stdin.flush()
            body = self._read_reply(proc.stdout.fileno(), deadline)
        except _Killed as killed:
            code = self._kill()
            if killed.reason == "timeout":
                raise TimeoutError(f"query ran past {timeout:g}s (worker killed)") from None
            if killed.reason == "too_large":
                raise ResultTooLarge(f"result too large: more than {killed.detail}") from None
            raise self._died(code) from None
        except BrokenPipeError:
            raise self._died(self._kill()) from None
        try:
            return _decode(body, timeout)
        except (ValueError, KeyError, TypeError) as err:  # not from our worker
            raise QueryFailed(f"malformed reply from the SQL worker: {err}") from err

    def _died(self, code: int) -> QueryFailed | TimeoutError:
        if code == -signal.SIGXCPU:
            return TimeoutError("query ran past its CPU time limit (worker killed)")
        return WorkerDied(f"the SQL worker ended ({_ended(code)}){self._last_words}")

    def _stderr_tail(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0, os.SEEK_END)
        self._stderr.seek(max(0, self._stderr.tell() - 300))
        lines = self._stderr.read().decode("utf-8", "replace").strip().splitlines()
        return f": {lines[-1]}" if lines else ""

    def _read_reply(self, fd: int, deadline: float) -> bytes:
        head = _read_exact(fd, FRAME_HEADER, deadline)
        size = int.from_bytes(head, "big")
        cap = self.limits.result_bytes + ERROR_SLACK
        if size > cap:  # the worker checks this itself; the parent never trusts it to
            raise _Killed("too_large", f"{cap} bytes")
        return _read_exact(fd, size, deadline)


def _ended(code: int) -> str:
    if code >= 0:
        return f"exit status {code}"
    try:
        return f"signal {signal.Signals(-code).name}"
    except ValueError:  # a real-time signal has no name
        return f"signal {-code}"


class _Killed(Exception):  # noqa: N818 - internal signal from the reader
    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason)
        self.reason, self.detail = reason, detail


def _read_exact(fd: int, n: int, deadline: float) -> bytes:
    """``n`` bytes from the pipe ``fd`` by ``deadline`` (else ``_Killed("timeout")``); the
    worker's end of output first is ``_Killed("died")``."""
    parts: list[bytes] = []
    got = 0
    while got < n:
        # what has arrived is read even past the deadline (the parent may have been slow)
        left = max(0.0, deadline - time.monotonic())
        if not select.select([fd], [], [], left)[0]:
            raise _Killed("timeout")
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            raise _Killed("died")
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def _value(v: Any) -> Any:
    return base64.b64decode(v["b"]) if isinstance(v, dict) else v


def _decode(body: bytes, timeout_s: float) -> list[tuple[Any, ...]]:
    reply = json.loads(body)
    if reply.get("ok"):
        return [tuple(_value(v) for v in row) for row in reply["rows"]]
    kind, name, message = reply.get("kind"), reply.get("name") or "", str(reply.get("message"))
    if kind == "timeout":
        raise TimeoutError(f"query ran past {timeout_s:g}s")
    if kind == "sql":
        error = getattr(sqlite3, name, None)
        cls = error if isinstance(error, type) and issubclass(error, sqlite3.Error) else None
        raise (cls or sqlite3.Error)(message)
    if kind == "error":
        raise QueryFailed(f"{name}: {message}")
    raise _KINDS.get(str(kind), QueryFailed)(message)


def execute_readonly(
    db_path: str | Path, sql: str, timeout_s: float = 5.0, max_rows: int = 100_000
) -> list[tuple[Any, ...]]:
    """One query in a worker of its own (see :meth:`SqlExecutor.execute`); many queries share
    one :class:`SqlExecutor` instead (a worker start costs tens of milliseconds)."""
    with SqlExecutor(SqlLimits(timeout_s=timeout_s, max_rows=max_rows)) as executor:
        return executor.execute(db_path, sql)


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
