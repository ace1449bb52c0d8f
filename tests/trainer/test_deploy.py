"""The deploy/ DeepSpeed configs: the choices deploy/README.md justifies, and that they run.

The GPU configs run here on CPU with their batch sizes shrunk (DeepSpeed's CPU accelerator
does bf16), one rank and two accumulation steps: the keys are accepted and a checkpoint
of each ZeRO stage exports.
"""

import json
from pathlib import Path

import pytest

from model import BertConfig
from trainer import export
from trainer.run import main

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
TINY = BertConfig(vocab_size=200, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                  intermediate_size=64, max_position_embeddings=64)  # fmt: skip


@pytest.mark.parametrize("name", ["zero2.json", "zero2_phase2.json", "zero3.json"])
def test_gpu_configs_make_the_documented_choices(name):
    ds = json.loads((DEPLOY / name).read_text())
    assert ds["bf16"]["enabled"] is True and "fp16" not in ds
    assert ds["data_types"]["grad_accum_dtype"] == "fp32"
    assert ds["optimizer"]["type"] == "AdamW"  # not LAMB: DeepSpeed issues #490, #1217
    schedule = ds["scheduler"]
    assert schedule["type"] == "WarmupDecayLR"
    assert schedule["params"]["warmup_type"] == "linear"  # DeepSpeed's default is "log"
    assert schedule["params"]["total_num_steps"] == "auto"  # = --max-steps
    zero = ds["zero_optimization"]
    assert zero["overlap_comm"] is True
    large_params = 335_000_000
    assert zero["reduce_bucket_size"] <= large_params / 4  # several buckets per backward
    assert ds["gradient_clipping"] == 1.0
    assert ds["train_batch_size"] % ds["train_micro_batch_size_per_gpu"] == 0


@pytest.mark.parametrize("name", ["zero2.json", "zero3.json"])
def test_gpu_configs_run_on_cpu_with_small_batches(name, tiny_shards, tmp_path):
    ds = json.loads((DEPLOY / name).read_text())
    ds.update(train_batch_size=4, train_micro_batch_size_per_gpu=2)
    (tmp_path / "ds.json").write_text(json.dumps(ds))
    TINY.to_json(tmp_path / "model.json")
    argv = ["--ds-config", str(tmp_path / "ds.json"), "--data", str(tiny_shards),
            "--model", str(tmp_path / "model.json"), "--output-dir", str(tmp_path / "out"),
            "--max-steps", "2", "--log-every", "1", "--num-workers", "0", "--export-hf", "false"]  # fmt: skip
    assert main(argv) == 0
    records = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2] and records[-1]["samples"] == 8
    model = export.load_model(tmp_path / "out")
    assert model.config == TINY


def test_cpu_config_is_fp32_without_zero():
    ds = json.loads((DEPLOY / "cpu.json").read_text())
    assert "bf16" not in ds and "fp16" not in ds
    assert ds["zero_optimization"]["stage"] == 0  # ZeRO's copies cost 10-28% on CPU
    assert ds["optimizer"]["params"]["torch_adam"] is True
