"""A failed run stops (trainer/failure.py): the fault-injection matrix.

| fault | world | how it is injected |
|---|---|---|
| disk full during a checkpoint write | 2 ranks | a tmpfs on OUT/checkpoints with room for one checkpoint and a half (when this process may mount one), else ``enospc`` |
| a shard corrupt mid-epoch | 2 ranks; 1 with and without workers | a segment id set to 255 in a row first read after the run's first checkpoint (same size and rows: the start-up check passes) |
| an exception in one rank's step | 2 ranks; 1 | ``raise`` |
| a DataLoader worker killed | 2 ranks; 1 | ``workerkill``: SIGKILL |
| disk full | 1 rank | ``enospc`` |
| one rank SIGKILLed; two ``--no_ssh`` launchers, node 1's rank fails | 2 | test_resume.py |

(``raise``, ``enospc``, ``workerkill``: tests/faults/fault_injection.py, loaded by the
ranks only.) Each row checks the exit code (the launcher's, and each rank's as its log says),
at most :data:`EXIT_BOUND_S` from the fault to the launcher's exit, exactly one error line on
the console naming the cause and the last complete checkpoint, no traceback, and that
``latest`` names that checkpoint.

The faults of one world size run as a chain on one output directory: each run resumes from
the checkpoint the one before left, and the last run, with nothing injected (and the shard
repaired), must end with the weights of an uninterrupted run: every resume in the chain
continued exactly where its checkpoint was.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pyarrow as pa
import pytest

from tests.helpers import (
    REPO,
    free_port,
    interleave,
    launch,
    max_weight_difference,
    rank_env,
    sample_lines,
    trainer_argv,
)
from tests.trainer.conftest import STRAIGHT_STEPS
from trainer.checkpoint import tag_for

pytestmark = pytest.mark.slow

EXIT_BOUND_S = 60  # from a fault to the launcher's exit, as trainer/failure.py states
STEPS, SAVE_EVERY = STRAIGHT_STEPS, 2
# A DataLoader worker sends 8 micro-batches at once (trainer/data.py): 4 steps of 2; a bad row
# fails its whole group, up to 4 steps before the step that would train on it.
GROUP_STEPS = 4
# A killed DataLoader worker as torch reports it, which of two ways it sees the death first:
# its SIGCHLD handler ("is killed by signal"), or a queue read that times out and finds the
# worker gone ("exited unexpectedly"). Both name the worker and its pid.
WORKER_KILLED = (
    r"RuntimeError: DataLoader worker \(pid(?:\(s\))? \d+\) "
    r"(?:exited unexpectedly|is killed by signal: Killed)"
)
LOGGED_ERROR = r"ERROR (?:\[rank \d+\] )?trainer\.failure"  # a rank's log file, its tag


@dataclass
class Outcome:
    """One launch of a chain: exit code, console, seconds from the fault to the exit, and
    what each rank's log gained meanwhile."""

    code: int
    console: str
    seconds: float
    logs: list[str]
    latest: str | None
    incomplete: list[str]  # checkpoint directories without trainer_state.json


def run(files: Path, data: Path, out: Path, *extra: str, fault=None, ranks=2) -> Outcome:
    """trainer/run.py with ``fault`` (tests/faults), resuming from ``out`` if it has a
    checkpoint; logs are read from where they ended before."""
    log_files = [out / "logs" / f"train-rank{r}.log" for r in range(ranks)]
    sizes = [f.stat().st_size if f.exists() else 0 for f in log_files]
    faults = Path(f"{out}.faults")
    faults.unlink(missing_ok=True)
    argv = trainer_argv(
        files, data, out, "--resume", "auto", *extra, steps=STEPS, save_every=SAVE_EVERY
    )
    if ranks > 1:
        cmd = [
            shutil.which("deepspeed"),
            "--num_gpus",
            str(ranks),
            "--master_port",
            str(free_port()),
            *argv,
        ]
    else:
        cmd = [sys.executable, *argv]
    env = rank_env(fault, BERT_TEST_FAULT_LOG=str(faults))
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    exited = time.time()
    logs = []
    for f, size in zip(log_files, sizes, strict=True):
        with open(f, encoding="utf-8") as stream:
            stream.seek(size)
            logs.append(stream.read())
    struck = _fault_time(faults, logs)
    latest = out / "checkpoints" / "latest"
    incomplete = [
        p.name
        for p in sorted((out / "checkpoints").glob("step*"))
        if not (p / "trainer_state.json").exists() and not p.name.endswith("_universal")
    ]
    return Outcome(
        code=done.returncode,
        console=done.stdout + done.stderr,
        seconds=exited - struck if struck is not None else float("nan"),
        logs=logs,
        latest=latest.read_text() if latest.exists() else None,
        incomplete=incomplete,
    )


