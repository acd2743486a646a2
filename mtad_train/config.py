"""The configurations of the training commands: one dataclass per command, one field per option.

Each field's default and help text are written here once; ``scripts/distill_draft.py`` and
``scripts/train_head.py`` make their options from these dataclasses (:mod:`mtad_train.cli`) and
the runs read the typed fields. :class:`DistillConfig` is a distillation
(:mod:`mtad_train.loop`); the others are the sub-commands of the feature head's command line
(:mod:`mtad_train.head_commands`); the head's optimisation itself is
:class:`mtad_train.head_train.HeadTrainConfig` (nested in :class:`HeadTrainCommand`) and a
cumulative session's :class:`mtad_train.cumulative.CumulativeConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mtad_train.cli import opt
from mtad_train.drafts import DraftSpec
from mtad_train.head_train import HeadTrainConfig

REPO = Path(__file__).resolve().parents[1]
AUTOCAST = ("auto", "bf16", "off")
HELDOUT_FEATURES = ".dev/head/features/heldout"
HELDOUT_IDS = "assets/evalsets/smollm2-heldout.npz"


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


@dataclass
class DistillConfig:
    """Distil a small draft model that shares a target's tokenizer (online knowledge
    distillation); ``scripts/distill_draft.py``."""

    target: str = "smollm2"
    target_dtype: str = "bfloat16"
    device: str = opt(default_factory=default_device)
    threads: int = opt(0, help="torch CPU threads (0 = leave)")
    seed: int = 0
    out: str = opt("", required=True, help="output folder (one sub-folder per draft)")
    ckpt_dir: str | None = opt(None, help="resumable training state (atomic)")
    ckpt_every_s: float = 120.0
    export_every_s: float = opt(
        90.0, help="write the drafts + report into --out this often (0 = only at the end)"
    )
    transport_dir: str | None = opt(
        None, help="also write split copies (<draft>.st.partNN + meta.tar) here"
    )
    transport_chunk_mib: float = 15.5
    save_data: bool = opt(
        False,
        help="also save the generated sequences (uint16 ids) as data.npz in --out "
        "(and as data.npz.partNN in --transport-dir), to reuse with --data-in",
    )
    data_in: list[str] = opt(
        default_factory=list,
        nargs="*",
        help="data.npz files of earlier runs, added to the buffer before training",
    )
    init_from: str | None = opt(
        None, help="start the drafts from this draft folder (same architecture)"
    )
    eval_only: bool = opt(
        False, help="no training: evaluate --init-from and write its report into --out"
    )
    # data
    pool: str = str(REPO / ".dev" / "distill_pool.jsonl.gz")
    pool_seed: int = 0
    default_prompts: str | None = opt(None, help="default prompt set (jsonl)")
    ngram: int = opt(8, help="n of the disjointness check")
    max_prompt_tokens: int = 448
    max_seq_tokens: int = 704
    gen_batch_size: int = 512
    gen_max_new: int = 192
    gen_greedy_frac: float = opt(
        0.2, help="fraction of generation batches decoded greedily (rest: warped sampling)"
    )
    followup_frac: float = opt(0.1, help="fraction of generated chats that get a second user turn")
    # drafts and optimisation
    drafts: list[DraftSpec] = opt(
        default_factory=lambda: [DraftSpec.parse("L4:layers=4")],
        parse=DraftSpec.parse,
        help="draft specs, e.g. L4:layers=4 L2:layers=2,tv_weight=0 (default: L4)",
    )
    teacher_topk: int = opt(
        64,
        help="store the target's top-k log-probs while it generates and train on "
        "them (top-k KL, no second target forward); 0 = full-vocabulary KL "
        "with the target run again at every step",
    )
    init_embed: str = opt("pca", choices=("pca", "random"))
    lr: float = 2e-3
    min_lr_frac: float = 0.05
    warmup_steps: int = 50
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    tokens_per_step: int = 32768
    micro_tokens: int = 16384
    prompt_weight: float = opt(
        0.0,
        help="loss weight of prompt positions (response positions weigh 1); with "
        "--teacher-topk the target's top-k there comes from one teacher-forced "
        "pass per sequence, stored like the response positions'",
    )
    replay_ratio: float = opt(
        4.0, help="in the interleaved phase, train until trained/generated tokens >= this"
    )
    autocast: str = opt("auto", choices=AUTOCAST)
    # schedule: time or steps
    time_budget: float = opt(0.0, help="seconds for the whole run (0 = use --max-steps)")
    gen_frac: float = opt(
        0.6, help="fraction of the budget (time or steps) spent interleaving generation"
    )
    final_reserve_s: float = 20.0
    max_steps: int = 0
    # held-out report
    eval_n_humaneval: int = 164
    eval_n_mtbench: int = 80
    eval_n_default: int = 10_000
    eval_n_pool: int = opt(
        128, help="held-out pool items (never trained on) to measure the generalisation gap"
    )
    eval_max_new: int = 128
    eval_mtbench_turn2: bool = True
    eval_batch_size: int = 256
    require_eval_kinds: str = opt(
        "humaneval,mtbench", help="fail early unless these evaluation sets are found (comma list)"
    )

    def __post_init__(self) -> None:
        if self.eval_only:
            if not self.init_from:
                raise ValueError("--eval-only needs --init-from")
            self.time_budget, self.max_steps = 0.0, 0
        elif not self.time_budget and not self.max_steps:
            raise ValueError("give --time-budget or --max-steps")


# --- scripts/train_head.py: one dataclass per sub-command --------------------------------------
@dataclass
class FeaturesCommand:
    """Teacher-forced pass: target features + top-k."""

    data: str = opt("", required=True, help="ids in the data.npz layout")
    out: str = opt("", required=True)
    part: str = opt("0/1", help="i/n: this process writes shards j %% n == i")
    threads: int = 1
    dtype: str = "bfloat16"
    shard_tokens: int = 65_536


@dataclass
class EvalCommand:
    """Held-out acceptance of a saved head, by depth and kind."""

    head: str = opt("", required=True)
    eval_features: str = HELDOUT_FEATURES
    eval_data: str = HELDOUT_IDS
    depths: int = 4
    threads: int = 1
    json: str | None = None
    autocast: str = opt("auto", choices=AUTOCAST)


@dataclass
class CompareCommand:
    """Two heads on the same held-out responses: A minus B by depth and kind, with paired
    bootstrap intervals over the responses."""

    head: str = opt("", required=True, help="head A: a folder, or REV:FOLDER (committed at REV)")
    against: str = opt("", required=True, help="head B: a folder, or REV:FOLDER")
    eval_features: str = HELDOUT_FEATURES
    eval_data: str = HELDOUT_IDS
    depths: int = 4
    threads: int = 1
    autocast: str = opt("auto", choices=AUTOCAST)
    confidence: float = 0.95
    resamples: int = 9999
    seed: int = 0
    json: str | None = None

    def __post_init__(self) -> None:
        if not 0.0 < self.confidence < 1.0:
            raise ValueError("--confidence must be in (0, 1)")
        if self.resamples < 100:
            raise ValueError("--resamples must be at least 100")


@dataclass
class FinalsCommand:
    """Add the final normed state to stored shards."""

    features: list[str] = opt(default_factory=list, required=True)
    threads: int = 1
    dtype: str = "bfloat16"
    watch: bool = opt(False, help="keep adding as new shards appear")


@dataclass
class FuseCommand:
    """A head that fuses tapped target layers (EAGLE-3), warm-started from a committed head that
    reads the final normed state alone: it starts as that head and goes on from its state."""

    head: str = opt("", required=True, help="the committed head folder to start from")
    out: str = opt("", required=True, help="the new head folder (must not exist)")
    taps: str = opt("2,15,-1", help="target layers fused, -1 (the final normed state) among them")


@dataclass
class ForkCommand:
    """An arm of an A/B between training variants: the committed head and its local checkpoint
    copied into a new folder, the teacher cache linked (``mtad_train.cumulative.fork_arm``)."""

    out: str = opt("", required=True, help="the arm's folder (must be new): out/head, out/ckpt")
    head: str = "assets/drafts/smollm2-head"
    ckpt_dir: str = ".dev/head/cumulative"


@dataclass
class ReportCommand:
    """A head folder's report, held-out table and curve."""

    head: str = opt("", required=True)
    title: str = "shipped"
    eval_features: str = HELDOUT_FEATURES
    eval_data: str = HELDOUT_IDS
    depths: int = 4
    curves: list[str] = opt(
        default_factory=list, nargs="*", help="curve.jsonl of each stage, in order"
    )
    compare_draft: str | None = opt(None, help="an independent draft folder")
    against: str | None = opt(
        None, help="another head (a folder, or REV:FOLDER): the gain over it, paired intervals"
    )
    notes: str | None = None
    threads: int = 1
    autocast: str = opt("auto", choices=AUTOCAST)


