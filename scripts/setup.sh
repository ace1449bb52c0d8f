#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment in .venv and install the
# package with its test extras (which include `train`: torch, DeepSpeed, ...; the base
# install is the pipeline's only). Sourced by scripts/test.sh and scripts/quickstart.sh.
#
# torch: a machine with an NVIDIA GPU takes PyPI's default (CUDA) build. A machine
# without one takes a CPU build: from $TORCH_INDEX_URL if set, else from PyTorch's
# CPU index when it answers, else whatever pip resolves for $TORCH_SPEC (on machines
# with a local wheel cache of torch 2.13.0+cpu, that wheel).
#
# Console: one "[setup] ..." line per step; pip's output goes to $SETUP_LOG (default
# .venv/setup.log), whose last lines are shown when a step fails. VERBOSE=1 shows it all.
#
# Re-runs are cheap: after a successful install a stamp (.venv/.setup-stamp) records a hash
# of pyproject.toml, setup.py, this script, the extras and the torch spec; while they are
# unchanged (and torch still imports) the pip steps are skipped. The package is installed
# editable, so code changes need no reinstall. BERT_SETUP_FORCE=1 reinstalls anyway. A fresh
# clone (CI) has no .venv, so no stamp: everything is installed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${BERT_VENV:-$root/.venv}"
extras="${BERT_EXTRAS:-test,dask}"
# Why pinned here and not in pyproject.toml (torch>=2.6): this script makes the environment
# CI and the quickstart run in, whose measured numbers (README) are for one torch, and our CI
# machines hold a local wheel of exactly 2.13.0+cpu. pyproject.toml stays a range so that a
# user's own (CUDA) torch build satisfies it. TORCH_SPEC overrides the pin.
torch_spec="${TORCH_SPEC:-torch==2.13.0}"
setup_log="${SETUP_LOG:-$venv/setup.log}"
mkdir -p "$(dirname "$setup_log")"
: >"$setup_log"

# setup_step MESSAGE CMD...: run CMD with its output in $setup_log; one console line.
setup_step() {
  local message="$1" t0=$SECONDS rc=0
  shift
  if [ "${VERBOSE:-0}" != 0 ]; then
    echo "[setup] $message"
    "$@" 2>&1 | tee -a "$setup_log" || rc=$?
  else
    printf '[setup] %s ... ' "$message"
    "$@" >>"$setup_log" 2>&1 || rc=$?
  fi
  if [ "$rc" -ne 0 ] && [ "${VERBOSE:-0}" != 0 ]; then
    echo "[setup] $message FAILED (exit $rc); log: $setup_log"
    return "$rc"
  elif [ "$rc" -ne 0 ]; then
    echo "FAILED (exit $rc); the end of $setup_log:"
    tail -n 25 "$setup_log" | sed 's/^/    /'
    return "$rc"
  fi
  [ "${VERBOSE:-0}" != 0 ] || echo "done in $((SECONDS - t0)) s"
}

if [ ! -x "$venv/bin/python" ]; then
  setup_step "creating virtual environment $venv" python3 -m venv "$venv"
fi
# shellcheck disable=SC1091
. "$venv/bin/activate"
export PIP_DISABLE_PIP_VERSION_CHECK=1

stamp_file="$venv/.setup-stamp"
stamp="$(
  {
    cat "$root/pyproject.toml" "$root/setup.py" "$root/scripts/setup.sh"
    echo "extras=$extras torch=$torch_spec index=${TORCH_INDEX_URL:-}"
  } | python -c 'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())'
)"
if [ "${BERT_SETUP_FORCE:-0}" = 0 ] && [ "$(cat "$stamp_file" 2>/dev/null)" = "$stamp" ] &&
  python -c "import torch" 2>/dev/null; then
  echo "[setup] $venv is up to date (pyproject.toml, setup.py and setup.sh unchanged since" \
    "its install; BERT_SETUP_FORCE=1 reinstalls)"
  return 0 2>/dev/null || exit 0
fi
rm -f "$stamp_file"

if ! python -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    setup_step "GPU found: installing $torch_spec (default CUDA build)" pip install "$torch_spec"
  else
    index="${TORCH_INDEX_URL:-}"
    if [ -z "$index" ] && python - <<'PY' 2>/dev/null
import urllib.request
urllib.request.urlopen("https://download.pytorch.org/whl/cpu/", timeout=3)
PY
    then
      index="https://download.pytorch.org/whl/cpu"
    fi
    if [ -n "$index" ]; then
      setup_step "no GPU: installing $torch_spec from $index" \
        pip install "$torch_spec" --extra-index-url "$index"
    else
      setup_step "no GPU: installing $torch_spec" pip install "$torch_spec"
    fi
  fi
fi
setup_step "installing the project with extras [$extras]" pip install -e "$root[$extras]"
echo "$stamp" >"$stamp_file"