def _fault_time(faults: Path, logs: list[str]) -> float | None:
    """When the fault struck: the injection's own record, else the first error a rank
    logged (a real full disk, a corrupt row: the rank logs it as it raises)."""
    if faults.exists():
        return min(float(line.split()[-1]) for line in faults.read_text().splitlines())
    stamps = re.findall(rf"^(\S+ \S+) {LOGGED_ERROR}", "\n".join(logs), re.M)
    if not stamps:
        return None
    return min(datetime.strptime(s, "%Y-%m-%d %H:%M:%S,%f").timestamp() for s in stamps)


def check_failed(outcome: Outcome, code: int, cause: str, *, ranks: int) -> None:
    """The row's checks (module docstring); ``cause``: a regex the error line must match."""
    console = outcome.console
    errors = [line for line in console.splitlines() if "ERROR trainer.failure:" in line]
    assert outcome.code == code, console[-3000:]
    assert len(errors) == 1 and "Traceback" not in console, console[-3000:]
    # A rank that took the launcher's SIGTERM for a stop request, not the failure it follows.
    assert "aborted at once" not in console, console[-3000:]
    assert re.search(cause, errors[0]), errors[0]
    # A data error's row comes again on a resume: the hint says to repair the shard first.
    follow = "A resume reads the same row again: repair the shard" if code == 2 else "Resume with"
    complete = f"the last complete checkpoint is {{}}/checkpoints/{outcome.latest}. {follow}"
    assert re.search(complete.format(".*"), console), console[-2000:]
    assert "--resume auto" in re.split("[Rr]esume with:", console)[-1]
    assert outcome.seconds <= EXIT_BOUND_S, outcome.seconds
    print(f"{errors[0].split('ERROR')[1][:90]}... exit {code} {outcome.seconds:.2f} s after")
    said = [log for log in outcome.logs if re.search(LOGGED_ERROR, log)]
    quiet = [log for log in outcome.logs if "stopping: " in log and f"(exit code {code})" in log]
    assert len(said) + len(quiet) >= ranks or "exited or was killed" in errors[0]
    assert len(said) >= 1


# ----------------------------------------------------------------------------- shard surgery


def row_locations(shards: Path) -> list[tuple[Path, int]]:
    """(shard file, row in it) of every row id, in manifest order."""
    manifest = json.loads((shards / "manifest.json").read_text())
    return [(shards / s["name"], r) for s in manifest["shards"] for r in range(s["rows"])]


def corrupt_row(shards: Path, row_id: int) -> tuple[Path, int, bytes]:
    """Set the last segment id of row ``row_id`` to 255 in place (the file keeps its size and
    rows); returns (file, offset, the original byte) to repair it."""
    path, row = row_locations(shards)[row_id]
    source = pa.memory_map(str(path))
    base = source.read_buffer().address
    source.seek(0)
    chunks = pa.ipc.open_stream(source).read_all().column("segment_ids").chunks
    for chunk in chunks:
        if row < len(chunk):
            break
        row -= len(chunk)
    values = chunk.values
    end = int(chunk.offsets.to_numpy()[row + 1]) - 1
    offset = values.buffers()[1].address - base + values.offset + end
    with open(path, "r+b") as f:
        f.seek(offset)
        original = f.read(1)
        f.seek(offset)
        f.write(b"\xff")
    return path, offset, original


