"""Spider scoring against hostile model SQL (issue 38, item 1): queries that crash the scorer
(an error message that is not UTF-8, a result of huge blobs), single operations that run past
the time budget or build giant values, results huge in bytes, a pointer-exposing function; and
a harness run whose generations hold such queries, or whose scoring fails, loses no
generation. The databases are built here; the queries are this file's own."""

from __future__ import annotations

import dataclasses
import json
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from mtad.tasks import spider as spider_module
from mtad.tasks.samples import SampleOutput
from mtad.tasks.spider import SpiderTask
from mtad.tasks.sqlite_readonly import (
    _CHILD,
    QueryOutOfMemory,
    QueryRefused,
    ResultTooLarge,
    SqlExecutor,
    SqlLimits,
    WorkerDied,
    connect_readonly,
    execute_readonly,
)

REPO = Path(__file__).resolve().parents[1]

# One operation of SQLite, so the progress handler never runs inside it: instr() compares a
# 1.5 M-character needle at each of 1.5 M offsets of a 3 M-character haystack (about 2e12 byte
# comparisons, minutes), every value within the default value limit.
SLOW = (
    "SELECT instr(h, n) FROM (SELECT replace(hex(zeroblob(1500000)), '0', 'a') AS h, "
    "replace(hex(zeroblob(750000)), '0', 'a') || 'b' AS n)"
)
NOT_UTF8 = "SELECT json_extract('{}', CAST(x'ff' AS TEXT))"  # SQLite quotes the bad path back
POINTER = "SELECT hex(fts3_tokenizer('simple'))"  # the address of the simple tokenizer
BIG_BLOBS = "SELECT zeroblob(3000000) FROM singer AS a, singer AS b"  # 16 rows of 3 MB

QUESTIONS = [
    ("How many singers are there?", "SELECT count(*) FROM singer"),
    ("List the singers' names.", "SELECT name FROM singer"),
    ("How old is the oldest singer?", "SELECT max(age) FROM singer"),
    ("Which countries do singers come from?", "SELECT DISTINCT country FROM singer"),
    ("List singers older than 30.", "SELECT name FROM singer WHERE age > 30"),
    ("What is the youngest age?", "SELECT min(age) FROM singer"),
]


@pytest.fixture
def spider_dir(tmp_path: Path) -> Path:
    db = tmp_path / "database" / "concerts" / "concerts.sqlite"
    db.parent.mkdir(parents=True)
    conn = sqlite3.connect(db)
    conn.executescript(
        """
        CREATE TABLE singer (id INTEGER PRIMARY KEY, name TEXT, country TEXT, age INTEGER);
        INSERT INTO singer VALUES (1, 'Ana', 'Spain', 28), (2, 'Bo', 'Sweden', 41),
                                  (3, 'Chen', 'China', 35), (4, 'Dee', 'Spain', 22);
        """
    )
    conn.commit()
    conn.close()
    dev = [{"db_id": "concerts", "question": q, "query": sql} for q, sql in QUESTIONS]
    (tmp_path / "dev.json").write_text(json.dumps(dev))
    (tmp_path / "tables.json").write_text(
        json.dumps([{"db_id": "concerts", "table_names_original": ["singer"]}])
    )
    return tmp_path


@pytest.fixture
def db(spider_dir: Path) -> Path:
    return spider_dir / "database" / "concerts" / "concerts.sqlite"


def _continuation(sql: str) -> str:
    """The model's text after the prompt's trailing ``SELECT``."""
    assert sql.startswith("SELECT")
    return sql[len("SELECT") :] + ";"


# ------------------------------------------------------------------------------------------
# crashing queries


def test_an_error_message_that_is_not_utf8_is_an_sql_error(db: Path) -> None:
    with pytest.raises(sqlite3.OperationalError, match="not UTF-8: JSON path error near '\ufffd'"):
        execute_readonly(db, NOT_UTF8)


