"""The engine's typed contracts (issue 36, item 2): both runners implement the one draft
contract, :class:`~mtad.engine.draft_runner.DraftRunner`, member for member; a step's time goes
to a named phase or nowhere; a method's ``max_step_tokens`` follows from its declared draft
depth; the beam draft takes its parameters as one object."""

from __future__ import annotations

import inspect

import pytest
import torch

from mtad.engine import DecodeContext, DecodeStats, DraftRunner, ModelRunner
from mtad.engine.feature_head import FeatureHead, HeadSpec
from mtad.engine.head_runner import HeadRunner
from mtad.engine.loading import LoadedPair
from mtad.engine.tiny import build_tiny_model
from mtad.methods import build_method
from mtad.methods.beam import BeamSpec
from mtad.methods.common import BeamParams

TAPS = [1, 2, 3]


@pytest.fixture(scope="module")
def runners() -> tuple[ModelRunner, HeadRunner]:
    target = build_tiny_model("llama", "target", vocab_size=320, seed=3).eval()
    head = FeatureHead(
        target.config,
        HeadSpec(taps=TAPS),
        target.get_input_embeddings(),
        target.get_output_embeddings().weight.detach(),
        None,
    )
    runner = ModelRunner(target, "target", feature_taps=TAPS)
    return runner, HeadRunner(head.eval(), runner)


def contract_members() -> dict[str, object]:
    """The members :class:`DraftRunner` declares: its annotated attributes (value None) and
    its methods and properties (their definitions)."""
    found: dict[str, object] = dict.fromkeys(DraftRunner.__annotations__)
    for name, value in vars(DraftRunner).items():
        if not name.startswith("_") and (callable(value) or isinstance(value, property)):
            found[name] = value
    return found


def test_the_contract_names_what_methods_and_the_loop_use() -> None:
    members = contract_members()
    for name in ("feed", "forward", "crop", "select_rows", "repeat_rows", "candidates"):
        assert name in members
    for name in ("vocab_size", "context_limit", "forwards", "lm_head", "reads_target_features"):
        assert name in members


@pytest.mark.parametrize("kind", ["model", "head"])
def test_both_runners_implement_every_member_of_the_draft_contract(runners, kind) -> None:
    runner = runners[0] if kind == "model" else runners[1]
    assert isinstance(runner, DraftRunner)
    for name, declared in contract_members().items():
        # defined by the runner itself, not inherited from the protocol's stubs
        assert hasattr(runner, name), f"{type(runner).__name__} lacks {name}"
        own = inspect.getattr_static(type(runner), name, None)
        if isinstance(declared, property):
            assert isinstance(own, property), f"{name} is a property of the contract"
        elif callable(declared):
            got = list(inspect.signature(getattr(runner, name)).parameters)
            want = list(inspect.signature(declared).parameters)[1:]  # without self
            assert got == want, f"{type(runner).__name__}.{name}{got} != contract {want}"


def test_only_a_feature_draft_reads_the_targets_features(runners) -> None:
    target, head = runners
    assert (target.reads_target_features, head.reads_target_features) == (False, True)
    assert head.lm_head == "feature" and head.lm_head_kernels == {}
    assert target.lm_head == "stock"  # vocabulary 320: the CPU lm_head is not worth it


def test_model_facts_record_a_feature_draft(runners) -> None:
    """The harness reads ``lm_head`` and ``lm_head_kernels`` of every runner through the
    contract (a HeadRunner had no kernels to report and failed here before)."""
    from mtad.harness.generation import model_facts

    target, head = runners
    facts = model_facts(LoadedPair(target, head, None), {})
    assert facts["lm_head"] == {"target": "stock", "draft": "feature"}
    assert facts["lm_head_kernels"] == {"target": {}, "draft": {}}
    assert facts["packed_linears"] == {"target": 0, "draft": 0}  # float32: nothing packed


def test_a_phase_outside_the_closed_set_is_refused_at_the_call(runners) -> None:
    target = runners[0]
    stats = DecodeStats()
    ctx = DecodeContext(target, None, torch.tensor([1, 2]), 8, torch.Generator(), stats)
    with ctx.timed("draft"):
        pass
    with ctx.timed("verify"):
        pass
    assert stats.time_draft > 0 and stats.time_verify > 0
    before = (stats.time_draft, stats.time_verify)
    ran = []
    # "other" was booked as verify before the phases were a closed type
    with pytest.raises(ValueError, match="phase must be one of"), ctx.timed("other"):
        ran.append(True)
    assert not ran and (stats.time_draft, stats.time_verify) == before


# the hand-set values each method carried before max_step_tokens was derived from draft_depth
HAND_SET = [
    ("ar", {}, 1),
    ("sps", {"gamma": 6}, 7),
    ("blockverify", {"gamma": 2}, 3),
    ("mtad", {"gamma": 5}, 6),
    ("mmtad", {"gamma": 3}, 4),
    ("mtjd", {"gamma": 6}, 6),  # the beam is the target's own block: no token after it
    ("bild", {"max_draft": 3}, 4),
    ("specinfer", {"branching": [2, 2, 1, 1]}, 5),
]


@pytest.mark.parametrize(("name", "params", "tokens"), HAND_SET, ids=[h[0] for h in HAND_SET])
def test_max_step_tokens_follows_the_declared_draft_depth(name, params, tokens) -> None:
    method = build_method(name, **params)
    depth = method.draft_depth()
    assert method.max_step_tokens == tokens
    assert method.max_step_tokens == (depth.tokens if depth else 0) + method.tokens_after_draft


def test_beam_params_give_the_beam_draft_one_object() -> None:
    prm = BeamParams(temperature=0.7, top_k=5, top_p=0.8, gamma=3, beam_width=2, replacement=True)
    assert prm.beam == BeamSpec(3, 2, prm.warp, True)
