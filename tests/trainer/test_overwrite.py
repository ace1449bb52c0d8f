"""An --output-dir that holds checkpoints is resumed or refused, never trained over silently
(trainer/checkpoint.py check_start), and its metrics.jsonl reads as one run
(report/records.py)."""

import json
from pathlib import Path

import pytest

from report.records import current_run, read_current
from report.summary import main as summary_main
from tests.helpers import args
from trainer import checkpoint
from trainer.run import main
from trainer.signals import resume_command

RUN = ("--max-steps", "4", "--save-every", "2", "--log-every", "2", "--export-hf", "false")


def snapshot(out: Path) -> dict[str, bytes]:
    """Every file of a run's output but its logs (which append), by relative path."""
    return {
        str(p.relative_to(out)): p.read_bytes()
        for p in sorted(out.rglob("*"))
        if p.is_file() and "logs" not in p.relative_to(out).parts
    }


def run_ids(out: Path) -> set:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return {json.loads(line)["run_id"] for line in lines}


@pytest.fixture
def stopped_run(tiny_shards, tmp_path):
    """A run of 4 steps in tmp_path/out with checkpoints at steps 2 and 4."""
    argv = args(tmp_path, tiny_shards, *RUN)
    assert main(argv) == 0
    return argv, tmp_path / "out"


def test_the_same_command_again_is_refused_naming_both_commands(stopped_run, caplog):
    argv, out = stopped_run
    before = snapshot(out)
    caplog.clear()
    assert main(argv) == 2
    said = caplog.text
    assert "holds an earlier run's checkpoints (step00000002, step00000004)" in said
    assert "Nothing was changed" in said
    assert "--resume auto" in said and "--overwrite" in said
    assert snapshot(out) == before  # not a byte: checkpoints, latest, metrics, TensorBoard


def test_overwrite_starts_over_and_keeps_nothing_of_the_old_run(stopped_run):
    argv, out = stopped_run
    (old,) = run_ids(out)
    assert main([*argv, "--overwrite"]) == 0
    (new,) = run_ids(out)  # the old run's records are gone with its checkpoints
    assert new != old
    assert (out / "checkpoints" / "latest").read_text() == "step00000004"
    assert checkpoint.read_state(str(out / "checkpoints"), "step00000004")["run_id"] == new
    assert [r["step"] for r in read_current(out / "metrics.jsonl")] == [2, 4]
    assert main(argv) == 2  # and the new run is as protected as the old


def test_resume_auto_continues_and_the_records_stay_one_run(stopped_run, tiny_shards, capsys):
    argv, out = stopped_run
    longer = [*argv, "--max-steps", "6", "--resume", "auto"]
    assert main(longer) == 0
    assert len(run_ids(out)) == 1
    assert [r["step"] for r in read_current(out / "metrics.jsonl")] == [2, 4, 6]
    assert summary_main([str(out)]) == 0
    assert "step 6" in capsys.readouterr().out


def test_resuming_an_earlier_checkpoint_is_refused_or_drops_the_later_ones(stopped_run, caplog):
    argv, out = stopped_run
    earlier = str(out / "checkpoints" / "step00000002")
    before = snapshot(out)
    caplog.clear()
    assert main([*argv, "--resume", earlier]) == 2
    assert "checkpoints past step 2, the one --resume names (step00000004)" in caplog.text
    assert snapshot(out) == before
    assert main([*argv, "--resume", earlier, "--overwrite"]) == 0
    assert (out / "checkpoints" / "latest").read_text() == "step00000004"
    # The file holds steps 2, 4 (first process) and 4 again (the resume from 2): one run.
    steps = [r["step"] for r in read_current(out / "metrics.jsonl") if r["split"] == "train"]
    assert steps == [2, 4]
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 3


def test_a_fresh_start_beside_records_but_no_checkpoint_is_allowed(tiny_shards, tmp_path):
    # A run stopped before its first checkpoint has nothing to lose: the next starts over,
    # and the records of the one before are not its own.
    out = tmp_path / "out"
    out.mkdir()
    (out / "metrics.jsonl").write_text(json.dumps({"step": 2, "split": "train", "loss": 9}) + "\n")
    assert main(args(tmp_path, tiny_shards, *RUN)) == 0
    assert [r["step"] for r in read_current(out / "metrics.jsonl")] == [2, 4]
    assert all("run_id" in r for r in read_current(out / "metrics.jsonl"))


def test_commands_to_resume_and_to_overwrite():
    prefix, argv = ["python", "-m", "trainer.run"], ["--data", "s", "--overwrite", "off"]
    assert resume_command(prefix, argv) == "python -m trainer.run --data s --resume auto"
    assert resume_command(prefix, [*argv, "--resume=x"], overwrite=True) == (
        "python -m trainer.run --data s --resume=x --overwrite"
    )


def r(step, run="a", segment="1", start=0, split="train"):
    return {"step": step, "split": split, "run_id": run, "segment": segment, "start_step": start}


@pytest.mark.parametrize(
    ("written", "kept"),
    [
        # killed after 16, resumed from its step-15 checkpoint: 16 was done again
        ([r(5), r(10), r(15), r(16), r(20, segment="2", start=15)], [5, 10, 15, 20]),
        # started over (another run id): the earlier run's records go
        ([r(5), r(10), r(15), r(16), r(5, run="b", segment="2")], [5]),
        # resumed from an earlier checkpoint (--overwrite): what followed it goes
        (
            [r(5), r(10), r(15), r(10, segment="2", start=5), r(15, segment="2", start=5)],
            [5, 10, 15],
        ),
        # eval records follow the same rule
        (
            [r(10), r(10, split="eval"), r(12), r(12, split="eval"), r(12, segment="2", start=10)],
            [10, 10, 12],
        ),
        # records from before run ids: kept as written
        ([{"step": 5}, {"step": 10}], [5, 10]),
    ],
)
def test_current_run_keeps_what_the_checkpoints_hold(written, kept):
    assert [rec["step"] for rec in current_run(written)] == kept


def test_current_run_drops_the_right_segment_records():
    written = [r(5), r(10), r(15), r(10, segment="2", start=5)]
    assert [(x["step"], x["segment"]) for x in current_run(written)] == [(5, "1"), (10, "2")]
