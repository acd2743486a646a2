"""IFEval's rule-based verifiers (Zhou et al., 2023, arXiv 2311.07911), as lm-eval ships them
(``lm_eval/tasks/ifeval/``: ``instructions.py``, ``instructions_registry.py``, ``utils.py``), loaded
without their network side effect, and applied to one response.

Importing ``lm_eval.tasks.ifeval.instructions_util`` calls ``nltk.download("punkt_tab")`` when
nltk's punkt data is not installed: a network request at run time. :func:`verifiers` imports the
modules with ``nltk.download`` replaced by a function that only records the request (and lm-eval's
"Downloaded punkt_tab" line, printed whether or not anything was downloaded, swallowed). Two
instruction types need that data to be checked (:data:`PUNKT_INSTRUCTIONS`: nltk's sentence and
word tokenizers); every other verifier is regular expressions, ``langdetect`` and JSON.
:func:`check_runnable` refuses a prompt set that uses one of them on a machine without the data,
before any model loads, saying how to install it.

``langdetect`` (the language and case verifiers) is random unless seeded: :func:`score` seeds it
before every check (``DetectorFactory.seed = 0``) so a response gets the same verdict on every
machine and every run.
"""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

# nltk's sentence tokenizer (count_sentences) and word_tokenize need nltk's punkt data.
PUNKT_INSTRUCTIONS = frozenset(
    {"length_constraints:number_sentences", "change_case:capital_word_frequency"}
)
PUNKT_RESOURCES = ("tokenizers/punkt_tab",)
PUNKT_HINT = "python -m nltk.downloader punkt_tab punkt"

_modules: dict[str, ModuleType] = {}


def verifiers() -> ModuleType:
    """lm-eval's ``lm_eval.tasks.ifeval.utils`` (its ``instructions_registry`` beside it),
    imported once, with no download attempted (module docstring)."""
    if "utils" not in _modules:
        import nltk

        real = nltk.download
        requested: list[Any] = []
        nltk.download = lambda *args, **kwargs: requested.append(args) or False  # type: ignore[assignment]
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                from lm_eval.tasks.ifeval import utils
        finally:
            nltk.download = real
        _modules["utils"] = utils
    return _modules["utils"]


def registry() -> Mapping[str, Any]:
    """Instruction id -> its verifier class (lm-eval's ``INSTRUCTION_DICT``)."""
    verifiers()
    return sys.modules["lm_eval.tasks.ifeval.instructions_registry"].INSTRUCTION_DICT


def conflicts() -> Mapping[str, set[str]]:
    """Instruction id -> the ids it cannot be combined with (IFEval's own table)."""
    verifiers()
    return sys.modules["lm_eval.tasks.ifeval.instructions_registry"].INSTRUCTION_CONFLICTS


def description(instruction_id: str, kwargs: Mapping[str, Any]) -> str:
    """The instruction's text as IFEval's verifier words it for ``kwargs``."""
    return registry()[instruction_id](instruction_id).build_description(**dict(kwargs))


def punkt_available() -> bool:
    import nltk

    try:
        for resource in PUNKT_RESOURCES:
            nltk.data.find(resource)
    except LookupError:
        return False
    return True


def check_runnable(instruction_ids: Iterable[str], where: str) -> None:
    """``ValueError`` naming ``where`` when an id is not one of IFEval's instructions, or needs
    nltk's punkt data on a machine that has none (nothing is downloaded at run time)."""
    ids = set(instruction_ids)
    unknown = sorted(ids - set(registry()))
    if unknown:
        raise ValueError(f"{where}: unknown IFEval instruction {unknown[0]!r}")
    needs = sorted(ids & PUNKT_INSTRUCTIONS)
    if needs and not punkt_available():
        raise ValueError(
            f"{where}: instruction {needs[0]!r} needs nltk's punkt data, which is not installed "
            f"here and is never downloaded at run time; install it first ({PUNKT_HINT})"
        )


@dataclass(frozen=True)
class Verdict:
    """One response against one prompt's instructions: per instruction, strict and loose."""

    strict: tuple[bool, ...]
    loose: tuple[bool, ...]

    @property
    def prompt_strict(self) -> bool:
        return all(self.strict)

    @property
    def prompt_loose(self) -> bool:
        return all(self.loose)


def score(
    prompt: str,
    instruction_ids: Sequence[str],
    kwargs: Sequence[Mapping[str, Any]],
    response: str,
) -> Verdict:
    """IFEval's strict and loose verdicts (lm-eval's ``test_instruction_following_strict`` and
    ``_loose``: loose also accepts the response without its first and / or last line, or
    without ``*``) of ``response``."""
    utils = verifiers()
    import langdetect

    example = utils.InputExample(
        key=0, instruction_id_list=list(instruction_ids), prompt=prompt, kwargs=list(kwargs)
    )
    langdetect.DetectorFactory.seed = 0
    strict = utils.test_instruction_following_strict(example, response).follow_instruction_list
    langdetect.DetectorFactory.seed = 0
    loose = utils.test_instruction_following_loose(example, response).follow_instruction_list
    return Verdict(tuple(map(bool, strict)), tuple(map(bool, loose)))


__all__ = [
    "PUNKT_INSTRUCTIONS",
    "Verdict",
    "check_runnable",
    "conflicts",
    "description",
    "punkt_available",
    "registry",
    "score",
    "verifiers",
]
