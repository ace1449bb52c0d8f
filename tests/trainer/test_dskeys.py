"""The DeepSpeed JSON's keys against the installed DeepSpeed's: every typo named, with its path."""

import json
import re
from pathlib import Path

import pytest
import torch

from tests.helpers import cpu_ds
from trainer.dskeys import check_keys, optimizer_class
from trainer.run import main

REPO = Path(__file__).resolve().parents[2]
ZERO3 = REPO / "deploy" / "zero3.json"  # AdamW without torch_adam: DeepSpeed's FusedAdam


def edited(path: str, value) -> dict:
    """deploy/zero3.json with ``value`` at the dotted ``path``."""
    ds = json.loads(ZERO3.read_text())
    *parents, key = path.split(".")
    section = ds
    for name in parents:
        section = section.setdefault(name, {})
    section[key] = value
    return ds


@pytest.mark.parametrize("path", sorted((REPO / "deploy").glob("*.json")), ids=lambda p: p.name)
def test_every_deploy_config_passes(path):
    check_keys(json.loads(path.read_text()), where=str(path))


def test_valid_keys_outside_deploy_pass():
    ds = json.loads(ZERO3.read_text())
    del ds["zero_optimization"]["stage3_prefetch_bucket_size"]  # the alias of prefetch_bucket_size
    ds["zero_optimization"].update(  # a field's name and its alias, a nested model
        prefetch_bucket_size=10,
        stage3_param_persistence_threshold=10,
        offload_optimizer={"device": "cpu", "pin_memory": True},
    )
    ds.update(
        bfloat16={"enabled": True},  # DeepSpeed's old name of bf16
        tensorboard={"enabled": True, "output_path": "tb", "job_name": "run"},
        checkpoint={"load_universal": True, "tag_validation": "Warn"},  # resume's key
        # CPU Adam (offloaded), with the keys the engine consumes itself
        optimizer={
            "type": "adam",
            "params": {
                "lr": 1e-3,
                "adam_w_mode": False,
                "fp32_optimizer_states": False,
                "adamw_mode": True,
            },
        },
        scheduler={
            "type": "WarmupCosineLR",
            "params": {"total_num_steps": 9, "cos_min_ratio": 0.1},
        },
    )
    check_keys(ds, where="x.json")
    torch_types = {
        "optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9}},
        "scheduler": {"type": "StepLR", "params": {"step_size": 10}},
    }
    check_keys({**ds, **torch_types}, where="x.json")


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("gradient_cliping", 1.0, "unknown key gradient_cliping (did you mean gradient_clipping?)"),
        (
            "zero_optimization.stage3_max_live_paramters",
            1,
            "unknown key zero_optimization.stage3_max_live_paramters "
            "(did you mean stage3_max_live_parameters?)",
        ),
        (
            "zero_optimization.offload_optimizer",
            {"device": "cpu", "pin_memroy": True},
            "unknown key zero_optimization.offload_optimizer.pin_memroy (did you mean pin_memory?)",
        ),
        (
            "zero_optimization.prefetch_bucket_size",
            1,  # zero3.json has its alias: DeepSpeed refuses both
            "zero_optimization.prefetch_bucket_size is also given as stage3_prefetch_bucket_size "
            "(keep one)",
        ),
        ("bf16.enable", True, "unknown key bf16.enable (did you mean enabled?)"),
        (
            "zero_optimization.reduce_bucket_sise",
            "auto",  # "auto": DeepSpeed drops it unseen
            "unknown key zero_optimization.reduce_bucket_sise (did you mean reduce_bucket_size?)",
        ),
        (
            "zero_optimization.offload_optimizer",
            {"device": "cpu", "buffer_cont": "auto"},
            "unknown key zero_optimization.offload_optimizer.buffer_cont "
            "(did you mean buffer_count?)",
        ),
        ("optimizer.typ", "AdamW", "unknown key optimizer.typ (did you mean type?)"),
        (
            "optimizer.params.weight_decy",
            0.1,
            "unknown key optimizer.params.weight_decy "
            "(FusedAdam takes no such argument; did you mean weight_decay?)",
        ),
        (
            "scheduler.params.warmup_num_step",
            5,
            "unknown key scheduler.params.warmup_num_step "
            "(WarmupDecayLR takes no such argument; did you mean warmup_num_steps?)",
        ),
        (
            "optimizer.type",
            "AdamWW",
            "optimizer.type 'AdamWW' is not one DeepSpeed can build (did you mean AdamW?)",
        ),
        (
            "scheduler.type",
            "WarmupDecay",
            "scheduler.type 'WarmupDecay' is not one DeepSpeed can "
            "build (did you mean WarmupDecayLR?)",
        ),
        (
            "checkpoint.load_universl",
            True,
            "unknown key checkpoint.load_universl (did you mean load_universal?)",
        ),
        (
            "load_universal_checkpoint",
            True,  # DeepSpeed's engine method, not a key
            "unknown key load_universal_checkpoint (did you mean checkpoint.load_universal?)",
        ),
        (
            "optimizer.params.max_grad_norm",
            1.0,
            "optimizer.params.max_grad_norm: use the top-level gradient_clipping",
        ),
    ],
)
def test_a_typo_is_named_with_its_path_and_the_closest_key(path, value, message):
    with pytest.raises(ValueError, match=re.escape(message)) as err:
        check_keys(edited(path, value), where="--ds-config x.json")
    text = str(err.value)
    assert text.startswith("--ds-config x.json: ") and "Fix or remove it" in text


def test_every_unknown_key_is_named_at_once():
    ds = edited("gradient_cliping", 1.0)
    ds["zero_optimization"]["stag"] = 2
    both = r"gradient_cliping .*; unknown key zero_optimization\.stag"
    with pytest.raises(ValueError, match=both):
        check_keys(ds, where="x.json")


def test_the_optimizer_class_is_the_one_deepspeed_builds():
    from deepspeed.ops.adam import DeepSpeedCPUAdam, FusedAdam

    adamw = {"optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
    assert optimizer_class(adamw) is FusedAdam
    torch_adam = {"optimizer": {"type": "AdamW", "params": {"torch_adam": True}}}
    assert optimizer_class(torch_adam) is torch.optim.AdamW
    offload = {**adamw, "zero_optimization": {"offload_optimizer": {"device": "cpu"}}}
    assert optimizer_class(offload) is DeepSpeedCPUAdam
    assert optimizer_class({"optimizer": {"type": "SGD"}}) is torch.optim.SGD
    assert optimizer_class({"optimizer": {"type": "sgd"}}) is None  # torch's names: exact case
    assert optimizer_class({}) is None


def test_a_typo_stops_the_run_before_deepspeed_starts(tiny_shards, tmp_path, caplog):
    ds = cpu_ds(gradient_cliping=1.0, train_micro_batch_size_per_gpu=8)
    del ds["gradient_clipping"]
    (tmp_path / "ds.json").write_text(json.dumps(ds))
    argv = [
        "--ds-config",
        str(tmp_path / "ds.json"),
        "--data",
        str(tiny_shards),
        "--model",
        "tiny",
        "--output-dir",
        str(tmp_path / "out"),
        "--max-steps",
        "1",
        "--num-workers",
        "0",
    ]
    assert main(argv) == 2
    assert f"--ds-config {tmp_path / 'ds.json'}: unknown key gradient_cliping" in caplog.text
    assert "did you mean gradient_clipping?" in caplog.text
    assert "Traceback" not in caplog.text
    assert not (tmp_path / "out" / "checkpoints").exists()
