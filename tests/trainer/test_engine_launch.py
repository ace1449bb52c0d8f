"""The torch engine launched as users launch it: DDP over 2 CPU ranks, killed and resumed.

deploy/cpu.json (no ZeRO) runs on the torch engine. A 2-rank run with 2 accumulation
micro-steps is the reference. Another is killed by SIGKILL after its step-4 checkpoint,
resumed on 2 ranks to step 6, where its weights must be the reference's bit for bit, and
resumed again on 1 rank (4 micro-steps: the same 16 rows a step, in the same micro-batches)
to step 8, where they must match within the order of the fp32 reductions (as
tests/trainer/test_world_size.py allows for DeepSpeed's engine), with no conversion: a
torch-engine checkpoint holds the whole optimizer in one file. Dropout is off, since a
new world size reseeds it.
"""

import shutil
from pathlib import Path

import pytest

from tests.helpers import (
    interleave,
    launch,
    max_weight_difference,
    sample_lines,
    write_launch_files,
)
from trainer.checkpoint import tag_for

pytestmark = pytest.mark.slow

NO_DROPOUT = ("--dropout", "0")


def run(files: Path, data: Path, out: Path, ranks: int, steps: int, *extra: str, fault=None):
    done = launch(
        files,
        data,
        out,
        *NO_DROPOUT,
        *extra,
        ranks=ranks,
        fault=fault,
        ds=f"ds{ranks}.json",
        steps=steps,
        save_every=2,
    )
    return done


@pytest.fixture(scope="module")
def runs(small_shards, tmp_path_factory):
    if shutil.which("deepspeed") is None:
        pytest.skip("the deepspeed launcher is not on PATH")
    files = tmp_path_factory.mktemp("engine_launch")
    write_launch_files(files, "ds2.json", gradient_accumulation_steps=2)
    write_launch_files(files, "ds1.json", gradient_accumulation_steps=4)
    reference = run(files, small_shards, files / "reference", 2, 8)
    assert reference.returncode == 0, reference.stderr[-3000:]
    out = files / "resumed"
    killed = run(files, small_shards, out, 2, 8, fault="sigkill@4")
    assert killed.returncode != 0, "the fault hook did not kill the run"
    assert (out / "checkpoints" / "latest").read_text() == tag_for(4)
    two = run(files, small_shards, out, 2, 6, "--resume", "auto")
    assert two.returncode == 0, two.stderr[-3000:]
    one = run(files, small_shards, out, 1, 8, "--resume", "auto")
    assert one.returncode == 0, one.stderr[-3000:]
    return files, reference, two, one


def test_two_ranks_run_ddp_on_the_torch_engine(runs):
    _, reference, _, one = runs
    assert "engine: torch (DDP over 2 ranks; --engine auto: no ZeRO" in reference.stderr
    assert "engine: torch (one rank; --engine auto" in one.stderr


def test_a_killed_run_resumed_on_2_ranks_has_the_uninterrupted_weights_exactly(runs):
    files = runs[0]
    assert max_weight_difference(files / "reference", files / "resumed", tag_for(6)) == 0.0


def last_of_step(lines: list[list[int]], step: int, micro_steps: int) -> list[list[int]]:
    """A rank's micro-batches of ``step`` from the run that finished it: its last lines (a
    killed run may have recorded the step it did not finish)."""
    return [b for b in lines if b[0] == step][-micro_steps:]


def test_resumed_on_1_rank_it_reads_the_same_rows_and_ends_within_reduction_noise(runs):
    files = runs[0]
    reference = interleave(sample_lines(files / "reference", 2))
    rank0, rank1 = sample_lines(files / "resumed", 2)  # rank 0's file has the 1-rank run's too
    seen = []
    for step in range(1, 7):
        seen += interleave([last_of_step(rank0, step, 2), last_of_step(rank1, step, 2)])
    for step in (7, 8):
        seen += last_of_step(rank0, step, 4)
    assert seen == reference
    difference = max_weight_difference(files / "reference", files / "resumed", tag_for(8))
    assert difference <= 1e-6, difference
    assert not list((files / "resumed" / "checkpoints").glob("*_universal"))
