"""A Dask cluster on this machine, started with Dask's own CLI as an operator starts one.

``deploy/beam/dask.sh`` gives the commands for real machines: ``dask scheduler`` on one,
``dask worker SCHEDULER --nworkers 1 --nthreads 1 --memory-limit ...`` on each of the
others. This module runs exactly those commands as local processes, for the tests
(``tests/pipeline/test_dask_cluster.py``) and ``bench/pipeline_memory.py``::

    with DaskCluster(tmp_dir, workers=2, memory_limit="2GiB") as cluster:
        main(["build", ..., "--runner=apache_beam.runners.dask.dask_runner.DaskRunner",
              f"--dask_client_address={cluster.address}"])

The scheduler listens on a port the system picks (``--port 0``) and writes its address
to a scheduler file, so two clusters never race for a port. Workers import the
pipeline's DoFns and the DaskRunner fix (``pipeline/beam/dask_compat.py``) by reference, so
they get ``PYTHONPATH`` with this checkout first (as a real worker gets the package
installed). Each process leads its own process group; :meth:`DaskCluster.close`
stops the groups (SIGTERM, then SIGKILL), and the scheduler's idle timeout and the
workers' death timeout end them if the process that started them dies first.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the checkout: workers import `pipeline` from it
DASK_RUNNER = "apache_beam.runners.dask.dask_runner.DaskRunner"
# Safety nets if whoever started the cluster dies without closing it: an idle scheduler
# exits after an hour, a worker 60 s after losing its scheduler.
IDLE_TIMEOUT = "3600s"
DEATH_TIMEOUT = "60s"


def dask_executable() -> str:
    """The ``dask`` command beside this Python, else the first on PATH.

    Raises:
        FileNotFoundError: no ``dask`` command (pip install '.[dask]').
    """
    beside = Path(sys.executable).parent / "dask"
    found = str(beside) if beside.exists() else shutil.which("dask")
    if not found:
        raise FileNotFoundError("no `dask` command: pip install '.[dask]' (distributed)")
    return found


def scheduler_command(scheduler_file: Path) -> list[str]:
    return [
        dask_executable(),
        "scheduler",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--no-dashboard",
        "--scheduler-file",
        str(scheduler_file),
        "--idle-timeout",
        IDLE_TIMEOUT,
    ]


def worker_command(address: str, memory_limit: str, threads: int, directory: Path) -> list[str]:
    """One worker process (``--nworkers 1``) under a nanny that restarts it if it dies."""
    return [
        dask_executable(),
        "worker",
        address,
        "--nworkers",
        "1",
        "--nthreads",
        str(threads),
        "--memory-limit",
        memory_limit,
        "--no-dashboard",
        "--local-directory",
        str(directory),
        "--death-timeout",
        DEATH_TIMEOUT,
    ]


def worker_env() -> dict[str, str]:
    """The environment of the cluster's processes: this Python's ``bin`` first on PATH and
    this checkout first on PYTHONPATH."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


class DaskCluster:
    """``dask scheduler`` and ``workers`` x ``dask worker`` as local processes.

    Attributes (after :meth:`start`):
        address: the scheduler's ``tcp://127.0.0.1:PORT``, for ``--dask_client_address``.
        scheduler: its Popen; ``workers``: one Popen per ``dask worker`` (the nanny,
            whose child process runs the tasks). Logs: ``directory/*.log``.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        workers: int = 2,
        memory_limit: str = "2GiB",
        threads: int = 1,
    ):
        self.directory = Path(directory)
        self.num_workers, self.memory_limit, self.threads = workers, memory_limit, threads
        self.address = ""
        self.scheduler: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen] = []

    def _spawn(self, command: list[str], name: str) -> subprocess.Popen:
        log = open(self.directory / f"{name}.log", "ab")  # noqa: SIM115 (the child keeps it)
        with log:
            return subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=worker_env(),
                start_new_session=True,
            )

    def log(self, name: str) -> str:
        path = self.directory / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self, timeout: float = 120) -> DaskCluster:
        """Start the scheduler, then the workers; return once every worker has registered.

        Raises:
            RuntimeError: a process exited, or ``timeout`` seconds passed (with its log).
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        scheduler_file = self.directory / "scheduler.json"
        scheduler_file.unlink(missing_ok=True)
        self.scheduler = self._spawn(scheduler_command(scheduler_file), "scheduler")
        deadline = time.monotonic() + timeout
        self._wait(
            lambda: scheduler_file.exists() and scheduler_file.stat().st_size,
            self.scheduler,
            "scheduler",
            deadline,
        )
        self.address = json.loads(scheduler_file.read_text())["address"]
        for i in range(self.num_workers):
            command = worker_command(
                self.address, self.memory_limit, self.threads, self.directory / f"worker-{i}"
            )
            self.workers.append(self._spawn(command, f"worker-{i}"))
        for i, worker in enumerate(self.workers):
            name = f"worker-{i}"
            self._wait(lambda name=name: "Registered to:" in self.log(name), worker, name, deadline)
        return self

    def _wait(self, ready, process: subprocess.Popen, name: str, deadline: float) -> None:
        while not ready():
            if process.poll() is not None or time.monotonic() > deadline:
                self.close()
                state = "exited" if process.returncode is not None else "is not ready"
                raise RuntimeError(f"dask {name} {state}; its log:\n{self.log(name)[-3000:]}")
            time.sleep(0.2)

    def kill_worker(self, index: int, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to worker ``index``'s whole process group (nanny and worker): the
        machine is lost, not just the process its nanny would restart."""
        os.killpg(self.workers[index].pid, sig)
        self.workers[index].wait(timeout=30)

    def close(self, timeout: float = 20) -> None:
        """Stop the workers, then the scheduler: SIGTERM each process group, SIGKILL what is
        left after ``timeout`` seconds. Safe to call twice."""
        for processes in (self.workers, [self.scheduler] if self.scheduler else []):
            for process in processes:
                _signal_group(process, signal.SIGTERM)
            for process in processes:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=timeout)
                _signal_group(process, signal.SIGKILL)  # the group's other processes too
                process.wait()

    def __enter__(self) -> DaskCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group has already gone
        os.killpg(process.pid, sig)  # the process leads its group (start_new_session)
