"""Exact resume: on two CPU ranks of one node, and on two "nodes" of one rank each.

A run whose rank 1 is killed with SIGKILL after a checkpoint (tests/faults) must end at once:
rank 0 and the launcher exit 1 within the bound of trainer/failure.py, rank 0 saying once
which rank died. Resumed with ``--resume auto`` it must end with the weights of an
uninterrupted run (tests/trainer/conftest.py; dropout on: the RNG states are restored too),
and the rows it trained on across the interruption must be the uninterrupted run's: more
than one epoch of them, the first epoch exactly once each. The other rows of the fault
matrix: tests/trainer/test_faults.py.

Two nodes are started as a cluster without ssh starts them (deploy/slurm.sbatch): one
``deepspeed --hostfile H --no_ssh --node_rank N`` launcher per node, the same hostfile,
master address and port, and one output directory (the shared file system). Node 1's rank
fails in a step: both launchers exit 1, and only node 1 prints an error. Each node has
one rank, so both ranks have LOCAL_RANK 0: a file written by "local rank 0" instead of
global rank 0 would be written twice. Every file write of the ranks is recorded (an audit
hook loaded through ``sitecustomize``, :data:`WRITE_AUDIT`), and the two-node run must end
with the weights of the one-node uninterrupted run: the global ranks are the same.
Resuming on another number of ranks: tests/trainer/test_world_size.py.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

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
from trainer.checkpoint import tag_for

STEPS, SAVE_EVERY, KILL_AFTER = 14, 4, 6  # resumes at step 4, repeats steps 5 and 6
RUN = {"steps": STEPS, "save_every": SAVE_EVERY}  # tests/trainer/conftest.py's straight run
EXIT_BOUND_S = 60  # from a fault to the launcher's exit (trainer/failure.py)

pytestmark = pytest.mark.slow


def across_the_kill(first_attempt, both_attempts, saved_at: int) -> list[list[int]]:
    """The micro-batches the weights saw: the killed run's up to its checkpoint, then what the
    resumed run appended to the same sample files (ranks may have died a line apart)."""
    return interleave(
        [
            [b for b in before if b[0] <= saved_at] + after[len(before) :]
            for before, after in zip(first_attempt, both_attempts, strict=True)
        ]
    )


@pytest.fixture(scope="module")
def runs(small_shards, zero2_files, straight_run):
    files, port = zero2_files, free_port()
    start = time.time()
    killed = launch(
        files, small_shards, files / "killed", fault=f"sigkill@{KILL_AFTER}:1", port=port, **RUN
    )
    exited = time.time()
    # One rank killed: the other and the launcher exit at once, the survivor saying why. The
    # launcher exits with the status of the first failed rank it sees: the survivor's 1 or
    # the killed one's -9 (247).
    assert killed.returncode in (1, 247), killed.stderr[-3000:]
    console = killed.stdout + killed.stderr
    assert len(error_lines(console)) == 1 and "Traceback" not in console, console[-3000:]
    assert re.search(r"rank 1 \(pid \d+\) exited or was killed", console), console[-3000:]
    assert f"checkpoints/{tag_for(SAVE_EVERY)}. Resume with" in console
    assert exited - start < EXIT_BOUND_S + 60  # start-up included; the fault's own bound:
    assert exited - killed_at(files / "killed") <= EXIT_BOUND_S
    assert (files / "killed" / "checkpoints" / "latest").read_text() == tag_for(SAVE_EVERY)
    first_attempt = sample_lines(files / "killed", 2)  # ranks may have died a line apart
    resumed = launch(files, small_shards, files / "killed", "--resume", "auto", port=port, **RUN)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # DeepSpeed made its CPU all-reduce files where trainer/distributed.py looks (else it
    # warns), and they are gone after every run, the killed one too.
    logs = [run.stdout + run.stderr for run in (straight_run, killed, resumed)]
    logs += [f.read_text() for f in files.glob("*/logs/*.log")]
    assert len(logs) > 3 and not any("all-reduce buffer is not at" in log for log in logs)
    assert not list(Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_{port}_*"))
    return files, first_attempt


def error_lines(console: str) -> list[str]:
    """The console's error lines of trainer/failure.py (one per failed run)."""
    return [line for line in console.splitlines() if "ERROR trainer.failure:" in line]


def killed_at(out: Path) -> float:
    """When the fault hook (tests/faults) struck the run writing to ``out``."""
    return float(Path(f"{out}.faults").read_text().split()[-1])


