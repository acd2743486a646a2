"""Spider: execution accuracy on a Spider-shaped fixture (two sqlite databases, a dozen
questions); gold scores 100%, wrong 0%, writes are refused and change nothing."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from pathlib import Path

import pytest

from mtad.tasks.samples import SampleOutput
from mtad.tasks.spider import SpiderTask, clean_prediction
from mtad.tasks.sqlite_readonly import QueryRefused, SqlExecutor, SqlLimits, execute_readonly

QUESTIONS = [
    ("concerts", "How many singers are there?", "SELECT count(*) FROM singer"),
    (
        "concerts",
        "List the names of singers older than 30.",
        "SELECT name FROM singer WHERE age > 30",
    ),
    (
        "concerts",
        "What are the names of all singers ordered by age, youngest first?",
        "SELECT name FROM singer ORDER BY age ASC",
    ),
    ("concerts", "What is the average age of singers?", "SELECT avg(age) FROM singer"),
    (
        "concerts",
        "How many concerts did each singer give? Show names and counts.",
        "SELECT s.name, count(*) FROM singer AS s JOIN concert AS c ON s.id = c.singer_id "
        "GROUP BY s.id",
    ),
    ("concerts", "Which countries do singers come from?", "SELECT DISTINCT country FROM singer"),
    ("school", "How many students are there?", "SELECT count(*) FROM student"),
    (
        "school",
        "List the names of students in the course called Algebra.",
        "SELECT st.name FROM student AS st JOIN enrolment AS e ON st.id = e.student_id "
        "JOIN course AS c ON c.id = e.course_id WHERE c.title = 'Algebra'",
    ),
    ("school", "What is the highest grade?", "SELECT max(grade) FROM enrolment"),
    (
        "school",
        "Which courses have no students?",
        "SELECT title FROM course WHERE id NOT IN (SELECT course_id FROM enrolment)",
    ),
    ("school", "Give the names of all students.", "SELECT name FROM student"),
    (
        "school",
        "How many students take each course? Show titles and counts.",
        "SELECT c.title, count(e.student_id) FROM course AS c LEFT JOIN enrolment AS e "
        "ON c.id = e.course_id GROUP BY c.id",
    ),
]


def _make_db(path: Path, script: str) -> None:
    path.parent.mkdir(parents=True)
    conn = sqlite3.connect(path)
    conn.executescript(script)
    conn.commit()
    conn.close()


@pytest.fixture
def spider_dir(tmp_path: Path) -> Path:
    _make_db(
        tmp_path / "database" / "concerts" / "concerts.sqlite",
        """
        CREATE TABLE singer (id INTEGER PRIMARY KEY, name TEXT, country TEXT, age INTEGER);
        CREATE TABLE concert (id INTEGER PRIMARY KEY, singer_id INTEGER REFERENCES singer(id),
                              year INTEGER);
        INSERT INTO singer VALUES (1, 'Ana', 'Spain', 28), (2, 'Bo', 'Sweden', 41),
                                  (3, 'Chen', 'China', 35), (4, 'Dee', 'Spain', 22);
        INSERT INTO concert VALUES (1, 1, 2019), (2, 1, 2020), (3, 2, 2021), (4, 3, 2021);
        """,
    )
    _make_db(
        tmp_path / "database" / "school" / "school.sqlite",
        """
        CREATE TABLE student (id INTEGER PRIMARY KEY, name TEXT);
        CREATE TABLE course (id INTEGER PRIMARY KEY, title TEXT);
        CREATE TABLE enrolment (student_id INTEGER, course_id INTEGER, grade REAL);
        INSERT INTO student VALUES (1, 'Eva'), (2, 'Finn'), (3, 'Gus');
        INSERT INTO course VALUES (1, 'Algebra'), (2, 'Biology'), (3, 'Chemistry');
        INSERT INTO enrolment VALUES (1, 1, 3.5), (2, 1, 2.5), (3, 2, 4.0);
        """,
    )
    dev = [{"db_id": db, "question": q, "query": sql} for db, q, sql in QUESTIONS]
    (tmp_path / "dev.json").write_text(json.dumps(dev))
    tables = [{"db_id": db, "table_names_original": []} for db in ("concerts", "school")]
    (tmp_path / "tables.json").write_text(json.dumps(tables))
    return tmp_path


def _continuation(sql: str) -> str:
    """What the model writes after the prompt's trailing ``SELECT``."""
    assert sql.upper().startswith("SELECT")
    return sql[len("SELECT") :] + ";\n\n-- next"