def repair(path: Path, offset: int, original: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(original)


def first_read_after(straight: Path, ranks: int, after: int, gap: int) -> int:
    """A row the uninterrupted run first reads again at a step >= ``after + gap`` (none of its
    reads in steps ``after + 1 .. after + gap - 1``), so that a run resumed at ``after`` saves a
    checkpoint before reaching it."""
    first: dict[int, int] = {}
    for batch in interleave(sample_lines(straight, ranks)):
        step = batch[0]
        for row in batch[1:]:
            if step > after and row >= 0:
                first.setdefault(row, step)
    late = sorted((step, row) for row, step in first.items() if after + gap <= step <= STEPS)
    assert late, f"no row is first read again between steps {after + gap} and {STEPS}"
    return late[0][1]


# ----------------------------------------------------------------------------- tmpfs


@contextlib.contextmanager
def small_tmpfs(where: Path, size: int):
    """A tmpfs of ``size`` bytes mounted on ``where`` (yields False when this process may not
    mount one); unmounted at the end."""
    where.mkdir(parents=True, exist_ok=True)
    mount = shutil.which("mount")
    if mount is None or os.geteuid() != 0:
        yield False
        return
    ok = (
        subprocess.run(
            [mount, "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True
        ).returncode
        == 0
    )
    try:
        yield ok
    finally:
        if ok:
            subprocess.run(["umount", "-l", str(where)], capture_output=True)


def regrow(where: Path) -> None:
    """Make room on the tmpfs: the disk was freed."""
    subprocess.run(["mount", "-o", "remount,size=512m", str(where)], check=True)


def directory_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


# ----------------------------------------------------------------------------- two ranks


@pytest.fixture(scope="module")
def two_rank_chain(zero2_files, small_shards, straight_run, tmp_path_factory):
    files, straight = zero2_files, zero2_files / "straight"
    data = tmp_path_factory.mktemp("faults2") / "shards"
    shutil.copytree(small_shards, data)
    out = files / "chain"
    outcomes = {}
    one_checkpoint = directory_size(straight / "checkpoints" / "step00000004")
    with small_tmpfs(out / "checkpoints", int(one_checkpoint * 1.5)) as mounted:
        # Disk full at checkpoint 4 (the tmpfs holds checkpoint 2 and half of another).
        outcomes["disk"] = run(files, data, out, fault=None if mounted else "enospc@4")
        outcomes["disk"].mounted = mounted
        if mounted:
            regrow(out / "checkpoints")
        outcomes["raise"] = run(files, data, out, fault="raise@7:1")
        # A worker of rank 1 dies as it builds a batch of step 10 (a few steps early).
        outcomes["worker"] = run(files, data, out, fault=f"workerkill@{9 * 16}:1")
        resume_at = int(outcomes["worker"].latest[len("step") :])
        row = first_read_after(straight, 2, resume_at, GROUP_STEPS + 1)
        broken = corrupt_row(data, row)
        outcomes["corrupt"] = run(files, data, out)
        outcomes["corrupt"].resumed_at = resume_at
        repair(*broken)
        outcomes["done"] = run(files, data, out)
        outcomes["difference"] = max_weight_difference(straight, out, tag_for(STEPS))
    return outcomes


def test_disk_full_during_a_checkpoint_ends_every_rank(two_rank_chain):
    disk = two_rank_chain["disk"]
    # A full tmpfs fails in torch.save ("unexpected pos") or in a write (ENOSPC); the line
    # says which checkpoint and how much room is left.
    cause = r"saving checkpoint step00000004 failed on rank \d: \w+Error: .*"
    cause += r"MiB free" if disk.mounted else r"No space left on device"
    check_failed(disk, 1, cause, ranks=2)
    assert disk.latest == "step00000002"  # the partial checkpoint 4 is never taken


def test_an_exception_in_one_ranks_step_ends_every_rank(two_rank_chain):
    check_failed(
        two_rank_chain["raise"],
        1,
        r"step 7 failed on rank 1: RuntimeError: injected fault",
        ranks=2,
    )
    assert two_rank_chain["raise"].latest == "step00000006"


def test_a_killed_dataloader_worker_ends_every_rank(two_rank_chain):
    cause = r"failed on rank 1: " + WORKER_KILLED
    check_failed(two_rank_chain["worker"], 1, cause, ranks=2)


def test_a_shard_corrupt_mid_epoch_is_a_data_error(two_rank_chain):
    corrupt = two_rank_chain["corrupt"]
    cause = r"step \d+ failed on rank \d: ShardFormatError in a DataLoader worker: segment_ids values must be in \[0, 2\), got 255 .*shard-0000\d-of-00003\.arrow"
    check_failed(corrupt, 2, cause, ranks=2)
    # It saved a checkpoint after its resume, then met the row: latest is that checkpoint.
    assert int(corrupt.latest[len("step") :]) > corrupt.resumed_at


def test_the_chain_of_failed_and_resumed_runs_ends_as_the_uninterrupted_run(two_rank_chain):
    assert two_rank_chain["done"].code == 0, two_rank_chain["done"].console[-3000:]
    assert two_rank_chain["difference"] <= 1e-6


# ----------------------------------------------------------------------------- one process


@pytest.fixture(scope="module")
def one_rank_chain(zero2_files, small_shards, tmp_path_factory):
    files = zero2_files
    data = tmp_path_factory.mktemp("faults1") / "shards"
    shutil.copytree(small_shards, data)
    straight = files / "straight-one"
    done = launch(files, data, straight, steps=STEPS, save_every=SAVE_EVERY, ranks=1)
    assert done.returncode == 0, done.stderr[-3000:]
    out, outcomes = files / "chain-one", {}
    outcomes["raise"] = run(files, data, out, fault="raise@3", ranks=1)
    outcomes["disk"] = run(files, data, out, fault="enospc@6", ranks=1)
    outcomes["worker"] = run(files, data, out, fault=f"workerkill@{9 * 8}", ranks=1)
    resume_at = int(outcomes["worker"].latest[len("step") :])
    broken = corrupt_row(data, first_read_after(straight, 1, resume_at, SAVE_EVERY + 1))
    outcomes["corrupt"] = run(files, data, out, "--num-workers", "0", ranks=1)
    outcomes["corrupt-workers"] = run(files, data, out, ranks=1)
    repair(*broken)
    outcomes["done"] = run(files, data, out, ranks=1)
    outcomes["difference"] = max_weight_difference(straight, out, tag_for(STEPS))
    return outcomes


def test_one_process_exception_in_a_step(one_rank_chain):
    check_failed(
        one_rank_chain["raise"],
        1,
        r"step 3 failed on rank 0: RuntimeError: injected fault",
        ranks=1,
    )
    assert one_rank_chain["raise"].latest == "step00000002"


def test_one_process_disk_full(one_rank_chain):
    cause = r"saving checkpoint step00000006 failed on rank 0: OSError: .*No space left on device"
    check_failed(one_rank_chain["disk"], 1, cause, ranks=1)
    assert one_rank_chain["disk"].latest == "step00000004"
    assert one_rank_chain["disk"].incomplete == []  # the failed save removed what it wrote


def test_one_process_killed_worker(one_rank_chain):
    cause = WORKER_KILLED
    check_failed(one_rank_chain["worker"], 1, cause, ranks=1)


@pytest.mark.parametrize("name", ["corrupt", "corrupt-workers"])
def test_one_process_corrupt_shard_is_a_data_error_with_and_without_workers(one_rank_chain, name):
    cause = r"failed on rank 0: ShardFormatError.*: segment_ids values must be in \[0, 2\), got 255"
    check_failed(one_rank_chain[name], 2, cause, ranks=1)


def test_one_process_chain_ends_as_the_uninterrupted_run(one_rank_chain):
    assert one_rank_chain["done"].code == 0, one_rank_chain["done"].console[-3000:]
    assert one_rank_chain["difference"] <= 1e-6


def test_ranks_that_end_well_first_are_not_taken_for_dead(zero2_files, small_shards):
    """Rank 0 plots after the last barrier while rank 1 has ended and exited: a finished
    rank is not a dead one (trainer/failure.py's done marks), so the run ends 0, quietly."""
    out = zero2_files / "slow-plot"
    fault = "slowplot@3:0"
    done = launch(
        zero2_files, small_shards, out, "--plots", "true", fault=fault, steps=2, save_every=0
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ERROR" not in done.stderr and (out / "plots" / "loss.png").is_file()
