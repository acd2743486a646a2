"""Spider (Yu et al., 2018) text-to-SQL, scored by execution accuracy on the sqlite databases.

The data is not on any registry reachable here: ``task.data_dir`` points at a Spider checkout
holding ``<split>.json`` (e.g. ``dev.json``), ``tables.json`` and
``database/<db_id>/<db_id>.sqlite``.

Prompt (after Rajkumar et al., 2022, "Evaluating the Text-to-SQL Capabilities of Large Language
Models"): the database's ``CREATE TABLE`` statements, the question as an SQL comment, then
``SELECT`` for the model to continue. Chat models get the same content in a user message and a
reply pre-filled with an opened ``sql`` fence and ``SELECT``.

Execution accuracy: predicted and gold queries run on the database through a read-only
connection (``mode=ro`` URI, ``PRAGMA query_only``, and an authorizer that allows nothing but
reading), each under a time limit and a row cap; a prediction is correct when its result rows
equal the gold ones as a multiset, or as a list when the gold query has ``ORDER BY``. This is
the plain execution match of the Spider evaluation, without the test-suite databases or its
column-permutation search.
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
import urllib.parse
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mtad.tasks.base import Sample, SampleOutput, Task, TaskResult

STOP = (";", "\n\n", "```")
RAW_TEMPLATE = (
    "{schema}\n\n"
    "-- Using valid SQLite, answer the following question for the tables provided above.\n"
    "-- {question}\n"
    "SELECT"
)
CHAT_TEMPLATE = (
    "{schema}\n\nUsing valid SQLite, write one query over the tables above that answers this "
    "question: {question}\nReply with the SQL query only."
)
CHAT_PREFIX = "```sql\nSELECT"

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


def clean_prediction(text: str) -> str:
    """``SELECT`` + the model's continuation, on one line, without a trailing semicolon."""
    sql = "SELECT" + text
    return re.sub(r"\s+", " ", sql).strip().rstrip(";").strip()


class SpiderTask(Task):
    name = "spider"
    primary_metric = "execution_accuracy"

    def __init__(
        self,
        *,
        data_dir: str | None = None,
        split: str = "dev",
        timeout_s: float = 5.0,
        max_rows: int = 100_000,
        max_new_tokens: int = 128,
        **common: Any,
    ) -> None:
        super().__init__(max_new_tokens=max_new_tokens, **common)
        self.data_dir = Path(data_dir).expanduser() if data_dir else None
        self.split = split
        self.timeout_s = float(timeout_s)
        self.max_rows = int(max_rows)

    def _check_data_dir(self) -> Path:
        expected = f"{self.split}.json, tables.json and database/<db_id>/<db_id>.sqlite"
        if self.data_dir is None:
            raise ValueError(
                "task.data_dir: not set. Spider is not downloadable here; point task.data_dir at "
                f"a Spider checkout holding {expected} (https://yale-lily.github.io/spider)."
            )
        missing = [
            name
            for name in (f"{self.split}.json", "tables.json", "database")
            if not (self.data_dir / name).exists()
        ]
        if missing:
            raise FileNotFoundError(
                f"task.data_dir={self.data_dir}: missing {', '.join(missing)} "
                f"(a Spider checkout holds {expected})"
            )
        return self.data_dir

    def db_path(self, db_id: str) -> Path:
        return self._check_data_dir() / "database" / db_id / f"{db_id}.sqlite"

    def load_samples(self) -> list[Sample]:
        root = self._check_data_dir()
        entries = json.loads((root / f"{self.split}.json").read_text())
        known = {t["db_id"] for t in json.loads((root / "tables.json").read_text())}
        schemas: dict[str, str] = {}
        samples = []
        for i, entry in enumerate(entries):
            db_id = entry["db_id"]
            if db_id not in schemas:
                path = self.db_path(db_id)
                if db_id not in known or not path.is_file():
                    raise FileNotFoundError(
                        f"task.data_dir: database {db_id!r} (question {i} of {self.split}.json) "
                        f"is not in tables.json or has no file {path}"
                    )
                schemas[db_id] = schema_ddl(path)
            question = entry["question"].strip()
            samples.append(
                Sample(
                    id=f"{self.split}/{i}",
                    turns=[CHAT_TEMPLATE.format(schema=schemas[db_id], question=question)],
                    raw_prompt=RAW_TEMPLATE.format(schema=schemas[db_id], question=question),
                    assistant_prefix=CHAT_PREFIX,
                    stop=STOP,
                    max_new_tokens=self.max_new_tokens,
                    reference={"db_id": db_id, "question": question, "gold": entry["query"]},
                )
            )
        return samples

    def execution_match(self, db_id: str, gold: str, predicted: str) -> tuple[bool, str]:
        """(correct, error message) for one prediction."""
        path = self.db_path(db_id)
        try:
            gold_rows = execute_readonly(path, gold, self.timeout_s, self.max_rows)
        except Exception as e:  # a broken gold query is a data problem, not a model error
            raise RuntimeError(f"gold query fails on {db_id}: {gold!r}: {e}") from e
        try:
            pred_rows = execute_readonly(path, predicted, self.timeout_s, self.max_rows)
        except (QueryRefused, TimeoutError, sqlite3.Error) as e:
            return False, f"{type(e).__name__}: {e}"
        ordered = re.search(r"\border\s+by\b", gold, re.IGNORECASE) is not None
        return results_match(gold_rows, pred_rows, ordered), ""

    def score(self, outputs: Sequence[SampleOutput]) -> TaskResult:
        records = []
        for output in outputs:
            ref = output.sample.reference
            prediction = clean_prediction(output.text)
            correct, error = self.execution_match(ref["db_id"], ref["gold"], prediction)
            records.append(
                {
                    **self.base_record(output),
                    "db_id": ref["db_id"],
                    "prediction": prediction,
                    "exec_match": correct,
                    "exec_error": error,
                }
            )
        n = len(records)
        return TaskResult(
            records,
            {
                "execution_accuracy": sum(r["exec_match"] for r in records) / n
                if n
                else float("nan"),
                "spider_n": n,
                "spider_errors": sum(bool(r["exec_error"]) for r in records),
            },
        )
