#!/usr/bin/env bash
# Set up the environment (scripts/setup.sh; skipped when nothing it installs changed) and
# run lint plus the whole test suite on CPU: what CI runs (.ci/run). Extra arguments go to
# pytest, e.g. `bash scripts/test.sh -k model`, or `bash scripts/test.sh -m "not slow"` for
# the fast tier (no DeepSpeed launches or Beam worker processes). pytest prints the 15
# slowest tests at the end (pyproject.toml).
#
# Every environment below is installed from its lock, locks/NAME.txt (exact versions and
# hashes; scripts/lock.sh writes them, docs/testing.md), as .venv is by setup.sh; with
# BERT_NO_LOCK=1 each takes the newest releases its ranges allow instead.
#
# The base install: `pip install -e .` is the data pipeline alone (no torch), and it is what
# Beam installs on its workers. So a run without arguments (CI's) first runs the pipeline's
# fast tests (`tests/pipeline -m "not slow"`) in a second environment, .venv-base, that holds
# `pip install -e . pytest` and nothing else: a torch import crept into pipeline/ or
# tests/helpers.py fails there. Tests that need an extra (transformers, datasets, tfrecord,
# matplotlib, dask) skip saying which. .venv-base is made once and reused while
# pyproject.toml, setup.py and this script are unchanged (a stamp, as scripts/setup.sh
# keeps); pip's cache serves its wheels. BERT_TEST_BASE=1 runs this check even with pytest
# arguments, BERT_TEST_BASE=0 skips it. The tests that pass there are not run again in .venv
# (tests/conftest.py: the list of what passed goes from one run to the other), so each runs
# once; those the base install skips run in .venv.
#
# Then, in a third environment, .venv-gcp (a copy of .venv-base plus `pip install -e
# '.[gcp]'`, what deploy/beam/dataflow.sh asks for), the DataflowRunner's dry runs of a build
# and an export (tests/pipeline/test_dry_run.py -m slow; no credentials, no network calls).
# Not in .venv: with the gcp extra installed, Beam no longer warns "apitools not found" on
# import, the warning that gave every process Python's root log handler, so Beam's local
# worker processes log otherwise (their INFO lines no longer reach Beam's log file). Copying
# .venv-base means only the extra is installed; same stamp; BERT_TEST_BASE covers it too.
#
# The exports' readers, in an environment of their own, .venv-readers: what scripts/readers.sh
# makes for users (mosaicml-streaming 0.13.0 and megatron-core 0.16.1 with torch 2.13.0 for
# CPU; it says why not the mds extra), started from a copy of .venv-base;
# tests/pipeline/test_export_mds.py and test_export_megatron.py. Same stamp; BERT_TEST_BASE
# covers it too.
#
# And in .venv-report (a copy of .venv-base plus matplotlib)
# tests/report/test_base_install.py: the summary, the plots and `pipeline stats --plot` read
# a run's output where no training stack is installed. The rest of tests/report runs in .venv.
#
# .venv-gcp, .venv-report and .venv-readers are made in the background while the base
# install's tests run (their output, the "[setup] ..." lines, is shown when both end);
# their own tests follow, then the main run in .venv.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# shellcheck disable=SC1091
. "$root/scripts/install.sh"

# What .venv-base and .venv-gcp install: their stamp.
deps_stamp="$(cat pyproject.toml setup.py scripts/test.sh scripts/install.sh scripts/readers.sh locks/* | python3 -c \
  'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())')"

# fresh VENV NAME: whether VENV must be (re)made: missing, or made from other files (its
# stamp, .NAME-stamp, differs from $deps_stamp).
fresh() {
  [ "$(cat "$1/.$2-stamp" 2>/dev/null)" != "$deps_stamp" ] || [ ! -x "$1/bin/python" ]
}

