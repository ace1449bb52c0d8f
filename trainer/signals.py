"""Ctrl-C and a cluster's SIGTERM: finish the step, save, print the resume command, exit.

trainer/run.py installs a :class:`StopRequest` around the run, on every rank:

- **First SIGINT or SIGTERM while training**: the ranks finish the optimizer step in
  progress, save a checkpoint (data position and RNG states included, so the resumed run
  is exactly the uninterrupted one), skip evaluation and export, rank 0 prints the command
  that resumes the run, and every rank exits with 128 + the signal's number: **130** for
  SIGINT, **143** for SIGTERM. The ranks agree in the all-reduce every step already makes
  (trainer/loop.py), so a signal that reaches one rank only (``kill`` of one process, a
  scheduler that signals one task) stops them all after the same step.
- **A second signal**, one second or more after the first (or after the step the ranks
  agreed to stop at): exit at once with 128 + its number, one line and no traceback. A
  checkpoint being written is then left uncommitted: ``latest`` (trainer/checkpoint.py) still
  names the previous complete one, which ``--resume auto`` takes. Signals within a second
  of the first are the same request fanned out and count once: a terminal's Ctrl-C reaches
  every process of the job and the deepspeed launcher then sends its ranks SIGTERM as well;
  SLURM signals every process of a step, the launcher included.
- **Before training** (start-up, loading a checkpoint) **and after it** (export) the first
  signal exits at once: there is nothing to finish. A signal after the stop's checkpoint is
  committed exits quietly with the stop's code.

Signals are noticed even while the main thread waits in a collective for another rank: the
interpreter writes each signal's number to a pipe (``signal.set_wakeup_fd``) that a watcher
thread reads. The watcher unblocks SIGINT and SIGTERM for itself: a process can start with
them blocked (a signal mask survives fork and exec, so a launcher that spawns with them
blocked passes that on), and a run with them blocked in every thread could only be SIGKILLed,
its step and checkpoint lost. DataLoader workers ignore SIGINT and SIGTERM
(:func:`ignore_in_worker`): a terminal or SLURM signals them too, and a worker killed
mid-step would fail the step.

Grace: a scheduler allows some seconds between SIGTERM and SIGKILL (SLURM's KillWait and
Kubernetes' terminationGracePeriodSeconds default to 30; the deepspeed launcher SIGKILLs its
ranks 30 s after it is signalled). The step in progress cannot be cut short (the ranks agree
only between steps) and a save cut short costs nothing (it is never resumed), so the trainer
always tries; ``--signal-grace`` instead warns at the first checkpoint when a step plus a save
take longer than the grace (:func:`grace_warning`), while there is time to act.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from pipeline.options import FALSE, TRUE

logger = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
SAME_REQUEST_S = 1.0  # signals this close to the first are one request (module docstring)
_LOCAL_RANK = ("--local_rank", "--local-rank")  # the deepspeed launcher adds it to each rank
_MODULE = ("-m", "--module")


def exit_code(signum: int) -> int:
    """The shell's convention for a process ended by a signal: ``exit_code(15) -> 143``."""
    return 128 + signum


def script_args(argv: Sequence[str]) -> list[str]:
    """``argv`` without the ``--local_rank`` the deepspeed launcher adds to each rank's:
    ``["--local_rank=1", "--data", "s"] -> ["--data", "s"]``."""
    return _without(argv, _LOCAL_RANK)


