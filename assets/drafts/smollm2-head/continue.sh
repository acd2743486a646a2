# Go on training the committed head for one session (issue 39): resumes from training/state.json
# and the weights beside it (or the local checkpoint under .dev/ that descends from them), one
# torch thread, teacher on the fly; exports weights, state and a held-out curve row every 40 min
# and when the budget ends. Commit the folder afterwards. Usage: bash continue.sh [SECONDS]
cd "$(dirname "$0")/../../.." || exit 1
mkdir -p .dev/head/cumulative
exec .venv/bin/python scripts/train_head.py cumulative --threads 1 \
  --time-budget-s "${1:-7200}" --export-every-s 2400 >> .dev/head/cumulative/stdout.log 2>&1
