"""trainer/checkpoint.py's housekeeping before a resume: saves cut short, room on the disk."""

import errno
import shutil
from collections import namedtuple

import pytest

from trainer import checkpoint


def make_checkpoint(checkpoints, tag: str, *, complete: bool, size: int = 10) -> None:
    path = checkpoints / tag
    path.mkdir(parents=True)
    (path / "mp_rank_00_model_states.pt").write_bytes(b"\0" * size)
    if complete:
        (path / checkpoint.STATE_FILE).write_text("{}")


def test_saves_cut_short_are_removed_and_complete_ones_kept(tmp_path):
    checkpoints = tmp_path / checkpoint.CHECKPOINTS
    make_checkpoint(checkpoints, "step00000002", complete=True)
    make_checkpoint(checkpoints, "step00000004", complete=False)  # a full disk cut it short
    make_checkpoint(checkpoints, "step00000002_universal", complete=False)  # a conversion
    (checkpoints / checkpoint.LATEST).write_text("step00000002")
    assert checkpoint.remove_incomplete(str(tmp_path)) == ["step00000004"]
    assert sorted(p.name for p in checkpoints.iterdir()) == [
        "latest",
        "step00000002",
        "step00000002_universal",
    ]
    assert checkpoint.remove_incomplete(str(tmp_path / "elsewhere")) == []


def test_a_resume_without_room_for_its_next_checkpoint_is_refused(tmp_path, monkeypatch):
    checkpoints = tmp_path / checkpoint.CHECKPOINTS
    make_checkpoint(checkpoints, "step00000002", complete=True, size=3 * 2**20)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(0, 0, 2**20))
    with pytest.raises(OSError) as raised:
        checkpoint.check_free_space(str(checkpoints), "step00000002", str(tmp_path))
    assert raised.value.errno == errno.ENOSPC
    assert (
        f"{checkpoints} has 1.0 MiB free, less than the 3.0 MiB of the checkpoint "
        "step00000002" in str(raised.value)
    )
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(0, 0, 4 * 2**20))
    checkpoint.check_free_space(str(checkpoints), "step00000002", str(tmp_path))
