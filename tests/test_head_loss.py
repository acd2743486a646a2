"""The head's training loss (mtad_train.head_train.head_loss): its fused row statistics give
the loss and the gradient that plain autograd over the whole float32 rows gives.

The reference below is the loss as written before the fusion (issue 39): ``logits.float()``,
``logsumexp``, ``gather`` and ``topk`` on whole rows, differentiated by autograd."""

from __future__ import annotations

import pytest
import torch

from mtad_train import objectives as O
from mtad_train.head_train import chunk_rows, head_loss, row_stats


def reference_loss(logits, t_ids, t_logp, cols, overlap_weight, kl_weight):
    lf = logits.float()
    lse = torch.logsumexp(lf, dim=-1, keepdim=True)
    c = t_ids if cols is None else cols[t_ids]
    present = c >= 0
    log_q = lf.gather(-1, c.clamp_min(0)) - lse
    p = torch.where(present, t_logp.exp(), 0.0)
    q = torch.where(present, log_q.exp(), 0.0)
    p_rest = (1.0 - p.sum(-1)).clamp_min(1e-6)
    q_rest = (1.0 - q.sum(-1)).clamp_min(1e-6)
    kl = (p * (t_logp - torch.where(present, log_q, 0.0))).sum(-1)
    kl = kl + p_rest * (p_rest.log() - q_rest.log())
    warp = O.AUTHORS_WARP
    idx, p_w = O.target_sparse(t_logp, warp)
    pc = c.gather(-1, idx)
    q_vals = lf.topk(warp.top_k, dim=-1).values
    probs = torch.softmax(q_vals.detach(), dim=-1)
    keep = (probs.cumsum(-1) - probs) < warp.top_p
    q_logz = torch.logsumexp(q_vals.masked_fill(~keep, float("-inf")), dim=-1, keepdim=True)
    thr = q_vals.detach().masked_fill(~keep, float("inf")).min(-1, keepdim=True).values
    q_at = lf.gather(-1, pc.clamp_min(0))
    q_w = torch.where((q_at >= thr) & (pc >= 0), (q_at - q_logz).exp(), 0.0)
    overlap = torch.minimum(p_w, q_w).sum(-1)
    return kl_weight * kl + overlap_weight * (1.0 - overlap), kl, overlap


def _case(n: int, dtype: torch.dtype, seed: int = 0):
    """Compact logits over 300 of a 500-token vocabulary, the target's top-20 drawn around the
    draft's own preferences (so the warped sets overlap), some ids outside the compact rows."""
    gen = torch.Generator().manual_seed(seed)
    vocab, compact = 500, 300
    vocab_ids = torch.randperm(vocab, generator=gen)[:compact]
    cols = torch.full((vocab,), -1, dtype=torch.long)
    cols[vocab_ids] = torch.arange(compact)
    logits = (3 * torch.randn(n, compact, generator=gen)).to(dtype)
    noisy = logits.float() + torch.randn(n, compact, generator=gen)
    full = torch.full((n, vocab), -30.0)
    full[:, vocab_ids] = noisy
    full[:, :40] += 4 * torch.rand(n, 40, generator=gen)  # some of them outside the rows
    t_logp, t_ids = full.log_softmax(-1).topk(20, dim=-1)
    return logits, t_ids, t_logp, cols


ROWS = chunk_rows(300)  # rows of a chunk at the test's 300 columns


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [1, ROWS - 1, 3 * ROWS + 5])
def test_the_fused_loss_gives_autograds_loss_and_gradient(n, dtype):
    logits, t_ids, t_logp, cols = _case(n, dtype)
    weights = torch.rand(n, generator=torch.Generator().manual_seed(1))
    outs, grads = [], []
    for fn in (head_loss, reference_loss):
        x = logits.clone().requires_grad_(True)
        loss, kl, ov = fn(x, t_ids, t_logp, cols, 0.3, 0.7)
        (weights * loss).sum().backward()
        outs.append((loss.detach(), kl.detach(), ov.detach()))
        grads.append(x.grad.float())
    assert grads[0].dtype == torch.float32 and grads[0].abs().sum() > 0
    for got, want in zip(outs[0], outs[1], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # the gradient comes back in the logits' dtype: bfloat16 rounds both alike
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(grads[0], grads[1], rtol=tol, atol=tol)
    assert (ov > 0).any() and (ov < 1).any()


def test_row_stats_without_some_gradients_and_the_full_vocabulary():
    logits, t_ids, _, _ = _case(40, torch.float32, seed=2)
    x = logits.clone().requires_grad_(True)
    lse, at, top = row_stats(x, t_ids.clamp_max(logits.shape[1] - 1), 10)
    torch.testing.assert_close(lse, torch.logsumexp(logits, -1))
    torch.testing.assert_close(top, logits.topk(10, -1).values)
    top.sum().backward()  # only the top-k is used: a one on each row's 10 largest
    want = torch.zeros_like(logits).scatter_(-1, logits.topk(10, -1).indices, 1.0)
    torch.testing.assert_close(x.grad, want)


@pytest.mark.parametrize(
    ("rows", "width", "k"), [(3, 12289, 10), (5, 49152, 20), (4, 640, 10), (2, 100, 10)]
)
def test_blocked_topk_is_torchs_topk(rows, width, k):
    """The k largest of each row, sorted, with their columns: whole blocks only, a tail after
    the last block, rows too narrow to block (torch's own top-k), and rows whose top values
    crowd into one block or sit in the tail."""
    from mtad_train.head_train import blocked_topk

    gen = torch.Generator().manual_seed(width)
    x = 3 * torch.randn(rows, width, generator=gen)
    x[0, 64 : 64 + k] += 50.0  # the row's k largest in one block
    x[-1, -1] += 60.0  # the largest in the tail
    want = torch.topk(x, k, dim=-1)
    values, indices = blocked_topk(x, k)
    torch.testing.assert_close(values, want.values, rtol=0, atol=0)
    assert torch.equal(indices, want.indices)


def test_blocked_topk_with_ties_gives_the_values_and_columns_holding_them():
    from mtad_train.head_train import blocked_topk

    x = torch.zeros(2, 4096)
    x[:, ::512] = 1.0  # eight equal maxima in eight blocks, the rest tied at zero
    values, indices = blocked_topk(x, 10)
    torch.testing.assert_close(values, torch.topk(x, 10, dim=-1).values, rtol=0, atol=0)
    assert torch.equal(x.gather(-1, indices), values)
    assert all(len(set(row.tolist())) == 10 for row in indices)  # distinct columns
