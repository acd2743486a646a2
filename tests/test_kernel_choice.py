"""CPU kernel choice by measurement (issue 22): the table, its file cache, and the kernels it
chooses between, which must all compute the same thing.

* every logits-head kernel equals ``F.linear`` within 1e-5 relative, float32 and bfloat16;
* both top-k kernels of the warping fast path give the generic warping bit for bit;
* the table keeps the fastest candidate, reuses its file, and ignores a corrupt or foreign one;
* ties straddling the top-p cut (bfloat16 logits) stay on the sparse candidate path.
"""

from __future__ import annotations

import json
import time

import pytest
import torch

from mtad.engine import _warping_cpu
from mtad.engine.heads import HEAD_KERNELS, CPUHeadLM
from mtad.engine.kernels import (
    CACHE_ENV,
    FORMAT,
    MORE_ROUNDS,
    ROUNDS,
    KernelTable,
    kernel_table,
    machine,
    time_candidates,
)
from mtad.engine.runner import ModelRunner
from mtad.engine.tiny import build_tiny_model
from mtad.engine.warping import (
    NEG_INF,
    WarpConfig,
    _top_k_mask,
    _top_p_drop,
    warp_candidates,
    warp_logprobs,
)


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Each test measures into its own cache file (never the user's)."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "kernels.json"))
    return tmp_path / "kernels.json"


@pytest.fixture(scope="module")
def wide_llama():
    return build_tiny_model("llama", "target", vocab_size=8192, seed=3)


def never(*_args) -> None:
    raise AssertionError("a cached choice was measured again")


def spinner(seconds: float):
    """A candidate that keeps the CPU busy for ``seconds`` of CPU time (and so of wall time)."""

    def spin() -> None:
        end = time.process_time() + seconds
        while time.process_time() < end:
            pass

    return spin


# ------------------------------------------------------------------ the head's kernels


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kernel", HEAD_KERNELS)
def test_every_head_kernel_gives_linear_logits(wide_llama, dtype, kernel):
    """Each kernel (and so the chosen one) equals F.linear in the head's dtype within 1e-5
    relative to the row's largest logit, for decoding row counts and beyond the measured
    range; in bfloat16 also within one rounding step of each logit (summed in another order,
    a float32 value near a rounding boundary lands on the neighbouring bf16 value: seen on an
    AVX2 CPU without native bf16, where both kernels were within 0.5 ulp of the exact
    product yet 1 ulp apart)."""
    model = build_tiny_model("llama", "target", vocab_size=8192, seed=3).to(dtype)
    weight = model.get_output_embeddings().weight
    head = CPUHeadLM(model, kernel=kernel)
    g = torch.Generator().manual_seed(0)
    for rows in (1, 2, 3, 5, 9, 70):
        hidden = torch.randn(1, rows, weight.shape[1], generator=g).to(dtype)
        with torch.inference_mode():
            got = head.project(hidden)
            want = torch.nn.functional.linear(hidden, weight)
        assert got.dtype == want.dtype and got.shape == want.shape and got.is_contiguous()
        scale = want.float().abs().amax(dim=-1, keepdim=True)
        tol = 1e-5 * scale
        if dtype == torch.bfloat16:  # one bf16 step of each logit (eps: 1 ulp at 1.0)
            tol = tol + torch.finfo(dtype).eps * want.float().abs()
        excess = ((got.float() - want.float()).abs() - tol).max()
        assert float(excess) <= 0, (kernel, dtype, rows, float(excess))


def test_head_chooses_by_measurement_and_records_it(wide_llama, private_cache):
    """The first projection of a row count measures (and caches) the kernels; the choice is
    the table's, listed per row count as metrics.json records it; a later head reads it back
    from the file without measuring."""
    table = KernelTable()
    head = CPUHeadLM(wide_llama, table=table)
    weight = wide_llama.get_output_embeddings().weight
    with torch.inference_mode():
        for rows in (1, 5, 1):
            head.project(torch.randn(1, rows, weight.shape[1]))
    keys = {rows: KernelTable.key("lm_head", weight.dtype, rows, *weight.shape) for rows in (1, 5)}
    assert head.kernels == {rows: table.choices[k] for rows, k in keys.items()}
    assert set(table.measured) == set(keys.values())  # measured once per row count
    for k in keys.values():  # the fastest by the timings taken (ms)
        assert table.choices[k] == min(table.measured[k], key=table.measured[k].get)
    if "copy" not in head.kernels.values():
        assert head._wt is None  # the transposed copy made for timing is not kept
    cached = KernelTable()
    assert cached.loaded_from_file and cached.choices == table.choices
    runner = ModelRunner(wide_llama, lm_head="fast")
    runner.net.table = cached
    with torch.inference_mode():
        runner.net.project(torch.randn(1, 5, weight.shape[1]))
    assert runner.lm_head_kernels == {"5": table.choices[keys[5]]} and not cached.measured


def test_prefill_rows_use_linear_unmeasured(wide_llama):
    table = KernelTable()
    head = CPUHeadLM(wide_llama, table=table)
    assert head.kernel_for(500) == "linear" and not table.measured


def test_bad_forced_kernel_is_refused(wide_llama):
    with pytest.raises(ValueError, match="kernel"):
        CPUHeadLM(wide_llama, kernel="fastest")


# ------------------------------------------------------------------ the table and its file


def test_table_keeps_the_fastest_and_reuses_its_file(private_cache):
    table = KernelTable()
    assert not table.loaded_from_file
    assert table.choose("op|x", {"slow": spinner(0.004), "fast": spinner(0.0)}) == "fast"
    assert table.measured["op|x"]["slow"] > table.measured["op|x"]["fast"]  # ms
    data = json.loads(private_cache.read_text())
    assert data == {"format": FORMAT, "machine": machine(), "choices": {"op|x": "fast"}}
    again = KernelTable()
    assert again.loaded_from_file
    assert again.choose("op|x", {"slow": never, "fast": never}) == "fast"
    # a cached name that is no longer a candidate is measured again
    assert again.choose("op|x", {"slow": spinner(0.004), "new": spinner(0.0)}) == "new"


@pytest.mark.parametrize(
    "content",
    [
        b"\x00\xff not json",
        b'{"format": 1, "machine": {"cpu": "Another CPU", "capability": "AVX2", '
        b'"torch": "0.0"}, "choices": {"op|x": "slow"}}',
        b'{"format": 0, "machine": null, "choices": {"op|x": "slow"}}',
        b'["op|x", "slow"]',
        b"",
    ],
    ids=["corrupt", "foreign", "old-format", "not-a-table", "empty"],
)
def test_corrupt_or_foreign_cache_is_ignored_and_rebuilt(private_cache, content):
    private_cache.write_bytes(content)
    table = KernelTable()
    assert not table.loaded_from_file and table.choices == {}
    assert table.choose("op|x", {"slow": spinner(0.004), "fast": spinner(0.0)}) == "fast"
    rebuilt = json.loads(private_cache.read_text())
    assert rebuilt["machine"] == machine() and rebuilt["choices"] == {"op|x": "fast"}


def test_foreign_entries_of_a_valid_file_are_kept_per_key(private_cache):
    """Keys carry dtype, shape and threads: another thread count is another choice."""
    table = KernelTable()
    table.choose(KernelTable.key("op", torch.float32, 3, 4), {"a": spinner(0.0)})
    torch.set_num_threads(2)
    try:
        key2 = KernelTable.key("op", torch.float32, 3, 4)
    finally:
        torch.set_num_threads(1)
    assert key2 not in table.choices and key2.endswith("|t2")


def test_close_calls_get_more_rounds():
    """Two candidates within 15% of each other are timed 1 + 4 + 8 times and compared by
    median; a clear winner's rival 1 + 4 times, by its best round (a fake clock: each call of a
    candidate advances it by that candidate's cost)."""
    now = [0.0]
    calls: dict[str, int] = {}

    def costing(name: str, seconds: float):
        def run() -> None:
            calls[name] = calls.get(name, 0) + 1
            now[0] += seconds

        return run

    def clock() -> float:
        return now[0]

    close = time_candidates({"a": costing("a", 1.0), "b": costing("b", 1.1)}, clock=clock)
    clear = time_candidates({"c": costing("c", 1.0), "d": costing("d", 2.0)}, clock=clock)
    assert calls == {"a": 13, "b": 13, "c": 5, "d": 5} and 1 + ROUNDS + MORE_ROUNDS == 13
    assert close == pytest.approx({"a": 1.0, "b": 1.1}) and clear == pytest.approx({"c": 1, "d": 2})


def test_unwritable_cache_keeps_choices_in_memory(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv(CACHE_ENV, str(blocker / "sub" / "kernels.json"))  # parent is a file
    table = kernel_table()
    assert table.choose("op|y", {"only": spinner(0.0)}) == "only"
    assert table.choices == {"op|y": "only"}


# ------------------------------------------------------------------ the warping kernels


def generic_warp(logits: torch.Tensor, warp: WarpConfig) -> torch.Tensor:
    """The device-independent path: full-vocabulary top-k mask and sort-based top-p."""
    warp = warp.scoring()
    logits = logits.float()
    if warp.temperature != 1.0:
        logits = logits / warp.temperature
    logits = _top_k_mask(logits, warp.top_k)
    if warp.top_p < 1.0:
        logits = logits.masked_fill(_top_p_drop(logits, warp.top_p), NEG_INF)
    return torch.log_softmax(logits, dim=-1)


@pytest.mark.parametrize("kernel", ["chunked", "topk"])
@pytest.mark.parametrize("warp", [WarpConfig(1.0, 10, 0.9), WarpConfig(0.7, 4, 0.5)])
def test_both_topk_kernels_give_the_generic_warp(kernel, warp, monkeypatch):
    """Vocabulary 8192 (128 chunks of 64): the chunked kernel applies; forced either way, the
    fast warping equals the generic one bit for bit, bfloat16 ties included."""
    monkeypatch.setattr(_warping_cpu, "_topk_kernel", _AlwaysKernel(kernel))
    g = torch.Generator().manual_seed(7)
    for trial in range(24):
        x = torch.randn(4, 8192, generator=g) * [0.5, 2.0, 6.0][trial % 3]
        if trial % 2:
            x = x.bfloat16()
        assert torch.equal(warp_logprobs(x, warp), generic_warp(x, warp)), (kernel, trial)


class _AlwaysKernel(dict):
    """A choice memo that answers one kernel for every shape."""

    def __init__(self, kernel: str) -> None:
        super().__init__()
        self.kernel = kernel

    def get(self, key, default=None):
        return self.kernel


def test_topk_kernel_is_measured_once_per_shape(monkeypatch):
    monkeypatch.setattr(_warping_cpu, "_topk_kernel", {})
    x = torch.randn(3, 8192)
    warp_candidates(x, WarpConfig(1.0, 10, 0.9))
    warp_candidates(x + 1, WarpConfig(1.0, 10, 0.9))
    (key,) = _warping_cpu._topk_kernel
    assert key[:4] == (3, 8192, 26, 10) and _warping_cpu._topk_kernel[key] in ("chunked", "topk")
    table = kernel_table()
    want = KernelTable.key("topk_rows", torch.float32, 3, 8192, 26, 10)
    assert table.choices == {want: _warping_cpu._topk_kernel[key]}


def test_ties_straddling_the_top_p_cut_stay_sparse():
    """Equal values across the top-p cut: the lower token ids are kept (the generic path's
    stable order), on the sparse candidates as on the dense rows."""
    x = torch.randn(2, 4096, generator=torch.Generator().manual_seed(8)) * 0.01 - 5.0
    x[:, [900, 40, 3000, 7]] = 2.0  # four equal top values: top-p 0.6 keeps three of them
    x[1, 11] = 3.0
    warp = WarpConfig(1.0, 6, 0.6)
    c = warp_candidates(x, warp)
    dense = warp_logprobs(x, warp)
    assert not c.dense
    assert torch.equal(torch.isfinite(dense), torch.isfinite(generic_warp(x, warp)))
    assert torch.isfinite(dense[0]).nonzero().flatten().tolist() == [7, 40, 900]
    assert torch.isfinite(dense[1]).nonzero().flatten().tolist() == [7, 11, 40]
    torch.testing.assert_close(c.to_dense(4096), dense, rtol=0, atol=2e-6)
