"""Forward hooks that read a target's hidden states: what a feature-level draft head reads.

:class:`FeatureTap` keeps the outputs of chosen decoder layers of the last forward (tap ``-1``:
the final normed hidden state, the feature EAGLE-1/2 heads read), for the engine's
:class:`~mtad.engine.runner.FeatureStore` and for the teacher-forced training pass
(:mod:`mtad_train.features`). Hooks cost nothing but a reference per forward.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

FINAL_NORM_TAP = -1


class FeatureTap:
    """Forward hooks on decoder layers that keep each layer's output of the last forward."""

    def __init__(self, model: torch.nn.Module, taps: Sequence[int]) -> None:
        self.taps = tuple(int(t) for t in taps)
        layers = decoder_layers(model)
        bad = [t for t in self.taps if not (0 <= t < len(layers) or t == FINAL_NORM_TAP)]
        if bad:
            raise ValueError(f"taps: layers {bad} out of range for a {len(layers)}-layer model")
        self.outputs: dict[int, torch.Tensor] = {}
        modules = {t: final_norm(model) if t == FINAL_NORM_TAP else layers[t] for t in self.taps}
        self._handles = [m.register_forward_hook(self._hook(t)) for t, m in modules.items()]

    def _hook(self, layer: int):
        def keep(_module, _inputs, output):
            self.outputs[layer] = output[0] if isinstance(output, tuple) else output

        return keep

    def take(self) -> torch.Tensor:
        """``[rows, n, len(taps), hidden]`` of the last forward (then forgotten)."""
        out = torch.stack([self.outputs.pop(t) for t in self.taps], dim=-2)
        self.outputs.clear()
        return out

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The decoder layers of a causal LM (Llama-style ``model.model.layers`` or OPT-style
    ``model.model.decoder.layers``)."""
    base = getattr(model, "model", model)
    for owner in (base, getattr(base, "decoder", None)):
        layers = getattr(owner, "layers", None)
        if isinstance(layers, torch.nn.ModuleList):
            return layers
    raise ValueError(f"{type(model).__name__}: no decoder layers found for a feature tap")


def final_norm(model: torch.nn.Module) -> torch.nn.Module:
    """The norm applied to the last layer's output before the logits head."""
    base = getattr(model, "model", model)
    for owner in (base, getattr(base, "decoder", None)):
        norm = getattr(owner, "norm", None) or getattr(owner, "final_layer_norm", None)
        if isinstance(norm, torch.nn.Module):
            return norm
    raise ValueError(f"{type(model).__name__}: no final norm found for a feature tap")
