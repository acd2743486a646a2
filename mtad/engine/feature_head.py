"""A feature-level draft head: one decoder layer over the target's hidden states (EAGLE).

Li et al., "EAGLE: Speculative Sampling Requires Rethinking Feature Uncertainty" (ICML 2024);
EAGLE-2 (EMNLP 2024) drafts with the same head; EAGLE-3 (Li et al. 2025) fuses low, middle and
high target layers and trains the head on its own outputs ("training-time test", as HASS, Zhang
et al. 2024, does with its harmonised context alignment). This module is the head itself; the
draft contract around it is :class:`mtad.engine.head_runner.HeadRunner`, training is
:mod:`mtad_train.head_train`.

Position ``i`` of the head reads token ``t_i`` and a feature of position ``i - 1``: the target's
(fused) hidden state ``g_{i-1}`` where the target has computed it, else the head's own output
``a_{i-1}`` (when drafting past what the target verified). Its output ``a_i`` gives the draft's
distribution of ``t_{i+1}`` through the target's own final norm convention and frozen logits head
(restricted to a frequency-ranked sub-vocabulary, FR-Spec, Zhao et al. 2025, where the head folder
carries one: other tokens get probability zero, so lossless methods stay exact)::

    x_i = fc([embed(t_i); g_{i-1} or a_{i-1}])      a_i = layer(x_i | x_<i)
    q(t_{i+1}) = softmax(lm_head(norm(a_i)))

Two layouts load into this class (``HeadSpec``): ours (three tapped target layers fused by a
learned ``fuse`` projection, an input norm, a final norm), and the published EAGLE-1/2 heads
(the target's final normed hidden state as the feature, no fusion, layer 0 without its input
norm, no final norm, ``fc`` with a bias), so ``yuhuili/EAGLE-llama2-chat-7B`` & co. load through
the same code. The decoder layer is transformers' ``LlamaDecoderLayer`` (its parameters, its
rotary embedding); attention is computed here, so that training can attend across draft depths
(:func:`mtad_train.unroll.unrolled`) and inference can keep its own cache (``HeadRunner``'s
:class:`~mtad.engine.head_runner.BucketedKV`, or a transformers ``DynamicCache``).
"""

from __future__ import annotations

