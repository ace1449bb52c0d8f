"""Beam's DaskRunner on a Dask cluster started as operators start one: ``dask scheduler``
and two ``dask worker --nworkers 1 --nthreads 1 --memory-limit ...`` processes
(``tests/dask_cluster.py``), the build submitted with ``--dask_client_address``.
The workers are separate processes: the DoFns and the DaskRunner fix reach them only
through the package (here PYTHONPATH), as on real machines.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.dask_cluster import DASK_RUNNER, DaskCluster, worker_env

from .test_build import BASE, digest, make_corpus

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(tmp_path):
    """A fresh cluster per test (one test kills a worker); stopped however the test ends."""
    pytest.importorskip(
        "distributed", reason="Beam's DaskRunner needs the [dask] extra (distributed)"
    )
    cluster = DaskCluster(tmp_path / "dask-cluster", workers=2, memory_limit="2GiB")
    try:
        yield cluster.start()
    finally:
        cluster.close()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def direct(corpus, tmp_path_factory):
    """The DirectRunner's shards, the reference for every Dask build."""
    out = tmp_path_factory.mktemp("direct") / "shards"
    done = build(corpus, out, [])
    assert done.returncode == 0, done.stderr
    return out


def build(corpus: str, out: Path, runner_args: list[str], *extra: str, background: bool = False):
    """``python -m pipeline build`` as a user runs it; stderr holds our console lines."""
    cmd = [
        sys.executable,
        "-m",
        "pipeline",
        "build",
        "--input",
        corpus,
        "--output",
        str(out),
        *BASE,
        *extra,
        *runner_args,
    ]
    env = {**worker_env(), "PYTHONHASHSEED": "123"}
    if background:
        return subprocess.Popen(
            cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


def on(cluster: DaskCluster) -> list[str]:
    return [f"--runner={DASK_RUNNER}", f"--dask_client_address={cluster.address}"]


def test_a_cli_cluster_gives_the_direct_runners_bytes(cluster, corpus, direct, tmp_path):
    from distributed import Client, get_task_stream

    # Two partitions (the 3 files in 2 bundles): both workers get work.
    with Client(cluster.address, timeout=30) as client:
        with get_task_stream(client) as tasks:
            done = build(corpus, tmp_path / "dask", on(cluster), "--dask_npartitions=2")
        workers = set(client.scheduler_info()["workers"])
    assert done.returncode == 0, done.stderr + (tmp_path / "dask.build.log").read_text()[-3000:]
    assert digest(tmp_path / "dask") == digest(direct)
    assert "installing the DaskRunner fixes" in done.stderr
    # The bundles ran in the two worker processes, not in the submitting one.
    assert len(workers) == 2 and {task["worker"] for task in tasks.data} == workers


def test_killing_a_worker_mid_build(cluster, tmp_path):
    """SIGKILL one worker (its nanny too: the machine is gone) while it runs the build's
    tasks. Dask reschedules its tasks on the other worker: the build ends with exit 0 and
    the same bytes as an undisturbed build, no half-written file left behind."""
    from distributed import Client

    corpus = make_corpus(tmp_path / "corpus", n_docs=1500, n_files=4)
    reference = tmp_path / "reference"
    assert build(corpus, reference, []).returncode == 0
    with Client(cluster.address, timeout=30) as client:
        process = build(
            corpus, tmp_path / "dask", on(cluster), "--dask_npartitions=4", background=True
        )
        victim = wait_for_a_busy_worker(client, process)
        index = worker_index(cluster, client, victim)
        cluster.kill_worker(index)
        _, stderr = process.communicate(timeout=600)
        alive = len(client.scheduler_info()["workers"])
    assert alive == 1
    assert process.returncode == 0, stderr
    assert digest(tmp_path / "dask") == digest(reference)  # hidden .tmp files included


def wait_for_a_busy_worker(client, process: subprocess.Popen) -> str:
    """The address of the first worker seen running one of the build's tasks."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        assert process.poll() is None, "the build ended before a worker was busy"
        busy = [worker for worker, tasks in client.processing().items() if tasks]
        if busy:
            return busy[0]
        time.sleep(0.05)
    raise AssertionError("no worker ran a task")


def worker_index(cluster: DaskCluster, client, address: str) -> int:
    """Which ``dask worker`` process (nanny) holds the worker at ``address``."""
    import psutil

    pid = client.run(os.getpid, workers=[address])[address]
    for i, nanny in enumerate(cluster.workers):
        if pid in {c.pid for c in psutil.Process(nanny.pid).children(recursive=True)}:
            return i
    raise AssertionError(f"no dask worker process holds pid {pid}")