def test_one_failing_sample_is_its_record_never_an_exception_out_of_score(
    spider_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = SpiderTask(data_dir=str(spider_dir))
    samples = task.samples()
    outs = [
        SampleOutput.from_texts(samples[0], [_continuation(NOT_UTF8)]),
        SampleOutput.from_texts(samples[1], [_continuation(QUESTIONS[1][1])]),
        SampleOutput.from_texts(samples[2], [_continuation(QUESTIONS[2][1])]),
    ]
    real_match = spider_module.results_match

    def match(gold: Any, pred: Any, ordered: bool) -> bool:
        if gold == [(41,)]:  # sample 2's result: comparing it runs out of memory
            raise MemoryError
        return real_match(gold, pred, ordered)

    monkeypatch.setattr(spider_module, "results_match", match)
    res = task.score(outs)
    errors = [r["exec_error"] for r in res.records]
    assert errors[0].startswith("OperationalError: error message is not UTF-8")
    assert errors[1] == "" and res.records[1]["exec_match"]
    assert errors[2].startswith("MemoryError") and not res.records[2]["exec_match"]
    assert res.metrics["execution_accuracy"] == pytest.approx(1 / 3)
    assert res.metrics["spider_errors"] == 2


def test_a_failing_gold_query_fails_its_sample_and_is_counted(spider_dir: Path) -> None:
    dev = json.loads((spider_dir / "dev.json").read_text())
    dev[0]["query"] = "SELECT nonexistent FROM singer"
    (spider_dir / "dev.json").write_text(json.dumps(dev))
    task = SpiderTask(data_dir=str(spider_dir), limit=2)
    outs = [
        SampleOutput.from_texts(s, [_continuation(sql)])
        for s, (_, sql) in zip(task.samples(), QUESTIONS, strict=False)
    ]
    res = task.score(outs)
    assert res.records[0]["exec_error"].startswith("gold query fails: OperationalError")
    assert res.records[1]["exec_match"]
    assert res.metrics["spider_gold_errors"] == 1 and res.metrics["execution_accuracy"] == 0.5


# ------------------------------------------------------------------------------------------
# the time budget: single expensive operations


def test_a_single_expensive_operation_is_killed_at_the_wall_clock(db: Path) -> None:
    limits = SqlLimits(timeout_s=0.5, kill_grace_s=0.5)
    with SqlExecutor(limits) as executor:
        start = time.monotonic()
        with pytest.raises(TimeoutError, match="worker killed"):
            executor.execute(db, SLOW)
        # the kill comes at 1 s; the rest is slack for a loaded machine (unbounded: minutes)
        assert time.monotonic() - start < limits.timeout_s + limits.kill_grace_s + 10
        assert executor.execute(db, "SELECT count(*) FROM singer") == [(4,)]
        assert executor.starts == 2  # the killed worker was replaced


def test_an_orphaned_worker_is_stopped_by_its_cpu_limit(db: Path) -> None:
    """Without the parent's kill (a parent that died or hangs), RLIMIT_CPU ends the worker."""
    spec = SqlLimits(timeout_s=0.1, kill_grace_s=0.1).worker_spec()
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", "-B", str(_CHILD), json.dumps(spec)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
    )
    request = {"db": str(db), "sql": SLOW, "timeout_s": 0.1, "max_rows": 10}
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(request).encode() + b"\n")
    proc.stdin.flush()
    try:
        code = proc.wait(timeout=120)  # a few CPU seconds, however slowly a busy host gives them
    finally:
        proc.kill()
        proc.wait()
    assert code == -signal.SIGXCPU


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT length(zeroblob(1000000000))",
        "SELECT length(randomblob(1000000000))",
        "SELECT length(replace(hex(zeroblob(3000000)), '0', '0123456789'))",
        "SELECT length(printf('%.*c', 1000000000, 'x'))",
        "SELECT length(group_concat(hex(zeroblob(1000000)))) FROM singer AS a, singer AS b",
    ],
)
def test_blob_builders_cannot_build_past_the_value_limit(db: Path, sql: str) -> None:
    """Each one builds no value past the limit, and fails or answers within the time budget
    (printf loops over its width after giving up on the value: killed on time)."""
    limits = SqlLimits(timeout_s=1, kill_grace_s=1)
    start = time.monotonic()
    try:
        with SqlExecutor(limits) as executor:
            ((length,),) = executor.execute(db, sql)
    except sqlite3.DataError as err:
        assert "too big" in str(err)
    except TimeoutError as err:
        assert "worker killed" in str(err)
    else:
        assert length is None or length <= limits.value_bytes  # printf may answer NULL
    # the kill comes at 2 s, the rest is slack for a loaded host (unbounded: many seconds and
    # gigabytes)
    assert time.monotonic() - start < limits.timeout_s + limits.kill_grace_s + 10


