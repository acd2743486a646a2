"""One host synchronisation per iteration for the linear draft methods (issue 37).

On a GPU each host read stalls the device; the decoding loop's rule (``mtad/engine/loop.py``)
is one read per iteration: the accepted length and the committed tokens together. Counted on
the CPU by ``tests/host_syncs.py`` on the GPU's code path (no CPU-only fast path applies).
"""

from __future__ import annotations

import pytest
import torch
from host_syncs import HostReads, count_per_iteration, gpu_path_warp
from method_params import METHOD_PARAMS

from mtad.engine import Decoder, ModelRunner
from mtad.engine.warping import Candidates, WarpConfig, warp_candidates
from mtad.methods import build_method
from mtad.methods.blockverify import next_token_distribution, verification_plan
from mtad.methods.sps import normalized_residual, residual_candidates, residual_or_bonus

PROMPT = [5, 17, 3, 42, 8, 99, 12]
GREEDY = {"temperature": 0.0, "top_k": 0, "top_p": 1.0}
SAMPLED = {"temperature": 1.0, "top_k": 0, "top_p": 0.9}
assert gpu_path_warp().top_k == SAMPLED["top_k"] and gpu_path_warp().top_p == SAMPLED["top_p"]


@pytest.mark.parametrize("method", ["ar", "sps", "blockverify", "mtad"])
@pytest.mark.parametrize("warp", [SAMPLED, GREEDY], ids=["sampled", "greedy"])
def test_one_host_read_per_iteration(tiny_llama, method: str, warp: dict) -> None:  # noqa: ANN001
    target, draft = tiny_llama
    dec = Decoder(
        build_method(method, **{**METHOD_PARAMS[method], **warp}),
        ModelRunner(target, "target"),
        ModelRunner(draft, "draft"),
    )
    count = count_per_iteration(dec, PROMPT, 24)
    assert count.setup == 0, count.sites
    assert set(count.reads) == {1}, count.sites  # the commit reads nothing again
    assert not any("_warping_cpu" in s for s in count.sites), count.sites  # the GPU's path
    # the time split waits for the GPU once per phase (draft, verify): no read, GPU only
    assert set(count.timer_syncs) == {1 if method == "ar" else 2}


def test_the_counter_sees_reads_and_data_sized_ops() -> None:
    x = torch.tensor([0.5, -1.0, 2.0])
    with HostReads() as mode:
        float(x[0])
        x.tolist()
        bool((x > 0).any())
        x[x > 0]
        (x > 0).nonzero()
        x + 1  # not a read
    assert [op for op, _ in mode.events] == [
        "__float__",
        "tolist",
        "__bool__",
        "__getitem__[bool]",
        "nonzero",
    ]


def _rows(shape: tuple[int, ...], seed: int, top_k: int) -> Candidates:
    gen = torch.Generator().manual_seed(seed)
    warp = WarpConfig(1.0, top_k, 0.9)
    return warp_candidates(torch.randn(shape, generator=gen) * 2, warp)


@pytest.mark.parametrize("top_k", [0, 8], ids=["dense", "sparse"])
def test_next_token_rows_chosen_on_the_device_equal_the_host_choice(top_k: int) -> None:
    """SpS's and block verification's next-token row picked by a 0-d ``k`` on the device is,
    value for value, the row the host picked from an int ``k``: the same samples follow."""
    g, vocab = 3, 64
    p, q = _rows((g + 1, vocab), 1, top_k), _rows((g, vocab), 2, top_k)
    x = torch.tensor([3, 9, 27])
    _, resid, mass = verification_plan(p, q, x)
    for k in range(g + 1):
        # SpS: the host's choice, then the device's
        host = residual_candidates(p[k], q[k]) if k < g else p[g]
        device = residual_or_bonus(p, q, torch.tensor(k))
        assert torch.equal(device.to_dense(vocab), host.to_dense(vocab)), k
        for seed in range(3):
            draws = [d.sample(torch.Generator().manual_seed(seed)) for d in (host, device)]
            assert int(draws[0]) == int(draws[1]), (k, seed)
        # block verification: the weighted residual of row k, or the bonus row
        row = p[k]
        bv_host = (
            Candidates(row.tokens, normalized_residual(resid[k], mass[k], row.logp), row.dense)
            if k < g
            else p[g]
        )
        bv_device = next_token_distribution(p, resid, mass, torch.tensor(k))
        assert torch.equal(bv_device.to_dense(vocab), bv_host.to_dense(vocab)), k
