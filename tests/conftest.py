"""Shared test fixtures: tiny shard directories built by the real pipeline, in-process.

``make_corpus`` is the one in tests/pipeline/test_build.py (loaded from that file, not
copied), so the trainer's tests read exactly the kind of data the pipeline tests check.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest


@pytest.fixture
def umask_022():
    """The process umask is 022 during the test, so files written as usual are 0644."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def make_corpus(directory: Path, **options) -> str:
    """tests/pipeline/test_build.py's make_corpus (loaded on first use, not at collection)."""
    path = Path(__file__).parent / "pipeline" / "test_build.py"
    spec = importlib.util.spec_from_file_location("_pipeline_test_build", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.make_corpus(directory, **options)


def build_shards(tmp: Path, *, n_docs: int = 120, num_shards: int = 3, **options) -> Path:
    """Build a shard directory with ``python -m pipeline build`` (in-process) and return it.

    Defaults: vocab 200, dupe 3, seq 48, 3 shards (about 1,200 rows). ``options`` are more
    pipeline flags without the dashes, e.g. ``dupe_factor=1``.
    """
    from pipeline.__main__ import main

    corpus = make_corpus(tmp / "corpus", n_docs=n_docs)
    flags = {"vocab_size": 200, "dupe_factor": 3, "max_seq_length": 48, "num_shards": num_shards}
    flags.update(options)
    argv = ["build", "--input", corpus, "--output", str(tmp / "shards")]
    for key, value in flags.items():
        argv += [f"--{key}", str(value)]
    assert main(argv) == 0
    return tmp / "shards"


@pytest.fixture(scope="session")
def tiny_shards(tmp_path_factory) -> Path:
    """About 1,200 rows of seq <= 48 in 3 uneven shards, vocab 200 (read-only: do not modify)."""
    return build_shards(tmp_path_factory.mktemp("tiny_shards"))


@pytest.fixture(scope="session")
def small_shards(tmp_path_factory) -> Path:
    """About 100 rows in 3 shards, vocab 200, seq <= 48: a few steps make an epoch."""
    return build_shards(tmp_path_factory.mktemp("small_shards"), n_docs=40, dupe_factor=1)
