# ruff: noqa: E501  (template lines read best unwrapped)
"""How the prompts of the distillation pool are worded: the request formats for code
(complete, write, explain / review / test) and for documents (summarise, rewrite, extract), the
questions about commands and packages, and the templated chats built from
:mod:`mtad_train.topics`. :mod:`mtad_train.pool` fills them with material from
:mod:`mtad_train.sources`.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from mtad_train import topics as T


def chat(text: str) -> list[dict]:
    """A one-turn chat: the user's message."""
    return [{"role": "user", "content": text}]


# (user instruction, assistant prefill): the first is the harness's own HumanEval chat wrapping
# (mtad.tasks.humaneval), a format only; the problems here are standard-library functions.
CODE_PREFILL_FORMATS = [
    (
        "Complete the following Python function. Keep the signature; write only the body.\n\n"
        "```python\n{p}```",
        "Here is the completed function:\n```python\n{p}",
    ),
    (
        "Finish this function:\n```python\n{p}```",
        "Sure! Here is the full function:\n```python\n{p}",
    ),
    ("Implement the function below.\n```python\n{p}```", "```python\n{p}"),
]
CODE_COMPLETE_FORMATS = [
    "Complete the following Python function:\n```python\n{p}```",
    "Complete this Python function so that it does what its docstring says.\n\n```python\n{p}```",
    "Write the body of this function.\n\n{p}",
    "Implement the following function in Python:\n\n```python\n{p}```",
    "{p}",
]
CODE_EXPLAIN_FORMATS = [
    "Explain what the following Python code does:\n```python\n{s}```",
    "Review this code and suggest improvements:\n```python\n{s}```",
    "Write unit tests for this function:\n```python\n{s}```",
    "Add comments to this code to make it easier to read:\n```python\n{s}```",
    "Is there a bug in this function? Explain.\n```python\n{s}```",
    "Rewrite this function to be more readable:\n```python\n{s}```",
]
# a coding task of mtad_train.topics in a language
CODE_WRITE_FORMATS = (
    "Write a {l} function that {t}.",
    "Write a {l} program that {t}.",
    "How do I write code in {l} that {t}? Include an example.",
)
DOC_FORMATS = [
    "Summarize the following text in two sentences:\n\n{t}",
    "Summarize the following text:\n\n{t}",
    "Extract the key points from this text as a bulleted list:\n\n{t}",
    "Rewrite the following paragraph in plain language:\n\n{t}",
    "What is the main idea of this passage?\n\n{t}",
    "Write three questions a reader might ask after reading this:\n\n{t}",
    "Extract all names of programs, files and options mentioned in this text:\n\n{t}",
    "Give this text a title and a one-paragraph summary:\n\n{t}",
]
# about a command or package: name, one-line summary, and the summary without its full stop
COMMAND_FORMATS = [
    "What does the command `{name}` do? ({summary})",
    "Explain what {name} is used for and give an example.",
    "Write a short tutorial about {name}: {summary}.",
    "Describe {what} in simple terms.",
]


def _a(word: str) -> str:
    return ("an " if word[:1].lower() in "aeiou" else "a ") + word


def templated_chats(rng: random.Random, n: int) -> Iterator[dict]:
    """``n`` templated chat instructions (writing, roleplay, explanations, reasoning and math),
    built combinatorially from the word lists of :mod:`mtad_train.topics`."""
    gen = _writing(rng) + _reasoning(rng)
    for _ in range(n):
        yield {"kind": "chat", "source": "templated", "messages": chat(rng.choice(gen)())}


