"""What the package's metadata installs, and what a Beam worker needs of it.

Beam's ``--setup_file`` installs the base dependencies on every Dataflow/Spark/Flink worker,
so they must be the pipeline's and nothing heavier; the training stack is the ``train``
extra. The metadata is built the way pip builds it (setuptools' PEP 517 hook) from a copy
of the sources, so no ``*.egg-info`` lands in the checkout.
"""

import ast
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pipeline", "model", "trainer", "finetune", "report")
TRAINING_PACKAGES = ("model", "trainer", "finetune")
# Never on a Beam worker: each is large (torch with CUDA: GBs) and none is used there.
TRAINING_STACK = (
    "torch",
    "deepspeed",
    "datasets",
    "matplotlib",
    "tensorboard",
    "safetensors",
    "transformers",
)
# Import name -> distribution name, for the third-party modules pipeline/ imports.
DISTRIBUTIONS = {
    "apache_beam": "apache-beam",
    "numpy": "numpy",
    "pyarrow": "pyarrow",
    "tokenizers": "tokenizers",
    "google": "protobuf",
    "h5py": "h5py",
    "google_crc32c": "google-crc32c",
}
# Installed for a worker without being imported by pipeline/ (none today).
USED_BY_BEAM: list[str] = []
# Imported only inside a function, for an option a worker never runs (`stats --plot`),
# or for a runner of its own extra (`dask`: pipeline/beam/dask_compat.py, the DaskRunner's).
# `streaming`: `export --to mds` only, its own extra (mds), imported when the export starts.
# `xxhash`, `py3langid`: `curate` only (MinHash shingles, --languages), its own extra.
OPTIONAL = {"matplotlib", "dask", "jieba", "streaming", "xxhash", "py3langid"}
# Import name -> distribution, for what model/, trainer/ and finetune/ import beyond the
# base install:
# each must be in the `train` extra.
TRAIN_DISTRIBUTIONS = {
    "torch": "torch",
    "deepspeed": "deepspeed",
    "safetensors": "safetensors",
    "tqdm": "tqdm",
}
# Imported by model/, trainer/ or finetune/ without being in `train`, each for its reason.
TRAIN_NOT_DECLARED = {
    "psutil": "DeepSpeed's own dependency; trainer/signals.py falls back without it",
    "pydantic": "DeepSpeed's config classes are pydantic models; dskeys.py inspects them",
    "transformers": "python -m trainer.fillmask only (the test extra); it names what to install",
    "onnxruntime": "python -m model.export_onnx only (the onnx extra)",
}

