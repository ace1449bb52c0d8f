"""Fixtures of the fine-tuning tests: one thread, and a tiny random-init --init directory."""

from pathlib import Path

import pytest
import torch

from tests.helpers import make_finetune_init


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """A model this small gains nothing from threads, and on a busy 2-core machine
    intra-op threads waiting on each other make a run several times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def init_dir(tmp_path_factory) -> Path:
    return make_finetune_init(tmp_path_factory.mktemp("init"))
