"""Ctrl-C and SIGTERM (trainer/signals.py): stop after the step, save, print the resume command.

The slow tests launch real runs and signal them once the metrics show step 2: SIGTERM to one
rank of two and its DataLoader worker, as the deepspeed launcher and SLURM send it (the other
rank learns it in the per-step all-reduce), and SIGINT to the whole process group of a
one-rank run, as a terminal's Ctrl-C. Each stopped run is resumed with the very command it
printed and must end as an uninterrupted run: the same weights (two ranks) and the same rows,
in the same order. DataLoader workers must ignore the signals: a worker killed fails its
rank's step, one that handles them prints the stop message twice. The fast tests drive the
handler in a small process: a second signal exits at once, even while the main thread is
blocked in C (as in a collective waiting for another rank).
"""

import contextlib
import json
import os
import selectors
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import REPO, free_port, sample_lines, trainer_argv, write_launch_files
from trainer import export
from trainer.checkpoint import tag_for
from trainer.signals import grace_warning, launch_prefix, resume_command, script_args

STEPS, SAVE_EVERY, SIGNAL_AT = 12, 6, 2  # signal once metrics.jsonl shows step 2
ENV = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def rows_in_order(per_rank: list[list[list[int]]]) -> list[int]:
    """Row ids in stream order: micro-step by micro-step, rank 0 first."""
    return [row for group in zip(*per_rank, strict=True) for batch in group for row in batch[1:]]


def test_resume_command_of_one_node_of_several_says_every_node_runs_it():
    prefix = ["deepspeed", "--hostfile", "h", "--no_ssh", "--node_rank", "0", "trainer/run.py"]
    assert resume_command(prefix, ["--data", "s"]) == (
        "deepspeed --hostfile h --no_ssh --node_rank 0 trainer/run.py --data s --resume auto\n"
        "  (on every node, each with its own --node_rank; under SLURM: sbatch again)"
    )


def test_resume_command_drops_resume_and_local_rank_and_quotes():
    args = script_args(["--local_rank=1", "--data", "my shards", "--resume", "x", "--seed", "3"])
    assert resume_command(["python", "trainer/run.py"], args) == (
        "python trainer/run.py --data 'my shards' --seed 3 --resume auto"
    )
    assert resume_command(["p"], ["--resume=runs/a"]) == "p --resume auto"
    assert script_args(["--local-rank", "0", "--data", "s"]) == ["--data", "s"]


def test_launch_prefix_is_the_launcher_as_typed():
    args = ["--data", "s"]
    rank = ["python3", "-u", "trainer/run.py", "--local_rank=0", *args]
    node = [
        "python3",
        "-u",
        "-m",
        "deepspeed.launcher.launch",
        "--world_info=e30=",
        "trainer/run.py",
        *args,
    ]
    runner = ["/venv/bin/python3", "/venv/bin/deepspeed", "--num_gpus", "2", "trainer/run.py"]
    shell = ["bash", "-c", shlex.join([*runner, *args])]
    chain = [rank, node, [*runner, *args], shell]
    assert launch_prefix(chain, args, "trainer/run.py") == [
        "deepspeed",
        "--num_gpus",
        "2",
        "trainer/run.py",
    ]
    module = ["/usr/bin/python", "-m", "trainer.run", *args]
    assert launch_prefix([module, shell], args, "/repo/trainer/run.py") == module[:3]
    assert launch_prefix([rank, node], args, "trainer/run.py") is None  # no typed command
    assert launch_prefix([["python", "other.py", *args]], args, "trainer/run.py") is None


def test_grace_warning_when_a_step_and_a_save_do_not_fit():
    assert "35 s, more than --signal-grace 30 s" in grace_warning(20.0, 15.0, 30.0)
    assert grace_warning(20.0, 5.0, 30.0) is None
    assert grace_warning(200.0, 50.0, 0) is None  # 0: no check


HANDLER = """
import logging, os, signal, sys, time
logging.basicConfig(level=logging.INFO, format="%(message)s")
from trainer.signals import StopRequest

def peer_failed():  # as trainer/failure.py's RunWatch.check ends a run another rank failed
    logging.info("stopping: step 7 failed on rank 1 (exit code 1)")
    os._exit(1)

if "blocked-from-start" in sys.argv[3:]:  # as if started so: a signal mask survives exec
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
with StopRequest(resume="python -m trainer.run --resume auto", output_dir=sys.argv[1],
                 same_request_s=0.3) as stop:
    stop.training = sys.argv[2] == "training"
    if "peer-failed" in sys.argv[3:]:
        stop.check_peers = peer_failed
    # The main thread as if stuck in C: only the watcher thread can take the signals now.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    print("ready", flush=True)
    time.sleep(60)
"""