# make_base: .venv-base, the base install (pip install -e . pytest), without torch.
make_base() {
  local venv="$root/.venv-base"
  if fresh "$venv" base; then
    rm -rf "$venv"
    mkdir -p "$venv"
    local setup_log="$venv/setup.log"
    setup_step "creating $venv (the base install: pip install -e . pytest)" \
      python3 -m venv "$venv"
    lock_install "$venv/bin/python" "$root/locks/base.txt" -e "$root" pytest
    setup_step "checking that every requirement is met (pip check)" "$venv/bin/pip" check
    echo "$deps_stamp" >"$venv/.base-stamp"
  fi
  if "$venv/bin/python" -c "import torch" 2>/dev/null; then
    echo "the base install ($venv) holds torch: a base dependency pulls it in" >&2
    return 1
  fi
}

# make_extra NAME LOCK PIP_ARGS...: .venv-NAME, a copy of .venv-base plus LOCK (or PIP_ARGS).
make_extra() {
  local name="$1" lock="$2" venv="$root/.venv-$1"
  shift 2
  if fresh "$venv" "$name"; then
    rm -rf "$venv"
    setup_step "creating $venv (a copy of .venv-base)" cp -a "$root/.venv-base" "$venv"
    lock_install "$venv/bin/python" "$lock" "$@"
    setup_step "checking that every requirement is met (pip check)" "$venv/bin/pip" check
    echo "$deps_stamp" >"$venv/.$name-stamp"
  fi
}

# make_side_venvs: the three environments the side tests run in, one after another.
make_side_venvs() {
  make_extra gcp "$root/locks/gcp.txt" -e "${root}[gcp]"
  make_extra report "$root/locks/report.txt" "matplotlib>=3.7"
  if fresh "$root/.venv-readers" readers; then
    BERT_READERS_FROM="$root/.venv-base" bash "$root/scripts/readers.sh" "$root/.venv-readers"
    echo "$deps_stamp" >"$root/.venv-readers/.readers-stamp"
  fi
}

# side_tests: the base install's tests (.venv-base, made by the background job $base_job
# while setup.sh made .venv), while the other environments are made beside them, then the
# tests of each of those.
side_tests() {
  local side_log="$root/.venv-base/side-setup.log" rc=0 side
  wait "$base_job" || rc=$?
  base_job=""
  cat "$work/base.log"
  [ "$rc" -eq 0 ] || return "$rc"
  make_side_venvs >"$side_log" 2>&1 &
  side=$!
  echo "[test] tests/pipeline on the base install (.venv-base, no torch); making .venv-gcp," \
    ".venv-report and .venv-readers meanwhile"
  BERT_TEST_PASSED_TO="$passed" "$root/.venv-base/bin/python" -m pytest tests/pipeline \
    -m "not slow" -p no:cacheprovider -q --durations=5 || rc=$?
  wait "$side" || rc=$?
  cat "$side_log"
  [ "$rc" -eq 0 ] || return "$rc"

  echo "[test] the DataflowRunner's dry runs on the gcp extra (.venv-gcp)"
  BERT_GCP_TESTS=1 "$root/.venv-gcp/bin/python" -m pytest tests/pipeline/test_dry_run.py \
    -m slow -p no:cacheprovider -q --durations=3
  if "$root/.venv-report/bin/python" -c "import torch" 2>/dev/null; then
    echo "the reports' environment (.venv-report) holds torch: matplotlib pulls it in?" >&2
    return 1
  fi
  echo "[test] the reports on the base install plus matplotlib (.venv-report, no torch)"
  "$root/.venv-report/bin/python" -m pytest tests/report/test_base_install.py \
    -p no:cacheprovider -q --durations=3
  echo "[test] the MDS and Megatron exports read by streaming and megatron-core (.venv-readers)"
  BERT_MDS_TESTS=1 BERT_MEGATRON_TESTS=1 "$root/.venv-readers/bin/python" -m pytest \
    tests/pipeline/test_export_mds.py tests/pipeline/test_export_megatron.py \
    -p no:cacheprovider -q --durations=3
}

