#!/usr/bin/env bash
# The install steps scripts/setup.sh, scripts/test.sh and scripts/readers.sh share (sourced;
# defines functions only). They read $root (the checkout), $setup_log (where pip's output
# goes), $extras (the extras asked for) and $torch_spec (locks/torch.txt's, or TORCH_SPEC).
# shellcheck disable=SC1091
. "$root/scripts/errors.sh"

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
    echo "[setup] $message FAILED: $(last_error_line "$setup_log")"
    echo "[setup] the whole log: $setup_log"
    return "$rc"
  fi
  [ "${VERBOSE:-0}" != 0 ] || echo "done in $((SECONDS - t0)) s"
}

# pip_install PYTHON PIP_ARGS...: `PYTHON -m pip install PIP_ARGS`, then the environment's
# modules byte-compiled on every core. pip compiles each file it installs, one at a time:
# for torch and locks/test.txt that was 62 s of the 94 s .venv took (2 cores, 2026-12-07);
# unpacked with --no-compile (31 s), then compiled by compileall's worker processes (27 s),
# the same .pyc files come in 58 s. They matter on machines that set
# PYTHONDONTWRITEBYTECODE=1, as ours do: without them every process compiles what it imports
# (tried on 2026-12-07: the suite's main stream went from 330 to 643 s). A file that does
# not compile on this Python (torch ships one of 3.12's syntax) is named in the log and
# left, as pip leaves it; anything else going wrong fails the step. (A second call re-reads
# every file's .pyc: 7 s for .venv. The editable project, which installs no module, skips it.)
pip_install() {
  local python="$1"
  shift
  # `|| return`: setup_step runs this after `||`, where set -e stops nothing.
  "$python" -m pip install --no-compile "$@" || return
  "$python" - <<'PY'
import compileall, sysconfig
for path in sorted({sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}):
    compileall.compile_dir(path, quiet=1, workers=0)
PY
}

# lock_usable PYTHON: whether the locks apply to PYTHON (and why not, on stdout, if not).
lock_usable() {
  if [ "${BERT_NO_LOCK:-0}" != 0 ]; then
    echo "BERT_NO_LOCK=$BERT_NO_LOCK"
    return 1
  fi
  "$1" -c 'import platform, sys
ok = sys.version_info[:2] == (3, 11) and sys.platform == "linux" and platform.machine() == "x86_64"
print("" if ok else f"the locks are for CPython 3.11 on x86-64 Linux, this is {platform.python_implementation()} {sys.version.split()[0]} on {sys.platform} {platform.machine()}")
sys.exit(0 if ok else 1)'
}

# lock_install PYTHON LOCK PIP_ARGS...: into PYTHON's environment, LOCK (locks/NAME.txt: exact
# versions, hashes checked, no resolution) then the project, editable and without its
# dependencies (all of them are in LOCK); or, where the locks do not apply (lock_usable, or
# LOCK is ""), `pip install PIP_ARGS`: the newest releases the ranges allow. Then `pip freeze`
# in the log.
lock_install() {
  local python="$1" lock="$2" why
  shift 2
  if why="$(lock_usable "$python")" && [ -z "$lock" ]; then
    why="no lock for BERT_EXTRAS=$extras"
  fi
  if [ -n "$lock" ] && [ -z "$why" ]; then
    setup_step "installing ${lock#"$root"/} (exact versions, hashes checked)" \
      pip_install "$python" --require-hashes --no-deps -r "$lock"
    setup_step "installing the project (editable, its dependencies from the lock)" \
      "$python" -m pip install --no-deps --no-build-isolation -e "$root"
  else
    echo "[setup] not using the lock ($why): the newest releases pyproject.toml allows"
    setup_step "installing: pip install $*" pip_install "$python" "$@"
  fi
  {
    echo "== installed in $("$python" -c 'import sys; print(sys.prefix)') (pip freeze)"
    "$python" -m pip freeze --all
  } >>"$setup_log" 2>&1
}

# install_torch PYTHON: $torch_spec into PYTHON's environment: PyPI's default (CUDA) build on
# a machine with an NVIDIA GPU; else a CPU build, from $TORCH_INDEX_URL if set, else from
# PyTorch's CPU index when it answers, else whatever pip resolves for the spec (on machines
# with a local wheel of torch 2.13.0+cpu, that wheel).
install_torch() {
  local python="$1" index="${TORCH_INDEX_URL:-}"
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    setup_step "GPU found: installing $torch_spec (default CUDA build)" \
      pip_install "$python" "$torch_spec"
    return
  fi
  if [ -z "$index" ] && "$python" - <<'PY' 2>/dev/null
import urllib.request
urllib.request.urlopen("https://download.pytorch.org/whl/cpu/", timeout=3)
PY
  then
    index="https://download.pytorch.org/whl/cpu"
  fi
  if [ -n "$index" ]; then
    setup_step "no GPU: installing $torch_spec from $index" \
      pip_install "$python" "$torch_spec" --extra-index-url "$index"
  else
    setup_step "no GPU: installing $torch_spec" pip_install "$python" "$torch_spec"
  fi
}
