"""Task interface: prompts (chat / raw / multi-turn), stop strings, subsets, registry, configs."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from scripted import ScriptedDecoder

from mtad.engine.tiny import build_tiny_tokenizer
from mtad.tasks import TASKS, build_task
from mtad.tasks.base import Task
from mtad.tasks.generator import TextGenerator, derive_seed, first_stop
from mtad.tasks.samples import Sample, SampleOutput, TaskResult

CONF = Path(__file__).resolve().parents[1] / "conf" / "task"


class EchoTask(Task):
    name = "echo"

    def __init__(self, samples: list[Sample], **common: Any) -> None:
        super().__init__(**common)
        self._all = samples

    def load_samples(self) -> list[Sample]:
        return self._all

    def score(self, outputs):  # noqa: ANN001, ANN201
        return TaskResult([self.base_record(o) for o in outputs], {"n": len(outputs)})


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


def test_stop_string_cuts_text_and_tokens(tok) -> None:  # noqa: ANN001
    decoder = ScriptedDecoder(tok, "    return a + b\ndef other():\n    pass\n", block=3)
    gen = TextGenerator(decoder, tok, seed=3)(
        "def add(a, b):\n", max_new_tokens=64, stop=["\ndef", "\nclass"], key="x"
    )
    assert gen.text == "    return a + b"
    assert gen.stopped_by == "stop"
    # kept tokens end with the one that completes "\ndef"; the block's overshoot is dropped
    assert tok.decode(gen.output_ids) == "    return a + b\ndef"
    assert gen.n_generated > len(gen.output_ids)
    assert decoder.calls[0]["seed"] == derive_seed(3, "x")


def test_no_stop_keeps_everything(tok) -> None:  # noqa: ANN001
    decoder = ScriptedDecoder(tok, "abcdef")
    gen = TextGenerator(decoder, tok)("p", max_new_tokens=4, stop=["zz"])
    assert gen.text == "abcd" and gen.stopped_by == "max_new_tokens" and len(gen.output_ids) == 4
    assert first_stop("a;b\n\nc", [";", "\n\n"]) == 1 and first_stop("abc", ["x", ""]) == -1


def test_prompts_chat_raw_and_multi_turn(tok) -> None:  # noqa: ANN001
    sample = Sample(
        id="s",
        turns=["first question", "second question"],
        system="be brief",
        stop=("\n\n",),
        max_new_tokens=8,
    )
    task = EchoTask([sample])
    decoder = ScriptedDecoder(tok, "reply text")
    out = task.run_sample(sample, TextGenerator(decoder, tok), tok)
    assert [g.text for g in out.generations] == ["reply te", "reply te"]
    second_prompt = out.generations[1].prompt
    assert second_prompt == (
        "<|system|>be brief\n<|user|>first question\n<|assistant|>reply te\n"
        "<|user|>second question\n<|assistant|>"
    )
    # every turn has its own seed, stable under subsetting
    assert decoder.calls[0]["seed"] != decoder.calls[1]["seed"]

    raw_tok = copy.deepcopy(tok)
    raw_tok.chat_template = None
    prompt, special = task.build_prompt(sample, raw_tok, ["A1"])
    assert special is True
    assert prompt == (
        "be brief\n\n### User:\nfirst question\n\n### Assistant:\nA1\n\n"
        "### User:\nsecond question\n\n### Assistant:\n"
    )

    one = Sample(id="c", turns=["Fix this"], raw_prompt="def f():\n", assistant_prefix="```py\n")
    assert task.build_prompt(one, raw_tok) == ("def f():\n", True)
    chat_prompt, special = task.build_prompt(one, tok)
    assert chat_prompt.endswith("<|assistant|>```py\n") and special is False
    forced_raw = EchoTask([one], chat_template=False)
    assert forced_raw.build_prompt(one, tok)[0] == "def f():\n"
    with pytest.raises(ValueError, match="no chat template"):
        EchoTask([one], chat_template=True).build_prompt(one, raw_tok)


def test_limit_offset_select_a_subset() -> None:
    samples = [Sample(id=str(i), turns=[f"q{i}"]) for i in range(10)]
    assert [s.id for s in EchoTask(samples, limit=3, offset=2).samples()] == ["2", "3", "4"]
    assert len(EchoTask(samples, offset=8).samples()) == 2
    assert EchoTask(samples, limit=3, offset=2).signature() == {
        "task": "echo",
        "limit": 3,
        "offset": 2,
    }
    with pytest.raises(ValueError, match="past the end"):
        EchoTask(samples, offset=10).samples()
    with pytest.raises(ValueError, match="task.limit"):
        EchoTask(samples, limit=-1)


def test_generate_runs_every_sample(tok) -> None:  # noqa: ANN001
    samples = [Sample(id=str(i), turns=[f"q{i}"], max_new_tokens=3) for i in range(4)]
    task = EchoTask(samples, limit=2, offset=1)
    seen: list[tuple[int, int]] = []
    outs = task.generate(
        TextGenerator(ScriptedDecoder(tok, "xyz"), tok), progress=lambda i, n: seen.append((i, n))
    )
    assert [o.sample.id for o in outs] == ["1", "2"] and seen == [(1, 2), (2, 2)]
    res = task.score(outs)
    assert res.records[0] == {
        "id": "1",
        "output": "xyz",
        "output_tokens": 3,  # kept up to the stop string; the decoder's new_tokens count all
        "stopped_by": "max_new_tokens",
    }
    assert SampleOutput.from_texts(samples[0], ["a", "b"]).text == "b"


@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_task_config_builds(name: str) -> None:
    """``task=<name>`` as Hydra composes it (its params' defaults, then the YAML's values)."""
    from mtad.harness.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(CONF.parent), version_base="1.3"):
        cfg = compose("config", overrides=[f"task={name}"]).task
    task = build_task(cfg)
    assert task.name == name
    assert task.signature()["task"] == name


def test_build_task_errors_name_the_key() -> None:
    with pytest.raises(ValueError, match="task.name"):
        build_task({"limit": 3})
    with pytest.raises(ValueError, match="unknown task 'nope'"):
        build_task({"name": "nope"})
    with pytest.raises(ValueError, match="task.bogus"):
        build_task({"name": "prompts", "bogus": 1})


def test_stop_detection_fires_at_the_first_block_that_completes_it(tok) -> None:  # noqa: ANN001
    """Windowed stop checks (constant cost per iteration) agree with decoding everything:
    random texts with multi-byte characters, random stop strings and block sizes."""
    import math
    import random

    rng = random.Random(1)
    alphabet = list("ab \n#dé€:;")
    checked = 0
    for _ in range(200):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 60)))
        stop = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 3)))]
        block = rng.randint(1, 4)
        gen = TextGenerator(ScriptedDecoder(tok, text, block=block), tok)(
            "pr", max_new_tokens=400, stop=stop
        )
        ids = tok(text, add_special_tokens=False)["input_ids"]
        first = next(
            (k for k in range(1, len(ids) + 1) if first_stop(tok.decode(ids[:k]), stop) >= 0),
            None,
        )
        if first is None:
            assert gen.text == text and gen.stopped_by == "max_new_tokens"
            continue
        checked += 1
        assert len(gen.output_ids) == first
        assert gen.n_generated == min(len(ids), math.ceil(first / block) * block)
        assert gen.text == text[: first_stop(text, stop)]
    assert checked > 50
