#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment in .venv and install the package with
# its test extras (which include `train`: torch, DeepSpeed, ...; the base install is the
# pipeline's only). Sourced by scripts/test.sh and scripts/quickstart.sh.
#
# The lock: by default every package comes at the exact version, and with the hash, that
# locks/test.txt holds (scripts/lock.sh writes it; docs/testing.md): what CI last tested, on
# any day. BERT_NO_LOCK=1 installs the newest releases pyproject.toml's ranges allow instead
# (what scripts/upgrade-check.sh tries on purpose). The lock is for CPython 3.11 on x86-64
# Linux; elsewhere setup.sh says so and installs the ranges. Another BERT_EXTRAS than the
# lock's (test,dask) installs the ranges too. The versions installed end the setup log.
#
# torch, locks/torch.txt's version (TORCH_SPEC overrides it), is installed first and is in no
# lock: a machine with an NVIDIA GPU takes PyPI's default (CUDA) build, whose nvidia-*
# packages torch pins itself. A machine without one takes a CPU build: from $TORCH_INDEX_URL
# if set, else from PyTorch's CPU index when it answers, else whatever pip resolves for the
# spec (on machines with a local wheel of torch 2.13.0+cpu, that wheel).
#
# Console: one "[setup] ..." line per step; pip's output goes to $SETUP_LOG (default
# .venv/setup.log), whose last lines are shown when a step fails. VERBOSE=1 shows it all.
#
# Re-runs are cheap: after a successful install a stamp (.venv/.setup-stamp) records a hash
# of pyproject.toml, setup.py, this script, the lock, the extras and the torch spec; while
# they are unchanged (and torch still imports) the pip steps are skipped. The package is
# installed editable, so code changes need no reinstall. BERT_SETUP_FORCE=1 reinstalls
# anyway. A fresh clone (CI) has no .venv, so no stamp: everything is installed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${BERT_VENV:-$root/.venv}"
extras="${BERT_EXTRAS:-test,dask}"
# Why pinned in locks/torch.txt and not in pyproject.toml (torch>=2.6): this script makes the
# environment CI and the quickstart run in, whose measured numbers (README) are for one torch,
# and our CI machines hold a local wheel of exactly 2.13.0+cpu. pyproject.toml stays a range so
# that a user's own (CUDA) torch build satisfies it.
torch_spec="${TORCH_SPEC:-$(grep -v '^#' "$root/locks/torch.txt")}"
lock_file="$root/locks/test.txt"
setup_log="${SETUP_LOG:-$venv/setup.log}"
# shellcheck disable=SC1091
. "$root/scripts/install.sh"
mkdir -p "$(dirname "$setup_log")"
: >"$setup_log"

if [ ! -x "$venv/bin/python" ]; then
  setup_step "creating virtual environment $venv" python3 -m venv "$venv"
fi
# shellcheck disable=SC1091
. "$venv/bin/activate"
export PIP_DISABLE_PIP_VERSION_CHECK=1

stamp_file="$venv/.setup-stamp"
stamp="$(
  {
    cat "$root/pyproject.toml" "$root/setup.py" "$root/scripts/setup.sh" "$root/scripts/install.sh" \
      "$lock_file"
    echo "extras=$extras torch=$torch_spec index=${TORCH_INDEX_URL:-} no_lock=${BERT_NO_LOCK:-0}"
  } | python -c 'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())'
)"
if [ "${BERT_SETUP_FORCE:-0}" = 0 ] && [ "$(cat "$stamp_file" 2>/dev/null)" = "$stamp" ] &&
  python -c "import torch" 2>/dev/null; then
  echo "[setup] $venv is up to date (pyproject.toml, setup.py, setup.sh and the lock unchanged" \
    "since its install; BERT_SETUP_FORCE=1 reinstalls)"
  return 0 2>/dev/null || exit 0
fi
rm -f "$stamp_file"

python -c "import torch" 2>/dev/null || install_torch python
[ "$extras" = "test,dask" ] || lock_file=""  # the lock holds those extras, no others
lock_install python "$lock_file" -e "$root[$extras]"
setup_step "checking that every requirement is met (pip check)" pip check
echo "[setup] installed: $(python - <<'PY'
from importlib.metadata import PackageNotFoundError, version
def installed(name):
    try:
        return f"{name} {version(name)}"
    except PackageNotFoundError:
        return f"{name} (none)"
names = ("torch", "apache-beam", "deepspeed", "pyarrow", "tokenizers", "transformers", "numpy")
print(", ".join(installed(name) for name in names))
PY
) (every version: $setup_log)"
echo "$stamp" >"$stamp_file"
