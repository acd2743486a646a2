"""The feature head's commands (``scripts/train_head.py``): data, teacher pass, training, report.

One function per sub-command, each taking its configuration dataclass (:mod:`mtad_train.config`,
:class:`mtad_train.cumulative.CumulativeConfig`); :data:`COMMANDS` names them for the script.
Each stage is resumable: the teacher pass writes complete shards atomically, training saves a
checkpoint every few minutes and resumes from it to the same weights.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mtad.engine.features import FINAL_NORM_TAP
from mtad.engine.spec import HEAD_FILE_SUFFIXES
from mtad_train.config import (
    CompareCommand,
    CorpusCommand,
    EvalCommand,
    EvalsetCommand,
    FeaturesCommand,
    FinalsCommand,
    ForkCommand,
    FuseCommand,
    HeadTrainCommand,
    ReportCommand,
)
from mtad_train.cumulative import CumulativeConfig, TeacherAheadConfig, head_spec
from mtad_train.ids import read_ids, read_kinds, write_ids
from mtad_train.respond import RespondCommand, respond


def use_autocast(choice: str) -> bool:
    """bfloat16 matmuls where they are fast: ``auto`` is on with native bfloat16 (a CPU with
    AMX / AVX-512 BF16, or a GPU); on an AVX2 CPU bfloat16 is emulated and slower than fp32."""
    from mtad.cpu import native_bf16

    return choice == "bf16" or (
        choice == "auto" and bool(torch.cuda.is_available() or native_bf16())
    )


def feature_folders(roots: list[str]) -> list[Path]:
    """The complete shard folders under ``roots`` (a shard being written ends in ``.tmp``)."""
    return [
        p
        for r in roots
        for p in sorted(Path(r).glob("shard*"))
        if p.is_dir() and not p.name.endswith(".tmp")
    ]


def file_log(path: Path) -> Callable[[str], None]:
    """A log function: each message printed and appended to ``path`` with the time of day."""
    path.parent.mkdir(parents=True, exist_ok=True)

    def log(msg: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} {msg}"
        print(line, flush=True)
        with open(path, "a") as f:
            f.write(line + "\n")

    return log


# --- data -------------------------------------------------------------------------------------
def features(cfg: FeaturesCommand) -> None:
    from mtad.engine.smollm2 import load_smollm2_target
    from mtad_train.features import teacher_pass

    torch.set_num_threads(cfg.threads)
    target, _ = load_smollm2_target(cfg.dtype)
    ids = read_ids(cfg.data)
    i, n = (int(x) for x in cfg.part.split("/"))
    teacher_pass(
        target, ids.lists(), ids.plens, cfg.out, part=(i, n), shard_tokens=cfg.shard_tokens
    )


def finals(cfg: FinalsCommand) -> None:
    """The target's final normed state of every stored position (``final.npy`` per shard),
    for heads that read and regress it; complete shards only, again and again with --watch
    while a teacher pass is still writing shards."""
    from mtad.engine.smollm2 import load_smollm2_target
    from mtad_train.features import derive_final

    torch.set_num_threads(cfg.threads)
    target, _ = load_smollm2_target(cfg.dtype)
    while True:
        done = sum(derive_final(target, f) for f in feature_folders(cfg.features))
        print(f"final states added to {done} shards", flush=True)
        if not cfg.watch:
            break
        time.sleep(60)


def corpus(cfg: CorpusCommand) -> None:
    from mtad.engine.smollm2 import load_smollm2_target
    from mtad_train.corpus import build_corpus
    from mtad_train.evalsets import evaluation_texts

    _, tok = load_smollm2_target("float32")
    seqs, plens, kinds, dropped = build_corpus(
        tok, evaluation_texts(), cfg.max_tokens, seed=cfg.seed
    )
    write_ids(cfg.out, seqs, plens, kinds, gen_tokens=0, gen_tokens_greedy=0)
    resp = Counter()
    for s, p, k in zip(seqs, plens, kinds, strict=True):
        resp[k] += len(s) - p
    print(
        f"{len(seqs)} sequences, {sum(map(len, seqs))} positions, response tokens {dict(resp)}; "
        f"dropped for overlap with evaluation prompts: {dropped}"
    )


def evalset(cfg: EvalsetCommand) -> None:
    """Held-out responses of the evaluation kinds, generated once by the target (warped
    sampling as the authors warp), so every draft is measured on the same responses."""
    from mtad.engine.smollm2 import load_smollm2_target
    from mtad_train.evaluate import HeldoutPlan, build_eval_sets

    torch.set_num_threads(cfg.threads)
    target, tok = load_smollm2_target(cfg.dtype)
    plan = HeldoutPlan(
        n_humaneval=cfg.n_humaneval,
        n_mtbench=cfg.n_mtbench,
        n_default=10_000,
        default_prompts=None,
        max_prompt_tokens=cfg.max_prompt_tokens,
        max_seq_tokens=cfg.max_prompt_tokens + 2 * cfg.max_new,
        max_new=cfg.max_new,
        batch_size=cfg.batch_size,
        seed=cfg.seed,
        device="cpu",
    )
    sets = build_eval_sets(plan, target, tok, [])
    seqs, plens, kinds = [], [], []
    for es in sets:
        seqs += es.seqs
        plens += es.plens
        kinds += [es.kind] * len(es.seqs)
    warp = "temperature 1, top-k 10, top-p 0.9"
    write_ids(
        cfg.out,
        seqs,
        plens,
        kinds,
        seed=cfg.seed,
        max_new=cfg.max_new,
        target_dtype=cfg.dtype,
        warp=warp,
    )
    for es in sets:
        n = sum(len(s) - p for s, p in zip(es.seqs, es.plens, strict=True))
        print(f"{es.kind}: {len(es.seqs)} prompts, {n} response tokens")


# --- evaluation and report --------------------------------------------------------------------
def heldout_shards(
    target32: torch.nn.Module, eval_data: str, eval_features: str, taps: Sequence[int]
):
    """The held-out features of the layers ``taps`` (a head's) as shards: a cache, completed
    from the committed ids when a shard is missing (a float32 teacher pass that skips the
    complete shards), so a fresh clone evaluates what a machine with the cache does."""
    from mtad_train.features import teacher_pass
    from mtad_train.head_train import ShardData

    ids = read_ids(eval_data)
    teacher_pass(target32, ids.lists(), ids.plens, Path(eval_features), progress=False)
    return ShardData(feature_folders([eval_features]), taps=taps)


def scored_head(
    spec: str,
    target32: torch.nn.Module,
    eval_data: str,
    eval_features: str,
    depths: int,
    autocast: str,
):
    """A head (a folder, or ``REV:FOLDER``: :func:`head_folder`) scored on the held-out
    responses, per response (:class:`mtad_train.head_eval.SequenceAcceptance`)."""
    from mtad.engine.feature_head import load_head
    from mtad.engine.subvocab import read_vocab
    from mtad_train.head_eval import sequence_acceptance

    with head_folder(spec) as folder:
        head = load_head(folder, target32, read_vocab(folder)).float()
    data = heldout_shards(target32, eval_data, eval_features, head.spec.taps)
    kinds = read_kinds(eval_data)
    return sequence_acceptance(head, data, kinds, depths, autocast=use_autocast(autocast))


def paired_gains(a, b, confidence: float, resamples: int, seed: int) -> dict[str, dict[str, Any]]:
    """``{kind: {"dK": PairedGain fields}}`` of A minus B, every kind and ``all``, every depth."""
    from mtad_train.head_eval import ALL, paired_gain

    return {
        kind: {
            f"d{d}": vars(paired_gain(a, b, d, kind, confidence, resamples, seed))
            for d in range(1, a.depths + 1)
        }
        for kind in [*sorted(set(a.kinds)), ALL]
    }


def heldout(cfg: EvalCommand) -> None:
    """Held-out expected acceptance of a saved head at every depth, per evaluation kind."""
    from mtad.engine.smollm2 import load_smollm2_target

    torch.set_num_threads(cfg.threads)
    target, _ = load_smollm2_target("float32")
    per_seq = scored_head(
        cfg.head, target, cfg.eval_data, cfg.eval_features, cfg.depths, cfg.autocast
    )
    res = per_seq.table()
    print("expected acceptance +- its standard error (responses as clusters)")
    for kind, row in res.items():
        print(
            f"{kind:14s} "
            + " ".join(
                f"d{d} {row[f'd{d}']:.3f}+-{per_seq.standard_error(d, kind):.3f}"
                for d in range(1, cfg.depths + 1)
            )
            + f"  ({row['positions']} positions, {row['prompts']} prompts)"
        )
    if cfg.json:
        Path(cfg.json).write_text(json.dumps(res, indent=2) + "\n")


def compare(cfg: CompareCommand) -> None:
    """Head A minus head B on the same held-out responses, by depth and kind, each with a
    paired bootstrap interval over the responses (:func:`mtad_train.head_eval.paired_gain`):
    whether a session's training moved the figure, not only by how much."""
    from mtad.engine.smollm2 import load_smollm2_target

    torch.set_num_threads(cfg.threads)
    target, _ = load_smollm2_target("float32")
    a, b = (
        scored_head(spec, target, cfg.eval_data, cfg.eval_features, cfg.depths, cfg.autocast)
        for spec in (cfg.head, cfg.against)
    )
    gains = paired_gains(a, b, cfg.confidence, cfg.resamples, cfg.seed)
    level = f"{100 * cfg.confidence:g}%"
    print(f"A = {cfg.head}\nB = {cfg.against}")
    header = f"{'A':>6s}  {'B':>6s}  {'A - B':>7s}  {level + ' interval':>19s}"
    print(f"{'kind':14s} depth  {header}  responses")
    for kind, by_depth in gains.items():
        for depth, g in by_depth.items():
            print(
                f"{kind:14s} {depth}     {g['a']:.4f}  {g['b']:.4f}  {g['gain']:+.4f}  "
                f"[{g['low']:+.4f}, {g['high']:+.4f}]  {g['sequences']}"
            )
    if cfg.json:
        doc = {"a": cfg.head, "b": cfg.against, "gain": gains}
        Path(cfg.json).write_text(json.dumps(doc, indent=2) + "\n")


@contextlib.contextmanager
def head_folder(spec: str) -> Iterator[Path]:
    """A head folder: ``spec`` itself, or ``REV:FOLDER`` -- the folder as committed at the git
    revision ``REV``, its top-level ``.json`` and ``.safetensors`` files (what loading a head
    reads) written to a temporary folder for the duration."""
    if Path(spec).is_dir() or ":" not in spec:
        if not Path(spec).is_dir():
            raise FileNotFoundError(f"no head folder {spec}")
        yield Path(spec)
        return
    rev, folder = spec.split(":", 1)
    folder = folder.rstrip("/")

    def git(*args: str) -> bytes:
        done = subprocess.run(["git", *args], capture_output=True, check=False)
        if done.returncode:
            raise ValueError(f"{spec}: git {' '.join(args)}: {done.stderr.decode().strip()}")
        return done.stdout

    names = [
        line.split("\t", 1)[1]
        for line in git("ls-tree", rev, f"{folder}/").decode().splitlines()
        if line.split()[1] == "blob"
    ]
    wanted = [n for n in names if n.endswith(HEAD_FILE_SUFFIXES)]
    if not wanted:
        raise ValueError(f"{spec}: no head files at {folder} in {rev}")
    with tempfile.TemporaryDirectory(prefix="head-") as tmp:
        for name in wanted:
            (Path(tmp) / Path(name).name).write_bytes(git("show", f"{rev}:{name}"))
        yield Path(tmp)


def report(cfg: ReportCommand) -> None:
    """A shipped head's report: held-out acceptance by evaluation kind and depth on the
    committed responses, the independent draft's figure on the same responses beside it, the
    curve of the training sessions, the verdict against issue 39's bar; ``report.md``,
    ``heldout.json`` and ``curve.png`` in the head's folder (``--notes``: a hand-written section
    appended, e.g. measured speed)."""
    from mtad_train.head_report import plot_curve, read_curve

    folder = Path(cfg.head)
    res = _report_acceptance(cfg, folder)
    (folder / "heldout.json").write_text(json.dumps(res, indent=1) + "\n")
    rows, base_pos, base_s = [], 0, 0.0
    for c in cfg.curves:  # each stage counts from 0: one axis across the stages
        stage = read_curve(Path(c))
        rows += [
            {**r, "positions": r["positions"] + base_pos, "seconds": r["seconds"] + base_s}
            for r in stage
        ]
        if stage:
            base_pos, base_s = rows[-1]["positions"], rows[-1]["seconds"]
    plot_curve(rows, folder / "curve.png", "smollm2 head")
    lines = _report_lines(cfg, folder, res)
    (folder / "report.md").write_text("\n".join(lines))
    print("\n".join(lines))


def _report_acceptance(cfg: ReportCommand, folder: Path) -> dict[str, Any]:
    """``{"head": by kind and depth, "head_se": their standard errors, "draft": the independent
    draft's (with --compare-draft), "against": the head's paired gains over another head (with
    --against)}``."""
    from mtad.engine.smollm2 import load_smollm2_target
    from mtad.engine.subvocab import read_vocab, restrict_vocab
    from mtad_train.head_eval import model_draft_acceptance

    torch.set_num_threads(cfg.threads)
    target, _ = load_smollm2_target("float32")
    per_seq = scored_head(
        str(folder), target, cfg.eval_data, cfg.eval_features, cfg.depths, cfg.autocast
    )
    res: dict[str, Any] = {"head": per_seq.table()}
    res["head_se"] = {
        kind: {f"d{d}": per_seq.standard_error(d, kind) for d in range(1, cfg.depths + 1)}
        for kind in res["head"]
    }
    if cfg.compare_draft:
        from transformers import AutoModelForCausalLM

        taps = head_spec(folder).taps
        data = heldout_shards(target, cfg.eval_data, cfg.eval_features, taps)
        draft = AutoModelForCausalLM.from_pretrained(cfg.compare_draft, dtype=torch.float32)
        ids = read_vocab(cfg.compare_draft)
        if ids:
            restrict_vocab(draft, ids)
        res["draft"] = model_draft_acceptance(draft.eval(), data, read_kinds(cfg.eval_data))
    if cfg.against:
        other = scored_head(
            cfg.against, target, cfg.eval_data, cfg.eval_features, cfg.depths, cfg.autocast
        )
        res["against"] = {
            "head": cfg.against,
            "gain": paired_gains(per_seq, other, 0.95, 9999, 0),
        }
    return res


def _report_lines(cfg: ReportCommand, folder: Path, res: dict[str, Any]) -> list[str]:
    from safetensors import safe_open

    from mtad_train.head_report import gain_table, heldout_table, verdict

    head_cfg = json.loads((folder / "head_config.json").read_text())
    with safe_open(str(folder / "model.safetensors"), "pt") as f:  # what the head adds
        n_params = sum(int(np.prod(f.get_slice(k).get_shape())) for k in f.keys())  # noqa: SIM118
    lines = [
        f"# Feature-level draft head for smollm2 ({cfg.title})",
        "",
        f"- Layout: {head_cfg['head']}; one decoder layer ({n_params / 1e6:.2f}M trained "
        f"parameters) over {_reads(head_cfg['head'])} and the embedding of the next token, "
        "the target's frozen embeddings and (sub-vocabulary) logits head.",
        f"- Trained positions (all sessions): {head_cfg.get('trained_positions', '?')}, "
        f"optimiser step {head_cfg.get('step', '?')}.",
        "",
        "## Held-out expected acceptance (committed responses, `assets/evalsets/`)",
        "",
        "Mean over response positions of sum_v min(p_w, q_w) under the authors' warping (T=1, "
        "top-k 10, top-p 0.9); at depth k the head has drafted k-1 positions on its own "
        "features (`mtad_train.head_eval`).",
        "",
        *heldout_table(res["head"], cfg.depths, res.get("head_se")),
        "",
        verdict(res["head"], cfg.depths),
    ]
    if "draft" in res:
        d = res["draft"]
        lines += [
            "",
            f"The independent draft `{cfg.compare_draft}` on the same responses (its "
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
    if "against" in res:
        lines += ["", *gain_table(res["against"], cfg.depths)]
    lines += ["", "Curve of every session's points against positions trained: `curve.png`.", ""]
    if cfg.notes:
        lines += [Path(cfg.notes).read_text().rstrip(), ""]
    return lines


def _reads(spec: dict[str, Any]) -> str:
    """What a head's layout reads from the target, in words."""
    layers = [
        "final normed state" if t == FINAL_NORM_TAP else f"layer {t}'s output" for t in spec["taps"]
    ]
    if not spec.get("fuse"):
        return f"the target's {layers[0]}"
    norm = " (each layer's output divided by its RMS)" if spec.get("tap_norm") else ""
    return f"a learned fusion of the target's {', '.join(layers)}{norm}"


# --- training ---------------------------------------------------------------------------------
def train(cfg: HeadTrainCommand) -> None:
    """Train the head on stored features (resumable: ``--ckpt-dir``), exporting it into
    ``--out`` with a held-out curve row every ``--export-every-s`` and at the end."""
    import dataclasses

    from mtad.engine.smollm2 import load_smollm2_target
    from mtad_train.head_train import ShardData
    from mtad_train.head_train import train as train_head

    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.train.seed)
    target, tok = load_smollm2_target("bfloat16")
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    head = _new_head(cfg, target, _vocab(cfg, target, tok, out))
    repeats = dict(r.split("=") for r in cfg.repeat)
    tcfg = dataclasses.replace(
        cfg.train,
        autocast=use_autocast(cfg.autocast),
        source_repeats={k: int(v) for k, v in repeats.items()},
    )
    folders = feature_folders(cfg.features)
    if FINAL_NORM_TAP in cfg.tap_list:  # shards waiting for their final states (finals
        # --watch) join a later run
        folders = [f for f in folders if (f / "final.npy").is_file()]
    data = ShardData(folders, tcfg.source_repeats, taps=cfg.tap_list)
    log = file_log(out / "train.log")
    log(
        f"training on {sum(len(s.lens) for s in data.shards)} sequences, "
        f"{sum(int(s.lens.sum()) for s in data.shards)} positions; config {tcfg}"
    )
    on_step, on_export = _train_callbacks(cfg, head, out, tcfg.autocast, log)
    train_head(
        head,
        data,
        tcfg,
        cfg.ckpt_dir,
        max_steps=cfg.max_steps,
        on_step=on_step,
        on_export=on_export,
        export_every_s=cfg.export_every_s,
        time_budget_s=cfg.time_budget,
        log=log,
    )


def _vocab(cfg: HeadTrainCommand, target, tok, out: Path) -> list[int] | None:
    """The head's sub-vocabulary: the one already in ``out``, else the ``--vocab-size`` most
    frequent response tokens of ``--vocab-from`` (written into ``out``), else None (all)."""
    from mtad.engine.subvocab import VOCAB_FILE, frequency_ranked_ids

    vocab_path = out / VOCAB_FILE
    if vocab_path.is_file():
        return json.loads(vocab_path.read_text())["ids"]
    if not cfg.vocab_size:
        return None
    toks = [t for d in cfg.vocab_from for t in read_ids(d).responses()]
    vocab = frequency_ranked_ids(
        toks, target.config.vocab_size, cfg.vocab_size, always=[tok.eos_token_id, tok.bos_token_id]
    )
    source = "response tokens of " + ", ".join(cfg.vocab_from)
    vocab_path.write_text(json.dumps({"ids": vocab, "k": cfg.vocab_size, "source": source}) + "\n")
    return vocab


def _new_head(cfg: HeadTrainCommand, target, vocab: list[int] | None):
    """A new head of ``--taps``' layout (or the ``--init-from`` head's weights)."""
    from mtad.engine.feature_head import FeatureHead, HeadSpec, load_head

    final = cfg.reads_final  # the final normed state: EAGLE-1/2's layout, regressed (HASS)
    spec = HeadSpec(taps=cfg.tap_list, fuse=not final, final_norm=not final)
    ids = torch.tensor(sorted(vocab)) if vocab else None
    head = FeatureHead.from_target(target, spec, ids, seed=cfg.train.seed)
    if cfg.init_from:  # continue from a saved head (same layout and sub-vocabulary)
        saved = load_head(cfg.init_from, target, vocab).float()
        head.load_state_dict(saved.state_dict())
    return head


def _train_callbacks(cfg: HeadTrainCommand, head, out: Path, autocast: bool, log):
    """``(on_step, on_export)`` of :func:`mtad_train.head_train.train`: a log line every ten
    steps; the head saved into ``out`` and a held-out row appended to ``curve.jsonl``."""
    from mtad_train.head_eval import depth_acceptance
    from mtad_train.head_train import ShardData

    eval_data = (
        ShardData(feature_folders([cfg.eval_features]), taps=cfg.tap_list)
        if cfg.eval_features
        else None
    )
    eval_kinds = read_kinds(cfg.eval_data) if cfg.eval_data else []

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
            depths = cfg.eval_depths
            row["heldout"] = depth_acceptance(
                head, eval_data, eval_kinds, depths, autocast=autocast
            )
            short = {
                k: [round(v[f"d{d + 1}"], 3) for d in range(depths)]
                for k, v in row["heldout"].items()
            }
            log("held-out " + json.dumps(short))
        with open(out / "curve.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")

    return on_step, on_export


def teacher_target(dtype: str) -> torch.nn.Module:
    """The cumulative training's teacher: the target in ``dtype``, its projections on
    prepacked weights where bfloat16 packs (:mod:`mtad.engine.packed`; the teacher's
    sequences are mostly under its 512-row limit). On the Intel Xeon (AMX, one thread): 1.16x
    the positions a second over 16 on-policy sequences, the same signal bit for bit
    (``torch.equal`` on 4 of them), as ``bench.packed_linears`` found for single products."""
    from mtad.engine.packed import set_linears
    from mtad.engine.smollm2 import load_smollm2_target

    target = load_smollm2_target(dtype)[0].eval()
    set_linears(target, "auto")
    return target


def cumulative(cfg: CumulativeConfig) -> None:
    """Go on training the committed head (:mod:`mtad_train.cumulative`): resume from the
    repository's state, teacher on the fly, export + a held-out curve row at the end."""
    from mtad.cpu import choose_dtype
    from mtad.engine.smollm2 import load_smollm2_target
    from mtad.runs.hardware import cpu_hardware
    from mtad_train.cumulative import Source, head_for_training, run_session
    from mtad_train.head_eval import depth_acceptance
    from mtad_train.head_train import ShardData

    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    dtype, why = choose_dtype(cfg.teacher_dtype, "cpu")
    target32, _ = load_smollm2_target("float32")
    head = head_for_training(target32, Path(cfg.head))
    eval_dir = Path(cfg.eval_features)
    kinds = read_kinds(cfg.eval_data)
    autocast = use_autocast("auto")
    target = target32 if dtype == "float32" else teacher_target(dtype)

    eval_data: list[ShardData] = []

    def evaluate(h) -> dict:
        # the held-out features are a cache: completed from the committed ids when a shard is
        # missing (a float32 teacher pass, skipping the complete shards) at the first export
        if not eval_data:
            eval_data.append(heldout_shards(target32, cfg.eval_data, str(eval_dir), head.spec.taps))
        return depth_acceptance(h, eval_data[0], kinds, cfg.eval_depths, autocast=autocast)

    sources = [Source.load(s, cfg.max_len) for s in cfg.sources]
    log = file_log(Path(cfg.ckpt_dir) / "train.log")
    host = {**cpu_hardware(), "teacher_dtype": dtype, "autocast": autocast}
    log(f"teacher {dtype} ({why}); head autocast {autocast}; config {cfg}")
    run_session(
        cfg, head, target, sources, evaluate=evaluate, host=host, log=log, autocast=autocast
    )


def teacher_ahead(cfg: TeacherAheadConfig) -> None:
    """Fill the teacher cache of a cumulative session ahead of its cursor (a second process
    beside ``cumulative``, on another core): the training then finds most of its teacher
    signal computed (:func:`mtad_train.cumulative.fill_ahead`)."""
    from mtad.cpu import choose_dtype
    from mtad_train.cumulative import TEACHER_DIR, Source, fill_ahead, head_spec, stop_on_term
    from mtad_train.teacher import TeacherCache

    torch.set_num_threads(cfg.threads)
    dtype, why = choose_dtype(cfg.teacher_dtype, "cpu")
    target = teacher_target(dtype)
    sources = [Source.load(s, cfg.max_len) for s in cfg.sources]
    taps = head_spec(Path(cfg.head)).taps  # the layers the head reads
    teacher = TeacherCache(Path(cfg.ckpt_dir) / TEACHER_DIR, target, cfg.topk, cfg.max_len, taps)
    log = file_log(Path(cfg.ckpt_dir) / "teacher.log")
    log(f"teacher ahead: {dtype} ({why}); cache {teacher.root}")
    fill_ahead(cfg, teacher, sources, cfg.ahead_steps, stop_on_term(log), log)


def fuse(cfg: FuseCommand) -> None:
    """A fused-layers head warm-started from a committed one (:func:`fuse_warm_start`)."""
    from mtad_train.cumulative import fuse_warm_start

    fuse_warm_start(Path(cfg.head), Path(cfg.out), [int(t) for t in cfg.taps.split(",")])
    print(f"{cfg.out}: taps {cfg.taps}, warm-started from {cfg.head}")


def fork(cfg: ForkCommand) -> None:
    """An A/B arm forked from the cumulative training (:func:`fork_arm`)."""
    from mtad_train.cumulative import fork_arm

    out = Path(cfg.out)
    how = fork_arm(Path(cfg.head), Path(cfg.ckpt_dir), out)
    print(f"{out}: forked from {cfg.head} ({how}); train it with")
    print(
        f"  python scripts/train_head.py cumulative --head {out / 'head'} --ckpt-dir "
        f"{out / 'ckpt'} --max-steps N --export-every-s 0 [the variant's options]"
    )


# name -> (configuration, run, help)
COMMANDS: dict[str, tuple[type, Callable[[Any], None], str]] = {
    "features": (FeaturesCommand, features, "teacher-forced pass: target features + top-k"),
    "eval": (EvalCommand, heldout, "held-out acceptance of a saved head, by depth and kind"),
    "compare": (CompareCommand, compare, "two heads on the same held-out responses, A - B"),
    "finals": (FinalsCommand, finals, "add the final normed state to stored shards"),
    "report": (ReportCommand, report, "a head folder's report, held-out table and curve"),
    "corpus": (CorpusCommand, corpus, "chat-formatted text from this disk, as uint16 ids"),
    "evalset": (EvalsetCommand, evalset, "held-out responses of the evaluation kinds"),
    "respond": (RespondCommand, respond, "the target's responses to the prompt pool, as shards"),
    "train": (HeadTrainCommand, train, "train the head on stored features (resumable)"),
    "fuse": (FuseCommand, fuse, "a head fusing target layers, warm-started from a committed one"),
    "fork": (ForkCommand, fork, "an A/B arm: the committed head and its checkpoint, copied"),
    "cumulative": (
        CumulativeConfig,
        cumulative,
        "go on training the committed head (resumable)",
    ),
    "teacher": (
        TeacherAheadConfig,
        teacher_ahead,
        "fill the cumulative training's teacher cache ahead of it (a second process)",
    ),
}
