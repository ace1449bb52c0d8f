"""CPU threads per rank: split between a node's ranks, left alone for one rank.

A bench that sets ``torch.set_num_threads(1)`` and then builds a one-rank trainer measures
on one thread: ``init_distributed`` once reset it to one thread per core, so "--threads 1"
timed the trainer on every core against a bare step on one.
"""

import os

import pytest
import torch

from trainer import distributed


@pytest.fixture
def threads(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("LOCAL_SIZE", raising=False)
    before = torch.get_num_threads()
    yield monkeypatch
    torch.set_num_threads(before)


def test_one_rank_keeps_the_threads_it_was_given(threads):
    threads.setenv("LOCAL_WORLD_SIZE", "1")
    torch.set_num_threads(1)
    distributed._share_cpu_threads()
    assert torch.get_num_threads() == 1


def test_two_ranks_split_the_cores(threads):
    threads.setenv("LOCAL_WORLD_SIZE", "2")
    cores = len(os.sched_getaffinity(0))
    distributed._share_cpu_threads()
    assert torch.get_num_threads() == max(1, cores // 2)


def test_omp_num_threads_wins(threads):
    threads.setenv("LOCAL_WORLD_SIZE", "2")
    threads.setenv("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    distributed._share_cpu_threads()
    assert torch.get_num_threads() == 1
