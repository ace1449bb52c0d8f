#!/usr/bin/env bash
# Regenerate the locks: the exact versions, with their hashes, of every environment the
# scripts make. scripts/setup.sh and scripts/test.sh install from them (BERT_NO_LOCK=1 skips
# them), so CI and the quickstart install what was last tested, whatever PyPI holds that day.
#
#   bash scripts/lock.sh            # every lock, from pyproject.toml and locks/*.in
#   bash scripts/upgrade-check.sh   # first: do the newest releases still work?
#
#   locks/test.txt      .venv: the test and dask extras (scripts/setup.sh, the quickstart)
#   locks/base.txt      .venv-base: the base install (the pipeline alone) + base.in
#   locks/gcp.txt       .venv-gcp: the base install with the gcp extra (Dataflow's dry runs)
#   locks/report.txt    .venv-report: the base install + matplotlib (report.in)
#   locks/readers.txt   .venv-readers: the base install + the exports' readers (readers.in,
#                       and readers-nodeps.in locked without their dependencies)
#   locks/torch.txt     the one torch every environment that has torch installs (written by
#                       hand, not here: its build is the machine's choice, a CPU or a CUDA one)
#
# The tool is uv's `pip compile` (uv pinned below): it resolves from PyPI in seconds, writes
# pip's requirements format with every file's sha256 (pip installs it with --require-hashes
# and no uv), and resolves for a stated target rather than for the machine it runs on. The
# target is what CI and the quickstart run on: CPython 3.11 on x86-64 Linux (manylinux_2_28);
# elsewhere setup.sh says there is no lock and installs pyproject.toml's ranges.
#
# torch is left out of every lock: its build differs by machine (CUDA wheels from PyPI on a
# GPU node, with their nvidia-* packages pinned by torch itself; a CPU build elsewhere), so
# setup.sh installs locks/torch.txt's version first and the lock around it. The resolution
# sees torch's CPU build (from TORCH_FIND_LINKS, default /opt/wheels where it exists, else
# PyTorch's CPU index), so no CUDA-only package enters a lock.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
uv_version=0.13.9
tools="$root/.venv-lock"
if [ "$("$tools/bin/uv" --version 2>/dev/null)" != "uv $uv_version" ]; then
  echo "[lock] installing uv $uv_version into $tools"
  python3 -m venv "$tools"
  "$tools/bin/python" -m pip install --quiet --disable-pip-version-check "uv==$uv_version"
fi

torch_source=()
if [ -n "${TORCH_FIND_LINKS:-}" ] || [ -d /opt/wheels ]; then
  torch_source=(--find-links "${TORCH_FIND_LINKS:-/opt/wheels}")
else
  torch_source=(--extra-index-url https://download.pytorch.org/whl/cpu
    --index-strategy unsafe-best-match)
fi
common=(--python-version 3.11 --python-platform x86_64-manylinux_2_28 --generate-hashes
  --no-emit-package torch --constraint locks/torch.txt "${torch_source[@]}"
  --custom-compile-command "bash scripts/lock.sh" --quiet)

# lock NAME ARGS...: locks/NAME.txt from ARGS (requirement sources, extras), written whole.
lock() {
  local name="$1"
  shift
  echo "[lock] locks/$name.txt"
  "$tools/bin/uv" pip compile "${common[@]}" "$@" -o "locks/$name.txt.tmp"
  mv "locks/$name.txt.tmp" "locks/$name.txt"
}

lock test pyproject.toml --extra test --extra dask
lock base pyproject.toml locks/base.in
lock gcp pyproject.toml locks/base.in --extra gcp
lock report pyproject.toml locks/report.in
lock readers pyproject.toml locks/readers.in
echo "[lock] locks/readers.txt: + readers-nodeps.in, without their dependencies"
"$tools/bin/uv" pip compile "${common[@]}" --no-deps --no-header locks/readers-nodeps.in \
  -o locks/readers-nodeps.tmp
{
  echo "# The readers themselves, without their dependencies (locks/readers-nodeps.in):"
  cat locks/readers-nodeps.tmp
} >>locks/readers.txt
rm locks/readers-nodeps.tmp
echo "[lock] done; the versions that moved: git diff --stat locks/ (then run bash scripts/test.sh)"
