"""The SQL worker process (private to :mod:`mtad.tasks.sqlite_readonly`).

Started as ``python -I -S -B _sqlite_child.py '<json spec>'``; it imports the standard library
only, sets its limits and says it is ready (a reply ``{"ok": true, "ready": true}``). Requests
arrive on stdin, one JSON line each (``db``, ``sql``, ``timeout_s``,
``max_rows``); each reply goes to stdout as an 8-byte big-endian length and a JSON body:
``{"ok": true, "rows": [...]}`` (a blob is ``{"b": "<base64>"}``) or ``{"ok": false, "kind":
..., "name": ..., "message": ...}``.

Why a process of its own: model-written SQL can spend seconds and gigabytes inside one VM step
(a blob builder, ``instr`` over megabyte strings), where SQLite's progress handler never runs.
Here the kernel bounds it (``RLIMIT_AS``, ``RLIMIT_CPU`` re-armed before every query, no file
growth), SQLite bounds itself (``SQLITE_LIMIT_LENGTH``, ``hard_heap_limit``), and the parent
kills this process past its wall-clock deadline. Whatever happens to a query, the parent gets
a reply of bounded size or sees this process end; it never sees an exception.

Kinds: ``refused`` (anything but reading, several statements, a denied function), ``timeout``
(the progress handler's deadline), ``memory`` (SQLite's heap limit or Python's ``MemoryError``),
``too_large`` (rows or encoded bytes past the limits), ``sql`` (SQLite's own error; ``name`` is
the ``sqlite3`` exception class; a message that is not UTF-8 is decoded with replacement and
says so), ``error`` (anything else, by type name).
"""

from __future__ import annotations

import base64
import json
import math
import resource
import signal
import sqlite3
import sys
import time
import urllib.parse
from typing import Any


class Failed(Exception):  # noqa: N818 - a reply, not a bug
    def __init__(self, kind: str, message: str, name: str = "") -> None:
        super().__init__(message)
        self.kind, self.name = kind, name


class Worker:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.allowed = set(spec["allowed_actions"])
        self.function_action = int(spec["function_action"])
        self.denied = {str(f).lower() for f in spec["denied_functions"]}
        self.denied_name = ""  # the function the authorizer refused in the current query

    def authorize(self, action: int, arg1: Any, arg2: Any, *_: Any) -> int:
        if action not in self.allowed:
            return sqlite3.SQLITE_DENY
        # SQLITE_FUNCTION: arg2 is the function's name
        if action == self.function_action and str(arg2).lower() in self.denied:
            self.denied_name = str(arg2)
            return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK

    def connect(self, db: str, deadline: float) -> sqlite3.Connection:
        uri = "file:" + urllib.parse.quote(db) + "?mode=ro"
        conn = sqlite3.connect(uri, uri=True, isolation_level=None)
        for name, value in self.spec["sqlite_limits"].items():
            conn.setlimit(getattr(sqlite3, name), int(value))
        conn.execute("PRAGMA query_only = ON")
        # sorts and temporary b-trees in the heap, where hard_heap_limit and RLIMIT_AS see them
        conn.execute("PRAGMA temp_store = MEMORY")
        conn.execute("PRAGMA trusted_schema = OFF")
        conn.set_authorizer(self.authorize)
        conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 1000)
        return conn

    def run(self, request: dict[str, Any]) -> dict[str, Any]:
        timeout_s = float(request["timeout_s"])
        used = sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
        # This query's CPU seconds (its time plus the parent's grace, rounded up to the
        # kernel's whole seconds) on top of what the process used so far; SIGXCPU past them.
        # The parent's wall-clock kill comes first; this bounds a worker whose parent is gone.
        cpu = math.ceil(used + timeout_s + float(self.spec["kill_grace_s"]))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, resource.RLIM_INFINITY))
        self.denied_name = ""
        deadline = time.monotonic() + timeout_s
        conn = self.connect(str(request["db"]), deadline)
        try:
            return {"ok": True, "rows": self.fetch(conn, str(request["sql"]), request)}
        finally:
            conn.close()

    def fetch(self, conn: sqlite3.Connection, sql: str, request: dict[str, Any]) -> bytes:
        """The rows, JSON-encoded. The byte budget is checked row by row on a lower bound of
        the encoding (so a few huge values stop the query before they pile up), then exactly
        on the encoding itself."""
        max_rows, max_bytes = int(request["max_rows"]), int(self.spec["result_bytes"])
        too_large = f"result too large: more than {max_bytes} bytes"
        rows: list[list[Any]] = []
        size = 0
        for row in conn.execute(sql):
            if len(rows) == max_rows:
                raise Failed("too_large", f"result too large: more than {max_rows} rows")
            plain = [_plain(v) for v in row]
            size += sum(_size(v) for v in plain) + 2
            if size > max_bytes:
                raise Failed("too_large", too_large)
            rows.append(plain)
        data = json.dumps(rows, ensure_ascii=False).encode()
        if len(data) > max_bytes:
            raise Failed("too_large", too_large)
        return data


