"""Train a feature-level draft head (EAGLE-style) for a pair: data, teacher pass, training, report.

    python scripts/train_head.py corpus   --out assets/drafts/smollm2-head/corpus.npz
    python scripts/train_head.py features --data assets/drafts/smollm2-draft/data.npz \
        --out .dev/head/features/onpolicy [--part 0/2]
    python scripts/train_head.py train    ... (see --help)

Each stage is resumable: the teacher pass writes complete shards atomically, training saves a
checkpoint every few minutes and resumes from it to the same weights.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402


def load_ids(path: str) -> tuple[list[list[int]], list[int], list[str]]:
    z = np.load(path)
    toks, lens = z["tokens"].astype(np.int64), z["lens"]
    seqs, off = [], 0
    for n in lens:
        seqs.append(toks[off : off + n].tolist())
        off += n
    return seqs, [int(p) for p in z["plens"]], [str(k) for k in z["kinds"]]


def cmd_features(args: argparse.Namespace) -> None:
    from mtad.engine.smollm2 import load_smollm2_target
    from mtad_train.features import teacher_pass

    torch.set_num_threads(args.threads)
    target, _ = load_smollm2_target(args.dtype)
    seqs, plens, _ = load_ids(args.data)
    i, n = (int(x) for x in args.part.split("/"))
    teacher_pass(target, seqs, plens, args.out, part=(i, n), shard_tokens=args.shard_tokens)


def cmd_finals(args: argparse.Namespace) -> None:
    """The target's final normed state of every stored position (``final.npy`` per shard),
    for heads that read and regress it; complete shards only, again and again with --watch
    while a teacher pass is still writing shards."""
    import time

    from mtad.engine.smollm2 import load_smollm2_target
    from mtad_train.features import derive_final

    torch.set_num_threads(args.threads)
    target, _ = load_smollm2_target(args.dtype)
    while True:
        done = sum(derive_final(target, f) for f in feature_folders(args.features))
        print(f"final states added to {done} shards", flush=True)
        if not args.watch:
            break
        time.sleep(60)


def cmd_eval(args: argparse.Namespace) -> None:
    """Held-out expected acceptance of a saved head at every depth, per evaluation kind."""
    import json

    from mtad.engine.feature_head import load_head
    from mtad.engine.smollm2 import load_smollm2_target
    from mtad.engine.subvocab import read_vocab
    from mtad_train.head_eval import depth_acceptance
    from mtad_train.head_train import ShardData

    torch.set_num_threads(args.threads)
    target, _ = load_smollm2_target("bfloat16")
    head = load_head(args.head, target, read_vocab(args.head)).float()
    data = ShardData(feature_folders([args.eval_features]), need_final=head.spec.taps == [-1])
    kinds = [str(k) for k in np.load(args.eval_data)["kinds"]]
    res = depth_acceptance(head, data, kinds, args.depths, autocast=use_autocast(args.autocast))
    for kind, row in res.items():
        print(
            f"{kind:14s} "
            + " ".join(f"d{d + 1} {row[f'd{d + 1}']:.3f}" for d in range(args.depths))
            + f"  ({row['positions']} positions, {row['prompts']} prompts)"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2) + "\n")


def save_ids(path: str, seqs, plens, kinds, **extra) -> None:
    """Sequences as uint16 ids in the data.npz layout, written atomically."""
    import os

    lens = np.array([len(x) for x in seqs], dtype=np.int32)
    toks = np.fromiter((t for x in seqs for t in x), dtype=np.uint16, count=int(lens.sum()))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = path + ".tmp.npz"
    np.savez_compressed(
        tmp,
        tokens=toks,
        lens=lens,
        plens=np.array(plens, dtype=np.int32),
        kinds=np.array(kinds),
        **extra,
    )
    os.replace(tmp, path)


def cmd_report(args: argparse.Namespace) -> None:
    """A shipped head's report: held-out acceptance by evaluation kind and depth on the
    committed responses, the independent draft's figure on the same responses beside it, the
    curve of the training stages, the verdict against issue 32's bar; ``report.md``,
    ``heldout.json`` and ``curve.png`` in the head's folder (``--notes``: a hand-written section
    appended, e.g. measured speed)."""
    import json

    from mtad.engine.feature_head import load_head
    from mtad.engine.smollm2 import load_smollm2_target
    from mtad.engine.subvocab import read_vocab, restrict_vocab
    from mtad_train.head_eval import depth_acceptance, model_draft_acceptance
    from mtad_train.head_report import heldout_table, plot_curve, read_curve, verdict
    from mtad_train.head_train import ShardData

    torch.set_num_threads(args.threads)
    autocast = use_autocast(args.autocast)
    folder = Path(args.head)
    target, _ = load_smollm2_target("float32")
    head = load_head(folder, target, read_vocab(folder)).float()
    data = ShardData(feature_folders([args.eval_features]), need_final=head.spec.taps == [-1])
    kinds = [str(k) for k in np.load(args.eval_data)["kinds"]]
    res = {"head": depth_acceptance(head, data, kinds, args.depths, autocast=autocast)}
    if args.compare_draft:
        from transformers import AutoModelForCausalLM

        draft = AutoModelForCausalLM.from_pretrained(args.compare_draft, dtype=torch.float32)
        ids = read_vocab(args.compare_draft)
        if ids:
            restrict_vocab(draft, ids)
        res["draft"] = model_draft_acceptance(draft.eval(), data, kinds)
    (folder / "heldout.json").write_text(json.dumps(res, indent=1) + "\n")
    rows, base_pos, base_s = [], 0, 0.0
    for c in args.curves:  # each stage counts from 0: one axis across the stages
        stage = read_curve(Path(c))
        rows += [
            {**r, "positions": r["positions"] + base_pos, "seconds": r["seconds"] + base_s}
            for r in stage
        ]
        if stage:
            base_pos, base_s = rows[-1]["positions"], rows[-1]["seconds"]
    plot_curve(rows, folder / "curve.png", "smollm2 head")
    cfg = json.loads((folder / "head_config.json").read_text())
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as f:  # what the head adds
        n_params = sum(int(np.prod(f.get_slice(k).get_shape())) for k in f.keys())  # noqa: SIM118
    lines = [
        f"# Feature-level draft head for smollm2 ({args.title})",
        "",
        f"- Layout: {cfg['head']}; one decoder layer ({n_params / 1e6:.2f}M trained "
        "parameters) over the target's final normed state and the embedding of the next token, "
        "the target's frozen embeddings and (sub-vocabulary) logits head.",
        f"- Trained positions (last stage): {cfg.get('trained_positions', '?')}, step "
        f"{cfg.get('step', '?')}.",
        "",
        "## Held-out expected acceptance (committed responses, `assets/evalsets/`)",
        "",
        "Mean over response positions of sum_v min(p_w, q_w) under the authors' warping (T=1, "
        "top-k 10, top-p 0.9); at depth k the head has drafted k-1 positions on its own "
        "features (`mtad_train.head_eval`).",
        "",
        *heldout_table(res["head"], args.depths),
        "",
        verdict(res["head"], args.depths),
    ]
    if "draft" in res:
        d = res["draft"]
        lines += [
            "",
            f"The independent draft `{args.compare_draft}` on the same responses (its "
            "acceptance does not depend on depth: it reads tokens, not features):",
            "",
            "| kind | head depth 1 | draft |",
            "|---|---|---|",
            *(
                f"| {k} | {res['head'][k]['d1']:.3f} | {d[k]['d1']:.3f} |"
                for k in d
                if k in res["head"]
            ),
        ]
    lines += ["", "Curve of the training stages: `curve.png`.", ""]
    if args.notes:
        lines += [Path(args.notes).read_text().rstrip(), ""]
    (folder / "report.md").write_text("\n".join(lines))
    print("\n".join(lines))


def cmd_corpus(args: argparse.Namespace) -> None:
    from collections import Counter

    from mtad.engine.smollm2 import load_smollm2_target
    from mtad_train.corpus import build_corpus
    from mtad_train.evalsets import evaluation_texts

    _, tok = load_smollm2_target("float32")
    seqs, plens, kinds, dropped = build_corpus(
        tok, evaluation_texts(), args.max_tokens, seed=args.seed
    )
    save_ids(args.out, seqs, plens, kinds, gen_tokens=0, gen_tokens_greedy=0)
    resp = Counter()
    for s, p, k in zip(seqs, plens, kinds, strict=True):
        resp[k] += len(s) - p
    print(
        f"{len(seqs)} sequences, {sum(map(len, seqs))} positions, response tokens {dict(resp)}; "
        f"dropped for overlap with evaluation prompts: {dropped}"
    )


def cmd_evalset(args: argparse.Namespace) -> None:
    """Held-out responses of the evaluation kinds, generated once by the target (warped
    sampling as the authors warp), so every draft is measured on the same responses."""
    from types import SimpleNamespace

    from mtad.engine.smollm2 import load_smollm2_target
    from mtad_train.evaluate import build_eval_sets

    torch.set_num_threads(args.threads)
    target, tok = load_smollm2_target(args.dtype)
    ns = SimpleNamespace(
        eval_n_humaneval=args.n_humaneval,
        eval_n_mtbench=args.n_mtbench,
        eval_n_default=10_000,
        default_prompts=None,
        max_prompt_tokens=args.max_prompt_tokens,
        seed=args.seed,
        eval_batch_size=args.batch_size,
        eval_max_new=args.max_new,
        device="cpu",
        eval_mtbench_turn2=True,
        max_seq_tokens=args.max_prompt_tokens + 2 * args.max_new,
    )
    sets = build_eval_sets(ns, target, tok, [])
    seqs, plens, kinds = [], [], []
    for es in sets:
        seqs += es.seqs
        plens += es.plens
        kinds += [es.kind] * len(es.seqs)
    save_ids(
        args.out,
        seqs,
        plens,
        kinds,
        seed=args.seed,
        max_new=args.max_new,
        target_dtype=args.dtype,
        warp="temperature 1, top-k 10, top-p 0.9",
    )
    for es in sets:
        n = sum(len(s) - p for s, p in zip(es.seqs, es.plens, strict=True))
        print(f"{es.kind}: {len(es.seqs)} prompts, {n} response tokens")


def response_tokens(data: str) -> list[np.ndarray]:
    z = np.load(data)
    toks, lens, plens = z["tokens"], z["lens"], z["plens"]
    out, off = [], 0
    for n, p in zip(lens, plens, strict=True):
        out.append(toks[off + p : off + n].astype(np.int64))
        off += n
    return out


def use_autocast(choice: str) -> bool:
    """bfloat16 matmuls where they are fast: ``auto`` is on with native bfloat16 (a CPU with
    AMX / AVX-512 BF16, or a GPU); on an AVX2 CPU bfloat16 is emulated and slower than fp32."""
    from mtad.cpu import native_bf16

    return choice == "bf16" or (
        choice == "auto" and bool(torch.cuda.is_available() or native_bf16())
    )


def feature_folders(roots: list[str]) -> list[Path]:
    return [
        p
        for r in roots
        for p in sorted(Path(r).glob("shard*"))
        if p.is_dir() and not p.name.endswith(".tmp")
    ]


def cmd_train(args: argparse.Namespace) -> None:
    import json
    import time

    from mtad.engine.feature_head import FeatureHead, HeadSpec
    from mtad.engine.smollm2 import load_smollm2_target
    from mtad.engine.subvocab import VOCAB_FILE, frequency_ranked_ids
    from mtad_train.head_eval import depth_acceptance
    from mtad_train.head_train import HeadTrainConfig, ShardData, train

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    target, tok = load_smollm2_target("bfloat16")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    vocab_path = out / VOCAB_FILE
    if vocab_path.is_file():
        vocab = json.loads(vocab_path.read_text())["ids"]
    elif args.vocab_size:
        toks = [t for d in args.vocab_from for t in response_tokens(d)]
        vocab = frequency_ranked_ids(
            toks,
            target.config.vocab_size,
            args.vocab_size,
            always=[tok.eos_token_id, tok.bos_token_id],
        )
        vocab_path.write_text(
            json.dumps(
                {
                    "ids": vocab,
                    "k": args.vocab_size,
                    "source": "response tokens of " + ", ".join(args.vocab_from),
                }
            )
            + "\n"
        )
    else:
        vocab = None
    taps = [int(t) for t in args.taps.split(",")]
    final = taps == [-1]  # the final normed state: EAGLE-1/2's layout, regressed (HASS)
    spec = HeadSpec(taps=taps, fuse=not final, final_norm=not final)
    ids = torch.tensor(sorted(vocab)) if vocab else None
    head = FeatureHead.from_target(target, spec, ids, seed=args.seed)
    if args.init_from:  # continue from a saved head (same layout and sub-vocabulary)
        from mtad.engine.feature_head import load_head

        saved = load_head(args.init_from, target, vocab).float()
        head.load_state_dict(saved.state_dict())
    repeats = dict(r.split("=") for r in args.repeat) if args.repeat else {}
    cfg = HeadTrainConfig(
        depths=args.depths,
        epochs=args.epochs,
        lr=args.lr,
        tokens_per_step=args.tokens_per_step,
        micro_tokens=args.micro_tokens,
        prompt_weight=args.prompt_weight,
        overlap_weight=args.overlap_weight,
        kl_weight=args.kl_weight,
        reg_weight=args.reg_weight if final else 0.0,
        feature_rms=args.feature_rms,
        deep_fraction=args.deep_fraction,
        depth_weights=[float(w) for w in args.depth_weights.split(",")],
        autocast=use_autocast(args.autocast),
        seed=args.seed,
        source_repeats={k: int(v) for k, v in repeats.items()},
        ckpt_every_s=args.ckpt_every_s,
        warmup_steps=args.warmup_steps,
    )
    folders = feature_folders(args.features)
    if final:  # shards still waiting for their final states (finals --watch) join a later run
        folders = [f for f in folders if (f / "final.npy").is_file()]
    data = ShardData(folders, cfg.source_repeats, need_final=final)
    eval_data = (
        ShardData(feature_folders([args.eval_features]), need_final=final)
        if args.eval_features
        else None
    )
    eval_kinds = [str(k) for k in np.load(args.eval_data)["kinds"]] if args.eval_data else []
    curve = out / "curve.jsonl"
    log_f = open(out / "train.log", "a")  # noqa: SIM115 (open for the whole run)

    def log(msg: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} {msg}"
        print(line, flush=True)
        log_f.write(line + "\n")
        log_f.flush()

    def on_step(state, rec) -> None:
        if state.step % 10 == 0 or state.step < 5:
            log(
                f"step {state.step} pos {state.positions} {state.seconds:.0f}s lr {rec['lr']:.2e} "
                f"kl {rec['kl']} overlap {rec['overlap']}"
            )

    def on_export(state) -> None:
        head.save(out, extra={"trained_positions": state.positions, "step": state.step})
        row = {"step": state.step, "positions": state.positions, "seconds": state.seconds}
        if eval_data is not None:
            row["heldout"] = depth_acceptance(
                head, eval_data, eval_kinds, args.eval_depths, autocast=cfg.autocast
            )
            log(
                "held-out "
                + json.dumps(
                    {
                        k: [round(v[f"d{d + 1}"], 3) for d in range(args.eval_depths)]
                        for k, v in row["heldout"].items()
                    }
                )
            )
        with open(curve, "a") as f:
            f.write(json.dumps(row) + "\n")

    log(
        f"training on {sum(len(s.lens) for s in data.shards)} sequences, "
        f"{sum(int(s.lens.sum()) for s in data.shards)} positions; config {cfg}"
    )
    train(
        head,
        data,
        cfg,
        args.ckpt_dir,
        max_steps=args.max_steps,
        on_step=on_step,
        on_export=on_export,
        export_every_s=args.export_every_s,
        time_budget_s=args.time_budget,
        log=log,
    )


def dataclass_options(parser: argparse.ArgumentParser, cls: type) -> None:
    """One ``--name`` option per field of the dataclass ``cls``, its default the field's
    (the dataclass is the one place of each default)."""
    import dataclasses

    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        flag = "--" + f.name.replace("_", "-")
        if isinstance(default, list):
            parser.add_argument(flag, nargs="+", default=default, dest=f.name)
        elif isinstance(default, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default)
        else:
            parser.add_argument(flag, type=type(default), default=default, dest=f.name)


def cmd_cumulative(args: argparse.Namespace) -> None:
    """Go on training the committed head (``mtad_train.cumulative``): resume from the
    repository's state, teacher on the fly, export + a held-out curve row at the end."""
    import dataclasses
    import time

    from mtad.cpu import choose_dtype
    from mtad.engine.smollm2 import load_smollm2_target
    from mtad.runs.hardware import cpu_hardware
    from mtad_train.cumulative import (
        CumulativeConfig,
        Source,
        head_for_training,
        run_session,
    )
    from mtad_train.features import teacher_pass
    from mtad_train.head_eval import depth_acceptance
    from mtad_train.head_train import ShardData

    cfg = CumulativeConfig(
        **{f.name: getattr(args, f.name) for f in dataclasses.fields(CumulativeConfig)}
    )
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    dtype, why = choose_dtype(cfg.teacher_dtype, "cpu")
    target32, _ = load_smollm2_target("float32")
    head_dir = Path(cfg.head)
    head = head_for_training(target32, head_dir)
    eval_dir = Path(cfg.eval_features)
    kinds = [str(k) for k in np.load(cfg.eval_data)["kinds"]]
    autocast = use_autocast("auto")
    target = target32 if dtype == "float32" else load_smollm2_target(dtype)[0]

    def evaluate(h) -> dict:
        # the held-out features are a cache: completed from the committed ids when a shard is
        # missing (a float32 teacher pass, skipping the complete shards), then read
        seqs, plens, _ = load_ids(cfg.eval_data)
        teacher_pass(target32, seqs, plens, eval_dir, progress=False)
        eval_data = ShardData(feature_folders([str(eval_dir)]), need_final=True)
        return depth_acceptance(h, eval_data, kinds, cfg.eval_depths, autocast=autocast)

    sources = [Source.load(s, cfg.max_len) for s in cfg.sources]
    log_path = Path(cfg.ckpt_dir) / "train.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)

    def log(msg: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} {msg}"
        print(line, flush=True)
        with open(log_path, "a") as f:
            f.write(line + "\n")

    host = {**cpu_hardware(), "teacher_dtype": dtype, "autocast": autocast}
    log(f"teacher {dtype} ({why}); head autocast {autocast}; config {cfg}")
    run_session(
        cfg,
        head,
        target,
        sources,
        evaluate=evaluate,
        host=host,
        log=log,
        autocast=autocast,
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("features", help="teacher-forced pass: target features + top-k")
    f.add_argument("--data", required=True, help="ids in the data.npz layout")
    f.add_argument("--out", required=True)
    f.add_argument("--part", default="0/1", help="i/n: this process writes shards j %% n == i")
    f.add_argument("--threads", type=int, default=1)
    f.add_argument("--dtype", default="bfloat16")
    f.add_argument("--shard-tokens", type=int, default=65_536)
    f.set_defaults(run=cmd_features)
    ev = sub.add_parser("eval", help="held-out acceptance of a saved head, by depth and kind")
    ev.add_argument("--head", required=True)
    ev.add_argument("--eval-features", default=".dev/head/features/heldout")
    ev.add_argument("--eval-data", default="assets/evalsets/smollm2-heldout.npz")
    ev.add_argument("--depths", type=int, default=4)
    ev.add_argument("--threads", type=int, default=1)
    ev.add_argument("--json", default=None)
    ev.add_argument("--autocast", choices=("auto", "bf16", "off"), default="auto")
    ev.set_defaults(run=cmd_eval)
    fi = sub.add_parser("finals", help="add the final normed state to stored shards")
    fi.add_argument("--features", nargs="+", required=True)
    fi.add_argument("--threads", type=int, default=1)
    fi.add_argument("--dtype", default="bfloat16")
    fi.add_argument("--watch", action="store_true", help="keep adding as new shards appear")
    fi.set_defaults(run=cmd_finals)
    r = sub.add_parser("report", help="a head folder's report, held-out table and curve")
    r.add_argument("--head", required=True)
    r.add_argument("--title", default="shipped")
    r.add_argument("--eval-features", default=".dev/head/features/heldout")
    r.add_argument("--eval-data", default="assets/evalsets/smollm2-heldout.npz")
    r.add_argument("--depths", type=int, default=4)
    r.add_argument("--curves", nargs="*", default=[], help="curve.jsonl of each stage, in order")
    r.add_argument("--compare-draft", default=None, help="an independent draft folder")
    r.add_argument("--notes", default=None)
    r.add_argument("--threads", type=int, default=1)
    r.add_argument("--autocast", choices=("auto", "bf16", "off"), default="auto")
    r.set_defaults(run=cmd_report)
    c = sub.add_parser("corpus", help="chat-formatted text from this disk, as uint16 ids")
    c.add_argument("--out", required=True)
    c.add_argument("--max-tokens", type=int, default=4_000_000)
    c.add_argument("--seed", type=int, default=0)
    c.set_defaults(run=cmd_corpus)
    e = sub.add_parser("evalset", help="held-out responses of the evaluation kinds")
    e.add_argument("--out", required=True)
    e.add_argument("--n-humaneval", type=int, default=164)
    e.add_argument("--n-mtbench", type=int, default=80)
    e.add_argument("--max-prompt-tokens", type=int, default=512)
    e.add_argument("--max-new", type=int, default=96)
    e.add_argument("--batch-size", type=int, default=64)
    e.add_argument("--threads", type=int, default=1)
    e.add_argument("--dtype", default="bfloat16")
    e.add_argument("--seed", type=int, default=20261202)
    e.set_defaults(run=cmd_evalset)
    t = sub.add_parser("train", help="train the head on stored features (resumable)")
    t.add_argument("--features", nargs="+", required=True, help="feature folders (shards)")
    t.add_argument("--repeat", nargs="*", default=[], help="FOLDER=N: passes per epoch")
    t.add_argument("--eval-features", default=None)
    t.add_argument("--eval-data", default=None, help="the held-out ids (kinds)")
    t.add_argument("--out", required=True)
    t.add_argument("--ckpt-dir", required=True)
    t.add_argument("--taps", default="2,15,28")
    t.add_argument("--vocab-size", type=int, default=16384)
    t.add_argument("--vocab-from", nargs="*", default=[])
    t.add_argument("--depths", type=int, default=4, help="draft depths trained")
    t.add_argument("--eval-depths", type=int, default=4, help="draft depths evaluated")
    t.add_argument("--epochs", type=float, default=2.0)
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--warmup-steps", type=int, default=20)
    t.add_argument("--tokens-per-step", type=int, default=8192)
    t.add_argument("--micro-tokens", type=int, default=2048)
    t.add_argument("--prompt-weight", type=float, default=0.1)
    t.add_argument("--overlap-weight", type=float, default=1.0)
    t.add_argument("--kl-weight", type=float, default=1.0)
    t.add_argument("--reg-weight", type=float, default=1.0, help="heads reading tap -1")
    t.add_argument("--feature-rms", type=float, default=1.0)
    t.add_argument("--depth-weights", default="1,1,1,1")
    t.add_argument(
        "--deep-fraction", type=float, default=1.0, help="share of positions scored at depths >= 2"
    )
    t.add_argument("--init-from", default=None, help="a saved head to continue from")
    t.add_argument("--autocast", choices=("auto", "bf16", "off"), default="auto")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--threads", type=int, default=1)
    t.add_argument("--ckpt-every-s", type=float, default=300.0)
    t.add_argument("--export-every-s", type=float, default=1800.0)
    t.add_argument("--time-budget", type=float, default=0.0)
    t.add_argument("--max-steps", type=int, default=0)
    t.set_defaults(run=cmd_train)
    from mtad_train.cumulative import CumulativeConfig

    cu = sub.add_parser("cumulative", help="go on training the committed head (resumable)")
    dataclass_options(cu, CumulativeConfig)
    cu.set_defaults(run=cmd_cumulative)
    args = ap.parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    main()