def _without(args: Sequence[str], flags: Sequence[str]) -> list[str]:
    """``args`` without the value-taking ``flags``, as ``--flag v`` or ``--flag=v``."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg in flags:
            skip = True
        elif not arg.startswith(tuple(f"{flag}=" for flag in flags)):
            out.append(arg)
    return out


def _without_switch(args: Sequence[str], switch: str) -> list[str]:
    """``args`` without a bool flag given as ``--switch``, ``--switch=v`` or ``--switch v``
    (v a word pipeline/options.py's parse_bool takes): ``(["--overwrite", "off", "--data",
    "s"], "--overwrite")`` -> ``["--data", "s"]``."""
    out, after = [], False
    for arg in args:
        if after and arg.strip().lower() in (*TRUE, *FALSE):
            after = False
            continue
        after = arg == switch
        if not after and arg.split("=")[0] != switch:
            out.append(arg)
    return out


def resume_command(prefix: Sequence[str], args: Sequence[str], *, overwrite: bool = False) -> str:
    """The shell command that continues a run: ``prefix``, then ``args`` without any
    ``--resume`` or ``--overwrite``, then ``--resume auto``. With ``overwrite``, the command
    that runs as asked over what the output directory holds: ``args`` as they are, then
    ``--overwrite`` (trainer/checkpoint.py check_start).

    Example: ``(["python", "trainer/run.py"], ["--data", "my shards", "--resume=x"])``
    -> ``"python trainer/run.py --data 'my shards' --resume auto"``. A launcher of one node of
    several (``deepspeed --no_ssh --node_rank 0``: rank 0's) gets a note that every node
    runs it with its own ``--node_rank``.
    """
    if overwrite:
        command = shlex.join([*prefix, *_without_switch(args, "--overwrite"), "--overwrite"])
    else:
        args = _without_switch(_without(args, ("--resume",)), "--overwrite")
        command = shlex.join([*prefix, *args, "--resume", "auto"])
    if "--no_ssh" in prefix:
        command += "\n  (on every node, each with its own --node_rank; under SLURM: sbatch again)"
    return command


def launch_prefix(cmdlines: Sequence[Sequence[str]], args: Sequence[str], script: str):
    """How the run was started: the command up to the script, from the outermost of
    ``cmdlines`` (this process's, its parent's, ...) that ends with the script and ``args``;
    None when none does. The deepspeed launcher's per-node ``deepspeed.launcher.launch`` is
    not a command anyone types, and ``python /venv/bin/deepspeed`` is shown as ``deepspeed``.

    Example: ``[["python", "-u", "run.py", "--local_rank=0", "--data", "s"],
    ["python", "-u", "-m", "deepspeed.launcher.launch", "--world_info=e30=", "run.py",
    "--data", "s"], ["/venv/bin/python", "/venv/bin/deepspeed", "--num_gpus", "2", "run.py",
    "--data", "s"]]``, ``["--data", "s"]``, ``"run.py"`` -> ``["deepspeed", "--num_gpus", "2",
    "run.py"]``.
    """
    found = None
    for cmd in cmdlines:
        cmd, n = list(cmd), len(cmd) - len(args)
        if n < 1 or cmd[n:] != list(args) or "deepspeed.launcher.launch" in cmd:
            continue
        named = Path(cmd[n - 1]).name == Path(script).name
        if named or (n >= 2 and cmd[n - 2] in _MODULE):
            found = cmd[:n]
    if found and len(found) > 2 and Path(found[0]).name.startswith("python"):
        runner = found[1]  # an entry-point script run by its interpreter (shebang)
        if not runner.startswith("-") and not runner.endswith(".py"):
            found = [Path(runner).name, *found[2:]]
    return found


def ancestor_cmdlines() -> list[list[str]]:
    """The command lines of this process and its ancestors, innermost first ([] if unknown)."""
    try:
        import psutil  # a dependency of deepspeed

        process, out = psutil.Process(), []
        while process is not None and len(out) < 8:
            out.append(process.cmdline())
            process = process.parent()
        return out
    except Exception:  # psutil missing, or a process gone: only a nicer hint is lost
        return []


def how_to_resume(
    argv: Sequence[str], script: str, launched: bool, *, overwrite: bool = False
) -> str:
    """The resume command of this run (module docstring), from its ancestors' command lines;
    with ``overwrite``, its command with ``--overwrite`` (:func:`resume_command`).

    Args:
        argv: this process's arguments after the script.
        script: the script as this process got it (``sys.argv[0]``).
        launched: started by a launcher (deepspeed, torchrun, SLURM): used when no ancestor's
            command line shows how, to name the launcher's part as unknown.
    """
    args = script_args(argv)
    prefix = launch_prefix(ancestor_cmdlines(), args, script)
    if prefix is not None:
        return resume_command(prefix, args, overwrite=overwrite)
    if launched:
        return "<your launcher, as before> " + resume_command([script], args, overwrite=overwrite)
    return resume_command(["python", "-m", "trainer.run"], args, overwrite=overwrite)


def grace_warning(step_s: float, save_s: float, grace_s: float) -> str | None:
    """A warning when a step plus a checkpoint save take longer than the grace, else None.

    Example: ``(20.0, 15.0, 30.0)`` -> a warning naming 35 s; ``(20.0, 5.0, 30.0)`` -> None;
    ``grace_s`` 0 -> None (no check).
    """
    if not grace_s or step_s + save_s <= grace_s:
        return None
    return (
        f"a step takes {step_s:.0f} s and a checkpoint save {save_s:.0f} s: {step_s + save_s:.0f}"
        f" s, more than --signal-grace {grace_s:g} s, so a scheduler's SIGTERM may be followed"
        " by SIGKILL before the stop's checkpoint is written (the run would resume from the last"
        " complete one); lower gradient_accumulation_steps, or give the job a longer grace"
        " (SLURM KillWait or sbatch --signal, Kubernetes terminationGracePeriodSeconds)"
    )


def ignore_in_worker(worker_id: int | None = None) -> None:
    """A DataLoader ``worker_init_fn``: the worker ignores SIGINT and SIGTERM (module
    docstring); it ends with the main process, which owns the stop: on Linux the kernel
    SIGKILLs it when its rank dies (a rank killed outright cannot stop its workers, which
    would otherwise live on until torch's watchdog notices, holding the job's output open)."""
    signal.set_wakeup_fd(-1)  # inherited from the main process by fork: its pipe, not ours
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    if sys.platform == "linux":
        import ctypes

        pr_set_pdeathsig = 1  # <linux/prctl.h>
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL))


class StopRequest:
    """SIGINT and SIGTERM handling for one run (module docstring); a context manager that
    installs it (in the main thread only) and puts back what was there before.

    Args:
        resume: the command that continues the run (:func:`how_to_resume`).
        overwrite: the run's command with ``--overwrite``, for a start refused because the
            output directory holds later checkpoints (trainer/checkpoint.py check_start).
        output_dir: the run's --output-dir; an abort names its last complete checkpoint.
        is_main: rank 0 prints; the other ranks log to their file only.
        same_request_s: signals this close to the first count once.
    """

    def __init__(
        self,
        *,
        resume: str,
        output_dir: str,
        overwrite: str = "",
        is_main: bool = True,
        same_request_s: float = SAME_REQUEST_S,
    ):
        self.resume, self.output_dir, self.is_main = resume, output_dir, is_main
        self.overwrite = overwrite
        self.same_request_s = same_request_s
        self.signum: int | None = None  # the stop's signal: this rank's first, or the agreed one
        self.training = False  # the phase where a first signal stops after the step
        self._since: float | None = None  # when the stop began (signal or agreement)
        self._done = False  # the stop's checkpoint is committed and the command printed
        # Reentrant: the main thread's handler may run while the main thread holds it.
        self._lock = threading.RLock()
        self._pipe: tuple[int, int] | None = None
        # trainer/failure.py's RunWatch.check: a first signal may come from a launcher whose
        # other rank died, and a stop that waits for it in the step's all-reduce never ends.
        self.check_peers: Callable[[], None] | None = None

    # -- the run's side -------------------------------------------------------------------

    def agree(self, signum: int) -> None:
        """The ranks agreed to stop (``signum``: the largest any rank got, the exit code of
        every rank); every rank calls it."""
        with self._lock:
            elsewhere = self.signum is None
            self.signum = signum
            self._since = self._since or time.monotonic()
        if elsewhere and self.is_main:
            name = signal.Signals(signum).name
            logger.info(
                "%s reached another rank: finishing this step, then saving a checkpoint", name
            )

    def finish(self, checkpoint: str | None) -> int:
        """Print how to resume (rank 0) after the stop; returns the exit code."""
        assert self.signum is not None, "finish() without a stop"
        code = exit_code(self.signum)
        if self.is_main:
            saved = f"checkpoint {checkpoint}" if checkpoint else "no checkpoint yet"
            logger.info(
                "stopped by %s (exit code %d); %s. Resume with:\n  %s",
                signal.Signals(self.signum).name,
                code,
                saved,
                self.resume,
            )
        with self._lock:
            self._done = True
        return code

    # -- the signals' side ----------------------------------------------------------------

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is not threading.main_thread():
            return self  # signal handlers can only be set from the main thread
        read, write = os.pipe()
        os.set_blocking(read, False)
        os.set_blocking(write, False)
        self._pipe = (read, write)
        self._old_fd = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        self._old = {s: signal.signal(s, self._on_python_signal) for s in STOP_SIGNALS}
        self._watcher = threading.Thread(target=self._watch, name="stop-signals", daemon=True)
        self._watcher.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._pipe is None:
            return
        for signum, handler in self._old.items():  # None: set outside Python
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        signal.set_wakeup_fd(self._old_fd)
        read, write = self._pipe
        os.write(write, b"\0")  # no signal has number 0: it tells the watcher to end
        self._watcher.join(timeout=5)
        os.close(read)
        os.close(write)
        self._pipe = None

    def _on_python_signal(self, signum, frame) -> None:
        """The main thread's handler: read the pipe now rather than when the watcher runs,
        so a stop requested between two steps is in the next step's all-reduce."""
        self._read_pipe()

    def _watch(self) -> None:
        """Runs while the main thread may be blocked in C (a collective waiting on a rank)."""
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # this thread takes them
        read = self._pipe[0]
        while self._read_pipe():
            select.select([read], [], [])

    def _read_pipe(self) -> bool:
        """Handle the signals in the pipe; False once __exit__ asked the watcher to end."""
        actions: list[Callable[[], None]] = []
        more = True
        with self._lock:
            while self._pipe is not None:
                try:
                    data = os.read(self._pipe[0], 64)
                except OSError:  # empty (the read end does not block), or closed
                    break
                if not data:
                    break
                more = more and 0 not in data
                actions += [self._next(s) for s in data if s in STOP_SIGNALS]
        if actions and self.check_peers is not None:
            # Before any action: a launcher signals its ranks after one of them failed, and
            # that failure, not the signal, is what this rank must exit with and log (in any
            # phase: the failing rank's collective may already have ended this one's training).
            self.check_peers()  # ends the run here when another rank has failed or died
        for action in actions:  # outside the lock: they log, and logging takes locks
            action()
        return more

    def _next(self, signum: int) -> Callable[[], None]:
        """What a signal does now (module docstring); called with the lock held."""
        name = signal.Signals(signum).name
        now = time.monotonic()
        if self._done:
            return lambda: self._exit(exit_code(self.signum), None)
        if self._since is None and self.training:
            self.signum, self._since = signum, now
            again = "Ctrl-C" if signum == signal.SIGINT else "signal"
            return lambda: self._log(
                logging.INFO,
                f"{name}: finishing this step, then saving a checkpoint (a second {again} "
                "aborts at once)",
            )
        if self._since is not None and now - self._since < self.same_request_s:
            self.signum = self.signum or signum
            return lambda: None
        when = "" if self._since is not None else " (not training: nothing to finish)"
        return lambda: self._exit(exit_code(signum), f"{name}: aborted at once{when}")

    def _log(self, level: int, message: str) -> None:
        logger.log(level if self.is_main else logging.INFO, "%s", message)

    def _exit(self, code: int, message: str | None) -> None:
        if message is not None:
            with contextlib.suppress(OSError):  # a log file that fails: leave all the same
                self._log(
                    logging.ERROR,
                    f"{message}, exit code {code}; "
                    f"{self.checkpoint_note()}. Resume with:\n  "
                    f"{self.resume}",
                )
        for handler in logging.getLogger().handlers:
            with contextlib.suppress(Exception):  # exiting anyway
                handler.flush()
        os._exit(code)

    def checkpoint_note(self) -> str:
        """'the last complete checkpoint is DIR/TAG', or 'no complete checkpoint yet'."""
        from .checkpoint import resolve

        try:
            directory, tag = resolve(self.output_dir)
        except (OSError, ValueError):
            return "no complete checkpoint yet"
        return f"the last complete checkpoint is {directory}/{tag}"