def _writing(rng: random.Random) -> list:
    """Instruction makers: writing, roleplay, explanations."""
    return [
        lambda: (
            f"Write {_a(rng.choice(T.STYLES))} {rng.choice(T.FORMS)} about {rng.choice(T.GENERAL_TOPICS).strip()}."
        ),
        lambda: (
            f"Write a {rng.choice(T.FORMS)} about {rng.choice(T.CONCEPTS).strip()} for {rng.choice(T.AUDIENCES)}."
        ),
        lambda: f"Explain {rng.choice(T.CONCEPTS).strip()} to {rng.choice(T.AUDIENCES)}.",
        lambda: f"What is {rng.choice(T.CONCEPTS).strip()}? Give a short explanation.",
        lambda: (
            f"Explain the difference between {rng.choice(T.CONCEPTS).strip()} and {rng.choice(T.CONCEPTS).strip()}."
        ),
        lambda: f"What are the advantages and disadvantages of {rng.choice(T.CONCEPTS).strip()}?",
        lambda: f"Pretend you are {rng.choice(T.PERSONAS)}. Describe a typical day.",
        lambda: (
            f"You are {rng.choice(T.PERSONAS)}. Give me advice about {rng.choice(T.CONCEPTS).strip()}."
        ),
        lambda: (
            f"Act as {rng.choice(T.PERSONAS)} and introduce yourself to {rng.choice(T.AUDIENCES)}."
        ),
        lambda: f"Plan a three-day trip to {rng.choice(T.PLACES)} for {rng.choice(T.AUDIENCES)}.",
        lambda: f"Describe the impact of {rng.choice(T.HISTORY)} on {rng.choice(T.DOMAINS)}.",
        lambda: f"Discuss the causes and consequences of {rng.choice(T.HISTORY)}.",
        lambda: (
            f"Write {_a(rng.choice(T.STYLES))} email to {rng.choice(T.AUDIENCES)} about {rng.choice(T.CONCEPTS).strip()}."
        ),
        lambda: (
            f"Give me {rng.randint(3, 7)} tips for learning about {rng.choice(T.CONCEPTS).strip()}."
        ),
        lambda: (
            f"Compare {rng.choice(T.PLACES)} and {rng.choice(T.PLACES)} as travel destinations."
        ),
        lambda: (
            f"Tell me {_a(rng.choice(T.STYLES))} story about {rng.choice(T.GENERAL_TOPICS).strip()}."
        ),
        lambda: (
            f"Describe {rng.choice(T.GENERAL_TOPICS).strip()} in {_a(rng.choice(T.STYLES))} way."
        ),
    ]


def _reasoning(rng: random.Random) -> list:
    """Instruction makers: reasoning and math."""
    return [
        lambda: (
            lambda a, b, c: (
                f"{rng.choice(T.NAMES)} has {a} {rng.choice(T.ITEMS)} and gives {b} to each of {c} friends. How many are left? Explain your reasoning."
            )
        )(rng.randint(20, 90), rng.randint(1, 5), rng.randint(2, 4)),
        lambda: (lambda a, b, c: f"Solve for x: {a}x + {b} = {c}. Show your steps.")(
            rng.randint(2, 12), rng.randint(1, 40), rng.randint(41, 200)
        ),
        lambda: (lambda a, b: f"What is {a} multiplied by {b}? Explain how you computed it.")(
            rng.randint(12, 99), rng.randint(12, 99)
        ),
        lambda: (
            lambda a, b: (
                f"A rectangle is {a} cm long and {b} cm wide. What are its area and perimeter?"
            )
        )(rng.randint(3, 40), rng.randint(3, 40)),
        lambda: (
            lambda a, b: (
                f"A train travels {a} km in {b} hours. What is its average speed, and how far does it go in {b + 2} hours?"
            )
        )(rng.randint(60, 600), rng.randint(2, 6)),
        lambda: (
            lambda a: f"What is the probability of rolling a total of {a} with two fair dice?"
        )(rng.randint(2, 12)),
        lambda: (
            lambda n1, n2: (
                f"{n1} is taller than {n2}, and {n2} is taller than {rng.choice(T.NAMES)}. Who is the shortest? Explain."
            )
        )(rng.choice(T.NAMES), rng.choice(T.NAMES)),
        lambda: (lambda a, b: f"Find the greatest common divisor of {a} and {b}, step by step.")(
            rng.randint(12, 300), rng.randint(12, 300)
        ),
        lambda: (
            lambda a, b: (
                f"If a shirt costs ${a} and is discounted by {b}%, what is the final price?"
            )
        )(rng.randint(10, 120), rng.choice([10, 15, 20, 25, 30, 40, 50])),
        lambda: (lambda a: f"Is {a} a prime number? Explain why or why not.")(rng.randint(10, 500)),
        lambda: (lambda a, b: f"What is the sum of all integers from {a} to {b}?")(
            rng.randint(1, 20), rng.randint(21, 200)
        ),
    ]
