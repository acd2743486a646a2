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
reading and denies the functions that expose library pointers), in a worker process bounded in
time (``timeout_s``, then a wall-clock kill), memory, value and result size (rows: ``max_rows``;
bytes), see :mod:`mtad.tasks.sqlite_readonly`; a prediction is correct when its result rows
equal the gold ones as a multiset, or as a list when the gold query has ``ORDER BY``. This is
the plain execution match of the Spider evaluation, without the test-suite databases or its
column-permutation search.

Scoring never raises for one sample: whatever goes wrong with a sample (its query refused,
timed out, killed, too large, an error message SQLite wrote in bytes that are not UTF-8, even
an error of this code) makes it a failed record (``exec_match`` false) whose ``exec_error``
says why, and the run goes on. A gold query that fails is a data error: its sample is failed
with ``exec_error`` ``gold query fails: ...`` and counted in ``spider_gold_errors``, so it shows
in the metrics instead of stopping the run after its generations.

``protocol: authors`` runs Spider as the MTAD authors' code does (GitHub ZongyueQin/MTAD,
``src/evaluation.py`` and ``src/utils.py``): the prompt is their one-shot Llama-2-chat-style
example (:data:`AUTHORS_EXAMPLE`, the text of their ``spider_examples``), then ``Schema:`` with
every table in their "MySQL-like" field format built from ``tables.json``
(:func:`authors_schema`, after their ``creating_schema`` + ``find_fields_MYSQL_like``), the
question and ``SQL:``; raw text for every model (their code applies no chat template); the
first :data:`AUTHORS_N` dev questions unless ``limit`` says otherwise (``dataloader[:10]``); no
stop strings (they decode the whole budget); the prediction is the continuation up to its first
``;``. Alongside our execution accuracy the run reports theirs, ``execution_accuracy_authors``
(rows compared as a set of sorted stringified rows: their ``match``). Their
``execution_accuracy_references`` leaves questions whose gold query fails out of the
denominator; here such a question stays in it, failed, and ``spider_gold_errors`` counts it.
Not reproduced: their tokenizer call cuts every prompt to its first 512 tokens
(``max_length=512, truncation=True``), which on large schemas drops the question itself; we feed
the whole prompt.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mtad.tasks.base import Task, check_positive, check_protocol
from mtad.tasks.params import SpiderParams
from mtad.tasks.samples import Sample, SampleOutput, TaskResult
from mtad.tasks.sqlite_readonly import (
    QueryFailed,
    SqlExecutor,
    SqlLimits,
    results_match,
    schema_ddl,
)

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

# The authors' few-shot preamble, exactly as their prompt starts (ZongyueQin/MTAD src/utils.py,
# ``spider_examples``; the double spaces around ">" and the space after ";" are theirs).
AUTHORS_EXAMPLE = (
    "[INST] <<SYS>> You are a SQL expert. You need to write the correct SQL based on the user "
    "question and database schemas. Below are some examples <</SYS>>\n"
    "Example\n"
    "Schema:\n"
    "Table department, columns = [*,Department_ID,Name,Creation,Ranking,Budget_in_Billions,"
    "Num_Employees]\n"
    "Table head, columns = [*,head_ID,name,born_state,age]\n"
    "Table management, columns = [*,department_ID,head_ID,temporary_acting]\n"
    "Foreign_keys = [management.head_ID = head.head_ID,management.department_ID = "
    "department.Department_ID]\n"
    'Question: "How many heads of the departments are older than 56 ?"\n'
    "SQL: SELECT count(*) FROM head WHERE age  >  56; \n\n"
)
AUTHORS_TEMPLATE = "{example}Schema:\n{schema}\nQuestion: {question}\nSQL:"
AUTHORS_N = 10  # src/evaluation.py: ``dataloader = dataloader[:10]``


def authors_schema(db: dict[str, Any]) -> str:
    """One ``tables.json`` entry in the authors' "MySQL-like" format.

    One line per table, ``Table <name>, columns = [*,<col>,...]``, tables sorted by name (their
    pandas ``groupby`` sorts the keys), columns in ``tables.json`` order after ``*``, original
    (not normalised) names, no foreign keys (their schema lists them only in the example).
    """
    tables = list(db["table_names_original"])
    fields: dict[str, list[str]] = {t: [] for t in tables}
    for index, name in db["column_names_original"]:
        if index == -1:  # Spider's "*" column stands for every table
            for t in tables:
                fields[t].append(name)
        else:
            fields[tables[index]].append(name)
    return "".join(f"Table {t}, columns = [{','.join(fields[t])}]\n" for t in sorted(fields))


def authors_prompt(db: dict[str, Any], question: str) -> str:
    """The authors' Spider prompt for one question (see the module docstring)."""
    return AUTHORS_TEMPLATE.format(
        example=AUTHORS_EXAMPLE, schema=authors_schema(db), question=question
    )


def authors_prediction(text: str) -> str:
    """The authors' prediction: the continuation up to its first ``;``, stripped."""
    return text.split(";")[0].strip()


