#!/usr/bin/env bash
# The prepared GPU check (issue 18): one line per check, then "N passed, M failed".
# On a machine without a usable GPU the CUDA-only checks are skipped, the rest run on the CPU.
#   bash scripts/gpu_check.sh [--quick] [--device cuda:1] [--only NAME]
# See scripts/gpu_check.py for what each check proves. Exit status 1 when a check failed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
export HF_HUB_OFFLINE=1 WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false
exec "$PY" scripts/gpu_check.py "$@"
