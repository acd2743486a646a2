"""Projections on prepacked weights (``mtad.engine.packed``): the same numbers as ``F.linear``,
switched on and off per model, following weight edits, out of the way of training, and
recorded per run. Where this CPU's oneDNN has no bfloat16 (an AVX2 host) nothing is packed, and
the tests that need packing are skipped (the rule itself is tested on every host)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mtad.engine import ModelRunner
from mtad.engine.feature_head import FeatureHead, HeadSpec
from mtad.engine.head_runner import HeadRunner
from mtad.engine.loop import Decoder
from mtad.engine.packed import (
    PACKED_MAX_ROWS,
    PackedLinear,
    bf16_packing_supported,
    linear,
    packable,
    set_linears,
)
from mtad.engine.subvocab import SubVocabHead
from mtad.engine.tiny import build_tiny_model
from mtad.harness.config import RuntimeConfig
from mtad.methods import build_method

needs_packing = pytest.mark.skipif(
    not bf16_packing_supported(), reason="this CPU's oneDNN has no bfloat16"
)
VOCAB = 320


def tiny(size: str = "target", seed: int = 3, dtype=torch.bfloat16) -> torch.nn.Module:
    return build_tiny_model("llama", size, vocab_size=VOCAB, seed=seed).to(dtype).eval()


def linear_count(model: torch.nn.Module) -> int:
    return sum(isinstance(m, torch.nn.Linear) for m in model.modules())


def test_only_bfloat16_cpu_weights_are_packable() -> None:
    """The one rule: 2-D, bfloat16, on the CPU, where oneDNN has bfloat16."""
    w = torch.zeros(8, 4)
    assert not packable(w) and not packable(w.half())
    assert not packable(torch.zeros(8, dtype=torch.bfloat16))
    assert packable(w.bfloat16()) == bf16_packing_supported()
    model = tiny(dtype=torch.float32)
    assert set_linears(model, "auto") == 0  # float32 keeps the stock path
    assert not any(isinstance(m, PackedLinear) for m in model.modules())


def test_linears_mode_is_checked() -> None:
    with pytest.raises(ValueError, match="linears must be"):
        set_linears(tiny(), "packed")
    with pytest.raises(ValueError, match="linears must be auto or stock"):
        RuntimeConfig(linears="fast")


@needs_packing
def test_set_linears_swaps_every_plain_linear_and_back() -> None:
    """Every ``nn.Linear`` (the output projection too) becomes a :class:`PackedLinear` with
    the same parameters and state dict; ``stock`` undoes it; a second ``auto`` changes
    nothing."""
    model = tiny()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    n = linear_count(model)
    assert set_linears(model, "auto") == n > 0
    assert set_linears(model, "auto") == n
    assert all(type(m) is PackedLinear for m in model.modules() if isinstance(m, torch.nn.Linear))
    after = model.state_dict()
    assert after.keys() == before.keys()
    assert all(torch.equal(after[k], before[k]) for k in before)
    assert set_linears(model, "stock") == 0
    assert all(
        type(m) is torch.nn.Linear for m in model.modules() if isinstance(m, torch.nn.Linear)
    )
    assert not any(hasattr(m, "pack") for m in model.modules() if isinstance(m, torch.nn.Linear))


@needs_packing
def test_a_subclass_of_linear_is_left_alone() -> None:
    class Scaled(torch.nn.Linear):
        def forward(self, x):
            return 2 * super().forward(x)

    model = torch.nn.Sequential(Scaled(8, 8), torch.nn.Linear(8, 8)).bfloat16()
    assert set_linears(model, "auto") == 1
    assert type(model[0]) is Scaled and type(model[1]) is PackedLinear


def assert_same_bf16(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal up to one bfloat16 rounding step of each value: both kernels accumulate in
    float32, and another summation order may land a value near a rounding boundary on its
    neighbour (on the AMX Xeon they were equal bit for bit at every shape tried)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    tol = torch.finfo(torch.bfloat16).eps * want.float().abs() + 1e-6
    assert bool(((got.float() - want.float()).abs() <= tol).all())


def bitwise_equal_here() -> bool:
    """Whether this host's packed kernels give ``F.linear``'s bits on the tiny models' shapes
    (what a token-for-token comparison of two decodes needs)."""
    from mtad.engine.packed import PackedWeight

    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for out_f, in_f in ((64, 64), (192, 64), (64, 192), (VOCAB, 64), (VOCAB // 2, 64)):
            w = torch.randn(out_f, in_f, generator=g).bfloat16()
            for rows in (1, 4, 19):
                x = torch.randn(rows, in_f, generator=g).bfloat16()
                if not torch.equal(linear(x, w, None, PackedWeight()), F.linear(x, w)):
                    return False
    return True


@needs_packing
@pytest.mark.parametrize("rows", [1, 3, 5, 17, PACKED_MAX_ROWS, PACKED_MAX_ROWS + 1])
def test_packed_projection_equals_f_linear(rows: int) -> None:
    """``F.linear``'s values, with and without a bias, 2-D and 3-D inputs, for decoding's row
    counts and past :data:`PACKED_MAX_ROWS` (the stock path there: bit for bit)."""
    from mtad.engine.packed import PackedWeight

    g = torch.Generator().manual_seed(rows)
    w = torch.randn(96, 64, generator=g).bfloat16()
    b = torch.randn(96, generator=g).bfloat16()
    x = torch.randn(1, rows, 64, generator=g).bfloat16()
    pack = PackedWeight()
    with torch.inference_mode():
        for bias in (None, b):
            want = F.linear(x, w, bias)
            assert_same_bf16(linear(x, w, bias, pack), want)
            assert_same_bf16(linear(x[0], w, bias, pack), want[0])
            if rows > PACKED_MAX_ROWS:
                assert torch.equal(linear(x, w, bias, pack), want)
    assert (pack._packed is None) == (rows > PACKED_MAX_ROWS)


@needs_packing
def test_an_edited_weight_is_repacked() -> None:
    """In-place writes (``_version``) and a reloaded state dict are seen: never stale."""
    layer = torch.nn.Linear(64, 32, bias=False).bfloat16()
    x = torch.randn(4, 64).bfloat16()
    set_linears(layer, "auto")
    with torch.inference_mode():
        first = layer(x)
    with torch.no_grad():
        layer.weight.mul_(-2.0)
    with torch.inference_mode():
        assert_same_bf16(layer(x), F.linear(x, layer.weight))
        assert_same_bf16(layer(x), -2.0 * first)  # exact: a power of two
    other = torch.nn.Linear(64, 32, bias=False).bfloat16()
    layer.load_state_dict(other.state_dict())
    with torch.inference_mode():
        assert_same_bf16(layer(x), F.linear(x, other.weight))


@needs_packing
def test_training_through_a_packed_layer_gets_autograds_gradients() -> None:
    """With gradients on, the stock path runs (oneDNN's packed op has no backward here)."""
    layer = torch.nn.Linear(16, 8).bfloat16()
    ref = torch.nn.Linear(16, 8).bfloat16()
    ref.load_state_dict(layer.state_dict())
    set_linears(layer, "auto")
    x = torch.randn(3, 16).bfloat16()
    layer(x).float().square().sum().backward()
    ref(x).float().square().sum().backward()
    assert torch.equal(layer.weight.grad, ref.weight.grad)
    assert torch.equal(layer.bias.grad, ref.bias.grad)


@needs_packing
def test_runners_decode_the_same_tokens_packed_or_stock() -> None:
    """A whole decode (SpS over a tiny bfloat16 pair; MTAD over a feature head with an FR-Spec
    sub-vocabulary) commits the same tokens either way; the runners report what they packed.
    Token for token only where the packed kernels give ``F.linear``'s bits (an AMX Xeon
    does): elsewhere a logit one rounding step off may flip a sampled token, and the
    per-projection tests above are the check."""
    if not bitwise_equal_here():
        pytest.skip("this host's packed kernels sum in another order than F.linear's")
    prompt = list(range(11, 30))

    def sps(mode: str) -> tuple[list[list[int]], int, int]:
        target = ModelRunner(tiny(), "target", linears=mode)
        draft = ModelRunner(tiny("draft"), "draft", linears=mode)
        dec = Decoder(build_method("sps", gamma=3), target, draft)
        tokens = [dec.generate(prompt, 24, seed=s).token_ids for s in range(3)]
        return tokens, target.packed_linears, draft.packed_linears

    def mtad(mode: str) -> tuple[list[list[int]], int]:
        model = tiny()
        model.lm_head = SubVocabHead(model.lm_head.weight, torch.arange(0, VOCAB, 2))
        head = FeatureHead(
            model.config,
            HeadSpec(taps=[1, 2, 3]),
            model.get_input_embeddings(),
            model.get_input_embeddings().weight.detach(),
            torch.arange(0, VOCAB, 2),
        ).bfloat16()
        target = ModelRunner(model, "target", feature_taps=[1, 2, 3], linears=mode)
        runner = HeadRunner(head.eval(), target, linears=mode)
        dec = Decoder(build_method("mtad", gamma=3, beam_width=4), target, runner)
        tokens = [dec.generate(prompt, 24, seed=s).token_ids for s in range(3)]
        return tokens, runner.packed_linears

    packed, n_target, n_draft = sps("auto")
    stock, s_target, s_draft = sps("stock")
    assert packed == stock
    assert n_target == linear_count(tiny()) and n_draft == linear_count(tiny("draft"))
    assert s_target == s_draft == 0
    head_packed, n_head = mtad("auto")
    head_stock, s_head = mtad("stock")
    assert head_packed == head_stock
    # fuse, fc, the layer's 7 projections and the logits over the sub-vocabulary
    assert (n_head, s_head) == (10, 0)


def test_a_weight_made_under_inference_mode_can_be_copied() -> None:
    """An inference tensor counts no versions: the derived copies key it without one (the
    transposed head copy raised 'Inference tensors do not track version counter' before)."""
    from mtad.engine.heads import CPUHeadLM
    from mtad.engine.packed import weight_key

    with torch.inference_mode():
        model = build_tiny_model("llama", "target", vocab_size=VOCAB, seed=3)
        w = model.get_output_embeddings().weight
        assert weight_key(w) == (w.data_ptr(), -1, tuple(w.shape))
        hidden = torch.randn(1, 2, w.shape[1])
        got = CPUHeadLM(model, kernel="copy").project(hidden)
        torch.testing.assert_close(got, F.linear(hidden, w))
    plain = torch.zeros(3, 2)
    before = weight_key(plain)
    plain.add_(1.0)
    assert weight_key(plain)[1] == before[1] + 1