def _hashes(root: Path) -> dict[str, str]:
    return {
        str(p): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_samples_and_prompts(spider_dir: Path) -> None:
    task = SpiderTask(data_dir=str(spider_dir))
    samples = task.samples()
    assert len(samples) == len(QUESTIONS)
    s = samples[0]
    assert s.raw_prompt.startswith("CREATE TABLE singer")
    assert s.raw_prompt.endswith("-- How many singers are there?\nSELECT")
    assert s.assistant_prefix.endswith("SELECT") and ";" in s.stop
    assert s.reference == {
        "db_id": "concerts",
        "question": "How many singers are there?",
        "gold": "SELECT count(*) FROM singer",
    }


def test_gold_scores_100_and_wrong_scores_0(spider_dir: Path) -> None:
    task = SpiderTask(data_dir=str(spider_dir))
    samples = task.samples()
    gold = [SampleOutput.from_texts(s, [_continuation(s.reference["gold"])]) for s in samples]
    res = task.score(gold)
    assert res.metrics["execution_accuracy"] == 1.0 and res.metrics["spider_errors"] == 0

    # a different but equivalent query also counts (execution, not string, match)
    equivalent = SampleOutput.from_texts(samples[0], [" COUNT(id) FROM singer"])
    assert task.score([equivalent]).metrics["execution_accuracy"] == 1.0

    wrong_sql = [
        "SELECT count(*) FROM singer WHERE age > 30",  # wrong count
        "SELECT name FROM singer WHERE age < 30",  # wrong condition
        "SELECT name FROM singer ORDER BY age DESC",  # wrong order where order matters
        "SELECT nonexistent FROM singer",  # invalid
    ]
    wrong = [
        SampleOutput.from_texts(s, [_continuation(sql)])
        for s, sql in zip(samples[:4], wrong_sql, strict=True)
    ]
    res = task.score(wrong)
    assert res.metrics["execution_accuracy"] == 0.0
    assert res.records[3]["exec_error"].startswith("OperationalError")


def test_writes_are_refused_and_change_nothing(spider_dir: Path) -> None:
    db = spider_dir / "database" / "concerts" / "concerts.sqlite"
    before = _hashes(spider_dir)
    for sql in [
        "DELETE FROM singer",
        "UPDATE singer SET age = 0",
        "INSERT INTO singer VALUES (9, 'X', 'Y', 1)",
        "DROP TABLE singer",
        "CREATE TABLE t (x)",
        "ALTER TABLE singer ADD COLUMN y",
        f"ATTACH DATABASE '{spider_dir / 'new.sqlite'}' AS other",
        "PRAGMA writable_schema = 1",
        "SELECT 1; DELETE FROM singer",
    ]:
        with pytest.raises(QueryRefused):
            execute_readonly(db, sql)
    # a refused prediction scores 0 and says why
    task = SpiderTask(data_dir=str(spider_dir))
    out = SampleOutput.from_texts(task.samples()[0], [" 1; DROP TABLE singer"])
    res = task.score([out])
    assert res.metrics["execution_accuracy"] == 0.0
    assert res.records[0]["prediction"] == "SELECT 1; DROP TABLE singer"
    assert "refused" in res.records[0]["exec_error"]
    assert _hashes(spider_dir) == before
    assert execute_readonly(db, "SELECT count(*) FROM singer") == [(4,)]


def test_runaway_query_times_out(spider_dir: Path) -> None:
    db = spider_dir / "database" / "concerts" / "concerts.sqlite"
    with SqlExecutor(SqlLimits(timeout_s=0.5)) as executor:
        executor.execute(db, "SELECT 1")  # the worker's start is not the query's time
        start = time.perf_counter()
        with pytest.raises(TimeoutError):
            executor.execute(
                db,
                "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
                "SELECT count(*) FROM c",
            )
        assert time.perf_counter() - start < 3.0


def test_missing_data_is_a_clear_error(tmp_path: Path, spider_dir: Path) -> None:
    with pytest.raises(ValueError, match=r"task.data_dir: not set.*dev.json, tables.json"):
        SpiderTask().samples()
    with pytest.raises(FileNotFoundError, match=r"task.data_dir=.*missing dev.json, tables.json"):
        SpiderTask(data_dir=str(tmp_path / "nowhere")).samples()
    (spider_dir / "database" / "school" / "school.sqlite").unlink()
    with pytest.raises(FileNotFoundError, match="database 'school'"):
        SpiderTask(data_dir=str(spider_dir)).samples()


def test_clean_prediction() -> None:
    assert clean_prediction(" name\n  FROM singer;") == "SELECT name FROM singer"
