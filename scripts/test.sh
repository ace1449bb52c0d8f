#!/usr/bin/env bash
# Set up the environment (scripts/setup.sh) and run the test suite on CPU.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -k model`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck disable=SC1091
. "$root/scripts/setup.sh"
cd "$root"
export DS_ACCELERATOR="${DS_ACCELERATOR:-cpu}"
ruff check . && ruff format --check .
# pytest exits 5 when it collects no test: that is a failure here too.
python -m pytest "$@"
