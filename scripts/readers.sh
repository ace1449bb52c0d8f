#!/usr/bin/env bash
# Make an environment that reads this project's MDS and Megatron exports with their trainers'
# own packages, on a machine with PyPI only, with or without a GPU:
#
#   bash scripts/readers.sh                # into .venv-readers
#   bash scripts/readers.sh ~/readers      # or another directory
#
# It holds the base install (`pip install -e .`), torch (locks/torch.txt's version, as
# scripts/setup.sh picks its build), mosaicml-streaming and megatron-core, at the versions
# locks/readers.txt holds (exact, hashes checked; BERT_NO_LOCK=1 or another Python than the
# lock's: locks/readers-nodeps.in and locks/readers.in, unlocked). It is what scripts/test.sh
# runs tests/pipeline/test_export_mds.py and test_export_megatron.py in, so the reads
# docs/exports.md shows are tested in exactly this environment.
#
# Why not `pip install -e '.[mds]'`: mosaicml-streaming's declared dependencies bring its
# cloud clients, matplotlib and torchvision, and `import streaming` imports torchvision (for
# its vision datasets, which reading MDS never uses). PyPI's torchvision wheels are CUDA
# builds: beside a CPU torch they fail to load (`operator torchvision::nms does not exist`),
# and so does `import streaming`. So both readers go in without their declared dependencies
# (locks/readers-nodeps.in) plus what their imports need (locks/readers.in), and, where no
# torchvision imports, a stub of the two names streaming imports from it takes its place
# (it says so). With PyTorch's own index at hand, a real CPU torchvision works as well.
#
# BERT_READERS_FROM=VENV starts from a copy of VENV, an environment holding the base install
# (scripts/test.sh passes its .venv-base), instead of a new one. pip's output goes to
# DIR/setup.log; one "[setup] ..." line per step, as scripts/setup.sh prints.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$(realpath -m "${1:-$root/.venv-readers}")"
extras="readers"
torch_spec="${TORCH_SPEC:-$(grep -v '^#' "$root/locks/torch.txt")}"
setup_log="$venv/setup.log"
export PIP_DISABLE_PIP_VERSION_CHECK=1
# shellcheck disable=SC1091
. "$root/scripts/install.sh"

rm -rf "$venv"
if [ -n "${BERT_READERS_FROM:-}" ]; then
  mkdir -p "$(dirname "$venv")"
  cp -a "$BERT_READERS_FROM" "$venv"
  : >"$setup_log"
  echo "[setup] $venv: a copy of $BERT_READERS_FROM"
else
  mkdir -p "$venv"
  : >"$setup_log"
  setup_step "creating virtual environment $venv" python3 -m venv "$venv"
fi
python="$venv/bin/python"
"$python" -c "import torch" 2>/dev/null || install_torch "$python"
if lock_usable "$python" >/dev/null; then
  lock_install "$python" "$root/locks/readers.txt"
else
  mapfile -t readers < <(grep -v '^#' "$root/locks/readers-nodeps.in")
  mapfile -t reader_deps < <(grep -v -e '^#' -e '^-r' "$root/locks/readers.in")
  lock_install "$python" "" -e "$root"
  setup_step "installing ${readers[*]} (without their declared dependencies)" \
    pip_install "$python" --no-deps "${readers[@]}"
  setup_step "installing what they import: ${reader_deps[*]}" \
    pip_install "$python" "${reader_deps[@]}"
fi

# torchvision_stub: the two names streaming/vision/base.py imports, and nothing else.
torchvision_stub() {
  local site
  site="$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  mkdir -p "$site/torchvision/datasets" "$site/torchvision/transforms"
  echo '"""A stub: streaming imports torchvision for its vision datasets only."""' \
    >"$site/torchvision/__init__.py"
  printf 'class VisionDataset:\n    """A stub."""\n\n\nclass CIFAR10(VisionDataset):\n    """A stub."""\n' \
    >"$site/torchvision/datasets/__init__.py"
  : >"$site/torchvision/transforms/__init__.py"
  printf 'def to_tensor(pic):\n    raise NotImplementedError("a stub of torchvision")\n' \
    >"$site/torchvision/transforms/functional.py"
}
if ! "$python" -c "import torchvision" 2>/dev/null; then
  setup_step "no torchvision imports here: writing a stub of the names streaming imports" \
    torchvision_stub
fi
setup_step "checking that both readers import" "$python" -c \
  "import streaming, megatron.core.datasets.indexed_dataset"
echo "[setup] $venv reads the exports: $venv/bin/python, as docs/exports.md shows"
