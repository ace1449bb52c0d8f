"""Shared test fixtures: tiny shard directories built by the real pipeline, in-process
(tests/helpers.py builds them from the corpus the pipeline tests check).

They stay Beam-built rather than written directly (as bench/loader_speed.py writes
synthetic shards): each is built once per pytest process, and both have users that need
what only the pipeline makes (learnable NSP rows for "the loss falls", the real vocab and
tokenizer for the exports, the same vocab in both for --eval-data). A written fixture for
the other tests would be built beside them, saving nothing in a whole-suite run.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers import build_shards


@pytest.fixture
def umask_022():
    """The process umask is 022 during the test, so files written as usual are 0644."""
    old = os.umask(0o022)
    yield
    os.umask(old)


@pytest.fixture(scope="session")
def tiny_shards(tmp_path_factory) -> Path:
    """About 1,200 rows of seq <= 48 in 3 uneven shards, vocab 200 (read-only: do not modify)."""
    return build_shards(tmp_path_factory.mktemp("tiny_shards"))


@pytest.fixture(scope="session")
def small_shards(tmp_path_factory) -> Path:
    """About 100 rows in 3 shards, vocab 200, seq <= 48: a few steps make an epoch."""
    return build_shards(tmp_path_factory.mktemp("small_shards"), n_docs=40, dupe_factor=1)