@dataclass
class CorpusCommand:
    """Chat-formatted text from this disk, as uint16 ids."""

    out: str = opt("", required=True)
    max_tokens: int = 4_000_000
    seed: int = 0


@dataclass
class EvalsetCommand:
    """Held-out responses of the evaluation kinds."""

    out: str = opt("", required=True)
    n_humaneval: int = 164
    n_mtbench: int = 80
    max_prompt_tokens: int = 512
    max_new: int = 96
    batch_size: int = 64
    threads: int = 1
    dtype: str = "bfloat16"
    seed: int = 20261202


@dataclass
class HeadTrainCommand:
    """Train the head on stored features (resumable)."""

    features: list[str] = opt(default_factory=list, required=True, help="feature folders (shards)")
    repeat: list[str] = opt(default_factory=list, nargs="*", help="FOLDER=N: passes per epoch")
    eval_features: str | None = None
    eval_data: str | None = opt(None, help="the held-out ids (kinds)")
    out: str = opt("", required=True)
    ckpt_dir: str = opt("", required=True)
    taps: str = "2,15,28"
    vocab_size: int = 16384
    vocab_from: list[str] = opt(default_factory=list, nargs="*")
    eval_depths: int = opt(4, help="draft depths evaluated")
    init_from: str | None = opt(None, help="a saved head to continue from")
    autocast: str = opt("auto", choices=AUTOCAST)
    threads: int = 1
    export_every_s: float = 1800.0
    time_budget: float = 0.0
    max_steps: int = 0
    train: HeadTrainConfig = opt(default_factory=HeadTrainConfig)  # its fields are options too

    @property
    def tap_list(self) -> list[int]:
        return [int(t) for t in self.taps.split(",")]

    @property
    def reads_final(self) -> bool:
        """The final normed state (tap -1): EAGLE-1/2's layout, regressed (HASS)."""
        return self.tap_list == [-1]