# The tests that passed on the base install (side_tests), left out of the last run.
passed="$(mktemp)"
work="$(mktemp -d)"
base_job=""
trainer=""
# On the way out (a failed step stops the script, set -e): background work still going (the
# base install's setup, the tests/trainer run) is stopped too.
cleanup() {
  if [ -n "$base_job" ] && kill -0 "$base_job" 2>/dev/null; then
    kill -- "-$base_job" 2>/dev/null || true
  fi
  if [ -n "$trainer" ] && kill -0 "$trainer" 2>/dev/null; then
    echo "[test] stopping the tests/trainer run (pid $trainer): an earlier step failed" >&2
    kill "$trainer" 2>/dev/null || true
  fi
  rm -rf "$passed" "$work"
}
trap cleanup EXIT

# Without arguments (CI's run), tests/trainer runs beside the rest, in the background (below).
streams=0
if [ $# -eq 0 ] && [ "${BERT_TEST_STREAMS:-1}" != 0 ]; then
  streams=1
fi
base="${BERT_TEST_BASE:-$([ $# -eq 0 ] && echo 1 || echo 0)}"

# .venv-base is made while setup.sh makes .venv, niced, on the core .venv's pip leaves idle
# (pip unpacks on one; a fresh clone, quiet: half the machine idle for setup.sh's first
# 100 s, 2026-12-07). Its console lines are shown when the base install's tests start.
# A process group of its own (set -m), so that a failure elsewhere stops its pip too.
if [ "$base" != 0 ]; then
  set -m
  (
    renice -n 10 -p "$BASHPID" >/dev/null || true
    make_base
  ) >"$work/base.log" 2>&1 &
  base_job=$!
  set +m
fi

# shellcheck disable=SC1091
. "$root/scripts/setup.sh"
export DS_ACCELERATOR="${DS_ACCELERATOR:-cpu}"
# Two commands, not `a && b`: set -e does not stop at a failed command left of &&.
ruff check .
ruff format --check .

# tests/trainer in the background: its time is mostly its DeepSpeed launches starting up
# (processes, imports, ranks waiting on each other), which leaves room on the cores for the
# other tests. Its output is shown when both have ended; the script fails if either failed.
# tests/trainer/test_deploy.py (the GPU script rehearsed on the CPU) runs after the rest
# instead, so that the two streams end near each other (a fresh clone, quiet: the background
# 877 s with it, the rest 575 s without it). BERT_TEST_STREAMS=0 runs one after the other.
deploy=""
if [ "$streams" != 0 ]; then
  # The two streams share the cores: torch in each pytest process takes half of them
  # (launches' ranks already take one each, tests/helpers.py). Between a tiny model's small
  # ops OpenMP's idle threads spin, taking a core from the other stream; one thread each is
  # also no slower alone on 2 cores (docs/results.md, "The test suite").
  cores="$(nproc)"
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$((cores > 1 ? cores / 2 : 1))}"
  echo "[test] tests/trainer in the background (its output follows the rest's)"
  python -m pytest tests/trainer --ignore=tests/trainer/test_deploy.py \
    --basetemp="$work/trainer" >"$work/trainer.log" 2>&1 &
  trainer=$!
  deploy=tests/trainer/test_deploy.py
  # Its GPU configs on the CPU need DeepSpeed's CPU Adam op, a minute of compiling on a
  # fresh machine: built now, beside the side stage's pip installs (trainer/ops.py; a
  # failure here is test_deploy's to report).
  python -m trainer.ops deploy/zero2.json >"$work/ops.log" 2>&1 &
  set -- --ignore=tests/trainer
fi

if [ "$base" != 0 ]; then
  side_tests
  export BERT_TEST_PASSED_IN="$passed"
fi

# pytest exits 5 when it collects no test: that is a failure here too.
rc=0
python -m pytest "$@" || rc=$?
if [ -n "$deploy" ]; then
  echo "[test] $deploy (the rest of tests/trainer runs in the background)"
  python -m pytest "$deploy" || rc=$?
fi
if [ -n "$trainer" ]; then
  trainer_rc=0
  wait "$trainer" || trainer_rc=$?
  echo "[test] tests/trainer (run beside the above; exit $trainer_rc):"
  cat "$work/trainer.log"
  [ "$trainer_rc" -eq 0 ] || rc=$trainer_rc
fi
exit "$rc"
