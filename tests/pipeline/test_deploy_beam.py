"""deploy/beam/: the launch scripts pass the worker setup deploy/beam/README.md describes.

Each script runs with a stand-in ``python`` on PATH that prints the arguments it got.
"""

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BEAM = ROOT / "deploy" / "beam"


def launch(script: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """Run ``deploy/beam/SCRIPT`` with ``env``; its stdout is the python command line."""
    fake = tmp_path / "bin" / "python"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    fake.chmod(0o755)
    base = {
        "PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}",
        "INPUT": "in/*.txt",
        "OUTPUT": "out",
        "SPARK_MASTER": "spark://m:7077",
        "FLINK_MASTER": "m:8081",
    }
    return subprocess.run(
        ["bash", str(BEAM / script)],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.mark.parametrize("script", ["spark.sh", "flink.sh"])
def test_portable_runners_run_workers_in_the_package_image(script, tmp_path):
    done = launch(script, tmp_path, SDK_IMAGE="registry/worker:1")
    assert done.returncode == 0, done.stderr
    args = done.stdout.splitlines()
    assert "--environment_type=DOCKER" in args  # Beam's default, said so by the README
    assert "--environment_config=registry/worker:1" in args

    missing = launch(script, tmp_path)  # no image: refused, naming what to build
    assert missing.returncode != 0 and missing.stdout == ""
    assert "SDK_IMAGE" in missing.stderr and "deploy/beam/Dockerfile" in missing.stderr

    local = launch(script, tmp_path, ENVIRONMENT_TYPE="LOOPBACK")
    assert local.returncode == 0, local.stderr
    assert "--environment_type=LOOPBACK" in local.stdout
    assert "--environment_config" not in local.stdout

    bad = launch(script, tmp_path, ENVIRONMENT_TYPE="docker")
    assert bad.returncode == 2 and "must be DOCKER, LOOPBACK" in bad.stderr


def test_dataflow_workers_install_the_package_through_setup_py(tmp_path):
    done = launch("dataflow.sh", tmp_path, PROJECT="p", REGION="r", BUCKET="gs://b")
    assert done.returncode == 0, done.stderr
    assert f"--setup_file={ROOT / 'setup.py'}" in done.stdout.splitlines()


def test_worker_image_installs_the_package_without_extras():
    dockerfile = (BEAM / "Dockerfile").read_text()
    assert "FROM apache/beam_python${PYTHON}_sdk:${BEAM}" in dockerfile
    installs = [line for line in dockerfile.splitlines() if "pip install" in line]
    assert installs == ["RUN pip install --no-cache-dir /src && rm -rf /src"]  # no [train]


def test_dask_script_passes_the_cluster_and_its_partitions(tmp_path):
    done = launch("dask.sh", tmp_path, DASK_ADDRESS="tcp://sched:8786", PARTITIONS="64")
    assert done.returncode == 0, done.stderr
    args = done.stdout.splitlines()
    assert "--runner=apache_beam.runners.dask.dask_runner.DaskRunner" in args
    assert "--dask_client_address=tcp://sched:8786" in args and "--dask_npartitions=64" in args
    local = launch("dask.sh", tmp_path)  # no address: Beam's own local cluster
    assert local.returncode == 0, local.stderr
    assert not [a for a in local.stdout.splitlines() if a.startswith("--dask_")]


def test_dask_script_shows_the_worker_flags_the_tests_run():
    """The commands dask.sh gives for real machines start workers as the cluster tests do."""
    pytest.importorskip("distributed", reason="the `dask` command comes with the [dask] extra")
    from tests.dask_cluster import worker_command

    shown = (BEAM / "dask.sh").read_text()
    tested = " ".join(worker_command("tcp://s:8786", "2GiB", 1, Path("d")))
    for flag in ("--nworkers 1", "--nthreads 1", "--memory-limit 2GiB", "--local-directory d"):
        assert flag in tested
        assert flag.split()[0] in shown
    assert "--nthreads 1" in shown
    assert "dask scheduler" in shown and "dask worker tcp://SCHEDULER:8786" in shown
