"""The ``instruct`` task's own prompt set: requests on everyday topics, each with one or two of
IFEval's verifiable instructions, built deterministically and committed as
``mtad/tasks/data/instruct_prompts.jsonl`` (IFEval's row format: ``key``, ``prompt``,
``instruction_id_list``, ``kwargs``).

    python scripts/instruct_data.py           # (re)write the committed file
    python scripts/instruct_data.py --check   # exit 1 when the file differs from a rebuild

Each prompt is one request sentence (:data:`REQUESTS` over :data:`TOPICS`, hand-written here for
this set: no evaluation or training text) followed by the instructions, each worded exactly as
IFEval's verifier words it (:func:`mtad.tasks.ifeval_rules.description`, lm-eval's
``build_description``) for the kwargs drawn here. One in three prompts carries a second
instruction that IFEval's conflict table allows beside the first.

The instruction types (:data:`INSTRUCTION_TYPES`) are those whose verdict the first few dozen
tokens of a response decide (a comma, a capital letter, a title, a keyword, the opening words),
so a CPU token budget of 32-64 measures instruction following rather than truncation; types
that need the end of a response (a postscript, an end phrase, closing quotes, JSON, a paragraph
count) or nltk's punkt data (a sentence count, capital-word frequency) are left out. The real
IFEval set (541 prompts, every type) runs with ``task.data=ifeval``.

A random generator seeded with :data:`SEED` draws every choice in a fixed order, and the
instruction texts come from the installed lm-eval: the same lm-eval gives the same bytes
(``tests/test_tasks_instruct.py`` rebuilds the file and compares).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from mtad.tasks import ifeval_rules

DATA_FILE = Path(__file__).resolve().parent / "data" / "instruct_prompts.jsonl"
SEED = 35
N_PROMPTS = 400
SECOND_EVERY = 3  # every third prompt gets a second instruction

# (topic, two words a reply about it would naturally use)
TOPICS: tuple[tuple[str, tuple[str, str]], ...] = (
    ("keeping houseplants alive", ("water", "light")),
    ("learning to ride a bicycle", ("balance", "pedal")),
    ("packing for a weekend trip", ("bag", "clothes")),
    ("making a cup of tea", ("kettle", "leaves")),
    ("starting a vegetable patch", ("soil", "seeds")),
    ("visiting a public library", ("books", "card")),
    ("training a young dog", ("treats", "patience")),
    ("saving money each month", ("budget", "savings")),
    ("baking bread at home", ("flour", "oven")),
    ("watching birds in a park", ("feathers", "binoculars")),
    ("writing a thank-you card", ("gratitude", "card")),
    ("planning a picnic", ("basket", "blanket")),
    ("learning a musical instrument", ("practice", "notes")),
    ("keeping a daily journal", ("pages", "thoughts")),
    ("cleaning a kitchen", ("sponge", "counter")),
    ("choosing running shoes", ("comfort", "size")),
    ("building a snowman", ("snow", "carrot")),
    ("going to the dentist", ("teeth", "appointment")),
    ("repairing a flat tyre", ("tube", "pump")),
    ("folding paper cranes", ("paper", "folds")),
    ("drinking enough water", ("glass", "thirst")),
    ("taking photos at sunset", ("camera", "colours")),
    ("moving into a new flat", ("boxes", "keys")),
    ("learning to swim", ("pool", "breathing")),
    ("hosting a board game night", ("dice", "friends")),
    ("brewing coffee", ("beans", "cup")),
    ("caring for a goldfish", ("tank", "food")),
    ("preparing for a job interview", ("questions", "confidence")),
    ("recycling at home", ("plastic", "bins")),
    ("sleeping well", ("bedtime", "rest")),
    ("walking in the rain", ("umbrella", "puddles")),
    ("cooking pasta", ("salt", "sauce")),
    ("reading to children", ("story", "voice")),
    ("painting a bedroom wall", ("brush", "colour")),
    ("looking after a sunflower", ("stem", "sun")),
    ("visiting grandparents", ("family", "visit")),
    ("making a paper kite", ("string", "wind")),
    ("using a map on a hike", ("trail", "compass")),
    ("writing a shopping list", ("milk", "list")),
    ("feeding ducks at a pond", ("pond", "ducks")),
    ("sewing on a button", ("needle", "thread")),
    ("stretching after exercise", ("muscles", "stretch")),
    ("choosing a birthday present", ("gift", "friend")),
    ("keeping a bike clean", ("chain", "cloth")),
    ("learning new words", ("vocabulary", "words")),
    ("making a sandwich", ("bread", "cheese")),
    ("spending a day at the zoo", ("animals", "tickets")),
    ("growing tomatoes", ("tomatoes", "sunlight")),
    ("waiting at a bus stop", ("bus", "timetable")),
    ("tidying a messy desk", ("drawer", "papers")),
    ("carving a pumpkin", ("pumpkin", "knife")),
    ("flying a kite on a beach", ("kite", "beach")),
    ("making pancakes", ("batter", "pan")),
    ("walking a dog at night", ("leash", "night")),
    ("setting up a fish tank", ("gravel", "filter")),
    ("learning to juggle", ("balls", "hands")),
    ("drawing a portrait", ("pencil", "face")),
    ("washing a car", ("bucket", "soap")),
    ("planting a tree", ("roots", "shovel")),
    ("making a snow globe", ("jar", "glitter")),
)

# One sentence each; "{topic}" is filled in. The last is a yes/no question (for
# detectable_format:constrained_response, whose options are yes / no / maybe).
REQUESTS: tuple[str, ...] = (
    "Write a short note about {topic}.",
    "Give a beginner some advice on {topic}.",
    "Describe {topic} to a friend.",
    "Explain what matters most when {topic}.",
    "Write a few lines for a blog post on {topic}.",
    "Tell me why someone might enjoy {topic}.",
)
YES_NO_REQUEST = "Is {topic} a good way to spend a free afternoon?"
LANGUAGES = ("es", "fr", "de", "it", "pt")
FILLER_WORDS = ("very", "really", "also", "just", "good", "important", "great", "things")
RARE_LETTERS = ("k", "w", "y", "v", "b")


def _kwargs(kind: str, rng: random.Random, keywords: tuple[str, str], request: str) -> dict:
    """IFEval's kwargs for one instruction of ``kind`` (the names its verifiers take)."""
    if kind == "keywords:existence":
        return {"keywords": list(keywords)}
    if kind == "keywords:forbidden_words":
        return {"forbidden_words": rng.sample(FILLER_WORDS, 2)}
    if kind == "keywords:frequency":
        return {
            "keyword": rng.choice(keywords),
            "frequency": rng.choice((2, 3)),
            "relation": "at least",
        }
    if kind == "keywords:letter_frequency":
        return {
            "letter": rng.choice(RARE_LETTERS),
            "let_frequency": rng.choice((2, 3, 4)),
            "let_relation": "at least",
        }
    if kind == "length_constraints:number_words":
        relation = rng.choice(("less than", "at least"))
        words = rng.choice((12, 20)) if relation == "less than" else rng.choice((10, 15))
        return {"num_words": words, "relation": relation}
    if kind == "detectable_format:number_highlighted_sections":
        return {"num_highlights": rng.choice((1, 2))}
    if kind == "detectable_format:number_bullet_lists":
        return {"num_bullets": rng.choice((2, 3))}
    if kind == "detectable_content:number_placeholders":
        return {"num_placeholders": rng.choice((1, 2))}
    if kind == "combination:repeat_prompt":
        return {"prompt_to_repeat": request}
    if kind == "language:response_language":
        return {"language": rng.choice(LANGUAGES)}
    return {}


