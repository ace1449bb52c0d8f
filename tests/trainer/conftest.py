"""Launch-test fixtures shared by test_resume.py and test_faults.py: one uninterrupted run that
every interrupted and resumed run of that configuration must end as."""

from __future__ import annotations

import importlib.util
import json
import shutil

import pytest

from tests.helpers import CPU_DS, launch, write_launch_files

STRAIGHT_STEPS = 14


@pytest.fixture(scope="session", autouse=True)
def deepspeed_ops():
    """DeepSpeed's CPU ops built once, before any test launches ranks: in a fresh environment
    the first launch would otherwise compile them inside its own time bound (a minute or two
    quiet, several on a loaded machine: the fault tests' 300 s bound was spent so once). An
    op already built costs an import."""
    if importlib.util.find_spec("deepspeed") is None:
        return
    from trainer import ops

    ops.build(json.loads(CPU_DS.read_text()))


@pytest.fixture(scope="session")
def zero2_files(tmp_path_factory):
    """model.json and ds.json of the launch tests: ZeRO-2 (a partitioned checkpoint, as on
    GPUs), micro-batch 4, 2 accumulation steps."""
    if shutil.which("deepspeed") is None:
        pytest.skip("the deepspeed launcher is not on PATH")
    files = tmp_path_factory.mktemp("zero2")
    write_launch_files(files, gradient_accumulation_steps=2, zero_optimization={"stage": 2})
    return files


@pytest.fixture(scope="session")
def straight_run(zero2_files, small_shards):
    """Two ranks, 14 steps, a checkpoint every 4, without interruption; returns the launch
    result (its output: ``zero2_files / "straight"``)."""
    done = launch(
        zero2_files, small_shards, zero2_files / "straight", steps=STRAIGHT_STEPS, save_every=4
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done
