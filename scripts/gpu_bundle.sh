#!/usr/bin/env bash
# The device bundle: every wheel the GPU check (scripts/gpu_check.py, harness sweep included)
# needs beyond a lent device machine's image, fetched here, where PyPI is reachable, into an
# ignored folder that travels with the working tree; then their total size.
#
#   bash scripts/gpu_bundle.sh                  # -> .whl/gpu/, for the image's CPython 3.12
#   bash scripts/gpu_bundle.sh --python 3.11 --dest /tmp/b311   # the same set for another Python
#
# The image (one H200; Python 3.12 with torch, transformers, accelerate and their dependencies;
# nothing can be downloaded there) already holds, by the device tool's own package list
# (/work/.library/device/KINDS.md, read on a machine on 2026-11-17), pandas, python-dateutil,
# six, py-cpuinfo, nvidia-ml-py, psutil, pyyaml, requests, rich, typer and scipy. It lacks what
# run.py imports at run time:
#   Hydra:        hydra-core, omegaconf, antlr4-python3-runtime (PyPI has only its source:
#                 built here into a pure-Python wheel)
#   codecarbon:   codecarbon, pycountry, rapidfuzz
#   smollm2 pair: gguf (transformers' GGUF reader; the GGUF itself travels apart, see
#                 scripts/gpu_device.sh)
# Found by running the harness in a virtual environment holding only torch, transformers and
# accelerate plus the image's packages above (see scripts/gpu_device.sh's header). If the
# image turns out to lack one of them, gpu_device.sh's import probe says which and runs the
# --quick checks: add it to BINARY below.
#
# Two wheels are trimmed of what codecarbon never reads (PRUNE): pycountry's translations
# (locales/, 7.7 of its 8 MiB; codecarbon looks a country up by its ISO code) and rapidfuzz's
# compiled kernels (2.9 of 3 MiB; its own pure-Python implementation takes over, for
# codecarbon's one match of the CPU's name at start-up). Their RECORD drops those entries.
#
# What one device call carries is 64 MiB, the tracked tree included: the script prints the
# bundle, the tree (and its largest files) and their sum against the 48 MiB this project keeps
# as its target (room for a rerun's extra files) and the 64 MiB limit; it fails past 64 MiB.
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
    codecarbon==3.3.2 pycountry==26.2.16 rapidfuzz==3.14.6
    gguf==0.19.0
)
# wheel name prefix -> members (regular expression on the path) left out of it
PRUNE='{"pycountry-": "^pycountry/(locales|tests)/", "rapidfuzz-": "^rapidfuzz/.*_cpp.*[.]so$"}'
rm -rf "$DEST"
mkdir -p "$DEST"
quiet() { grep -v "^WARNING: Location" || true; }  # this machine's extra local indexes
# --no-deps: the list above is the complete set; the image has the rest
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$DEST" "${BINARY[@]}" 2>&1 | quiet
"$PY" -m pip wheel -q --no-deps -w "$DEST" antlr4-python3-runtime==4.9.3 2>&1 | quiet
"$PY" - "$DEST" "$PRUNE" <<'PRUNE_PY'
import json, re, sys, zipfile
from pathlib import Path

dest, prune = Path(sys.argv[1]), json.loads(sys.argv[2])
for prefix, pattern in prune.items():
    (whl,) = dest.glob(prefix + "*.whl")
    drop = re.compile(pattern)
    tmp = whl.with_suffix(".tmp")
    with zipfile.ZipFile(whl) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as out:
        for info in src.infolist():
            if drop.search(info.filename):
                continue
            data = src.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                rows = data.decode().splitlines(keepends=True)
                data = "".join(r for r in rows if not drop.search(r.split(",", 1)[0])).encode()
            out.writestr(info, data, zipfile.ZIP_DEFLATED)
    before = whl.stat().st_size
    tmp.replace(whl)
    print(f"pruned {whl.name}: {before / 2**20:.1f} -> {whl.stat().st_size / 2**20:.1f} MiB")
PRUNE_PY
ls -l "$DEST"
COUNT=$(find "$DEST" -name '*.whl' | wc -l)
EXPECTED=$((${#BINARY[@]} + 1))
[ "$COUNT" -eq "$EXPECTED" ] || { echo "error: $COUNT wheels in $DEST, expected $EXPECTED" >&2; exit 1; }
BUNDLE=$(du -cb "$DEST"/*.whl | tail -1 | cut -f1)
TREE=$(git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- 2>/dev/null \
    | tail -1 | cut -f1)
LIMIT=$((64 * 1024 * 1024))
TARGET=$((48 * 1024 * 1024))
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
echo "largest files of the tree:"
git ls-files -z --cached --others --exclude-standard | du -b --files0-from=- 2>/dev/null \
    | sort -rn | head -4 | awk '{ printf "  %6.1f MiB  %s\n", $1 / 1048576, $2 }'
TOTAL=$((BUNDLE + TREE))
echo "bundle: $COUNT wheels, $(mib "$BUNDLE") in $DEST (cp${PYV/./}); tree $(mib "$TREE");" \
    "together $(mib "$TOTAL") of the 64 MiB a device call carries (target: 48 MiB)"
if [ "$TOTAL" -gt "$LIMIT" ]; then
    echo "error: the tree and the bundle exceed what one device call carries" >&2
    exit 1
elif [ "$TOTAL" -gt "$TARGET" ]; then
    echo "warning: over the 48 MiB target: $(mib $((TOTAL - TARGET))) too much, the tree's" \
        "share $(mib "$TREE")" >&2
fi
