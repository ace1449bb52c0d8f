"""trainer/failure.py's parts, in one process: the exit code and one-line cause of an error, a
one-process run's failure, the DataLoader that must close, a checkpoint cut short. The launched
fault matrix: tests/trainer/test_faults.py and test_resume.py."""

import errno
import logging
import os
import signal
import time

import pytest

from pipeline.shards.shard_format import ShardFormatError
from trainer import checkpoint
from trainer.checkpoint import NonFiniteError
from trainer.data import BatchLoader, PretrainingStream, StreamSpec
from trainer.failure import RunWatch, cause, exit_code
from trainer.shards import ShardSet
from trainer.signals import StopRequest


def raised(err: BaseException) -> BaseException:
    try:
        raise err
    except BaseException as caught:
        return caught


def from_worker(err: BaseException) -> BaseException:
    """``err`` as torch re-raises an error of a DataLoader worker in the main process (its
    ExceptionWrapper, what the worker sends and the main process re-raises)."""
    from torch._utils import ExceptionWrapper

    try:
        raise err
    except BaseException:
        wrapped = ExceptionWrapper(where="in DataLoader worker process 0")
    with pytest.raises(type(err)) as info:
        wrapped.reraise()
    return info.value


def test_exit_codes_data_errors_2_non_finite_3_else_1():
    assert exit_code(ShardFormatError("x.arrow: bad")) == 2
    assert exit_code(from_worker(ShardFormatError("x.arrow: bad"))) == 2
    assert exit_code(NonFiniteError("nan")) == 3
    assert exit_code(RuntimeError("boom")) == 1
    assert exit_code(from_worker(RuntimeError("boom"))) == 1


def test_cause_is_one_line_naming_the_file_or_the_code_line():
    full = raised(OSError(errno.ENOSPC, "No space left on device", "/ckpt/x.pt"))
    assert cause(full) == "OSError: [Errno 28] No space left on device: '/ckpt/x.pt'"
    line = cause(raised(RuntimeError("boom\nmore")))
    assert line.startswith("RuntimeError: boom [...] (tests/trainer/test_failure.py:")
    noted = raised(RuntimeError("unexpected pos 64"))
    noted.add_note("/out/checkpoints has 0.0 MiB free")
    assert cause(noted).startswith("RuntimeError: unexpected pos 64; /out/checkpoints has 0.0")


def test_cause_of_a_workers_error_is_the_original_line():
    err = from_worker(ShardFormatError("/s/shard-1.arrow: segment_ids values must be in [0, 2)"))
    assert "\n" not in cause(err)
    assert cause(err) == (
        "ShardFormatError in a DataLoader worker: /s/shard-1.arrow: segment_ids values must be "
        "in [0, 2)"
    )


def test_one_process_failure_says_one_line_and_returns_the_code(tmp_path, caplog):
    stop = StopRequest(
        resume="python -m trainer.run --data s --resume auto", output_dir=str(tmp_path)
    )
    with RunWatch(rank=0, world_size=1, stop=stop) as watch, caplog.at_level(logging.INFO):
        watch.activity = lambda: "step 7"
        code = watch.fail(raised(ShardFormatError("/s/a.arrow: bad row 3")))
    assert code == 2
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    assert errors[0].getMessage() == (
        "step 7 failed on rank 0: ShardFormatError: /s/a.arrow: bad row 3; no complete checkpoint "
        "yet. A resume reads the same row again: repair the shard first (python -m pipeline "
        "validate names the bad ones; build them again), then resume with:\n  python -m "
        "trainer.run --data s --resume auto"
    )
    usage = RunWatch(rank=0, world_size=1, stop=stop).fail(
        ValueError("--data x: no manifest"), usage=True
    )
    assert usage == 2 and caplog.records[-1].getMessage() == "--data x: no manifest"


def test_a_first_stop_signal_asks_whether_a_rank_has_died_first(tmp_path):
    stop = StopRequest(resume="r", output_dir=str(tmp_path))
    asked = []
    stop.check_peers = lambda: asked.append(stop.signum)
    stop.training = True
    read, write = os.pipe()  # the pipe the interpreter writes signal numbers to (__enter__)
    os.set_blocking(read, False)
    stop._pipe = (read, write)
    try:
        os.write(write, bytes([signal.SIGTERM]))  # the launcher's SIGTERM after a rank died
        assert stop._read_pipe()
    finally:
        stop._pipe = None
        os.close(read)
        os.close(write)
    assert asked == [signal.SIGTERM]


def test_closing_the_loader_ends_workers_that_ignore_sigterm(tiny_shards):
    spec = StreamSpec(micro=4, world_size=1, rank=0, seed=1)
    loader = BatchLoader(PretrainingStream(ShardSet(str(tiny_shards)), spec), num_workers=2)
    next(iter(loader))
    workers = [w for it in loader._iterators for w in it._workers]
    assert len(workers) == 2 and all(w.is_alive() for w in workers)
    os.kill(workers[0].pid, signal.SIGTERM)  # ignored (trainer/signals.py): it would hang exit
    time.sleep(0.2)
    assert workers[0].is_alive()
    loader.close()
    assert not any(w.is_alive() for w in workers)


def test_a_checkpoint_without_its_state_file_is_not_taken_for_complete(tmp_path):
    partial = tmp_path / "checkpoints" / "step00000008"
    partial.mkdir(parents=True)
    (partial / "mp_rank_00_model_states.pt").write_bytes(b"x")
    with pytest.raises(FileNotFoundError, match="step00000008 is incomplete: it has no trainer"):
        checkpoint.resolve(partial)
    (partial / checkpoint.STATE_FILE).write_text("{}")
    assert checkpoint.resolve(partial) == (str(partial.parent), "step00000008")


def test_a_live_peer_is_not_taken_for_gone_when_the_wall_clock_steps(monkeypatch):
    """A rank's identity is its pid and start time since boot (/proc/PID/stat), not psutil's
    create_time, which moves with the wall clock: a VM fork during a test stepped it, and
    two live ranks each declared the other dead."""
    import subprocess
    import sys

    import psutil

    from trainer.failure import _gone, _started

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started = _started(child.pid)
        assert not _gone(child.pid, started)
        monkeypatch.setattr(psutil.Process, "create_time", lambda self: time.time() + 3600.0)
        assert not _gone(child.pid, started)  # the clock stepped an hour: still the same rank
        assert _gone(child.pid, started + 1.0)  # another process that got the pid
        child.kill()
        deadline = time.monotonic() + 10
        while not _gone(child.pid, started) and time.monotonic() < deadline:
            time.sleep(0.01)  # killed, not yet reaped: a zombie is gone too
        assert _gone(child.pid, started)
    finally:
        child.kill()
        child.wait()
    assert _gone(child.pid, started)