import copy
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.llama.modeling_llama import (
    LlamaDecoderLayer,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

from mtad.engine.features import FINAL_NORM_TAP
from mtad.engine.packed import PackedWeight, linear
from mtad.engine.spec import HEAD_CONFIG_FILE as HEAD_CONFIG


@dataclass
class HeadSpec:
    """The layout of a head (saved as ``head_config.json`` beside its weights)."""

    taps: list[int] = field(default_factory=lambda: [2, 15, 28])
    fuse: bool = True  # a learned projection of the taps (EAGLE-3); False: exactly one tap
    input_norm: bool = True  # the layer's input RMSNorm (EAGLE-1/2's layer 0 has none)
    final_norm: bool = True  # an RMSNorm before the logits head (EAGLE-1/2: none)
    fc_bias: bool = False  # EAGLE-1/2's fc has a bias
    # each tapped decoder layer's output divided by its RMS before ``fuse`` (the final normed
    # state, tap -1, is read as it is): a decoder layer's output is the raw residual stream,
    # whose massive activations (SmolLM2-135M layer 15: RMS up to ~1,000 at the first position
    # against ~2 for the final normed state; Sun et al. 2024, "Massive Activations in Large
    # Language Models") swamp a fusion started from the final state alone: one step of a fresh
    # optimiser took the training overlap from 0.69 to 0.37 (notes.md, 2026-12-05)
    tap_norm: bool = False
    layout: str = "mtad"  # "mtad" or "eagle" (published EAGLE-1/2 checkpoints)

    def __post_init__(self) -> None:
        if not self.taps:
            raise ValueError("head: taps must name at least one target layer")
        if not self.fuse and len(self.taps) != 1:
            raise ValueError(f"head: without fuse exactly one tap is read, got {self.taps}")
        if self.layout not in ("mtad", "eagle"):
            raise ValueError(f"head: layout must be 'mtad' or 'eagle', got {self.layout!r}")


def rms_normalised_taps(tapped: torch.Tensor, taps: list[int], eps: float) -> torch.Tensor:
    """``tapped`` ``[..., taps, d]`` with each decoder layer's slot divided by its RMS (in
    float32, back in the input's dtype); the final normed state's slot (tap -1) unchanged."""
    x = tapped.float()
    scale = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    keep = torch.tensor([t == FINAL_NORM_TAP for t in taps], device=x.device)[:, None]
    return torch.where(keep, x, x * scale).to(tapped.dtype)


class FeatureHead(nn.Module):
    """The head's own parameters plus (unregistered, frozen) the target's embeddings and logits
    head; ``vocab_ids`` restricts the logits to a sub-vocabulary (compact rows)."""

    def __init__(
        self,
        target_config: Any,
        spec: HeadSpec,
        embed: nn.Module,
        lm_head_weight: torch.Tensor,
        vocab_ids: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        cfg = copy.deepcopy(target_config)
        cfg.num_hidden_layers = 1
        self.config = cfg
        self.spec = spec
        d = cfg.hidden_size
        self.fuse = nn.Linear(len(spec.taps) * d, d, bias=False) if spec.fuse else None
        self.fc = nn.Linear(2 * d, d, bias=spec.fc_bias)
        self.layers = nn.ModuleList([LlamaDecoderLayer(cfg, layer_idx=0)])
        self.norm = LlamaRMSNorm(d, eps=cfg.rms_norm_eps) if spec.final_norm else None
        self.rotary_emb = LlamaRotaryEmbedding(cfg)
        # the target's, shared and frozen: kept out of the state dict (a tuple hides them); an
        # FR-Spec sub-vocabulary gets its rows copied once, in ascending id order (column j of
        # the compact logits is token vocab_ids[j], as in mtad.engine.subvocab.SubVocabHead)
        self.vocab_size = int(lm_head_weight.shape[0])
        if vocab_ids is not None:
            vocab_ids = vocab_ids.to(torch.long).sort().values
            rows = lm_head_weight.detach().index_select(0, vocab_ids.to(lm_head_weight.device))
        else:
            rows = lm_head_weight
        self._frozen = (embed, rows)
        self.register_buffer("vocab_ids", vocab_ids, persistent=False)
        self.pack: PackedWeight | None = None  # set by mtad.engine.packed.set_linears
        attn = self.layers[0].self_attn
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.head_dim = attn.head_dim
        self.scaling = attn.scaling

    # --- pieces -------------------------------------------------------------------------------
    @property
    def embed(self) -> nn.Module:
        return self._frozen[0]

    @property
    def head_weight(self) -> torch.Tensor:
        """Rows of the logits head the draft projects onto (all, or the sub-vocabulary)."""
        return self._frozen[1]

    packs_projection = True
    projection_weight = head_weight

    def _apply(self, fn, recurse=True):  # .to(): move the frozen shared tensors along
        out = super()._apply(fn, recurse)
        embed, rows = self._frozen
        self._frozen = (embed, fn(rows) if rows.is_floating_point() else rows)
        return out

    def fused(self, tapped: torch.Tensor) -> torch.Tensor:
        """``[..., taps, d]`` target features -> ``[..., d]``."""
        if self.fuse is None:
            return tapped[..., 0, :]
        if self.spec.tap_norm:
            tapped = rms_normalised_taps(tapped, self.spec.taps, self.config.rms_norm_eps)
        return self.fuse(tapped.flatten(-2).to(self.fuse.weight.dtype))

    def layer_input(self, tokens: torch.Tensor, feature: torch.Tensor) -> torch.Tensor:
        e = self.embed(tokens).to(self.fc.weight.dtype)
        return self.fc(torch.cat([e, feature.to(e.dtype)], dim=-1))

    def logits(self, a: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        h = self.norm(a) if self.norm is not None else a
        if weight is not None:
            return F.linear(h.to(weight.dtype), weight)
        w = self.head_weight
        return linear(h.to(w.dtype), w, pack=self.pack)

    def _qkv(self, x: torch.Tensor, positions: torch.Tensor):
        layer = self.layers[0]
        attn = layer.self_attn
        h = layer.input_layernorm(x) if self.spec.input_norm else x
        b, n, _ = x.shape
        q = attn.q_proj(h).view(b, n, self.n_heads, self.head_dim).transpose(1, 2)
        k = attn.k_proj(h).view(b, n, self.n_kv, self.head_dim).transpose(1, 2)
        v = attn.v_proj(h).view(b, n, self.n_kv, self.head_dim).transpose(1, 2)
        cos, sin = self.rotary_emb(
            x,
            positions.expand(b, -1)
            if positions.dim() == 2
            else positions.view(1, -1).expand(b, -1),
        )
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        return q, k, v

    def _finish(self, x: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        """Residual, output projection and MLP after attention (``attn_out`` ``[b, H, n, hd]``)."""
        layer = self.layers[0]
        b, _, n, _ = attn_out.shape
        o = layer.self_attn.o_proj(attn_out.transpose(1, 2).reshape(b, n, -1))
        x = x + o
        return x + layer.mlp(layer.post_attention_layernorm(x))

    def _grouped_attention(self, q, k, v, total: int) -> torch.Tensor:
        """Attention of a few query rows with grouped key/value heads, as plain matmuls: the
        query heads sharing a key/value head are stacked as rows, so the cache is read as it is
        (no repeated copy) and no flash-kernel set-up is paid (on a CPU, 4 beams x 300 keys in
        bfloat16: a fraction of a millisecond against ~1.2 ms for SDPA). The queries are the
        last ``n`` of the ``total`` cached positions: keys at or after ``total`` (a bucketed
        cache's padding) are masked, and each query sees the new positions up to its own."""
        b, h, n, hd = q.shape
        g = h // self.n_kv
        qg = q.reshape(b, self.n_kv, g * n, hd)
        scores = torch.matmul(qg, k.transpose(-1, -2)).float() * self.scaling
        # two slices filled in place: cheaper than a mask over every key (0.05 of ~0.25 ms here)
        if scores.shape[-1] > total:
            scores[..., total:] = float("-inf")
        if n > 1:  # row (head j, query i) sees new position m only for m <= i
            later = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1).repeat(g, 1)
            scores[..., total - n : total].masked_fill_(later, float("-inf"))
        out = torch.matmul(torch.softmax(scores, dim=-1).to(v.dtype), v)
        return out.reshape(b, h, n, hd)

    def _repeat_kv(self, t: torch.Tensor) -> torch.Tensor:
        g = self.n_heads // self.n_kv
        return t if g == 1 else t.repeat_interleave(g, dim=1)

    # --- inference: one chain of positions after a cache ---------------------------------------
    def step(self, x: torch.Tensor, positions: torch.Tensor, cache: Any) -> torch.Tensor:
        """The layer over ``x`` ``[rows, n, d]`` at absolute ``positions`` ``[n]``, attending to
        the ``cache`` (a transformers ``DynamicCache`` or :class:`~mtad.engine.head_runner.
        BucketedKV`, appended to) and causally within ``x``."""
        q, k, v = self._qkv(x, positions)
        k_all, v_all = cache.update(k, v, 0)
        # a cache may return longer buffers than it holds (HeadRunner's BucketedKV: the keys
        # at or after its length are masked)
        n, total, keys = x.shape[1], cache.get_seq_length(0), k_all.shape[-2]
        if x.device.type == "cpu":
            out = self._grouped_attention(q, k_all, v_all, total)
        else:
            mask = None
            if n > 1 or keys > total:
                mask = torch.ones(n, keys, dtype=torch.bool, device=x.device).tril(total - n)
            out = F.scaled_dot_product_attention(
                q,
                self._repeat_kv(k_all),
                self._repeat_kv(v_all),
                attn_mask=mask,
                scale=self.scaling,
            )
        return self._finish(x, out)

    # --- a new head ------------------------------------------------------------------------------
    @classmethod
    def from_target(
        cls,
        target: nn.Module,
        spec: HeadSpec,
        vocab_ids: torch.Tensor | None = None,
        seed: int = 0,
    ) -> FeatureHead:
        """A new head for ``target``, its layer a copy of the target's last layer.

        * Reading the final normed state (tap -1, EAGLE-1/2's feature, no final norm): ``fc``
          passes the feature through and the layer starts as the identity (its output
          projections zero), so the head starts by repeating the previous position's state
          and its regression onto the next one (:mod:`mtad_train.head_train`) starts small.
        * Reading fused tapped layers: ``fuse`` selects the last tap (the input of the target's
          last layer for the default taps) and the copied layer and final norm run on it.

        The token embedding enters ``fc`` with small random weights."""
        from mtad.engine.features import decoder_layers, final_norm

        target.requires_grad_(False)  # frozen: its embeddings and logits head are shared
        head = cls(
            target.config,
            spec,
            target.get_input_embeddings(),
            target.get_output_embeddings().weight.detach(),
            vocab_ids,
        )
        head = head.to(torch.float32)
        d = target.config.hidden_size
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            if head.fuse is not None:
                head.fuse.weight.zero_()
                head.fuse.weight[:, -d:] = torch.eye(d)
            head.fc.weight.zero_()
            head.fc.weight[:, :d] = torch.randn(d, d, generator=gen) * (0.02 / d**0.5)
            head.fc.weight[:, d:] = torch.eye(d)
            if head.fc.bias is not None:
                head.fc.bias.zero_()
            layer = head.layers[0]
            layer.load_state_dict(decoder_layers(target)[-1].state_dict())
            if spec.taps == [FINAL_NORM_TAP]:
                layer.self_attn.o_proj.weight.zero_()
                layer.mlp.down_proj.weight.zero_()
            if head.norm is not None:
                head.norm.load_state_dict(final_norm(target).state_dict())
        return head

    # --- saving and loading ---------------------------------------------------------------------
    def save(self, folder: str | Path, extra: dict[str, Any] | None = None) -> None:
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().contiguous() for k, v in self.state_dict().items()}
        save_file(state, str(folder / "model.safetensors"))
        cfg = {"head": asdict(self.spec), "layer": _layer_config(self.config)}
        cfg.update(extra or {})
        (folder / HEAD_CONFIG).write_text(json.dumps(cfg, indent=2) + "\n")


LAYER_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "rms_norm_eps",
    "hidden_act",
    "attention_bias",
    "mlp_bias",
    "rope_parameters",
    "max_position_embeddings",
    "vocab_size",
)


def _layer_config(cfg: Any) -> dict[str, Any]:
    d = cfg.to_dict()
    return {k: d[k] for k in LAYER_KEYS if k in d}


def is_head_folder(folder: str | Path) -> bool:
    """A folder holding a head: ours (``head_config.json``) or an EAGLE-1/2 checkpoint (a
    ``config.json`` of one layer with ``pytorch_model.bin`` / ``model.safetensors`` holding
    ``fc.weight``)."""
    folder = Path(folder)
    if (folder / HEAD_CONFIG).is_file():
        return True
    return _eagle_state_file(folder) is not None


def _eagle_state_file(folder: Path) -> Path | None:
    cfg = folder / "config.json"
    if not cfg.is_file():
        return None
    try:
        if json.loads(cfg.read_text()).get("num_hidden_layers") != 1:
            return None
    except ValueError:
        return None
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (folder / name).is_file():
            return folder / name
    return None


def load_head(
    folder: str | Path,
    target: nn.Module,
    vocab_ids: list[int] | None = None,
) -> FeatureHead:
    """A head for ``target`` (a loaded causal LM) from ``folder``, in the target's dtype and on
    its device; our layout or an EAGLE-1/2 checkpoint (keys ``fc.*``, ``layers.0.*``; an
    ``embed_tokens.weight`` there is ignored: the target's embeddings are used)."""
    folder = Path(folder)
    tcfg = target.config
    if (folder / HEAD_CONFIG).is_file():
        saved = json.loads((folder / HEAD_CONFIG).read_text())
        spec = HeadSpec(**saved["head"])
        _check_layer(saved.get("layer", {}), tcfg, folder)
        state = _read_state(folder / "model.safetensors")
    else:
        path = _eagle_state_file(folder)
        if path is None:
            raise FileNotFoundError(f"{folder}: no {HEAD_CONFIG} and no EAGLE checkpoint")
        raw = _read_state(path)
        spec = HeadSpec(
            taps=[FINAL_NORM_TAP],
            fuse=False,
            input_norm=False,
            final_norm=False,
            fc_bias="fc.bias" in raw,
            layout="eagle",
        )
        _check_layer(json.loads((folder / "config.json").read_text()), tcfg, folder)
        state = {k: v for k, v in raw.items() if k.startswith(("fc.", "layers.0."))}
    emb, weight = target.get_input_embeddings(), target.get_output_embeddings().weight
    ids = None
    if vocab_ids is not None:
        ids = torch.tensor(vocab_ids, dtype=torch.long, device=weight.device)
    head = FeatureHead(tcfg, spec, emb, weight, ids)
    missing, unexpected = head.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.startswith("rotary_emb")]
    if spec.layout == "eagle":  # EAGLE-1/2 layer 0 has no input norm: its weight is unused
        missing = [k for k in missing if "input_layernorm" not in k]
    if missing or unexpected:
        raise ValueError(
            f"{folder}: head weights do not match: missing {missing}, unexpected {unexpected}"
        )
    return head.to(device=weight.device, dtype=weight.dtype).eval().requires_grad_(False)


def _read_state(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    return torch.load(path, map_location="cpu", weights_only=True)


def _check_layer(saved: dict[str, Any], tcfg: Any, folder: Path) -> None:
    for key in ("hidden_size", "num_attention_heads", "num_key_value_heads", "vocab_size"):
        want, got = getattr(tcfg, key, None), saved.get(key)
        if got is not None and want is not None and int(got) != int(want):
            raise ValueError(f"{folder}: head {key} {got} does not match the target's {want}")
