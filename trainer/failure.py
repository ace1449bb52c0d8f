"""A failed run stops: every rank and the launcher exit promptly, with one line of error.

Any failure on any rank ends the whole run: an exception (in a step, the data, a checkpoint
write, evaluation, export), a DataLoader worker that dies (torch raises it in the rank), or a
rank killed outright. What happens (trainer/run.py installs it on every rank):

- **The failing rank** (:meth:`RunWatch.fail`) claims the run's failure in the rendezvous
  store (``compare_set``: when several ranks fail at once, the first claim wins and only its
  rank prints), logs one line: where (the step, the checkpoint being saved, ...), the cause
  with the file it names or the code line that raised, the last complete checkpoint and the
  command that resumes from it; the traceback goes to its log file only. It then kills its
  own child processes (DataLoader workers ignore SIGTERM, trainer/signals.py, so they would
  otherwise keep the interpreter's exit waiting forever) and leaves with ``os._exit``:
  **2** for a data error (a corrupt shard, with or without DataLoader workers), **3** for a
  non-finite loss or weight, **1** for anything else. A one-process run returns the code
  from ``main`` instead: the trainer has closed its DataLoaders (trainer/data.py) as the
  error passed, and no other rank can keep it waiting.
- **Every other rank** learns it from a watcher thread (:class:`RunWatch`) that polls the
  store every :data:`POLL_S` seconds, even while its main thread waits in a collective for
  the rank that is gone, and exits with the same code, quietly (a line in its log file).
- **A rank that dies without a word** (SIGKILL, the OOM killer, a segfault): the ranks on
  its machine see its process gone at their next poll. Rank 0 also counts every rank's
  heartbeat and declares a rank dead after :data:`PEER_SILENCE_S` seconds of silence: the
  only sign a rank on another machine gives when that machine is lost. When rank 0 itself is
  gone, the store it hosts stops answering and the others stop after :data:`STORE_LOST_S`.
- **A rank that ended well** marks itself done in the store before it exits (rank 0 last,
  once every mark is there), so a rank still between the last barrier and its exit never
  takes a finished rank for a dead one.
- **The launcher** (``deepspeed``; one per node with ``--no_ssh``) exits with the first
  non-zero code of its ranks; a SIGTERM it sends the survivors meanwhile finds them already
  leaving (trainer/signals.py asks this watch first: a stop that waits for a dead rank would
  never come).

The bound: a failure is seen by every rank within about ``POLL_S`` (a process that died on
the same machine, an exception anywhere), ``STORE_LOST_S`` (rank 0 gone) or
``PEER_SILENCE_S`` (a silent rank on another machine); every rank has left a second or two
after that. A rank that is alive but stuck (a deadlock, a hung file system) is bounded by
``--collective-timeout`` instead (trainer/config.py).

Nothing is lost: ``latest`` (trainer/checkpoint.py) is written only after every rank finished
a checkpoint, so a save cut short is never resumed, and the line names the checkpoint that
``--resume auto`` takes.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import signal
import socket
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch.distributed as dist

from pipeline.shards.shard_format import ShardFormatError

from .checkpoint import NonFiniteError

logger = logging.getLogger(__name__)

POLL_S = 0.5  # how often each rank looks at the store and its machine's other ranks
# A live rank beats every POLL_S from a thread that needs the GIL only for microseconds; the
# main thread releases it in every torch op, collective and torch.save, so a thread ticks
# through a large save too (no bench times it). A minute of silence is a dead process or
# machine.
PEER_SILENCE_S = 60.0
STORE_LOST_S = 5.0  # rank 0, which hosts the store, is gone: no answer for this long
ACK_WAIT_S = 3.0  # rank 0 (the store's host) waits this long for the others to leave first
_KEY = "bert-run-watch"
DATA_ERROR, NON_FINITE, OTHER = 2, 3, 1


def exit_code(err: BaseException) -> int:
    """2 for a data error, 3 for a non-finite loss or weight, 1 for anything else."""
    if isinstance(err, NonFiniteError):
        return NON_FINITE
    if isinstance(err, ShardFormatError) or _worker_error_type(err) == ShardFormatError.__name__:
        return DATA_ERROR
    return OTHER


def cause(err: BaseException) -> str:
    """One line: the exception's type and message, and the code line that raised it unless
    the message names a file (an OSError's filename, a shard error's path) already.

    An error that torch re-raises from a DataLoader worker carries the worker's whole
    traceback in its message; its last line is the original error.

    Example: ``OSError(28, "No space left on device", "/ckpt/x.pt")`` ->
    ``"OSError: [Errno 28] No space left on device: '/ckpt/x.pt'"``.
    """
    text = str(err)
    name = type(err).__name__
    if _worker_error_type(err) is not None:
        last = text.rstrip().splitlines()[-1]
        kind, _, text = last.partition(": ")
        name = f"{kind.rsplit('.', 1)[-1]} in a DataLoader worker"
    lines = [line for line in text.strip().splitlines() if line.strip()]
    line = f"{name}: {lines[0] if lines else '(no message)'}"
    if len(lines) > 1:
        line += " [...]"
    for note in getattr(err, "__notes__", ()):
        line += f"; {note}"
    names_a_file = getattr(err, "filename", None) or "/" in text
    frames = traceback.extract_tb(err.__traceback__)
    if frames and not names_a_file:
        line += f" ({_short(frames[-1].filename)}:{frames[-1].lineno})"
    return line


def _worker_error_type(err: BaseException) -> str | None:
    """The original type's name of an error re-raised from a DataLoader worker, else None."""
    text = str(err)
    if not (text.startswith("Caught ") and "\nOriginal Traceback" in text):
        return None
    last = text.rstrip().splitlines()[-1]
    return last.partition(": ")[0].rsplit(".", 1)[-1]


