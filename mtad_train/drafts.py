"""The models of a distillation: the target (frozen) and the drafts built to match it.

A draft is a small ``LlamaForCausalLM`` with the target's vocabulary and tied embeddings,
described by a :class:`DraftSpec` (``--drafts`` on the command line); its input embeddings
start from the target's top principal directions (``--init-embed pca``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import load_file

from mtad.engine.subvocab import VOCAB_FILE, read_vocab, restrict_vocab

if TYPE_CHECKING:
    from mtad_train.config import DistillConfig


@dataclass
class DraftSpec:
    name: str
    layers: int = 4
    hidden: int = 256
    intermediate: int = 768
    heads: int = 4
    kv_heads: int = 2
    tv_weight: float = 1.0

    @classmethod
    def parse(cls, text: str) -> DraftSpec:
        """``name:layers=4,hidden=256,intermediate=768,heads=4,kv_heads=2,tv_weight=1``."""
        name, _, rest = text.partition(":")
        kw = {}
        for part in filter(None, rest.split(",")):
            k, v = part.split("=")
            kw[k.strip()] = float(v) if k.strip() == "tv_weight" else int(v)
        return cls(name=name, **kw)


def load_target(cfg: DistillConfig):
    dtype = getattr(torch, cfg.target_dtype)
    if cfg.target == "smollm2":
        from mtad.engine.smollm2 import load_smollm2_target

        model, tok = load_smollm2_target(dtype=dtype, device=cfg.device)
    elif cfg.target == "tiny":  # the tiny pair's random target and byte tokenizer (tests)
        from mtad.engine.tiny import build_tiny_model, build_tiny_tokenizer

        tok = build_tiny_tokenizer()
        model = build_tiny_model("llama", "target", vocab_size=320, seed=0)
        model = model.to(dtype).to(cfg.device).eval()
    elif cfg.target.startswith("tiny-random:"):
        from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

        tok = AutoTokenizer.from_pretrained(cfg.target.split(":", 1)[1])
        torch.manual_seed(1234)
        llama = LlamaConfig(
            vocab_size=len(tok),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=True,
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
        model = LlamaForCausalLM(llama).to(dtype).to(cfg.device).eval()
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(cfg.target)
        model = AutoModelForCausalLM.from_pretrained(cfg.target, dtype=dtype)
        model.to(cfg.device).eval()
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    for p in model.parameters():
        p.requires_grad_(False)
    return model, tok


def build_draft(spec: DraftSpec, target, cfg: DistillConfig):
    from transformers import LlamaConfig, LlamaForCausalLM

    tc = target.config
    rope = getattr(tc, "rope_parameters", None) or {}
    llama = LlamaConfig(
        vocab_size=tc.vocab_size,
        hidden_size=spec.hidden,
        intermediate_size=spec.intermediate,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        head_dim=spec.hidden // spec.heads,
        max_position_embeddings=getattr(tc, "max_position_embeddings", 8192),
        rms_norm_eps=getattr(tc, "rms_norm_eps", 1e-5),
        tie_word_embeddings=True,
        bos_token_id=tc.bos_token_id,
        eos_token_id=tc.eos_token_id,
        pad_token_id=tc.pad_token_id,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": float(rope.get("rope_theta", getattr(tc, "rope_theta", 1e4))),
        },
    )
    model = LlamaForCausalLM(llama)
    if cfg.init_embed == "pca":
        with torch.no_grad():
            emb = target.get_input_embeddings().weight.detach().float().to(cfg.device)
            centred = emb - emb.mean(0, keepdim=True)
            # top principal directions of the target's embedding rows
            sample = centred[:: max(1, emb.shape[0] // 16384)]
            _, _, v = torch.linalg.svd(sample, full_matrices=False)
            k = min(spec.hidden, v.shape[0])
            proj = centred @ v[:k].T
            proj *= emb.std() / proj.std()
            model.get_input_embeddings().weight[:, :k].copy_(proj.cpu())
    model.tie_weights()
    return model.to(cfg.device).float().train()


def build_optimisers(cfg: DistillConfig, drafts) -> list[torch.optim.Optimizer]:
    """AdamW per draft; no weight decay on vectors (norms)."""
    fused = cfg.device.startswith("cuda")
    opts = []
    for d in drafts:
        decay = [p for n, p in d.named_parameters() if p.ndim >= 2]
        no_decay = [p for n, p in d.named_parameters() if p.ndim < 2]
        opts.append(
            torch.optim.AdamW(
                [
                    {"params": decay, "weight_decay": cfg.weight_decay},
                    {"params": no_decay, "weight_decay": 0.0},
                ],
                lr=cfg.lr,
                betas=(0.9, 0.95),
                fused=fused,
            )
        )
    return opts


def init_from(folder: str, specs: list[DraftSpec], drafts, log, restrict: bool = False) -> None:
    """Load every draft from an earlier draft folder of the same architecture; ``restrict``
    (evaluation only): apply the folder's ``draft_vocab.json``, as the harness loads it."""
    init_sd = load_file(str(Path(folder) / "model.safetensors"))
    for s, d in zip(specs, drafts, strict=True):
        missing, unexpected = d.load_state_dict(
            {k: v.float() for k, v in init_sd.items()}, strict=False
        )
        missing = [k for k in missing if k != "lm_head.weight"]
        if missing or unexpected:
            raise SystemExit(
                f"--init-from {folder} does not fit draft {s.name}: "
                f"missing {missing[:3]}, unexpected {unexpected[:3]}"
            )
        d.tie_weights()
        if restrict and (vocab := read_vocab(folder)) is not None:
            restrict_vocab(d, vocab)
            log(f"draft {s.name}: output restricted to the {len(vocab)} ids of {VOCAB_FILE}")
        log(f"draft {s.name}: initialised from {folder}")