def authors_match(gold: Sequence[tuple], pred: Sequence[tuple]) -> bool:
    """The authors' result comparison: equal as sets of rows, each row's values stringified
    and sorted (so column order, row order and duplicates do not matter)."""

    def rows(result: Sequence[tuple]) -> set[tuple[str, ...]]:
        return {tuple(sorted(str(v) for v in row)) for row in result}

    return rows(gold) == rows(pred)


GOLD_FAILS = "gold query fails: "  # how a failed gold query's record starts its exec_error


class GoldFailed(Exception):  # noqa: N818 - a sample's outcome, not a bug
    """The sample's gold query failed (a data error, recorded on the sample)."""


def clean_prediction(text: str) -> str:
    """``SELECT`` + the model's continuation, on one line, without a trailing semicolon."""
    sql = "SELECT" + text
    return re.sub(r"\s+", " ", sql).strip().rstrip(";").strip()


class SpiderTask(Task):
    name = "spider"
    primary_metric = "execution_accuracy"
    score_record = "exec_match"

    def __init__(
        self,
        *,
        data_dir: str | None = SpiderParams.data_dir,
        split: str = SpiderParams.split,
        timeout_s: float = SpiderParams.timeout_s,
        max_rows: int = SpiderParams.max_rows,
        max_new_tokens: int = SpiderParams.max_new_tokens,
        protocol: str = SpiderParams.protocol,
        **common: Any,
    ) -> None:
        self.protocol = check_protocol(protocol)
        if protocol == "authors":  # raw text for every model, chat or not, as the authors do
            common["chat_template"] = False
            if common.get("limit") is None:
                common["limit"] = AUTHORS_N
        super().__init__(max_new_tokens=max_new_tokens, **common)
        self.data_dir = Path(data_dir).expanduser() if data_dir else None
        self.split = split
        check_positive(timeout_s=timeout_s, max_rows=max_rows)
        self.timeout_s = float(timeout_s)
        self.max_rows = int(max_rows)
        self.limits = SqlLimits(timeout_s=self.timeout_s, max_rows=self.max_rows)

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
        dbs = {t["db_id"]: t for t in json.loads((root / "tables.json").read_text())}
        known = set(dbs)
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
            if self.protocol == "authors":
                samples.append(
                    Sample(
                        id=f"{self.split}/{i}",
                        turns=[authors_prompt(dbs[db_id], entry["question"])],
                        stop=(),
                        max_new_tokens=self.max_new_tokens,
                        reference={"db_id": db_id, "question": question, "gold": entry["query"]},
                    )
                )
                continue
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

    def _execute(
        self, executor: SqlExecutor, db_id: str, gold: str, predicted: str
    ) -> tuple[bool, bool, str]:
        """(correct, correct by the authors' set comparison, error message)."""
        path = self.db_path(db_id)
        try:
            gold_rows = executor.execute(path, gold)
        except (QueryFailed, TimeoutError, sqlite3.Error) as e:  # data, not the model's error
            raise GoldFailed(f"{GOLD_FAILS}{type(e).__name__}: {e}") from e
        try:
            pred_rows = executor.execute(path, predicted)
        except (QueryFailed, TimeoutError, sqlite3.Error) as e:
            return False, False, f"{type(e).__name__}: {e}"
        ordered = re.search(r"\border\s+by\b", gold, re.IGNORECASE) is not None
        return results_match(gold_rows, pred_rows, ordered), authors_match(gold_rows, pred_rows), ""

    def score(self, outputs: Sequence[SampleOutput]) -> TaskResult:
        records = []
        gold_errors = 0
        with SqlExecutor(self.limits) as executor:
            for output in outputs:
                ref = output.sample.reference
                prediction = ""
                try:
                    if self.protocol == "authors":
                        prediction = authors_prediction(output.text)
                    else:
                        prediction = clean_prediction(output.text)
                    correct, authors_correct, error = self._execute(
                        executor, ref["db_id"], ref["gold"], prediction
                    )
                except GoldFailed as e:
                    correct, authors_correct, error = False, False, str(e)
                    gold_errors += 1
                except Exception as e:  # noqa: BLE001 - one sample's failure, recorded as such
                    # (e.g. MemoryError comparing results): never the run's, whose generations
                    # would go with it
                    correct, authors_correct, error = False, False, f"{type(e).__name__}: {e}"
                records.append(
                    {
                        **self.base_record(output),
                        "db_id": ref["db_id"],
                        "prediction": prediction,
                        "exec_match": correct,
                        "exec_match_authors": authors_correct,
                        "exec_error": error,
                    }
                )
        n = len(records)
        metrics: dict[str, Any] = {
            "execution_accuracy": sum(r["exec_match"] for r in records) / n if n else float("nan"),
            "spider_n": n,
            "spider_errors": sum(bool(r["exec_error"]) for r in records),
            "spider_gold_errors": gold_errors,
            "spider_protocol": self.protocol,
        }
        if self.protocol == "authors":  # a failed gold query counts as a miss (see above)
            metrics["execution_accuracy_authors"] = (
                sum(r["exec_match_authors"] for r in records) / n if n else float("nan")
            )
        return TaskResult(records, metrics)
