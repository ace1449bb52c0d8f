"""The deploy/ DeepSpeed configs: the choices deploy/README.md justifies, and that they run.

The GPU configs run here on CPU with their batch sizes shrunk (DeepSpeed's CPU accelerator
does bf16), one rank and two accumulation steps: the keys are accepted and a checkpoint
of each ZeRO stage exports. deploy/gpu_bench.sh parses, and its Python steps
(bench/gpu_bench.py) give bf16 configs, Google-like shards and the right medians.
"""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from bench import gpu_bench
from model import BertConfig
from trainer import export
from trainer.run import main

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
TINY = BertConfig(
    vocab_size=200,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=64,
)


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


# Slow: without torch_adam these configs load DeepSpeed's CPU Adam op, a JIT build of
# minutes on a machine that has not built it yet.
@pytest.mark.slow
@pytest.mark.parametrize("name", ["zero2.json", "zero3.json"])
def test_gpu_configs_run_on_cpu_with_small_batches(name, tiny_shards, tmp_path):
    ds = json.loads((DEPLOY / name).read_text())
    ds.update(train_batch_size=4, train_micro_batch_size_per_gpu=2)
    (tmp_path / "ds.json").write_text(json.dumps(ds))
    TINY.to_json(tmp_path / "model.json")
    argv = [
        "--ds-config",
        str(tmp_path / "ds.json"),
        "--data",
        str(tiny_shards),
        "--model",
        str(tmp_path / "model.json"),
        "--output-dir",
        str(tmp_path / "out"),
        "--max-steps",
        "2",
        "--log-every",
        "1",
        "--num-workers",
        "0",
        "--export-hf",
        "false",
    ]
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