def start_handler(tmp_path, phase: str, *options: str) -> subprocess.Popen:
    cmd = [sys.executable, "-c", HANDLER, str(tmp_path), phase, *options]
    p = subprocess.Popen(
        cmd, cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert p.stdout.readline() == "ready\n"
    return p


def signal_masks(pid: int) -> str:
    """Each thread's blocked, ignored, caught and pending signals (/proc), and this one's."""
    lines = [f"this process blocks {sorted(signal.pthread_sigmask(signal.SIG_BLOCK, []))}"]
    for status in sorted(Path(f"/proc/{pid}/task").glob("*/status")):
        with contextlib.suppress(OSError):
            fields = status.read_text().splitlines()
            lines.append(" ".join(f for f in fields if f.startswith(("Name", "Sig", "ShdPnd"))))
    return "\n".join(lines)


def stderr_until(p: subprocess.Popen, text: str, timeout: float = 30) -> str:
    """The process's stderr up to the line holding ``text``; fails saying each thread's signal
    masks when the line does not come (the handler has 60 s left to sleep)."""
    got, deadline = b"", time.monotonic() + timeout
    fd = p.stderr.fileno()  # read unbuffered: a buffered line would not wake the selector
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while text.encode() not in got:
            if not selector.select(deadline - time.monotonic()):
                masks = signal_masks(p.pid)
                p.kill()
                p.communicate()  # reaped, not left behind
                pytest.fail(f"no {text!r} in {timeout:.0f} s: {got!r}\n{masks}")
            chunk = os.read(fd, 4096)
            assert chunk, (got, p.communicate())  # the process ended without the line
            got += chunk
    return got.decode()


@pytest.mark.parametrize("options", [(), ("blocked-from-start",)])
def test_second_signal_aborts_at_once_while_the_main_thread_is_blocked(tmp_path, options):
    """``blocked-from-start``: the process starts with both signals blocked (a launcher
    spawned it so); the watcher thread takes them all the same."""
    p = start_handler(tmp_path, "training", *options)
    p.send_signal(signal.SIGTERM)
    p.send_signal(signal.SIGINT)  # the same request fanned out (within same_request_s)
    # The request's window opens when the watcher reads the first signal, not when it was
    # sent: wait for its line, then let the window (0.3 s) pass. Before, the test slept 0.6 s
    # from the sending, and a watcher scheduled late on a busy machine could read all three
    # signals inside one window, and count the third as the same request.
    first = stderr_until(p, "SIGTERM: finishing this step, then saving a checkpoint")
    time.sleep(0.35)
    assert p.poll() is None, p.communicate()  # a stop was requested; nothing aborted
    p.send_signal(signal.SIGINT)
    # Aborted, not finished: the main thread sleeps 60 s and cannot take the signal.
    _, err = p.communicate(timeout=30)
    err = first + err
    assert p.returncode == 130
    assert "SIGINT: aborted at once, exit code 130; no complete checkpoint yet" in err
    assert "Resume with:\n  python -m trainer.run --resume auto" in err
    assert "Traceback" not in err


def test_first_signal_outside_training_exits_at_once(tmp_path):
    p = start_handler(tmp_path, "start-up")
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=10)
    assert p.returncode == 143
    assert "SIGTERM: aborted at once (not training: nothing to finish), exit code 143" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("phase", ["training", "start-up"])
def test_a_signal_after_another_ranks_failure_exits_with_that_failure(tmp_path, phase):
    """The launcher SIGTERMs a rank after another failed, maybe after the failure's broken
    collective ended this rank's training: the failure's stop line and code, not 143."""
    p = start_handler(tmp_path, phase, "peer-failed")
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=10)
    assert p.returncode == 1, err
    assert "stopping: step 7 failed on rank 1 (exit code 1)" in err
    assert "aborted at once" not in err and "finishing this step" not in err