def test_killed_and_resumed_run_ends_with_the_same_weights(runs):
    files, _ = runs
    assert max_weight_difference(files / "straight", files / "killed", tag_for(STEPS)) <= 1e-6


def test_rows_across_the_interruption_are_exactly_the_uninterrupted_ones(runs, small_shards):
    files, first_attempt = runs
    straight = interleave(sample_lines(files / "straight", 2))
    assert max(b[0] for b in first_attempt[0]) > SAVE_EVERY  # it trained past the checkpoint
    seen = across_the_kill(first_attempt, sample_lines(files / "killed", 2), SAVE_EVERY)
    assert seen == straight
    rows = [r for batch in seen for r in batch[1:]]
    n = json.loads((small_shards / "manifest.json").read_text())["num_rows"]
    assert len(rows) == STEPS * 16 > n  # more than an epoch, crossing its boundary
    assert sorted(rows[:n]) == list(range(n))  # the first epoch: none lost, none repeated


# Loaded by every Python process of the two-node runs (sitecustomize): appends "RANK TIME_NS
# EVENT PATH" for each file opened for writing, renamed into place or torch.save'd under
# $WRITE_AUDIT_UNDER. torch.save writes in C++, past the audit events: it is wrapped as soon
# as torch has it.
WRITE_AUDIT = """
import os, sys, time
_under, _log = os.path.join(os.environ["WRITE_AUDIT_UNDER"], ""), os.environ["WRITE_AUDIT_LOG"]
_rank, _busy, _patched = os.environ.get("RANK", "-"), [False], [False]

def _record(event, path):
    try:
        path = os.path.abspath(os.fsdecode(os.fspath(path)))
    except TypeError:
        return
    if path.startswith(_under) and not _busy[0]:
        _busy[0] = True
        try:
            with open(os.path.join(_log, f"writes-{os.getpid()}.txt"), "a") as f:
                f.write(f"{_rank} {time.time_ns()} {event} {path}\\n")
        finally:
            _busy[0] = False

def _hook(event, args):
    torch = sys.modules.get("torch")
    if not _patched[0] and torch is not None and hasattr(torch, "save"):
        _patched[0], save = True, torch.save
        def audited_save(obj, f, *a, **k):
            _record("torch.save", f)
            return save(obj, f, *a, **k)
        torch.save = audited_save
    if event == "open" and (any(c in (args[1] or "") for c in "wax+")
                            or args[1] is None and args[2] & (os.O_WRONLY | os.O_RDWR)):
        _record("open", args[0])
    elif event == "os.rename":
        _record("rename", args[1])

sys.addaudithook(_hook)
try:
    import fault_injection  # tests/faults: on the path when a fault is injected
except ImportError:
    pass
"""


