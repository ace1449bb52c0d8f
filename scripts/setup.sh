#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment in .venv and install the
# package with its test extras. Sourced by scripts/test.sh and scripts/quickstart.sh.
#
# torch: a machine with an NVIDIA GPU takes PyPI's default (CUDA) build. A machine
# without one takes a CPU build: from $TORCH_INDEX_URL if set, else from PyTorch's
# CPU index when it answers, else whatever pip resolves for $TORCH_SPEC (on machines
# with a local wheel cache of torch 2.13.0+cpu, that wheel).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${BERT_VENV:-$root/.venv}"
extras="${BERT_EXTRAS:-test,dask}"
torch_spec="${TORCH_SPEC:-torch==2.13.0}"

if [ ! -x "$venv/bin/python" ]; then
  echo "[setup] creating virtual environment $venv"
  python3 -m venv "$venv"
fi
# shellcheck disable=SC1091
. "$venv/bin/activate"
export PIP_DISABLE_PIP_VERSION_CHECK=1
pip_q=(pip install --quiet)

if ! python -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "[setup] GPU found: installing $torch_spec (default CUDA build)"
    "${pip_q[@]}" "$torch_spec"
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
      echo "[setup] no GPU: installing $torch_spec from $index"
      "${pip_q[@]}" "$torch_spec" --extra-index-url "$index"
    else
      echo "[setup] no GPU: installing $torch_spec"
      "${pip_q[@]}" "$torch_spec"
    fi
  fi
fi
echo "[setup] installing the project with extras [$extras]"
"${pip_q[@]}" -e "$root[$extras]"
