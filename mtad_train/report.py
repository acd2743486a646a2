"""What a distillation writes: per draft a model folder (bf16 safetensors, config, recipe,
metrics, ``report.md``, loss curve), and optionally split copies for transport off a device."""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import save

from mtad.runs.atomic import write_atomic
from mtad_train.data import write_parts
from mtad_train.drafts import DraftSpec

if TYPE_CHECKING:
    from mtad_train.config import DistillConfig

ACCEPT_BAR, ACCEPT_GOAL = 0.45, 0.55  # held-out expected acceptance the draft must reach (#17)


def plot_losses(history: list[dict], specs, path: Path, name: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
    xs = [h["tokens"] / 1e6 for h in history]
    for spec in specs:
        if spec.name != name:
            continue
        ax[0].plot(xs, [h[spec.name]["kl"] for h in history], label="KL(p||q)")
        ax[1].plot(xs, [h[spec.name]["agree"] for h in history], label="train greedy agreement")
        if spec.tv_weight > 0:
            ax[1].plot(
                xs, [1 - h[spec.name]["tv"] for h in history], label="train sum min(p_w,q_w)"
            )
    for a in ax:
        a.set_xlabel("training tokens (millions)")
        a.grid(alpha=0.3)
        a.legend()
    ax[0].set_yscale("log")
    ax[0].set_title(f"{name}: distillation loss")
    ax[1].set_title("train-batch metrics")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _header_lines(spec: DraftSpec, recipe: dict, n_params: int, size_bytes: int) -> list[str]:
    """The title and the draft's facts: architecture, objective, data, wall time."""
    gpus = recipe["env"]["hardware"]["gpus"]  # mtad.harness.results.environment()
    hw = recipe["env"]["hardware"]
    cpu = f"CPU ({hw.get('processor') or 'unknown'}, {hw.get('torch_threads')} torch thread(s))"
    device = gpus[0] if gpus else cpu
    lines = [f"# Distilled draft `{spec.name}` for {recipe['target']}", ""]
    lines += [
        f"- Architecture: Llama, {spec.layers} layers, hidden {spec.hidden}, intermediate "
        f"{spec.intermediate}, {spec.heads} heads / {spec.kv_heads} KV heads, tied full-vocabulary "
        f"embeddings ({recipe['vocab_size']}), {n_params / 1e6:.2f}M parameters, "
        f"{size_bytes / 2**20:.1f} MiB bf16 safetensors.",
        (
            "- Objective: KL(p || q) over the target's top-"
            f"{recipe['args']['teacher_topk']} tokens plus one bin for the rest of the vocabulary "
            "(stored when the target generated the data), temperature 1"
            if recipe["args"].get("teacher_topk")
            else "- Objective: KL(p || q) full vocabulary, temperature 1"
        )
        + (
            f" + {spec.tv_weight} x (1 - sum_v min(p_w, q_w)) under the authors' warping"
            if spec.tv_weight > 0
            else ""
        )
        + ".",
        f"- Data: {recipe['plan']['gen_tokens']:,} target-generated response tokens "
        f"({recipe['plan']['gen_tokens_greedy']:,} greedy, rest warped sampling T=1/top-k 10/"
        f"top-p 0.9) over {recipe['plan']['gen_sequences']:,} prompts+turns from a pool of "
        f"{recipe['pool']['items_after_filter']:,} items; {recipe['plan']['train_tokens']:,} "
        f"token-positions trained on ({recipe['plan']['steps']} steps, "
        f"{recipe['plan']['train_tokens'] / max(1, recipe['plan']['gen_tokens']):.1f} passes).",
        f"- Wall time {recipe['plan']['wall_s']:.0f} s on {device}; "
        f"seed {recipe['seed']}; commit {recipe['git_commit'][:12]}.",
        "",
    ]
    return lines


def _quality_lines(recipe: dict, metrics: dict) -> list[str]:
    """The held-out table by prompt kind and the evaluation kinds' verdict against the bar."""
    lines = [
        "## Held-out quality (prompts never trained on)",
        "",
        "Expected acceptance = mean over response positions of sum_v min(p_w(v), q_w(v)) with both "
        "distributions warped as the authors do (temperature 1, top-k 10, top-p 0.9), computed "
        "with `mtad.engine.warping.warp_logprobs`; greedy agreement = argmax q == argmax p. "
        "Responses are the target's own warped samples (max "
        f"{recipe['args']['eval_max_new']} new tokens).",
        "",
        "| prompts | n | positions | greedy agreement | expected acceptance | raw overlap | KL |",
        "|---|---|---|---|---|---|---|",
    ]
    for kind, m in metrics.items():
        lines.append(
            f"| {kind} | {m['prompts']} | {m['positions']} | {m['agree']:.3f} | "
            f"{m['accept']:.3f} | {m['overlap_raw']:.3f} | {m['kl']:.3f} |"
        )
    ev_kinds = [k for k in metrics if k in ("humaneval", "mtbench", "mtbench-turn2", "default")]
    if ev_kinds:
        pos = sum(metrics[k]["positions"] for k in ev_kinds)
        acc = sum(metrics[k]["accept"] * metrics[k]["positions"] for k in ev_kinds) / pos
        agr = sum(metrics[k]["agree"] * metrics[k]["positions"] for k in ev_kinds) / pos
        lines += [
            "",
            f"Evaluation kinds together ({', '.join(ev_kinds)}; position-weighted): "
            f"greedy agreement **{agr:.3f}**, expected acceptance **{acc:.3f}** "
            f"(must hold >= {ACCEPT_BAR}: {'PASS' if acc >= ACCEPT_BAR else 'FAIL'}; "
            f"goal {ACCEPT_GOAL}).",
        ]
    return lines


def _disjointness_lines(overlap: dict) -> list[str]:
    """How the training pool was checked disjoint from every evaluation prompt; the recipe."""
    return [
        "",
        "## Disjointness of the training pool from every evaluation prompt",
        "",
        f"Normalised word {overlap['n']}-grams (lower case, [a-z0-9_]+ words) and exact "
        f"prompts. Before filtering: {overlap['before']['overlapping_items']} pool items "
        f"overlapped (dropped). After filtering, checked again over "
        f"{overlap['after']['pool_items']:,} pool items against "
        f"{overlap['after']['eval_items']} evaluation prompts "
        f"({overlap['after']['eval_ngrams']:,} distinct n-grams): overlapping items "
        f"{overlap['after']['overlapping_items']} -> "
        f"**{'disjoint' if overlap['after']['disjoint'] else 'NOT DISJOINT'}**.",
        "Follow-up turns used in training were checked the same way "
        f"({overlap['followups']['overlapping_items']}).",
        "Spider is not on disk: the pool contains no SQL at all (items matching "
        "`select ... from`, `create table`, `insert into` or the word `sql` are dropped), so "
        "no pool item is a SQL question over a Spider-like schema.",
        "Held-out pool items (kind `pool-heldout`) are pool prompts excluded from training, "
        "to show the gap to training-distribution prompts; `train-sample` are training "
        "sequences.",
        "",
        "## Recipe",
        "",
        "See `recipe.json` (seed, every argument, pool fingerprint, "
        "realised schedule, versions). Loss curve: `loss_curve.png`.",
        "",
    ]


def write_report(
    path: Path,
    spec: DraftSpec,
    recipe: dict,
    metrics: dict,
    overlap: dict,
    n_params: int,
    size_bytes: int,
):
    lines = _header_lines(spec, recipe, n_params, size_bytes)
    lines += _quality_lines(recipe, metrics) + _disjointness_lines(overlap)
    path.write_text("\n".join(lines))


def export(
    cfg: DistillConfig, out: Path, specs, drafts, recipe, history, metrics, overlap, final: bool
):
    out.mkdir(parents=True, exist_ok=True)
    for spec, d in zip(specs, drafts, strict=True):
        folder = out / spec.name
        folder.mkdir(parents=True, exist_ok=True)
        sd = {
            k: v.detach().to(torch.bfloat16).cpu().contiguous()
            for k, v in d.state_dict().items()
            if k != "lm_head.weight"
        }
        config = d.config.to_dict()
        config["dtype"] = "bfloat16"
        config["architectures"] = ["LlamaForCausalLM"]
        write_atomic(folder / "model.safetensors", save(sd, metadata={"format": "pt"}))
        write_atomic(folder / "config.json", json.dumps(config, indent=2, default=str))
        r = {**recipe, "draft": asdict(spec), "final": final}
        write_atomic(folder / "recipe.json", json.dumps(r, indent=2, default=str))
        if metrics:
            write_atomic(folder / "metrics.json", json.dumps(metrics.get(spec.name, {}), indent=2))
            n_params = sum(v.numel() for v in sd.values())
            write_report(
                folder / "report.md",
                spec,
                r,
                metrics[spec.name],
                overlap,
                n_params,
                (folder / "model.safetensors").stat().st_size,
            )
        if history:
            plot_losses(history, specs, folder / "loss_curve.png", spec.name)
    write_atomic(out / "history.json", json.dumps(history))
    if cfg.transport_dir:
        transport(out, Path(cfg.transport_dir), specs, cfg.transport_chunk_mib)


def transport(out: Path, tdir: Path, specs, chunk_mib: float):
    """Split each draft's safetensors into <= chunk_mib parts and tar the rest (device copies)."""
    tdir.mkdir(parents=True, exist_ok=True)
    for spec in specs:
        write_parts(
            (out / spec.name / "model.safetensors").read_bytes(), tdir, f"{spec.name}.st", chunk_mib
        )
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for p in sorted(out.rglob("*")):
            if p.is_file() and not p.name.startswith(("model.safetensors", "data.npz")):
                tf.add(p, arcname=str(p.relative_to(out)))
    write_atomic(tdir / "meta.tar", buf.getvalue())