def launch_nodes(files: Path, data: Path, out: Path, *extra: str, fault=None) -> list[int]:
    """Two nodes of one rank each (module docstring); returns the launchers' exit codes.

    Each launcher's output goes to OUT/node{N}.txt (a pipe left unread could block one
    launcher while the other waits for it in a collective).
    """
    hostfile, audit = files / "hostfile", files / "audit"
    hostfile.write_text("node-a slots=1\nnode-b slots=1\n")  # names only: no ssh to them
    (audit / "site").mkdir(parents=True, exist_ok=True)
    (audit / "site" / "sitecustomize.py").write_text(WRITE_AUDIT)
    path = os.pathsep.join([str(audit / "site"), os.environ.get("PYTHONPATH", "")])
    env = rank_env(
        fault,
        PYTHONPATH=path,
        WRITE_AUDIT_UNDER=str(out),
        WRITE_AUDIT_LOG=str(audit),
        BERT_TEST_FAULT_LOG=f"{out}.faults",
    )
    port = str(free_port())
    out.mkdir(parents=True, exist_ok=True)
    procs = []
    try:
        for node in (0, 1):
            cmd = [
                shutil.which("deepspeed") or "deepspeed",
                "--hostfile",
                str(hostfile),
                "--no_ssh",
                "--node_rank",
                str(node),
                "--master_addr",
                "127.0.0.1",
                "--master_port",
                port,
                *trainer_argv(files, data, out, *extra, **RUN),
            ]
            with open(out / f"node{node}.txt", "a") as log:
                procs.append(
                    subprocess.Popen(
                        cmd,
                        cwd=REPO,
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        return [p.wait(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)


def audited_writes(files: Path) -> list[tuple[int, int, str, str]]:
    """(rank, time_ns, event, path) of every write the trainer's ranks made, in time order."""
    rows = []
    for log in (files / "audit").glob("writes-*.txt"):
        for line in log.read_text().splitlines():
            rank, ns, event, path = line.split(" ", 3)
            if rank != "-":  # a launcher process: it writes nothing there
                rows.append((int(rank), int(ns), event, path))
    return sorted(rows, key=lambda row: row[1])


@pytest.fixture(scope="module")
def two_nodes(runs, small_shards):
    files, _ = runs
    out = files / "two-nodes"
    # Node 1's rank fails in a step: node 0's rank and launcher exit too, quietly.
    codes = launch_nodes(files, small_shards, out, fault=f"raise@{KILL_AFTER + 1}:1")
    exited = time.time()
    assert codes == [1, 1], (out / "node0.txt").read_text()[-3000:]
    assert exited - killed_at(out) <= EXIT_BOUND_S
    node0, node1 = ((out / f"node{n}.txt").read_text() for n in (0, 1))
    assert error_lines(node0) == [] and "Traceback" not in node0 + node1, node0[-3000:]
    assert len(error_lines(node1)) == 1 and "RuntimeError: injected fault" in node1
    assert (out / "checkpoints" / "latest").read_text() == tag_for(SAVE_EVERY)
    first_attempt = sample_lines(out, 2)
    codes = launch_nodes(files, small_shards, out, "--resume", "auto", "--export-hf", "true")
    assert codes == [0, 0], (out / "node0.txt").read_text()[-3000:]
    return out, first_attempt


def test_two_nodes_read_disjoint_rows_and_resume_as_one_node_uninterrupted(runs, two_nodes):
    files, _ = runs
    out, first_attempt = two_nodes
    assert max(b[0] for b in first_attempt[0]) > SAVE_EVERY
    seen = across_the_kill(first_attempt, sample_lines(out, 2), SAVE_EVERY)
    assert seen == interleave(sample_lines(files / "straight", 2))
    for rank0, rank1 in zip(seen[::2], seen[1::2], strict=True):  # one global micro-batch
        assert rank0[0] == rank1[0] and not set(rank0[1:]) & set(rank1[1:])
    assert max_weight_difference(files / "straight", out, tag_for(STEPS)) <= 1e-6


def test_two_nodes_write_each_file_once_shared_ones_from_global_rank_0(two_nodes, runs):
    out, _ = two_nodes
    writes = audited_writes(runs[0])
    writers: dict[str, set[int]] = {}
    for rank, _, _, path in writes:
        writers.setdefault(path, set()).add(rank)
    assert {rank for rank, *_ in writes} == {0, 1}
    for path, ranks in writers.items():
        own = re.search(r"(?:samples-rank|train-rank|zero_pp_rank_)(\d+)", path)  # its own
        assert ranks == {int(own.group(1)) if own else 0}, path
    step = f"{out}/checkpoints/{tag_for(STEPS)}"
    assert writers[f"{step}/mp_rank_00_model_states.pt"] == {0}
    for rank in (0, 1):  # each ZeRO partition by its own rank, once
        path = f"{step}/zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"
        assert [w[0] for w in writes if w[3] == path] == [rank]
    hf = {Path(path).name for path in writers if path.startswith(f"{out}/hf/")}
    assert {"config.json", "model.safetensors", "vocab.txt"} <= hf
    assert (out / "hf" / "model.safetensors").is_file()


def test_two_nodes_write_latest_after_every_rank_wrote_the_checkpoint(two_nodes, runs):
    out, _ = two_nodes
    writes = audited_writes(runs[0])
    latest = [ns for _, ns, event, path in writes if path == f"{out}/checkpoints/latest"]
    tags = sorted(p for p in (out / "checkpoints").iterdir() if p.name.startswith("step"))
    assert [t.name for t in tags] == [tag_for(s) for s in (4, 8, 12, 14)]
    assert len(latest) == len(tags)  # once per checkpoint: the killed run's, then the resumed
    for committed, tag in zip(latest, tags, strict=True):
        partitions = list(tag.glob("zero_pp_rank_*_optim_states.pt"))
        assert len(partitions) == 2
        assert all(p.stat().st_mtime_ns <= committed for p in partitions), tag.name