def launch(files: Path, data: Path, out: Path, *, ranks: int) -> subprocess.Popen:
    ds = "ds.json" if ranks == 2 else "ds1.json"  # the same rows per step
    argv = trainer_argv(
        files, data, out, "--log-every", "1", steps=STEPS, save_every=SAVE_EVERY, ds=ds
    )  # a step's metrics line at once: the signal waits for step 2
    if ranks == 2:
        argv = ["deepspeed", "--num_gpus", "2", "--master_port", str(free_port()), *argv]
    else:
        argv = [sys.executable, *argv]
    return subprocess.Popen(
        argv,
        cwd=REPO,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def wait_for_step(p: subprocess.Popen, out: Path, step: int) -> None:
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        if any(json.loads(line)["step"] >= step for line in lines):
            return
        assert p.poll() is None, p.communicate()[1][-3000:]
        time.sleep(0.02)
    raise TimeoutError(f"no step {step} in {metrics}")


def rank_tree(p: subprocess.Popen, rank: int) -> list[int]:
    """The pids of one rank launched by ``p`` and of its DataLoader workers."""
    psutil = pytest.importorskip("psutil")
    for child in psutil.Process(p.pid).children(recursive=True):
        if f"--local_rank={rank}" in child.cmdline():
            return [child.pid] + [c.pid for c in child.children(recursive=True)]
    raise AssertionError(f"no rank {rank} under {p.pid}")


def stop_and_resume(
    p: subprocess.Popen, out: Path, code: int, *, up_arrow: bool = False
) -> tuple[int, str]:
    """Wait for the stop; check its exit code, console and checkpoint; run the printed command
    (shlex-split, as a shell would) to the end. Returns (the step it stopped at, its stderr).

    ``up_arrow``: first run the stopped command again as it was (the mistake of not adding
    ``--resume auto``): it must be refused, exit 2, naming both commands and rewriting
    nothing (trainer/checkpoint.py check_start)."""
    _, err = p.communicate(timeout=240)
    assert p.returncode == code, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    tag = (out / "checkpoints" / "latest").read_text()
    stopped_at = int(tag.removeprefix("step"))
    assert SIGNAL_AT <= stopped_at < STEPS
    assert f"checkpoint {out / 'checkpoints' / tag}. Resume with:\n  " in err
    command = err.split("Resume with:\n  ")[1].splitlines()[0]
    assert command.endswith(" --resume auto")
    if up_arrow:
        before = output_files(out)
        again = subprocess.run(p.args, cwd=REPO, env=ENV, capture_output=True, text=True)
        assert again.returncode == 2, again.stderr[-3000:]
        assert "a fresh run would train from step 0 beside them" in again.stderr
        assert f"  {command}\n" in again.stderr and " --overwrite\n" in again.stderr
        assert output_files(out) == before
    done = subprocess.run(
        shlex.split(command), cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (
        f"resumed from {out / 'checkpoints'}/{tag} at step {stopped_at}"
        in (out / "logs" / "train-rank0.log").read_text()
    )
    return stopped_at, err


def output_files(out: Path) -> dict[str, tuple[int, bytes]]:
    """A run's files but its logs (which append): {relative path: (mtime_ns, bytes)}."""
    return {
        str(path.relative_to(out)): (path.stat().st_mtime_ns, path.read_bytes())
        for path in sorted(out.rglob("*"))
        if path.is_file() and "logs" not in path.relative_to(out).parts
    }


@pytest.fixture(scope="module")
def files(small_shards, tmp_path_factory):
    if shutil.which("deepspeed") is None:  # the printed resume command starts with it
        pytest.skip("the deepspeed launcher is not on PATH")
    files = tmp_path_factory.mktemp("signals")
    zero2 = {"stage": 2}
    write_launch_files(files, gradient_accumulation_steps=2, zero_optimization=zero2)
    write_launch_files(files, "ds1.json", gradient_accumulation_steps=4, zero_optimization=zero2)
    straight = launch(files, small_shards, files / "straight", ranks=2)
    _, err = straight.communicate(timeout=300)
    assert straight.returncode == 0, err[-3000:]
    return files


@pytest.mark.slow
def test_sigterm_to_one_rank_stops_both_and_resumes_exactly(files, small_shards):
    out = files / "sigterm"
    p = launch(files, small_shards, out, ranks=2)
    wait_for_step(p, out, SIGNAL_AT)
    for pid in rank_tree(p, 1):  # as the launcher and SLURM signal a rank: its workers too
        os.kill(pid, signal.SIGTERM)  # rank 0 learns it in the step's all-reduce
    stopped_at, err = stop_and_resume(p, out, 143)
    assert "SIGTERM reached another rank: finishing this step" in err
    command = err.split("Resume with:\n  ")[1].splitlines()[0]
    assert command.startswith("deepspeed --num_gpus 2 --master_port ")
    tag = tag_for(STEPS)
    straight = export.consolidated_state_dict(str(files / "straight" / "checkpoints"), tag)
    resumed = export.consolidated_state_dict(str(out / "checkpoints"), tag)
    assert max((straight[k] - resumed[k]).abs().max().item() for k in straight) <= 1e-6
    assert sample_lines(out, 2) == sample_lines(files / "straight", 2)  # no row lost or repeated
    print(f"stopped at step {stopped_at}")


@pytest.mark.slow
def test_ctrl_c_stops_a_one_rank_run_that_resumes_on_the_same_rows(files, small_shards):
    out = files / "sigint"
    p = launch(files, small_shards, out, ranks=1)
    wait_for_step(p, out, SIGNAL_AT)
    os.killpg(p.pid, signal.SIGINT)  # as a terminal does: the DataLoader worker gets it too
    stopped_at, err = stop_and_resume(p, out, 130, up_arrow=True)
    assert err.count("SIGINT: finishing this step, then saving a checkpoint") == 1  # no worker
    assert err.split("Resume with:\n  ")[1].startswith(f"{sys.executable} trainer/run.py ")
    assert rows_in_order(sample_lines(out, 1)) == rows_in_order(sample_lines(files / "straight", 2))
    print(f"stopped at step {stopped_at}")
