# Go on training the committed head for one session (issue 39): resumes from training/state.json
# and the weights beside it (or the local checkpoint under .dev/ that descends from it), one
# torch thread, teacher on the fly; exports weights, state and a held-out curve row every 40 min
# and when the budget ends. Commit the folder afterwards. Usage: bash continue.sh [SECONDS
# [EXPORT_EVERY_S]] (EXPORT_EVERY_S 0: export only when the session ends, e.g. while a reference
# run beside it decodes with the committed head, which must stay one head throughout).
# (--cooldown-s takes the rate down to 0 over the budget's last seconds: tried 2026-12-05 over
# the last sixth, the cooled weights scored as the averages did, notes.md; not used.)
#
# Beside it, niced, a second process fills the teacher cache ahead of the training's cursor
# (train_head.py teacher): the training then runs the head only, ~2x the steps per hour
# (11.5 s a step of 8,192 positions against ~23 s on the Intel Xeon, bf16). Niced, it takes
# what the session's other work leaves of the other core; it stops with the training.
#
# A third process, at the lowest priority of all, writes fresh on-policy shards (`train_head.py
# respond`, the target's own responses to the prompt pool): it takes only what the filler and the
# session's other work leave. The head memorises what it sees again and again (at 114.04M
# positions 0.746 at depth 1 on a shard trained on every epoch, 0.703 on one never seen; notes.md
# 2026-12-06 18:16), but drawing the newest shards at half of every step did not move the
# held-out curve more than drawing the whole folder alike (A/B, notes.md 2026-12-06 21:07): fresh
# shards keep the data growing, they are not a faster lever. New shards join the training when
# the on-policy source's epoch ends; commit them with the head.
#
# When the other core is free (the teacher cached ahead, nothing else to run), hand it to the
# training: `echo 2 > .dev/head/cumulative/threads` (read before each step; 1.70x a step on the
# Intel Xeon); `echo 1 > ...` gives it back. At the real-time priority below, two threads leave
# other work ~5% of the machine. Each session starts at one thread (the file is removed).
# The whole script is one function, read before it runs, called on the same line as the `exit`
# after it: bash reads a script as it goes, so an edit of this file while a session runs would
# otherwise run a shifted copy of it (it did, twice: on 2026-12-06 the function was called on
# one line and `exit` read from the next, whose offset the edit had moved into the function's
# text, so the training, the filler and `respond` started again after the SIGTERM's export).
main() {
  cd "$(dirname "$0")/../../.." || exit 1
  mkdir -p .dev/head/cumulative
  rm -f .dev/head/cumulative/threads
  # The allocator: glibc kept from fresh mappings, torch's transparent huge pages (the file says
  # why; `python -m bench.head_train_step` measures it: ~1.2x a step here).
  set -a
  . scripts/lean_allocator.env
  set +a
  # One core for training whatever else runs: nice alone did not hold it here (the training got
  # ~40% of a core beside four niced jobs, kernel 6.18); a round-robin real-time priority does
  # (~95%; the kernel's RT throttling leaves the core 5% for others). Needs root; else plain.
  run=(.venv/bin/python)
  if [ "$(id -u)" = 0 ] && command -v chrt > /dev/null; then run=(chrt -r 5 .venv/bin/python); fi
  nice -n 10 .venv/bin/python scripts/train_head.py teacher --threads 1 \
    >> .dev/head/cumulative/teacher.stdout 2>&1 &
  teacher=$!
  # at the lowest share of the CPU: a session of its own (setsid) is an autogroup of its own, the
  # unit the kernel shares the CPU between (a plain nice does not reach past it), set to nice 19
  setsid sh -c 'echo 19 > /proc/self/autogroup 2> /dev/null; exec "$@"' respond \
    nice -n 19 .venv/bin/python scripts/train_head.py respond --threads 1 --passes 4 \
    --time-budget-s "${1:-7200}" >> .dev/head/respond.stdout 2>&1 &
  respond=$!
  trap 'kill -TERM "$teacher" "$respond" 2> /dev/null; wait "$respond"' EXIT
  trap 'kill -TERM "$trainer" 2> /dev/null' TERM INT
  "${run[@]}" scripts/train_head.py cumulative --threads 1 \
    --time-budget-s "${1:-7200}" --export-every-s "${2:-2400}" >> .dev/head/cumulative/stdout.log 2>&1 &
  trainer=$!
  wait "$trainer"
  wait "$trainer" 2> /dev/null  # a TERM interrupts the first wait: wait for the export
}
main "$@"; exit