BUILD_METADATA = """
import json, sys, warnings
from setuptools import build_meta
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    name = build_meta.prepare_metadata_for_build_wheel(sys.argv[1])
print(json.dumps({"dist_info": name,
                  "warnings": [f"{w.category.__name__}: {w.message}" for w in caught]}))
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(METADATA text, warnings) of the package, built by setuptools from a copy of the tree."""
    pytest.importorskip("setuptools")  # the test extra brings it
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for package in PACKAGES:
        shutil.copytree(ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("metadata")
    done = subprocess.run(
        [sys.executable, "-c", BUILD_METADATA, str(out)],
        cwd=src,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    metadata = (out / result["dist_info"] / "METADATA").read_text(encoding="utf-8")
    return metadata, result["warnings"] + [line for line in done.stderr.splitlines() if line]


def requirements(metadata: str, extra: str | None = None) -> list[str]:
    """Distribution names of ``Requires-Dist`` lines: the base ones, or those of ``extra``."""
    names = []
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist: "):
            continue
        requirement, _, marker = line[len("Requires-Dist: ") :].partition(";")
        if (f'extra == "{extra}"' in marker) if extra else not marker.strip():
            names.append(re.match(r"[A-Za-z0-9._-]+(\[[^]]*\])?", requirement.strip())[0])
    return names


def third_party_imports(package: Path) -> set[str]:
    """Top-level names of every module ``package`` imports, lazily or not, beyond itself."""
    names = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"pipeline"}


def test_worker_install_is_the_pipelines_and_no_more(built):
    metadata, _ = built
    base = requirements(metadata)
    assert not set(base) & set(TRAINING_STACK), base  # what --setup_file puts on workers
    imported = third_party_imports(ROOT / "pipeline") - OPTIONAL
    assert imported <= set(DISTRIBUTIONS), imported - set(DISTRIBUTIONS)  # a new one: list it
    assert sorted(base) == sorted([*USED_BY_BEAM, *(DISTRIBUTIONS[name] for name in imported)])
    assert {"torch", "deepspeed", "safetensors", "tensorboard"} <= set(
        requirements(metadata, "train")
    )
    assert "bert-pipeline[train]" in requirements(metadata, "test")  # the tests run the trainer


def test_training_imports_are_declared(built):
    """What model/, trainer/ and finetune/ import comes with the base install or the `train`
    extra."""
    metadata, _ = built
    imported = set()
    for package in TRAINING_PACKAGES:
        imported |= third_party_imports(ROOT / package) - set(PACKAGES)
    imported -= set(DISTRIBUTIONS) | set(TRAIN_NOT_DECLARED)
    assert imported <= set(TRAIN_DISTRIBUTIONS), imported - set(TRAIN_DISTRIBUTIONS)  # list it
    declared = set(requirements(metadata, "train"))
    assert {TRAIN_DISTRIBUTIONS[name] for name in imported} <= declared


def test_reports_need_the_base_install_and_matplotlib_only():
    """report/ reads a cluster run's output where no training stack is installed."""
    imported = third_party_imports(ROOT / "report") - set(PACKAGES)
    assert imported <= set(DISTRIBUTIONS) | {"matplotlib"}, imported


def test_setup_py_adds_nothing_to_pyproject():
    """--setup_file runs setup.py: every requirement must come from pyproject.toml."""
    calls = [
        n for n in ast.walk(ast.parse((ROOT / "setup.py").read_text())) if isinstance(n, ast.Call)
    ]
    assert [(ast.unparse(c.func), c.args, c.keywords) for c in calls] == [("setup", [], [])]


def test_metadata_builds_without_deprecation_warnings(built):
    metadata, warnings = built
    assert warnings == []  # e.g. setuptools' on a `license = {text = ...}` table
    assert "License-Expression: Apache-2.0" in metadata.splitlines()


IMPORT_AND_RUN_WITHOUT_TRAINING_STACK = """
import importlib, pkgutil, sys
import pipeline
for module in pkgutil.iter_modules(pipeline.__path__):
    importlib.import_module("pipeline." + module.name)
loaded = sorted({name.split(".")[0] for name in sys.modules} & set(sys.argv[2].split(",")))
assert not loaded, f"importing pipeline/ loads {loaded}"
for name in sys.argv[2].split(","):
    sys.modules[name] = None  # `import name` raises ModuleNotFoundError from now on
from pipeline.cli.main import main
out = sys.argv[1]
assert main(["build", "--input", out + "/corpus.txt", "--output", out + "/shards",
             "--vocab_size", "60", "--max_seq_length", "32", "--dupe_factor", "1"]) == 0
assert main(["stats", out + "/shards"]) == 0
assert main(["inspect", out + "/shards", "-n", "1"]) == 0
assert main(["stats", out + "/shards", "--plot"]) == 2  # names matplotlib
try:
    import model
except ModuleNotFoundError as err:
    print("model:", err)
try:
    import trainer
except ModuleNotFoundError as err:
    print("trainer:", err)
try:
    import finetune
except ModuleNotFoundError as err:
    print("finetune:", err)
"""


def test_pipeline_runs_without_the_training_stack(tmp_path):
    """A worker of the base install: pipeline/ imports none of the training stack, and a
    build (its DoFns, in this process) plus stats and inspect run without it."""
    words = "the ancient king founded a school by the river and people came to learn there"
    sentences = [" ".join(words.split()[i % 7 :][:8]).capitalize() + "." for i in range(60)]
    docs = ["\n".join(sentences[i : i + 6]) for i in range(0, 60, 6)]
    (tmp_path / "corpus.txt").write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    argv = [IMPORT_AND_RUN_WITHOUT_TRAINING_STACK, str(tmp_path), ",".join(TRAINING_STACK)]
    done = subprocess.run(
        [sys.executable, "-c", *argv], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "--plot needs matplotlib: pip install matplotlib" in done.stderr
    # The trainer's packages say what to install instead of a bare "No module named 'torch'".
    assert "model: model/ needs torch" in done.stdout
    assert "trainer: trainer/ needs torch and deepspeed" in done.stdout
    assert "finetune: finetune/ needs torch" in done.stdout
    assert done.stdout.count("pip install 'bert-pipeline[train]'") == 3


def test_every_package_is_installed():
    """pyproject's ``packages.find`` includes each top-level package (a new one: add it)."""
    text = (ROOT / "pyproject.toml").read_text()
    include = re.search(r"^include = \[(.*)\]$", text, re.M)[1]
    patterns = {p.strip().strip('"') for p in include.split(",")}
    assert patterns == {f"{package}*" for package in PACKAGES}
    on_disk = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert on_disk == set(PACKAGES), on_disk
