"""The smollm2 pair's default draft follows the host (issue 39): the feature head where the CPU
has native bfloat16, the independent draft model elsewhere; ``kind: auto`` reads the folder, and
on a host without native bfloat16 the default run keeps the signature it had before the head
could be the default."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

import mtad.harness.config as harness_config
from mtad.engine.spec import ModelSpec, draft_kind
from mtad.harness.config import validate
from mtad.runs.identity import RunIdentity

CONF = Path(__file__).resolve().parents[1] / "conf"
HEAD = "assets/drafts/smollm2-head"
MODEL = "assets/drafts/smollm2-draft"
# dtypes pinned: "auto" would follow this host's CPU, and the signature with it
PINNED = ("pair.target.dtype=float32", "pair.draft.dtype=float32")


def spec_on(monkeypatch: pytest.MonkeyPatch, bf16_flag: str | None, *overrides: str):
    monkeypatch.setattr(harness_config, "native_bf16", lambda flags=None: bf16_flag)
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return validate(compose("config", overrides=[*PINNED, *overrides]))


def signature(spec) -> str:
    return RunIdentity.of(dataclasses.asdict(spec.cfg), {}).signature


@pytest.mark.parametrize(
    ("flag", "path", "kind"), [("amx_bf16", HEAD, "head"), (None, MODEL, "model")]
)
def test_the_default_draft_follows_the_cpu(monkeypatch, flag, path, kind) -> None:
    spec = spec_on(monkeypatch, flag)
    assert (spec.draft.path, spec.draft.kind) == (path, kind)
    # the run's config (what is hashed and recorded) holds the resolved draft, not "auto"
    assert (spec.cfg.pair.draft.path, spec.cfg.pair.draft.kind) == (path, kind)


def test_without_native_bf16_the_default_run_keeps_its_signature(monkeypatch) -> None:
    """The default run on an AVX2 host is the run it was when the pair named the draft model
    with the default kind: equal signatures, so earlier results are found and compared."""
    default = spec_on(monkeypatch, None)
    explicit = spec_on(monkeypatch, None, f"pair.draft.path={MODEL}", "pair.draft.kind=model")
    assert signature(default) == signature(explicit)


def test_either_draft_is_selectable_on_any_host(monkeypatch) -> None:
    on_bf16 = spec_on(monkeypatch, "amx_bf16", f"pair.draft.path={MODEL}")
    assert (on_bf16.draft.path, on_bf16.draft.kind) == (MODEL, "model")
    elsewhere = spec_on(monkeypatch, None, f"pair.draft.path={HEAD}")
    assert (elsewhere.draft.path, elsewhere.draft.kind) == (HEAD, "head")
    assert signature(on_bf16) != signature(spec_on(monkeypatch, "amx_bf16"))


def test_kind_auto_reads_the_folder(monkeypatch, tmp_path) -> None:
    (tmp_path / "h").mkdir()
    (tmp_path / "h" / "head_config.json").write_text("{}")
    (tmp_path / "m").mkdir()
    kinds = {
        name: draft_kind(ModelSpec(loader="local", path=str(tmp_path / name), kind="auto"))
        for name in ("h", "m", "missing")
    }
    # a missing folder is the default kind: the preflight says the folder is missing
    assert kinds == {"h": "head", "m": "model", "missing": "model"}
    hub = ModelSpec(loader="hub", path="org/not-a-folder-here", kind="auto")
    assert draft_kind(hub) == "model"
    assert draft_kind(ModelSpec(loader="local", path=str(tmp_path / "m"), kind="head")) == "head"