# Types whose verdict a response's opening decides (module docstring), in a fixed order.
INSTRUCTION_TYPES: tuple[str, ...] = (
    "punctuation:no_comma",
    "change_case:english_lowercase",
    "change_case:english_capital",
    "keywords:existence",
    "keywords:forbidden_words",
    "keywords:frequency",
    "keywords:letter_frequency",
    "length_constraints:number_words",
    "detectable_format:title",
    "detectable_format:number_highlighted_sections",
    "detectable_format:number_bullet_lists",
    "detectable_format:constrained_response",
    "detectable_content:number_placeholders",
    "combination:repeat_prompt",
    "language:response_language",
)
# Never the second instruction: they reword or replace the whole reply.
FIRST_ONLY = frozenset(
    {
        "detectable_format:constrained_response",
        "combination:repeat_prompt",
        "language:response_language",
    }
)


def build(n: int = N_PROMPTS, seed: int = SEED) -> list[dict[str, Any]]:
    """The prompt set's rows (module docstring): topic ``i mod len(TOPICS)``, first
    instruction type ``i mod len(INSTRUCTION_TYPES)``, everything else drawn by ``seed``."""
    rng = random.Random(seed)
    table = ifeval_rules.conflicts()
    rows = []
    for i in range(n):
        topic, keywords = TOPICS[i % len(TOPICS)]
        first = INSTRUCTION_TYPES[(i // len(TOPICS) + i) % len(INSTRUCTION_TYPES)]
        if first == "detectable_format:constrained_response":
            request = YES_NO_REQUEST.format(topic=topic)
        else:
            request = rng.choice(REQUESTS).format(topic=topic)
        kinds = [first]
        if i % SECOND_EVERY == SECOND_EVERY - 1 and first not in FIRST_ONLY:
            allowed = [
                k
                for k in INSTRUCTION_TYPES
                if k not in FIRST_ONLY and k not in table[first] and first not in table[k]
            ]
            if allowed:
                kinds.append(rng.choice(allowed))
        kwargs = [_kwargs(k, rng, keywords, request) for k in kinds]
        texts = [ifeval_rules.description(k, kw) for k, kw in zip(kinds, kwargs, strict=True)]
        rows.append(
            {
                "key": i,
                "prompt": " ".join([request, *texts]),
                "instruction_id_list": kinds,
                "kwargs": kwargs,
            }
        )
    return rows


def render(rows: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n" for row in rows)


def matches(path: Path = DATA_FILE) -> bool:
    """Whether ``path`` holds exactly a rebuild of the set."""
    return path.is_file() and path.read_text(encoding="utf-8") == render(build())


def write(path: Path = DATA_FILE) -> int:
    """Write the rebuilt set to ``path``; the number of prompts written."""
    text = render(build())
    path.write_text(text, encoding="utf-8")
    return text.count("\n")
