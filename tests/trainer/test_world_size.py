"""Resume on another number of ranks, automatically: 2 -> 1 -> 3 CPU ranks (ZeRO-2).

A run on 2 ranks saves at step 2; ``--resume auto`` continues it on 1 rank (its checkpoint is
converted to a universal one), which is killed after saving step 4; ``--resume auto`` on 3
ranks converts that one and trains to the end. The reference is the 2-rank run left
uninterrupted. The first segment *is* that run up to step 2: its step-2 checkpoint, copied
to a fresh output directory, is what a 2-rank run stopped there leaves (checkpoints never
change after they are written).

Comparable weights need the same global batch, in the same micro-batches: the micro batch is
4 rows on every rank and the accumulation steps keep 6 micro-batches per optimizer step
(2 ranks x 3, 1 x 6, 3 x 2), so every step averages the same 24 rows in the same six
micro-batches of 4 (trainer/order.py: micro-batch j of a step is rank j mod W's). Dropout is
off: a new world size reseeds the dropout RNGs (there is no per-rank state to map), which is
another random path, not an error. What is left is the order of the fp32 reductions (a
sum over 2, 1 or 3 ranks, ZeRO partitions of other sizes): measured max |w - w_ref| 3.7e-9
(2**-28, a few units in the last place of the small weights; LayerNorm's are about 1) in two
runs; the test allows 1e-6, as tests/trainer/test_resume.py does for the same world size.
"""

import json
import shutil
from pathlib import Path

import pytest

from model import BertConfig
from tests.helpers import (
    TINY,
    build_shards,
    interleave,
    launch,
    max_weight_difference,
    sample_lines,
    write_launch_files,
)
from trainer.checkpoint import tag_for
from trainer.run import main

STEPS, SAVE_EVERY = 8, 2  # 8 x 24 = 192 rows: past the end of the first epoch
ACCUMULATION = {2: 3, 1: 6, 3: 2}  # ranks -> accumulation steps: 6 micro-batches per step
NO_DROPOUT = ("--dropout", "0")

pytestmark = pytest.mark.slow


def segment(files: Path, data: Path, out: Path, ranks: int, *extra: str, fault=None):
    return launch(
        files,
        data,
        out,
        *NO_DROPOUT,
        *extra,
        ranks=ranks,
        fault=fault,
        ds=f"ds{ranks}.json",
        steps=STEPS,
        save_every=SAVE_EVERY,
    )


def copy_checkpoint(source: Path, out: Path, step: int) -> None:
    """``out`` as a run that saved ``source``'s checkpoint of ``step`` and stopped leaves it."""
    tag = tag_for(step)
    shutil.copytree(source / "checkpoints" / tag, out / "checkpoints" / tag)
    (out / "checkpoints" / "latest").write_text(tag)


@pytest.fixture(scope="module")
def runs(small_shards, tmp_path_factory):
    if shutil.which("deepspeed") is None:
        pytest.skip("the deepspeed launcher is not on PATH")
    files = tmp_path_factory.mktemp("world_size")
    for ranks, accumulation in ACCUMULATION.items():
        write_launch_files(
            files,
            f"ds{ranks}.json",
            zero_optimization={"stage": 2},
            gradient_accumulation_steps=accumulation,
        )
    reference = segment(files, small_shards, files / "reference", 2)
    assert reference.returncode == 0, reference.stderr[-3000:]
    out = files / "resumed"
    copy_checkpoint(files / "reference", out, 2)
    one = segment(files, small_shards, out, 1, "--resume", "auto", fault="sigkill@4")
    assert one.returncode != 0, "the fault hook did not kill the one-rank run"
    assert (out / "checkpoints" / "latest").read_text() == "step00000004"
    three = segment(files, small_shards, out, 3, "--resume", "auto")
    assert three.returncode == 0, three.stderr[-3000:]
    return files, one, three