def gpu_bench_on_cpu(tmp_path, **env_vars: str) -> subprocess.CompletedProcess:
    """``DEVICE=cpu bash deploy/gpu_bench.sh`` with results in tmp_path/gpu_bench; must pass."""
    env = {k: v for k, v in os.environ.items() if k not in ("WORK", "STAGES", "NUM_GPUS")}
    env.update(DEVICE="cpu", OUT=str(tmp_path), **env_vars)
    done = subprocess.run(
        ["bash", str(DEPLOY / "gpu_bench.sh")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    return done


def test_gpu_bench_import_stage_on_a_fresh_node(tmp_path):
    """A node's first run has no torch extensions cache: the import stage passes there (a
    missing cache directory lists as empty), and it records its line."""
    done = gpu_bench_on_cpu(
        tmp_path, STAGES="import", TORCH_EXTENSIONS_DIR=str(tmp_path / "no-torch-extensions")
    )
    assert "trainer imports" in done.stdout
    (stage,) = [json.loads(line) for line in (tmp_path / "gpu_bench/stages.jsonl").open()]
    assert stage["stage"] == "import" and stage["ok"] is True
    assert not (tmp_path / "no-torch-extensions").exists()  # nothing was built


@pytest.mark.slow
def test_gpu_bench_runs_every_stage_on_cpu(tmp_path):
    """DEVICE=cpu runs deploy/gpu_bench.sh's every stage on tiny: import, overhead (a step's
    ops and reads, on the micro-BERT), smoke (checkpoint, resume, export), correctness
    (bf16 unpadded against padded), speed (the unpadded path and the bare model steps),
    compiled (one --compile model run, torch.compile off on CPU: the long tier below
    compiles); each stage's line is written, and the results table."""
    done = gpu_bench_on_cpu(tmp_path, OMP_NUM_THREADS="1")
    res = tmp_path / "gpu_bench"
    stages = [json.loads(line) for line in (res / "stages.jsonl").read_text().splitlines()]
    assert [(s["stage"], s["ok"]) for s in stages] == [
        ("import", True),
        ("overhead", True),
        ("smoke", True),
        ("correctness", True),
        ("speed", True),
        ("compiled", True),
    ]
    checks = [json.loads(line) for line in (res / "correctness.jsonl").read_text().splitlines()]
    assert [c["ok"] for c in checks] == [True] and checks[0]["steps"] >= 6
    runs = [json.loads(line) for line in (res / "results.jsonl").read_text().splitlines()]
    assert sorted((r["unpad"], r["compile"]) for r in runs) == [(True, "model"), (True, "off")]
    assert all(r["sequences_per_s"] > 0 for r in runs)
    assert "tiny" in (res / "table.txt").read_text()
    assert "resumed from" in (res / "smoke.log").read_text() + done.stdout
    overhead = [json.loads(line) for line in (res / "overhead.jsonl").read_text().splitlines()]
    assert [(Path(r["ds_config"]).name, r["engine"]) for r in overhead] == [
        ("gpu.json", "torch"),
        ("zero2.json", "deepspeed"),
    ]
    assert all(r["bare"]["ops_per_step"] > 0 and r["trainer"]["ops_per_step"] > 0 for r in overhead)
    assert "engine: torch (one rank; --engine auto" in (res / "smoke.log").read_text()


@pytest.mark.slow
@pytest.mark.long  # inductor on 2 cores: over a minute
def test_gpu_bench_compiled_stage_compiles_on_cpu(tmp_path):
    """The compiled stage with torch.compile on (COMPILE_ON_CPU=1): its run records the
    graphs it compiled and its first step's time, and both speed paths' rows."""
    env = dict(OMP_NUM_THREADS="1", COMPILE_ON_CPU="1", STAGES="import speed compiled")
    gpu_bench_on_cpu(tmp_path, SPEED_UNPADS="true false", MODEL_SPEED="0", **env)
    res = tmp_path / "gpu_bench"
    runs = [json.loads(line) for line in (res / "results.jsonl").read_text().splitlines()]
    assert sorted((r["unpad"], r["compile"]) for r in runs) == [
        (False, "off"),
        (True, "model"),
        (True, "off"),
    ]
    (compiled,) = [r for r in runs if r["compile"] == "model"]
    assert compiled["compiled_graphs"] > 0 and compiled["first_step_s"] > 0


@pytest.mark.parametrize("torch_adam", [True, False])
def test_gpu_bench_ds_config_enables_bf16(torch_adam):
    base = json.loads((DEPLOY / "zero2.json").read_text())
    fp16_base = {**base, "fp16": {"enabled": True}, "bf16": {"enabled": False}}
    for source in (base, fp16_base):
        ds = gpu_bench.ds_config(source, micro=16, gpus=2, torch_adam=torch_adam)
        assert ds["bf16"]["enabled"] is True and "fp16" not in ds
        assert (ds["train_micro_batch_size_per_gpu"], ds["train_batch_size"]) == (16, 32)
        assert ds["scheduler"]["params"]["warmup_num_steps"] == gpu_bench.WARMUP_STEPS
        assert ds["optimizer"]["params"].get("torch_adam", False) is torch_adam
    assert "torch_adam" not in base["optimizer"]["params"]  # the source is left alone


def test_gpu_bench_model_config_changes_only_attention_dropout():
    config = gpu_bench.model_config("large", 0.0)
    assert config.attention_probs_dropout_prob == 0.0  # the varlen path on CUDA bf16
    assert config == BertConfig.preset("large", attention_probs_dropout_prob=0.0)
    assert BertConfig.preset("large").attention_probs_dropout_prob > 0  # nested by default


def test_gpu_bench_shards_are_google_like(tmp_path):
    from pipeline.shards.shard_format import join_path, open_shard, read_manifest

    assert gpu_bench.write_shards(tmp_path, seq=32, rows=400)
    assert not gpu_bench.write_shards(tmp_path, seq=32, rows=400)  # kept
    # Kept shards of other rows or another seq are refused, never reused.
    with pytest.raises(ValueError, match="holds 400 rows at seq 32, not 512 at seq 32"):
        gpu_bench.write_shards(tmp_path, seq=32, rows=512)
    with pytest.raises(ValueError, match="not 400 at seq 64"):
        gpu_bench.write_shards(tmp_path, seq=64, rows=400)
    manifest = read_manifest(tmp_path)
    assert manifest["params"]["max_seq_length"] == 32
    assert manifest["params"]["max_predictions_per_seq"] == 20
    lengths = [
        len(ids)
        for entry in manifest["shards"]
        for ids in open_shard(join_path(tmp_path, entry["name"])).column("input_ids").to_pylist()
    ]
    assert len(lengths) == 400 and max(lengths) == 32
    assert 0.05 < sum(n < 32 for n in lengths) / 400 < 0.15  # about 10% shorter
    assert gpu_bench.max_predictions(512) == 80


def test_gpu_bench_summary_drops_the_first_window_and_table_has_the_ratio(tmp_path):
    records = [
        {
            "step": 25,
            "loss": 9.0,
            "sequences_per_s": 10.0,
            "tokens_per_s": 1280.0,
            "tflops_per_s": 1.0,
            "mfu": 0.1,
        },
        {
            "step": 50,
            "loss": 8.0,
            "sequences_per_s": 100.0,
            "tokens_per_s": 12800.0,
            "tflops_per_s": 50.0,
            "mfu": 0.4,
        },
        {"step": 50, "split": "eval", "mlm_loss": 7.0},
        {
            "step": 75,
            "loss": 7.5,
            "sequences_per_s": 120.0,
            "tokens_per_s": 15360.0,
            "tflops_per_s": 60.0,
            "mfu": 0.5,
        },
    ]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    meta = {"preset": "base", "seq": 128, "micro": 128, "gpus": 1}
    unpadded = gpu_bench.summarize(path, unpad=True, **meta)
    assert unpadded["sequences_per_s"] == 110.0 and unpadded["mfu"] == 0.45
    assert unpadded["windows"] == 2 and unpadded["final_loss"] == 7.5
    padded = {**unpadded, "unpad": False, "sequences_per_s": 100.0, "mfu": None}
    assert unpadded["compile"] == "off" and unpadded["first_step_s"] is None
    compiled = {**unpadded, "compile": "model", "sequences_per_s": 150.0}
    table = gpu_bench.table([unpadded, padded, compiled]).splitlines()
    assert table[1].split() == [
        "base",
        "128",
        "off",
        "128",
        "100.0",
        "110.0",
        "1.100",
        "-",
        "45.0%",
    ]
    assert table[2].split() == ["base", "128", "model", "128", "-", "150.0", "-", "-", "45.0%"]


STUBS = {  # SLURM's commands and the deepspeed launcher, as far as deploy/slurm.sbatch uses them
    "scontrol": 'echo "$SLURM_JOB_NODELIST" | tr , "\\n"\n',  # show hostnames A,B
    # srun: the command once per node, in parallel, each with its SLURM_NODEID
    "srun": "while [[ $1 == -* ]]; do shift; done\n"
    'for ((i = 0; i < SLURM_NNODES; i++)); do SLURM_NODEID=$i "$@" & done\nwait\n',
    "deepspeed": 'echo "$*" >> "$OUT/launches"\n',
}


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_slurm_script_starts_one_no_ssh_launcher_per_node_from_one_hostfile(tmp_path):
    """The launch path tests/trainer/test_resume.py runs with two nodes on one machine."""
    bin_dir, venv = tmp_path / "bin", tmp_path / "venv"
    bin_dir.mkdir()
    for name, body in STUBS.items():
        (bin_dir / name).write_text("#!/usr/bin/env bash\n" + body)
        (bin_dir / name).chmod(0o755)
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text("")
    out = tmp_path / "run"
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "VENV": str(venv),
        "OUT": str(out),
        "SLURM_JOB_NODELIST": "gpu-a,gpu-b",
        "SLURM_NNODES": "2",
        "SLURM_JOB_ID": "77",
    }
    subprocess.run(["bash", str(DEPLOY / "slurm.sbatch")], env=env, check=True, timeout=30)
    hostfile = out / "hostfile-77"
    assert hostfile.read_text() == "gpu-a slots=8\ngpu-b slots=8\n"
    launches = sorted((out / "launches").read_text().splitlines())
    for node, line in enumerate(launches):
        assert line.startswith(
            f"--hostfile {hostfile} --no_ssh --node_rank {node} --master_addr gpu-a "
            "--master_port 29500 trainer/run.py --ds-config "
        )
        assert f"--output-dir {out} " in line and line.endswith("--resume auto")
    assert len(launches) == 2


@pytest.mark.slow
def test_wheelhouse_for_this_machine_holds_deepspeed_and_its_needs_but_not_torch(tmp_path):
    """deploy/wheelhouse.sh for the local Python and platform (it builds DeepSpeed and
    fetches the rest from PyPI): a pure-Python DeepSpeed wheel, a wheel for each of
    DeepSpeed's requirements but torch, none of torch's world, and the install list."""
    import re
    from importlib.metadata import requires

    out = tmp_path / "wheels"
    done = subprocess.run(
        ["bash", str(DEPLOY / "wheelhouse.sh"), str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    wheels = {
        re.sub(r"[-_.]+", "-", w.name.split("-")[0]).lower(): w.name for w in out.glob("*.whl")
    }
    assert wheels["deepspeed"].endswith("-py3-none-any.whl")
    needed = {
        re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].lower().replace("_", "-")
        for r in requires("deepspeed")
        if "extra ==" not in r
    }
    assert needed - {"torch"} <= set(wheels), needed - set(wheels)
    assert not {"torch", "triton"} & set(wheels)
    assert not [name for name in wheels if name.startswith("nvidia-")]
    listed = (out / "requirements.txt").read_text().split()
    assert listed[0].startswith("deepspeed==") and any(r.startswith("safetensors") for r in listed)
    assert "pip install --no-index --find-links" in done.stdout
