#!/usr/bin/env bash
# Learn of new releases before users do: install the newest versions pyproject.toml allows
# into a scratch environment (.venv-upgrade, made anew each run), print which packages moved
# from the lock (locks/test.txt), and run a smoke set on them:
#
#   build    python -m pipeline build, learning its vocab (Beam, tokenizers, pyarrow)
#   curate   python -m pipeline curate with MinHash and a quality filter
#   train    20 steps of `tiny` through the deepspeed launcher (torch, DeepSpeed)
#   export   the trainer's Hugging Face export, loaded back by transformers, and
#            python -m pipeline export --to tfrecord
#
#   bash scripts/upgrade-check.sh                       # ~5 min on 2 cores
#   UPGRADE_TESTS='-m "not slow"' bash scripts/upgrade-check.sh   # and that pytest run
#
# It prints one line per step and, for a failed one, its last error line and log (all under
# runs/upgrade-check/). Exit 0 when every step passed, 1 otherwise. When it passes, the lock
# can move: `bash scripts/lock.sh`, then `bash scripts/test.sh` on the new lock, and commit
# both. Not part of CI (.ci/run installs the lock): a release upstream must never block a
# submission. torch stays locks/torch.txt's version (TORCH_SPEC to try another): its build
# is the machine's choice, and moving it is a decision of its own.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="$root/.venv-upgrade"
work="${UPGRADE_DIR:-$root/runs/upgrade-check}"
rm -rf "$venv" "$work"
mkdir -p "$work/logs"
export BERT_VENV="$venv" BERT_NO_LOCK=1 SETUP_LOG="$work/logs/setup.log" DS_ACCELERATOR=cpu
echo "upgrade check: the newest releases pyproject.toml allows, in $venv; logs in $work/logs"
# shellcheck disable=SC1091
. "$root/scripts/setup.sh"

echo
echo "== what moved from locks/test.txt"
python - "$root/locks/test.txt" <<'EOF'
import re
import sys
from importlib.metadata import distributions

def canon(name):
    return re.sub(r"[-_.]+", "-", name).lower()

locked = {}
for line in open(sys.argv[1]):
    match = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s;\\]+)", line)
    if match:
        locked[canon(match[1])] = match[2]
now = {canon(d.metadata["Name"]): d.version for d in distributions()}
UNLOCKED = ("pip", "bert-pipeline", "torch")  # torch: locks/torch.txt, kept here
moved = [f"{n} {locked[n]} -> {now[n]}" for n in sorted(locked) if n in now and now[n] != locked[n]]
new = [f"{n} {now[n]}" for n in sorted(now) if n not in locked and n not in UNLOCKED]
gone = [f"{n} {locked[n]}" for n in sorted(locked) if n not in now]
print(f"{len(moved)} of {len(locked)} locked packages moved" + (":" if moved else ""))
for line in moved:
    print(f"  {line}")
if new:
    print("not in the lock: " + ", ".join(new))
if gone:
    print("in the lock, no longer installed: " + ", ".join(gone))
EOF

failed=0
declare -A status
# smoke NAME CMD...: one step of the smoke set, its output in $work/logs/NAME.log.
smoke() {
  local name="$1" t0=$SECONDS rc=0
  shift
  printf '[upgrade-check] %-8s ... ' "$name"
  "$@" >"$work/logs/$name.log" 2>&1 || rc=$?
  if [ "$rc" -eq 0 ]; then
    echo "ok in $((SECONDS - t0)) s"
    status[$name]=ok
  else
    echo "FAILED (exit $rc) in $((SECONDS - t0)) s: $(last_error_line "$work/logs/$name.log")"
    echo "                             log: $work/logs/$name.log"
    status[$name]=failed
    failed=1
  fi
}
# after STEP NAME...: whether the steps NAME... passed (STEP, which needs their output, runs
# only then; it is reported skipped otherwise).
after() {
  local step="$1" name
  shift
  for name in "$@"; do
    if [ "${status[$name]:-}" != ok ]; then
      printf '[upgrade-check] %-8s ... skipped: %s failed\n' "$step" "$name"
      return 1
    fi
  done
}

echo
smoke corpus python -m pipeline corpus --output "$work/corpus" --files 4 --sources docstrings
after build corpus && smoke build python -m pipeline build --input "$work/corpus/*.txt" \
  --output "$work/shards" --vocab_size 2000 --dupe_factor 1 --max_seq_length 64
after curate corpus && smoke curate python -m pipeline curate --input "$work/corpus/*.txt" \
  --output "$work/curated" --filters gopher_quality
after train build && smoke train deepspeed --num_gpus 1 --master_port "$(python -c 'import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')" \
  trainer/run.py --ds-config deploy/cpu.json --data "$work/shards" --model tiny \
  --output-dir "$work/train" --max-steps 20 --log-every 5 --save-every 20
after export build train && smoke export bash -c '
  python -c "import sys; from transformers import BertForPreTraining, BertTokenizerFast
BertForPreTraining.from_pretrained(sys.argv[1]); print(len(BertTokenizerFast.from_pretrained(sys.argv[1])))" "$1/train/hf" &&
  python -m pipeline export "$1/shards" --to tfrecord --output "$1/tfrecord"' _ "$work"
if [ -n "${UPGRADE_TESTS:-}" ]; then
  eval "smoke pytest python -m pytest -p no:cacheprovider -q $UPGRADE_TESTS"
fi

echo
if [ "$failed" = 0 ]; then
  echo "upgrade check passed on the newest releases: bash scripts/lock.sh moves the lock to" \
    "them (then bash scripts/test.sh, and commit locks/)"
else
  echo "upgrade check FAILED on the newest releases (above); the lock stays where it is"
fi
exit "$failed"
