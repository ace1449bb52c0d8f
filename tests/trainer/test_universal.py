"""trainer/universal.py: which checkpoints are converted, once, atomically, and what a failed
conversion says. DeepSpeed's converter is replaced by a stand-in here (it runs for real in
tests/trainer/test_world_size.py)."""

import json
import sys
from pathlib import Path

import pytest
import torch

from trainer import universal
from trainer.dsconfig import BatchSizes
from trainer.prepare import batch_change

CPU = torch.device("cpu")
TAG = "step00000004"
# Stands in for ds_to_universal: writes zero/ and, as it does, latest_universal beside its
# output folder; counts its runs in the file named by argv[1].
FAKE = """
import pathlib, sys
count, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[sys.argv.index("--output_folder") + 1])
count.write_text(str(int(count.read_text() or 0) + 1) if count.exists() else "1")
(out / "zero" / "bert.embeddings.word_embeddings.weight").mkdir(parents=True)
(out / "mp_rank_00_model_states.pt").write_bytes(b"weights")
(out.parent / "latest_universal").write_text(out.name)
"""
FAILING = "import sys; print('Traceback ...', file=sys.stderr); sys.exit('AssertionError: no universal_checkpoint_info')"


def zero_checkpoint(directory: Path, world_size: int, partitioned: bool = True) -> str:
    """A checkpoint as trainer/checkpoint.py saves it, files reduced to their names."""
    path = directory / "checkpoints" / TAG
    path.mkdir(parents=True)
    (path / "mp_rank_00_model_states.pt").write_bytes(b"weights")
    for rank in range(world_size if partitioned else 0):
        (path / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").write_bytes(b"partition")
    (path / "trainer_state.json").write_text(json.dumps({"world_size": world_size}))
    (path / "config.json").write_text("{}")
    return str(directory / "checkpoints")


@pytest.fixture
def fake_converter(tmp_path, monkeypatch):
    script, count = tmp_path / "fake.py", tmp_path / "runs"
    script.write_text(FAKE)

    def command(source, output):
        return [sys.executable, str(script), str(count), "--output_folder", str(output)]

    monkeypatch.setattr(universal, "converter_command", command)
    return lambda: int(count.read_text()) if count.exists() else 0


def test_only_a_zero_checkpoint_of_another_world_size_is_converted(tmp_path, fake_converter):
    two = zero_checkpoint(tmp_path / "zero", 2)
    assert universal.saved_world_size(two, TAG) == 2
    assert universal.for_world_size(two, TAG, 2, is_main=True, device=CPU) == (two, TAG)
    stage0 = zero_checkpoint(tmp_path / "stage0", 2, partitioned=False)
    assert universal.saved_world_size(stage0, TAG) is None  # the whole optimizer in one file
    assert universal.for_world_size(stage0, TAG, 3, is_main=True, device=CPU) == (stage0, TAG)
    assert fake_converter() == 0


def test_conversion_is_made_once_beside_the_checkpoint_with_our_files(tmp_path, fake_converter):
    directory = zero_checkpoint(tmp_path, 2)
    resumed = universal.for_world_size(directory, TAG, 3, is_main=True, device=CPU)
    assert resumed == (directory, f"{TAG}_universal")
    assert universal.is_universal(*resumed) and universal.saved_world_size(*resumed) is None
    target = Path(directory, f"{TAG}_universal")
    assert {p.name for p in target.iterdir()} == {
        "zero",
        "mp_rank_00_model_states.pt",
        "config.json",
        "trainer_state.json",
    }
    # Nothing else beside it: no .partial folder, no latest_universal of DeepSpeed's.
    assert sorted(p.name for p in Path(directory).iterdir()) == [TAG, f"{TAG}_universal"]
    assert universal.for_world_size(directory, TAG, 1, is_main=True, device=CPU) == resumed
    assert fake_converter() == 1  # reused for another world size
    assert (Path(directory, TAG) / "zero_pp_rank_1_mp_rank_00_optim_states.pt").is_file()


def test_other_ranks_only_wait_for_rank_0(tmp_path, fake_converter):
    directory = zero_checkpoint(tmp_path, 2)
    resumed = universal.for_world_size(directory, TAG, 1, is_main=False, device=CPU)
    assert resumed == (directory, f"{TAG}_universal") and fake_converter() == 0


def test_a_failed_conversion_is_refused_naming_both_sizes_and_leaves_nothing(tmp_path, monkeypatch):
    directory = zero_checkpoint(tmp_path, 2)
    # A conversion killed earlier left its temporary folder: it is replaced, then removed.
    (Path(directory) / f".{TAG}_universal.partial" / "junk").mkdir(parents=True)
    command = [sys.executable, "-c", FAILING]
    monkeypatch.setattr(universal, "converter_command", lambda source, output: command)
    with pytest.raises(ValueError) as err:
        universal.for_world_size(directory, TAG, 1, is_main=True, device=CPU)
    assert str(err.value).startswith(
        f"--resume: {directory}/{TAG} was saved on 2 ranks and this run has 1 rank; converting "
        "it to a universal checkpoint failed: DeepSpeed's ds_to_universal failed: Traceback ... "
        "| AssertionError: no universal_checkpoint_info. Resume on 2 ranks, or convert it by "
        f"hand (`python -m deepspeed.checkpoint.ds_to_universal --input_folder {directory}/{TAG}"
    )
    assert sorted(p.name for p in Path(directory).iterdir()) == [TAG]


def test_converter_command_is_deepspeeds_module():
    command = universal.converter_command(Path("c/step1"), Path("c/.p/step1_universal"))
    assert command[1:3] == ["-m", "deepspeed.checkpoint.ds_to_universal"]
    assert command[command.index("--input_folder") + 1] == "c/step1"
    assert 1 <= int(command[command.index("--num_extract_workers") + 1]) <= 4


def test_batch_change_is_said_when_rows_per_step_change():
    saved = {"world_size": 2, "micro_batch": 4, "gradient_accumulation_steps": 3, "position": 48}
    assert batch_change(saved, BatchSizes(micro=4, accumulation=6, world_size=1)) is None
    message = batch_change(saved, BatchSizes(micro=4, accumulation=3, world_size=3))
    assert message.startswith(
        "--resume: the checkpoint's run trained 24 rows per optimizer step (2 ranks x micro "
        "batch 4 x 3 accumulation steps), this run trains 36 (3 x 4 x 3). The data continues "
        "at row 48 of the stream, none lost or repeated"
    )
    assert "will see more rows than planned" in message and "train_batch_size 24" in message