# ------------------------------------------------------------------------------------------
# result size in bytes, memory


def test_a_result_of_a_few_huge_blobs_is_too_large_in_bytes(db: Path) -> None:
    with pytest.raises(ResultTooLarge, match="bytes"):
        execute_readonly(db, BIG_BLOBS)
    with pytest.raises(ResultTooLarge, match="more than 10 rows"):
        execute_readonly(db, "SELECT a.id FROM singer AS a, singer AS b", max_rows=10)
    small = SqlLimits(result_bytes=1000)
    with SqlExecutor(small) as executor:  # many small rows count too
        with pytest.raises(ResultTooLarge, match="more than 1000 bytes"):
            executor.execute(
                db, "SELECT a.name, b.name, c.name FROM singer AS a, singer AS b, singer AS c"
            )
        assert executor.execute(db, "SELECT name FROM singer WHERE id = 1") == [("Ana",)]


def test_a_query_past_the_memory_limits_fails_and_the_worker_goes_on(db: Path) -> None:
    distinct = (
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 1000000) "
        "SELECT count(DISTINCT hex(zeroblob(1000)) || x) FROM c"
    )
    with SqlExecutor(SqlLimits(timeout_s=60, heap_bytes=32 << 20)) as executor:  # SQLite's
        with pytest.raises(QueryOutOfMemory):
            executor.execute(db, distinct)
        assert executor.execute(db, "SELECT count(*) FROM singer") == [(4,)]
        assert executor.starts == 1
    rows = (
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 100) "
        "SELECT zeroblob(4000000) FROM c"
    )
    roomy = SqlLimits(
        timeout_s=60, memory_bytes=256 << 20, heap_bytes=1 << 30, result_bytes=1 << 30
    )
    with SqlExecutor(roomy) as executor:  # the kernel's address-space limit
        with pytest.raises(QueryOutOfMemory):
            executor.execute(db, rows)
        assert executor.execute(db, "SELECT count(*) FROM singer") == [(4,)]


def test_a_worker_that_dies_mid_query_is_a_failure_and_is_replaced(db: Path) -> None:
    with SqlExecutor(SqlLimits(timeout_s=60)) as executor:
        executor.execute(db, "SELECT 1")
        proc = executor._proc
        assert proc is not None
        threading.Timer(0.5, proc.send_signal, (signal.SIGSEGV,)).start()
        with pytest.raises(WorkerDied, match="SIGSEGV"):
            executor.execute(db, SLOW)
        assert executor.execute(db, "SELECT 2") == [(2,)] and executor.starts == 2
        last = executor._proc
    assert last is not None and last.returncode == 0  # reaped when the executor closed


# ------------------------------------------------------------------------------------------
# pointer-exposing functions


@pytest.mark.parametrize(
    "sql",
    [
        POINTER,
        "SELECT fts3_tokenizer('simple', x'0000000000000000')",  # would install a tokenizer
        "SELECT FTS3_Tokenizer('porter')",
        "SELECT fts5(NULL)",
        "SELECT load_extension('/nonexistent')",
    ],
)
def test_pointer_exposing_functions_are_denied(db: Path, sql: str) -> None:
    with pytest.raises(QueryRefused, match="denied function"):
        execute_readonly(db, sql)
    conn = connect_readonly(db)  # the in-process connection (schema reads) denies them too
    try:
        with pytest.raises(sqlite3.DatabaseError, match="not authorized"):
            conn.execute(sql).fetchall()
    finally:
        conn.close()


# ------------------------------------------------------------------------------------------
# the whole run: hostile generations, then a scorer that fails


HOSTILE = {
    0: QUESTIONS[0][1],  # correct
    1: NOT_UTF8,
    2: SLOW,
    3: BIG_BLOBS,
    4: POINTER,
    5: "SELECT a.id FROM singer AS a, singer AS b, singer AS c",  # 64 rows > max_rows
}


