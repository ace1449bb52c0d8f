"""A line before DeepSpeed JIT-compiles an op, and only when it will compile it."""

import logging
import os
from pathlib import Path

import pytest

from trainer import ops


@pytest.fixture
def cpu_extensions(tmp_path, monkeypatch):
    """An empty torch extensions cache (TORCH_EXTENSIONS_DIR) on DeepSpeed's CPU accelerator."""
    from deepspeed.accelerator import get_accelerator

    if get_accelerator().device_name() != "cpu":
        pytest.skip("the CPU accelerator's ops (DS_ACCELERATOR=cpu)")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    return tmp_path


def test_an_op_compiles_until_its_library_is_cached_and_up_to_date(cpu_extensions):
    directory = cpu_extensions / "deepspeed_shm_comm"
    assert ops.compile_directory("ShareMemCommBuilder") == directory
    library = directory / "deepspeed_shm_comm.so"
    library.touch()  # built now: newer than DeepSpeed's sources
    assert ops.compile_directory("ShareMemCommBuilder") is None
    os.utime(library, (0, 0))  # older than its sources: ninja rebuilds it
    assert ops.compile_directory("ShareMemCommBuilder") == directory
    assert ops.compile_directory("FusedLambBuilder") is None  # no such op on CPU: nothing to build


def test_the_optimizer_op_is_announced_only_when_deepspeed_builds_one(cpu_extensions, caplog):
    caplog.set_level(logging.INFO, logger="trainer")
    ops.announce_optimizer({"optimizer": {"type": "AdamW", "params": {"torch_adam": True}}})
    assert "compiling" not in caplog.text  # torch's AdamW: nothing to compile
    ops.announce_optimizer({"optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})
    assert (
        "compiling DeepSpeed's FusedAdam optimizer op (first run only, a minute or two; "
        f"cached in {cpu_extensions / 'fused_adam'})"
    ) in caplog.text


def test_each_python_environment_has_its_own_extensions_cache(tmp_path):
    one, other = {}, {}
    ops.use_environment_cache(one, str(tmp_path / ".venv"))
    ops.use_environment_cache(other, str(tmp_path / ".venv-base"))
    assert one["TORCH_EXTENSIONS_DIR"] != other["TORCH_EXTENSIONS_DIR"]
    assert one["TORCH_EXTENSIONS_DIR"].startswith(
        str(Path.home() / ".cache" / "torch_extensions" / "venv-")
    )
    again = {}
    assert ops.use_environment_cache(again, str(tmp_path / ".venv")) == one["TORCH_EXTENSIONS_DIR"]
    named = {"TORCH_EXTENSIONS_DIR": str(tmp_path)}  # the user's choice stays
    assert ops.use_environment_cache(named, str(tmp_path / ".venv")) == str(tmp_path)


def test_a_config_the_torch_engine_runs_builds_no_deepspeed_optimizer_op(monkeypatch):
    """deploy/gpu.json names DeepSpeed's default AdamW (FusedAdam on CUDA, a compiler and a
    minute); --engine auto runs it on torch's fused AdamW, so no op is built for it."""
    import json

    from tests.helpers import REPO

    monkeypatch.setattr(ops, "compile_directory", lambda name: None)  # build nothing here
    configs = {n: json.loads((REPO / "deploy" / n).read_text()) for n in ("gpu.json", "zero2.json")}
    deepspeeds = ops.optimizer_builder(configs["zero2.json"])
    assert deepspeeds is not None and deepspeeds == ops.optimizer_builder(configs["gpu.json"])
    assert deepspeeds in ops.build(configs["zero2.json"])
    assert deepspeeds not in ops.build(configs["gpu.json"])
