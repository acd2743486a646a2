#!/usr/bin/env bash
# The device bundle: every wheel the GPU check (scripts/gpu_check.py, harness sweep included)
# needs beyond a lent device machine's image, fetched here, where PyPI is reachable, into an
# ignored folder that travels with the working tree; then their total size.
#
#   bash scripts/gpu_bundle.sh                  # -> .whl/gpu/, for the image's CPython 3.12
#   bash scripts/gpu_bundle.sh --python 3.11 --dest /tmp/b311   # the same set for another Python
#
# The image (one H200; Python 3.12 with torch, transformers, accelerate and their dependencies:
# numpy, pyyaml, tqdm, psutil, typer, rich, pydantic, ...; nothing can be downloaded there) lacks
# what run.py imports at run time:
#   Hydra:        hydra-core, omegaconf, antlr4-python3-runtime (PyPI has only its source:
#                 built here into a pure-Python wheel)
#   codecarbon:   codecarbon, pycountry, rapidfuzz (compiled: cp312), py-cpuinfo (its CPU probe),
#                 nvidia-ml-py (pynvml: GPU energy and the NVML check)
#   summaries:    pandas (compiled: cp312), python-dateutil, six
#   smollm2 pair: gguf (transformers' GGUF reader; the GGUF itself travels apart, see
#                 scripts/gpu_device.sh)
# Found by running the harness in a virtual environment holding only torch, transformers and
# accelerate (see scripts/gpu_device.sh's header); scipy is not in the list: the harness
# imports it only where it computes an interval (mtad/intervals.py), which a smoke sweep of
# two prompts never does.
#
# What one device call carries is 64 MiB, the tracked tree included (~35 MiB, the shipped
# draft's 32 MiB among it): the bundle must stay under ~28 MiB. It prints its size and the
# room left, and fails when the two no longer fit.
set -euo pipefail
cd "$(dirname "$0")/.."
PYV=3.12
DEST=.whl/gpu
while [ $# -gt 0 ]; do
    case "$1" in
        --python) PYV=$2; shift 2 ;;
        --dest) DEST=$2; shift 2 ;;
        *) echo "usage: $0 [--python 3.12] [--dest DIR]" >&2; exit 2 ;;
    esac
done
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
BINARY=(
    hydra-core==1.3.8 omegaconf==2.3.1
    codecarbon==3.3.2 pycountry==26.2.16 rapidfuzz==3.14.6 py-cpuinfo==9.0.0
    nvidia-ml-py==13.615.71
    pandas==3.1.1 python-dateutil==2.9.0.post0 six==1.17.0
    gguf==0.19.0
)
rm -rf "$DEST"
mkdir -p "$DEST"
quiet() { grep -v "^WARNING: Location" || true; }  # this machine's extra local indexes
# --no-deps: the list above is the complete set; the image has the rest
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$DEST" "${BINARY[@]}" 2>&1 | quiet
"$PY" -m pip wheel -q --no-deps -w "$DEST" antlr4-python3-runtime==4.9.3 2>&1 | quiet
ls -l "$DEST"
COUNT=$(find "$DEST" -name '*.whl' | wc -l)
EXPECTED=$((${#BINARY[@]} + 1))
[ "$COUNT" -eq "$EXPECTED" ] || { echo "error: $COUNT wheels in $DEST, expected $EXPECTED" >&2; exit 1; }
BUNDLE=$(du -cb "$DEST"/*.whl | tail -1 | cut -f1)
TREE=$(git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- 2>/dev/null \
    | tail -1 | cut -f1)
LIMIT=$((64 * 1024 * 1024))
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
echo "bundle: $COUNT wheels, $(mib "$BUNDLE") in $DEST (cp${PYV/./}); tree $(mib "$TREE");" \
    "together $(mib $((BUNDLE + TREE))) of the 64 MiB a device call carries"
if [ $((BUNDLE + TREE)) -gt "$LIMIT" ]; then
    echo "error: the tree and the bundle exceed what one device call carries" >&2
    exit 1
fi
