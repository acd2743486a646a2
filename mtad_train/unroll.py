"""Training-time test: a feature head unrolled over a whole sequence at every draft depth.

EAGLE-3 (Li et al. 2025) and HASS (Zhang et al. 2024) train a head on its own outputs: at depth
``k`` the head reads what it drafted itself at depth ``k - 1``, with the attention the draft has
at that point. :func:`unrolled` computes every position at every depth in parallel, from the
head's own pieces (its layer input, projections, rotary embedding and MLP:
:class:`mtad.engine.feature_head.FeatureHead`); inference runs the same layer one chain at a
time through :meth:`~mtad.engine.feature_head.FeatureHead.step` and a cache, and
``tests/test_feature_head.py`` checks the two agree.
"""

from __future__ import annotations

import torch

from mtad.engine.feature_head import FeatureHead


def unrolled(
    head: FeatureHead, tokens: torch.Tensor, feats: torch.Tensor, depths: int
) -> list[torch.Tensor]:
    """Outputs ``a`` of every position at draft depths ``1..depths`` (training-time test).

    ``tokens`` ``[b, L]``, ``feats`` ``[b, L, d]`` the fused target feature of each position.
    Depth 1 reads true features (``g_{i-1}``); depth ``k`` at position ``i`` is what the head
    computes when the target has verified up to position ``i - k + 1``: its input reads the
    head's own depth-``k-1`` output at ``i - 1``, and it attends to the depth-1 entries of
    positions ``<= i - k + 1`` plus the entries its own chain wrote at positions
    ``i - k + 2 .. i`` (depth ``m`` at position ``i - k + m``), exactly the cache the draft
    holds at that point (:meth:`FeatureHead.step`). Outputs at positions ``i < k - 1`` are
    meaningless (no chain starts before position 0); callers weight them zero.
    """
    b, L = tokens.shape
    pos = torch.arange(L, device=tokens.device)
    zero = feats.new_zeros(b, 1, feats.shape[-1])
    prev = torch.cat([zero, feats[:, :-1]], dim=1)
    causal = torch.ones(L, L, dtype=torch.bool, device=tokens.device).tril()
    keys, values, outs = [], [], []
    for k in range(1, depths + 1):
        x = head.layer_input(tokens, prev)
        q, kk, vv = head._qkv(x, pos)
        keys.append(head._repeat_kv(kk))
        values.append(head._repeat_kv(vv))
        # scores against depth-1 keys of positions j <= i - (k - 1)
        s1 = torch.matmul(q, keys[0].transpose(-1, -2)) * head.scaling  # [b, H, L, L]
        allow = causal if k == 1 else torch.ones_like(causal).tril(-(k - 1))
        s1 = s1.masked_fill(~allow, torch.finfo(s1.dtype).min)
        diag_s, diag_v = [], []
        for m in range(2, k + 1):  # the chain's own entries: depth m at position i - (k - m)
            shift = k - m
            km, vm = _shift_right(keys[m - 1], shift), _shift_right(values[m - 1], shift)
            diag_s.append((q * km).sum(-1, keepdim=True) * head.scaling)  # [b, H, L, 1]
            diag_v.append(vm)
        if diag_s:
            valid = pos[None, None, :, None] >= (k - 1)
            ds = torch.cat(diag_s, dim=-1).masked_fill(~valid, torch.finfo(s1.dtype).min)
            p = torch.softmax(torch.cat([s1, ds], dim=-1).float(), dim=-1).to(q.dtype)
            out = torch.matmul(p[..., :L], values[0])
            for j, vm in enumerate(diag_v):
                out = out + p[..., L + j : L + j + 1] * vm
        else:
            p = torch.softmax(s1.float(), dim=-1).to(q.dtype)
            out = torch.matmul(p, values[0])
        a = head._finish(x, out)
        outs.append(a)
        prev = torch.cat([zero.to(a.dtype), a[:, :-1]], dim=1)
    return outs


def _shift_right(t: torch.Tensor, shift: int) -> torch.Tensor:
    """``t`` ``[b, H, L, hd]`` moved ``shift`` positions later along L (zeros in front)."""
    if shift == 0:
        return t
    pad = t.new_zeros(*t.shape[:2], shift, t.shape[-1])
    return torch.cat([pad, t[:, :, :-shift]], dim=2)