def _compose(*overrides: str) -> Any:
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def _scripted_texts(monkeypatch: pytest.MonkeyPatch, texts: dict[int, str]) -> list[str]:
    """Each sample's generation decoded by the real generator (its tokens and counters), its
    text replaced by ``texts[i]`` for sample ``dev/i``; returns every text handed out."""
    from mtad.tasks import generator

    real = generator.TextGenerator.__call__
    handed: list[str] = []

    def scripted(self: Any, prompt: str, **kw: Any) -> Any:
        gen = real(self, prompt, **kw)
        key = kw.get("key", "")
        if key.startswith("spider/dev/"):
            gen = dataclasses.replace(gen, text=texts[int(key.split("/")[2])])
            handed.append(gen.text)
        return gen

    monkeypatch.setattr(generator.TextGenerator, "__call__", scripted)
    return handed


def _rows(folder: Path, name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (folder / name).read_text().splitlines()]


def test_a_spider_run_with_hostile_queries_completes_with_every_generation_written(
    spider_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mtad.harness.job import run
    from mtad.runs.folder import is_complete

    texts = {i: _continuation(sql) for i, sql in HOSTILE.items()}
    handed = _scripted_texts(monkeypatch, texts)
    cfg = _compose(
        "+experiment=smoke",
        "task=spider",
        f"task.data_dir={spider_dir}",
        "task.limit=null",
        "task.timeout_s=2",
        "task.max_rows=50",
        "energy=none",
        "logger=none",
        f"results.root={tmp_path / 'results'}",
    )
    outcome = run(cfg)
    assert outcome.status == "done" and outcome.result_dir is not None
    assert is_complete(outcome.result_dir)
    assert sorted(handed) == sorted(texts.values())
    records = {r["id"]: r for r in _rows(outcome.result_dir, "samples.jsonl")}
    assert set(records) == {f"dev/{i}" for i in HOSTILE}
    assert all(records[f"dev/{i}"]["output"] == texts[i] for i in HOSTILE)
    errors = {i: records[f"dev/{i}"]["exec_error"] for i in HOSTILE}
    assert errors[0] == "" and records["dev/0"]["exec_match"]
    assert "not UTF-8" in errors[1]
    assert errors[2].startswith("TimeoutError")
    assert errors[3].startswith("ResultTooLarge") and "bytes" in errors[3]
    assert "denied function fts3_tokenizer" in errors[4]
    assert errors[5].startswith("ResultTooLarge") and "rows" in errors[5]
    assert not any(records[f"dev/{i}"]["exec_match"] for i in HOSTILE if i)
    metrics = json.loads((outcome.result_dir / "metrics.json").read_text())
    assert metrics["execution_accuracy"] == pytest.approx(1 / len(HOSTILE))
    assert metrics["spider_errors"] == len(HOSTILE) - 1


def test_a_run_whose_scoring_fails_keeps_every_generation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Any task: the generations are on disk before the scorer runs."""
    from mtad.harness import job
    from mtad.runs.folder import FAILED_FILE, is_complete

    def broken(*_: Any, **__: Any) -> Any:
        raise RuntimeError("the scorer fails (injected)")

    monkeypatch.setattr(job, "score_outputs", broken)
    cfg = _compose(
        "+experiment=smoke",
        "energy=none",
        "logger=none",
        f"results.root={tmp_path / 'results'}",
    )
    prep = job.prepare(cfg)
    with pytest.raises(RuntimeError, match="injected"):
        job.run(cfg)
    folder = prep.result_dir
    assert not is_complete(folder) and (folder / FAILED_FILE).is_file()
    samples = _rows(folder, "samples.jsonl")
    timings = _rows(folder, "timings.jsonl")
    assert len(samples) == cfg.task.limit == len(timings)
    assert [r["id"] for r in samples] == [t["id"] for t in timings]
    for row in samples:
        assert {"output", "output_tokens", "stopped_by", "prompt_tokens"} <= set(row)
        assert row["new_tokens"] > 0
        assert "wall_time" not in row  # the same split as a complete run's