def _plain(value: Any) -> Any:
    return {"b": base64.b64encode(value).decode()} if isinstance(value, bytes) else value


def _size(value: Any) -> int:
    """At most the length of ``value``'s JSON encoding."""
    if isinstance(value, str):
        return len(value) + 2
    if isinstance(value, dict):
        return len(value["b"]) + 9
    return 1


def _failure(worker: Worker, err: BaseException) -> dict[str, Any]:
    if isinstance(err, Failed):
        return {"ok": False, "kind": err.kind, "name": err.name, "message": str(err)}
    if isinstance(err, MemoryError):
        return {"ok": False, "kind": "memory", "name": "MemoryError", "message": "out of memory"}
    if isinstance(err, UnicodeDecodeError) and isinstance(err.object, bytes):
        # pysqlite decodes SQLite's message as UTF-8; model SQL can put any bytes in it
        text = err.object.decode("utf-8", "replace")
        message = f"error message is not UTF-8: {text}"
        return {"ok": False, "kind": "sql", "name": "OperationalError", "message": message}
    message = str(err)
    if isinstance(err, sqlite3.ProgrammingError):  # several statements
        return {"ok": False, "kind": "refused", "name": "", "message": f"refused: {message}"}
    if isinstance(err, sqlite3.Error):
        if worker.denied_name:
            denied = f"refused: denied function {worker.denied_name}"
            return {"ok": False, "kind": "refused", "name": "", "message": denied}
        if "not authorized" in message:
            refused = f"refused (not a read-only query): {message}"
            return {"ok": False, "kind": "refused", "name": "", "message": refused}
        if "interrupted" in message:
            return {"ok": False, "kind": "timeout", "name": "", "message": message}
        return {"ok": False, "kind": "sql", "name": type(err).__name__, "message": message}
    return {"ok": False, "kind": "error", "name": type(err).__name__, "message": message}


def _reply(out: Any, body: dict[str, Any]) -> None:
    rows = body.pop("rows", None)
    head = json.dumps(body).encode()
    # the rows are encoded already: splice them in rather than encoding them twice
    data = head[:-1] + b', "rows": ' + rows + b"}" if rows is not None else head
    out.write(len(data).to_bytes(8, "big") + data)
    out.flush()


def main() -> None:
    spec = json.loads(sys.argv[1])
    memory = int(spec["memory_bytes"])
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # read-only: SQLite has nothing to write; a write attempt fails (EFBIG) instead of growing
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    probe = sqlite3.connect(":memory:")
    probe.execute(f"PRAGMA hard_heap_limit = {int(spec['heap_bytes'])}")  # process-wide
    probe.close()
    worker = Worker(spec)
    out = sys.stdout.buffer
    _reply(out, {"ok": True, "ready": True})  # the parent's query clocks start from here
    for line in sys.stdin.buffer:
        try:
            body = worker.run(json.loads(line))
        except BaseException as err:  # noqa: BLE001 - every failure is a reply
            if isinstance(err, (KeyboardInterrupt, SystemExit)):
                raise
            body = _failure(worker, err)
        try:
            _reply(out, body)
        except MemoryError:
            _reply(out, _failure(worker, MemoryError()))


if __name__ == "__main__":
    main()
