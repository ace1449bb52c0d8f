#!/usr/bin/env bash
# Set up the environment (scripts/setup.sh; skipped when nothing it installs changed) and
# run lint plus the whole test suite on CPU: what CI runs (.ci/run). Extra arguments go to
# pytest, e.g. `bash scripts/test.sh -k model`, or `bash scripts/test.sh -m "not slow"` for
# the fast tier (no DeepSpeed launches or Beam worker processes). pytest prints the 15
# slowest tests at the end (pyproject.toml).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck disable=SC1091
. "$root/scripts/setup.sh"
cd "$root"
export DS_ACCELERATOR="${DS_ACCELERATOR:-cpu}"
ruff check . && ruff format --check .
# pytest exits 5 when it collects no test: that is a failure here too.
python -m pytest "$@"
