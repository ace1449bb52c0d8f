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

# scripts/test.sh runs tests/pipeline's fast tier first on the base install (.venv-base, no
# torch), then the whole suite in .venv. Those two environment variables let each test run
# once: the first run lists the tests that passed (BERT_TEST_PASSED_TO), and the second leaves
# out the tests of that list (BERT_TEST_PASSED_IN). A test the base install skipped (an extra
# it lacks) is not listed, so it runs in .venv.
PASSED_TO, PASSED_IN = "BERT_TEST_PASSED_TO", "BERT_TEST_PASSED_IN"


def pytest_runtest_logreport(report):
    path = os.environ.get(PASSED_TO)
    if path and report.when == "call" and report.passed:
        with open(path, "a", encoding="utf-8") as f:
            f.write(report.nodeid + "\n")


def pytest_collection_modifyitems(config, items):
    path = os.environ.get(PASSED_IN)
    if not path:
        return
    passed = set(Path(path).read_text(encoding="utf-8").splitlines())
    again = [item for item in items if item.nodeid in passed]
    if again:
        config.hook.pytest_deselected(items=again)
        items[:] = [item for item in items if item.nodeid not in passed]
        print(f"\n[test] {len(again)} tests passed on the base install already ({path})")


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
