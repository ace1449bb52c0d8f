#!/usr/bin/env bash
# A wheelhouse for GPU nodes without internet whose image already holds torch: every wheel
# the trainer needs beyond what such an image has, for the node's Python and platform.
#
#   bash deploy/wheelhouse.sh OUT [PYTHON_VERSION] [PLATFORM]
#   bash deploy/wheelhouse.sh wheels 3.12 manylinux2014_x86_64     # a CUDA image, Python 3.12
#   bash deploy/wheelhouse.sh wheels                                # this machine's Python
#
# Carry OUT to the node (next to the repository, or inside it under an ignored path), then:
#
#   pip install --no-index --find-links OUT -r OUT/requirements.txt
#
# and run the trainer from the repository as usual (`python trainer/run.py ...`; it needs no
# Beam: trainer/ imports only the shard contract and the algorithms of pipeline/).
#
# What goes in:
# - DeepSpeed, built here as a pure-Python wheel (DS_BUILD_OPS=0, its default): its ops
#   would build at first use, and a GPU run needs none of them with torch's AdamW
#   (deploy/gpu_bench.sh: TORCH_ADAM=1, its default) and bf16 (no CPU ops on a GPU node).
# - What DeepSpeed and the trainer's `train` extra need (pydantic, hjson, msgpack, einops,
#   ninja, py-cpuinfo, safetensors, tensorboard, matplotlib, tqdm, ... and theirs), as pip
#   resolves them for the target (`pip install --dry-run --report`, binary wheels only).
# - Not torch, nor what torch brings (nvidia-*, triton, sympy, networkx, ...): the image's.
#   SKIP="name ..." leaves more out (names as pip writes them).
#
# OUT/requirements.txt holds the top-level requirements (DeepSpeed pinned to the version
# built): pip keeps what the image has where it satisfies them and takes the rest from OUT.
# Needs pip 22.2 or newer (--report) and PyPI here; torch installed here (DeepSpeed's build
# imports it).
set -euo pipefail
out="${1:?usage: bash deploy/wheelhouse.sh OUT [PYTHON_VERSION] [PLATFORM]}"
pyver="${2:-$(python -c 'import sys; print(f"{sys.version_info.major}.{sys.version_info.minor}")')}"
platform="${3:-}"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

ds_version="$(python -c 'from importlib.metadata import version; print(version("deepspeed"))' 2>/dev/null || true)"
ds_spec="deepspeed${ds_version:+==$ds_version}"
echo "[wheelhouse] building $ds_spec as a pure-Python wheel"
DS_BUILD_OPS=0 pip wheel --quiet --no-deps --no-build-isolation --wheel-dir "$out" "$ds_spec"

# The train extra's requirements, from pyproject.toml (torch and deepspeed handled above).
mapfile -t extra < <(python - "$repo/pyproject.toml" <<'EOF'
import re, sys, tomllib
deps = tomllib.load(open(sys.argv[1], "rb"))["project"]["optional-dependencies"]["train"]
for dep in deps:
    name = re.split(r"[<>=!~;\[ ]", dep, maxsplit=1)[0].lower()
    if name not in ("torch", "deepspeed"):
        print(dep)
EOF
)

target=(--only-binary=:all: --python-version "$pyver")
if [[ -n "$platform" ]]; then target+=(--platform "$platform"); fi
echo "[wheelhouse] resolving for Python $pyver${platform:+ on $platform}: ${extra[*]}"
pip install --quiet --dry-run --ignore-installed --target "$work/target" --report "$work/report.json" \
    "${target[@]}" --find-links "$out" "$ds_spec" "${extra[@]}"

# name==version of every wheel to fetch: all but torch's own world and SKIP.
python - "$work/report.json" "${SKIP:-}" > "$work/wanted.txt" <<'EOF'
import json, re, sys
skip = {"torch", "triton", "sympy", "mpmath", "networkx", "jinja2", "markupsafe", "fsspec",
        "filelock", "setuptools"} | set(sys.argv[2].split())
for item in json.load(open(sys.argv[1]))["install"]:
    meta = item["metadata"]
    name = re.sub(r"[-_.]+", "-", meta["name"]).lower()
    if name not in skip and not name.startswith("nvidia-"):
        print(f"{name}=={meta['version']}")
EOF
grep -v '^deepspeed==' "$work/wanted.txt" > "$work/fetch.txt" || true
echo "[wheelhouse] downloading $(wc -l < "$work/fetch.txt") wheels"
if [[ -s "$work/fetch.txt" ]]; then
    pip download --quiet --no-deps "${target[@]}" --dest "$out" -r "$work/fetch.txt"
fi
# What to install: the top-level requirements. pip keeps what the image already has when it
# satisfies them (its numpy, say) and takes the rest from the wheelhouse.
printf '%s\n' "$ds_spec" "${extra[@]}" > "$out/requirements.txt"
echo "[wheelhouse] $(ls "$out"/*.whl | wc -l) wheels in $out; on the node:"
echo "  pip install --no-index --find-links $out -r $out/requirements.txt"