def test_rows_over_2_1_3_ranks_are_the_uninterrupted_runs(runs, small_shards):
    """The same micro-batches in the same order: micro-batch j of a step is rank j mod W's
    (k-th of its own for k = j div W) on W ranks, so stream order is rank order per micro-step."""
    files, _, _ = runs
    reference = interleave(sample_lines(files / "reference", 2))
    resumed = sample_lines(files / "resumed", 3)  # rank 0's file: the one-rank run's lines first
    seen = (
        [b for b in reference if b[0] <= 2]  # the 2-rank run, up to its checkpoint
        + [b for b in resumed[0] if b[0] <= 4]  # 1 rank, steps 3-4
        + interleave([[b for b in lines if b[0] > 4] for lines in resumed])  # 3 ranks, 5-8
    )
    assert seen == reference
    rows = [row for batch in seen for row in batch[1:]]
    n = json.loads((small_shards / "manifest.json").read_text())["num_rows"]
    assert len(rows) == STEPS * 24 > n  # past the end of the first epoch
    assert sorted(rows[:n]) == list(range(n))  # which has every row once


def test_weights_after_2_1_3_ranks_match_within_reduction_noise(runs):
    files, _, _ = runs
    difference = max_weight_difference(files / "reference", files / "resumed", tag_for(STEPS))
    assert difference <= 1e-6, difference

    def lr(out):
        records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        return {r["step"]: r["lr"] for r in records if r["split"] == "train"}

    resumed = lr(files / "resumed")
    assert sorted(resumed) == [4, 6, 8]  # the one-rank run logged step 4, the 3-rank 6 and 8
    assert resumed == {step: lr(files / "reference")[step] for step in resumed}


def test_each_checkpoint_is_converted_once_beside_it(runs):
    files, one, three = runs
    checkpoints = files / "resumed" / "checkpoints"
    names = sorted(p.name for p in checkpoints.iterdir() if p.name.startswith(("step", ".")))
    assert names == [
        "step00000002",
        "step00000002_universal",
        "step00000004",
        "step00000004_universal",
        "step00000006",
        "step00000008",
    ]
    for tag, saved, now in (("step00000002", 2, "1 rank"), ("step00000004", 1, "3 ranks")):
        universal = checkpoints / f"{tag}_universal"
        assert (universal / "zero").is_dir() and (universal / "config.json").is_file()
        rank = "rank" if saved == 1 else "ranks"
        said = f"resuming {checkpoints}/{tag} (saved on {saved} {rank}) on {now}: converting it"
        run = one if saved == 2 else three
        assert said in run.stdout + run.stderr
    assert not list(checkpoints.glob("latest_universal"))


@pytest.fixture(scope="module")
def other_vocab(tmp_path_factory) -> Path:
    return build_shards(
        tmp_path_factory.mktemp("vocab150"), n_docs=40, dupe_factor=1, vocab_size=150
    )


@pytest.mark.parametrize("change", ["data", "model", "vocab"])
def test_other_data_model_or_vocab_is_refused_before_converting(
    change, runs, small_shards, tiny_shards, other_vocab, tmp_path, caplog
):
    """One rank resuming a 2-rank checkpoint: refused, exit 2, nothing converted."""
    files, _, _ = runs
    copy_checkpoint(files / "reference", tmp_path / "out", 2)
    data, model = small_shards, TINY
    if change == "data":
        data = tiny_shards
    elif change == "model":
        model = {**TINY, "hidden_size": 64, "intermediate_size": 128}
    else:
        data, model = other_vocab, {**TINY, "vocab_size": 150}
    (tmp_path / "model.json").write_text(json.dumps(BertConfig(**model).to_dict()))
    argv = [
        "--ds-config",
        str(files / "ds1.json"),
        "--data",
        str(data),
        "--model",
        str(tmp_path / "model.json"),
        "--output-dir",
        str(tmp_path / "out"),
        "--max-steps",
        str(STEPS),
        "--num-workers",
        "0",
        "--resume",
        "auto",
    ]
    assert main(argv) == 2
    expected = {
        "data": f"trained on other data than --data {tiny_shards}",
        "model": "is a model with hidden_size=32, intermediate_size=64; this run builds "
        "hidden_size=64, intermediate_size=128",
        "vocab": "is a model with vocab_size=200; this run builds vocab_size=150 (--model "
        f"{tmp_path / 'model.json'}). Resume on the shards it was trained on (--data)",
    }[change]
    assert expected in caplog.text and "Traceback" not in caplog.text
    assert sorted(p.name for p in (tmp_path / "out" / "checkpoints").iterdir()) == [
        "latest",
        "step00000002",
    ]
