"""Exact resume on two CPU ranks (``deepspeed --num_gpus 2``), and universal-checkpoint resume on one.

A run killed with SIGKILL after a checkpoint and resumed with ``--resume auto`` must end with
the weights of an uninterrupted run (dropout on: the RNG states are restored too), and the
rows it trained on across the interruption must be the uninterrupted run's: more than one
epoch of them, the first epoch exactly once each.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from model import BertConfig
from trainer import export
from trainer.loop import FAULT_ENV

REPO = Path(__file__).resolve().parents[2]
TINY = {"vocab_size": 200, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 64, "max_position_embeddings": 64, "hidden_dropout_prob": 0.1}  # fmt: skip
STEPS, SAVE_EVERY, KILL_AFTER = 14, 4, 6  # resumes at step 4, repeats steps 5 and 6

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(files: Path, data: Path, out: Path, *extra: str, ranks=2, fault=None, ds="ds.json"):
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    env.pop(FAULT_ENV, None)
    if fault is not None:
        env[FAULT_ENV] = str(fault)
    argv = ["trainer/run.py", "--ds-config", str(files / ds), "--data", str(data),
            "--model", str(files / "model.json"), "--output-dir", str(out),
            "--max-steps", str(STEPS), "--save-every", str(SAVE_EVERY), "--log-every", "2",
            "--num-workers", "1", "--record-samples", "true", "--export-hf", "false", *extra]  # fmt: skip
    if ranks > 1:
        cmd = [shutil.which("deepspeed") or "deepspeed", "--num_gpus", str(ranks),
               "--master_port", str(free_port()), *argv]  # fmt: skip
    else:
        cmd = [sys.executable, *argv]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def sample_lines(out: Path, ranks: int) -> list[list[list[int]]]:
    """Per rank, the recorded micro-batches: [optimizer step, row ids...]."""
    files = [out / f"samples-rank{rank}.txt" for rank in range(ranks)]
    return [[list(map(int, line.split())) for line in f.read_text().splitlines()] for f in files]


def interleave(per_rank: list[list[list[int]]]) -> list[list[int]]:
    """Micro-batches in stream order: micro-step by micro-step, rank 0 first."""
    return [batch for group in zip(*per_rank, strict=True) for batch in group]


@pytest.fixture(scope="module")
def runs(small_shards, tmp_path_factory):
    if shutil.which("deepspeed") is None:
        pytest.skip("the deepspeed launcher is not on PATH")
    files = tmp_path_factory.mktemp("resume")
    (files / "model.json").write_text(json.dumps(BertConfig(**TINY).to_dict()))
    ds = json.loads((REPO / "deploy" / "cpu.json").read_text())
    ds.update(train_micro_batch_size_per_gpu=4, gradient_accumulation_steps=2)
    ds["zero_optimization"] = {"stage": 2}  # a partitioned checkpoint, as on GPUs
    (files / "ds.json").write_text(json.dumps(ds))
    # One rank with 4 accumulation steps reads the same rows per step as 2 ranks x 2.
    (files / "ds1.json").write_text(json.dumps({**ds, "gradient_accumulation_steps": 4}))
    done = launch(files, small_shards, files / "straight")
    assert done.returncode == 0, done.stderr[-3000:]
    killed = launch(files, small_shards, files / "killed", fault=KILL_AFTER)
    assert killed.returncode != 0, "the fault hook did not kill the run"
    assert (files / "killed" / "checkpoints" / "latest").read_text() == f"step{SAVE_EVERY:08d}"
    first_attempt = sample_lines(files / "killed", 2)  # ranks may have died a line apart
    resumed = launch(files, small_shards, files / "killed", "--resume", "auto")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return files, first_attempt


def test_killed_and_resumed_run_ends_with_the_same_weights(runs):
    files, _ = runs
    tag = f"step{STEPS:08d}"
    straight = export.consolidated_state_dict(str(files / "straight" / "checkpoints"), tag)
    resumed = export.consolidated_state_dict(str(files / "killed" / "checkpoints"), tag)
    assert straight.keys() == resumed.keys()
    assert max((straight[k] - resumed[k]).abs().max().item() for k in straight) <= 1e-6


def test_rows_across_the_interruption_are_exactly_the_uninterrupted_ones(runs, small_shards):
    files, first_attempt = runs
    straight = interleave(sample_lines(files / "straight", 2))
    assert max(b[0] for b in first_attempt[0]) == KILL_AFTER  # it did train past the checkpoint
    both_attempts = sample_lines(files / "killed", 2)
    seen = interleave(
        [
            [b for b in before if b[0] <= SAVE_EVERY] + after[len(before) :]
            for before, after in zip(first_attempt, both_attempts, strict=True)
        ]
    )  # what the checkpoint's weights saw, then what the resumed run appended
    assert seen == straight
    rows = [r for batch in seen for r in batch[1:]]
    n = json.loads((small_shards / "manifest.json").read_text())["num_rows"]
    assert len(rows) == STEPS * 16 > n  # more than an epoch, crossing its boundary
    assert sorted(rows[:n]) == list(range(n))  # the first epoch: none lost, none repeated


def test_universal_checkpoint_resumes_on_one_rank(runs, small_shards):
    files, _ = runs
    source = files / "straight" / "checkpoints" / f"step{SAVE_EVERY:08d}"
    refused = launch(
        files, small_shards, files / "one", "--resume", str(source), ranks=1, ds="ds1.json"
    )
    assert refused.returncode == 2 and "ds_to_universal" in refused.stderr
    universal = files / "universal" / f"step{SAVE_EVERY:08d}_universal"
    convert = [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal",
               "--input_folder", str(source), "--output_folder", str(universal)]  # fmt: skip
    done = subprocess.run(convert, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "DS_ACCELERATOR": "cpu"})  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    one = launch(
        files, small_shards, files / "one", "--resume", str(universal), ranks=1, ds="ds1.json"
    )
    assert one.returncode == 0, one.stderr[-3000:]
    rows = [r for batch in interleave(sample_lines(files / "one", 1)) for r in batch[1:]]
    straight_batches = interleave(sample_lines(files / "straight", 2))
    straight = [r for b in straight_batches if b[0] > SAVE_EVERY for r in b[1:]]
    assert rows == straight  # the same stream continues on one rank
    lr = {
        json.loads(x)["step"]: json.loads(x)["lr"] for x in (files / "one" / "metrics.jsonl").open()
    }
    lr2 = {
        json.loads(x)["step"]: json.loads(x)["lr"]
        for x in (files / "straight" / "metrics.jsonl").open()
    }
    assert lr[STEPS] == pytest.approx(lr2[STEPS])  # the schedule resumed at the right step