def _short(path: str) -> str:
    """A path relative to the working directory when it is under it."""
    with contextlib.suppress(ValueError):
        return os.path.relpath(path) if not os.path.relpath(path).startswith("..") else path
    return path


def _machine() -> str:
    """This machine and PID namespace: two processes with the same value can see each other's
    PIDs (a host name can repeat across machines; a boot id and namespace cannot)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}:{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:  # not Linux: no same-machine check, heartbeats only
        return f"{socket.gethostname()}:{os.getpid()}"


def _started(pid: int) -> float:
    """When process ``pid`` started: on Linux, ``/proc/PID/stat``'s start time in seconds
    since boot, which no step of the wall clock moves; elsewhere psutil's ``create_time``.

    psutil's ``create_time`` on Linux is that start time plus the boot time, which it reads
    as the wall clock less the uptime: when the clock steps (NTP, or this machine's VM
    forked, as it was once during a test), a live rank's create_time changes and its peers
    took it for a process that had exited.

    Raises:
        psutil.NoSuchProcess: no such process.
    """
    import psutil  # a dependency of deepspeed

    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except FileNotFoundError:
        if Path("/proc/self/stat").exists():
            raise psutil.NoSuchProcess(pid) from None
        return psutil.Process(pid).create_time()  # no /proc: not Linux
    fields = stat[stat.rindex(b")") + 2 :].split()  # after "pid (comm) ": field 3 on
    return int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime, in ticks


def _gone(pid: int, started: float) -> bool:
    """True when process ``pid`` (started at ``started``, :func:`_started`'s) has exited:
    gone, a zombie, or the pid taken by another process."""
    import psutil  # a dependency of deepspeed

    try:
        if _started(pid) != started:
            return True
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
    except (psutil.Error, OSError):  # not ours to look at: assume alive, heartbeats count
        return False


class RunWatch:
    """The failure handling of one rank (module docstring); a context manager that starts the
    watcher thread when the world has more than one rank.

    Args:
        rank, world_size: this process's place.
        stop: the run's StopRequest (trainer/signals.py): its resume command and last
            complete checkpoint go into the error line, and it asks :meth:`check` on a signal.
        log_path: this rank's log file (named in the error line), or None.
    """

    def __init__(self, *, rank: int, world_size: int, stop, log_path: str | None = None):
        self.rank, self.world_size, self.stop, self.log_path = rank, world_size, stop, log_path
        # What the run is doing ("step 41", "saving checkpoint step00000040", "export"):
        # trainer/run.py points it at the Trainer's activity once there is one.
        self.activity: Callable[[], str] = lambda: "start-up"
        self._store = None
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()
        self._lock = threading.Lock()  # one exit, from whichever thread gets there first
        self._peers: dict[int, tuple[int, float]] | None = None  # same machine: pid, created
        self._beats: dict[int, tuple[int, float]] = {}  # rank 0: last count, when it changed
        self._lost_since: float | None = None

    def __enter__(self) -> RunWatch:
        self.stop.check_peers = self.check
        if self.world_size > 1:
            self._store = _store_client()
            me = os.getpid()
            self._store.set(f"{_KEY}/pid/{self.rank}", f"{_machine()} {me} {_started(me)}")
            self._thread = threading.Thread(target=self._watch, name="run-watch", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self._closing.set()  # from here no check ends the run: the ranks are past their last collective
        if self._store is not None and exc_type is None:
            self._finish()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.stop.check_peers = None

    def _finish(self) -> None:
        """This rank ended well: mark it done, so that a rank still watching does not take its
        exit for a death; rank 0, which hosts the store, first waits (a few seconds at most)
        for every rank's mark, so that none of them finds the store gone while it looks."""
        keys = [f"{_KEY}/done/{r}" for r in range(self.world_size)]
        with contextlib.suppress(Exception):  # the store is gone: nobody is watching
            self._store.set(keys[self.rank], "1")
            deadline = time.monotonic() + ACK_WAIT_S
            while self.rank == 0 and time.monotonic() < deadline:
                if self._store.check(keys):
                    return
                time.sleep(0.05)

    def _done(self, rank: int) -> bool:
        """Whether ``rank`` ended well (:meth:`_finish`)."""
        try:
            return bool(self._store.check([f"{_KEY}/done/{rank}"]))
        except Exception:  # the store is gone: it cannot say
            return False

    # -- failures of this rank -------------------------------------------------------------

    def fail(self, err: BaseException, *, usage: bool = False) -> int:
        """End the run for ``err`` raised on this rank (module docstring). With several ranks
        it never returns; a one-process run returns the exit code (nothing else to stop: the
        caller has closed its DataLoaders, trainer/data.py).

        ``usage``: a bad flag, config, checkpoint or data found at start-up (nothing ran):
        exit 2 with the error's own message, as every command does, and no resume hint.
        """
        if usage:  # the message says it all: no traceback, as for every command
            return self._end(DATA_ERROR, str(err), hint=False)
        line = f"{self.activity()} failed on rank {self.rank}: {cause(err)}"
        with contextlib.suppress(OSError):  # a log file that cannot be written: the console says it
            logger.info("stopping: traceback of: %s", line, exc_info=err)  # the log file only
        dead = self._dead_peers()
        if dead:  # a collective broke because a rank died: that rank is the cause
            return self._end(OTHER, f"{self._died(*dead[0])}: {line}")
        return self._end(exit_code(err), line)

    def _dead_peers(self) -> list[tuple[int, int]]:
        """(rank, pid) of this machine's other ranks whose process is gone without having
        ended well."""
        gone = [
            (rank, pid)
            for rank, (pid, started) in (self._peers or {}).items()
            if _gone(pid, started)
        ]
        # Rank 0 (the store's host) is never done before the others: _finish waits for them.
        return [(rank, pid) for rank, pid in gone if rank == 0 or not self._done(rank)]

    def _died(self, rank: int, pid: int) -> str:
        return (
            f"rank {rank} (pid {pid}) exited or was killed (seen by rank {self.rank} during "
            f"{self.activity()}; its log may say why)"
        )

    def _end(self, code: int, line: str, *, hint: bool = True, claim: bool = True) -> int:
        """Claim the failure (first claim wins), say it once if this rank's claim won, and
        leave with the code of the failure that did; ``claim=False``: another rank's claim,
        seen in the store."""
        with self._lock:
            first = False
            if claim:
                first, code, line = self._claim(code, line)
            # The console handler comes first: a log file that fails (pipeline/console.py's
            # LogFileError) after it has the line must not keep this rank from leaving.
            with contextlib.suppress(OSError):
                if first and hint:
                    log = f" (log: {self.log_path})" if self.log_path else ""
                    # A bad row comes again on a resume: the data must change first.
                    repair = (
                        " A resume reads the same row again: repair the shard first (python -m "
                        "pipeline validate names the bad ones; build them again), then resume"
                        if code == DATA_ERROR
                        else " Resume"
                    )
                    logger.error(
                        "%s%s; %s.%s with:\n  %s",
                        line,
                        log,
                        self.stop.checkpoint_note(),
                        repair,
                        self.stop.resume,
                    )
                elif first:
                    logger.error("%s", line)
                else:
                    logger.info("stopping: %s (exit code %d)", line, code)
            if self._store is None:  # one process: nobody to tell, nothing stuck
                return code
            self._leave()
            _exit(code)

    def _claim(self, code: int, line: str) -> tuple[bool, int, str]:
        """(first, code, line): this rank's failure if its claim is the first, else the
        first one's as another rank claimed it."""
        if self._store is None or 0 in dict(self._dead_peers()):  # rank 0 hosted the store
            return True, code, line
        value = f"{code} {line}"
        try:
            got = self._store.compare_set(f"{_KEY}/failed", "", value)
        except Exception:  # the store is gone with rank 0: nobody to tell
            return True, code, line
        got = got.decode() if isinstance(got, bytes) else got
        if got == value:
            return True, code, line
        first_code, _, first_line = got.partition(" ")
        return False, int(first_code), first_line

    def _leave(self) -> None:
        """Say this rank is leaving; rank 0, which hosts the store, first waits (a few seconds
        at most) for the others to have left, so that none of them finds the store gone
        before it has seen the claim."""
        dead = dict(self._dead_peers())
        if self._store is None or 0 in dead:
            return
        with contextlib.suppress(Exception):  # the store is gone: nothing to wait for
            if self.rank != 0:
                self._store.add(f"{_KEY}/left", 1)
                return
            deadline = time.monotonic() + ACK_WAIT_S
            while time.monotonic() < deadline:  # the dead never leave
                if self._store.add(f"{_KEY}/left", 0) >= self.world_size - 1 - len(dead):
                    return
                time.sleep(0.05)

    # -- failures seen from here -----------------------------------------------------------

    def check(self) -> None:
        """One look at the store and this machine's other ranks; ends the run when one failed
        or died. The watcher thread calls it every POLL_S; trainer/signals.py calls it on a
        stop signal (a launcher's SIGTERM after one of its ranks died)."""
        if self._store is None or self._closing.is_set():
            return
        now = time.monotonic()
        dead = self._dead_peers()  # first: with rank 0 gone, the store calls would wait
        if dead:
            self._end(OTHER, self._died(*dead[0]))
        try:
            self._store.add(f"{_KEY}/beat/{self.rank}", 1)
            if self._store.check([f"{_KEY}/failed"]):
                code, _, line = self._store.get(f"{_KEY}/failed").decode().partition(" ")
                self._end(int(code), line, claim=False)
            self._lost_since = None
            if self.rank == 0:
                self._check_beats(now)
            self._find_local_peers()
        except (RuntimeError, OSError) as err:  # the store does not answer: rank 0 is gone?
            self._lost_since = self._lost_since or now
            if now - self._lost_since >= STORE_LOST_S:
                self._end(OTHER, f"rank {self.rank} lost the run's store on rank 0 ({err})")

    def _find_local_peers(self) -> None:
        """Once every rank has published its process: which ones share this machine."""
        if self._peers is None:
            keys = [f"{_KEY}/pid/{r}" for r in range(self.world_size)]
            if not self._store.check(keys):
                return  # not every rank is up yet
            here, self._peers = _machine(), {}
            for rank, value in enumerate(self._store.multi_get(keys)):
                machine, pid, started = value.decode().split(" ")
                if machine == here and rank != self.rank:
                    self._peers[rank] = (int(pid), float(started))

    def _check_beats(self, now: float) -> None:
        keys = [f"{_KEY}/beat/{r}" for r in range(1, self.world_size)]
        if not self._store.check(keys):
            return
        for rank, value in enumerate(self._store.multi_get(keys), start=1):
            count = int(value)
            last = self._beats.get(rank)
            if last is None or last[0] != count:
                self._beats[rank] = (count, now)
            elif now - last[1] > PEER_SILENCE_S and not self._done(rank):
                self._end(
                    OTHER,
                    f"rank {rank} has not been heard from for {now - last[1]:.0f} s "
                    f"(its process or machine is gone)",
                )

    def _watch(self) -> None:
        while not self._closing.wait(POLL_S):
            self.check()


def _store_client():
    """A client of the rendezvous store (MASTER_ADDR:MASTER_PORT, hosted by rank 0), on its own
    connection: the watcher's calls never wait behind the main thread's."""
    return dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        timeout=datetime.timedelta(seconds=STORE_LOST_S),
        wait_for_workers=False,
    )


def _exit(code: int):
    """Kill this process's children (DataLoader workers ignore SIGTERM), flush the logs and
    leave at once: no interpreter shutdown, which would wait for the workers and for threads
    stuck in a collective."""
    with contextlib.suppress(Exception):
        import psutil

        for child in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                child.send_signal(signal.SIGKILL)
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    os._exit(code)
