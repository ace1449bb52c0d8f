"""What a build needs from its runner, decided before it starts: the local runner's memory,
and the Dask runner's partitions.

The local runner (the DirectRunner: its driver and ``--direct_num_workers`` worker
processes on one machine) holds every PCollection between its steps in its driver's memory,
so its peak grows with the corpus. :func:`local_peak_bytes` estimates it from the input's
size, with the coefficients of ``pipeline/beam/memory.py`` (fitted on
``bench/pipeline_memory.py``'s measurements); :func:`check_local_memory` stops a build that would not fit before it
starts, naming the estimate, what the machine has, and the Dask command that would run it
in bounded memory. ``--force`` builds anyway.
"""

from __future__ import annotations

import os

from pipeline.beam import memory
from pipeline.beam.config import BuildConfig, is_local_runner
from pipeline.core.sources import is_compressed

DASK_COMMAND = (
    "dask scheduler --port 8786 & dask worker tcp://127.0.0.1:8786 --nworkers {cores} "
    "--nthreads 1 --memory-limit {limit} &  python -m pipeline build ... "
    "--runner=apache_beam.runners.dask.dask_runner.DaskRunner "
    "--dask_client_address=tcp://127.0.0.1:8786  (deploy/beam/README.md, 'Dask')"
)


def text_bytes(files: list[tuple[str, int]]) -> int:
    """The input's size as text: a compressed file counts ``memory.COMPRESSION_RATIO``
    times its size."""
    return int(sum(n * (memory.COMPRESSION_RATIO if is_compressed(p) else 1) for p, n in files))


def local_peak_bytes(input_bytes: int, workers: int, learn_vocab: bool) -> int:
    """The local runner's estimated peak memory, all its processes together, for
    ``input_bytes`` of text on ``workers`` worker processes (0: in the driver's process).

    ``local_peak_bytes(10**9, 2, False)`` -> ``4_050_000_000``: 3 processes of 0.35 GB, and
    3 bytes per input byte (the model and its fit: ``pipeline/beam/memory.py``).
    """
    per_input = memory.DRIVER_PER_INPUT + memory.WORKERS_PER_INPUT
    per_input += memory.LEARNING_PER_INPUT if learn_vocab else 0
    return int(memory.PROCESS_BYTES * (1 + workers) + per_input * input_bytes)


def available_bytes() -> int | None:
    """Memory the machine can give a new job now (Linux's MemAvailable), or None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class MemoryCheckError(ValueError):
    """The local runner would likely run out of memory (exit 2; --force overrides)."""


def check_local_memory(
    config: BuildConfig,
    files: list[tuple[str, int]],
    runner: str | None,
    workers: int,
    available: int | None = None,
) -> int | None:
    """Refuse a local build whose estimated peak exceeds ``memory.USABLE_SHARE`` of the memory
    available; returns the estimate (None on other runners or when nothing is known).

    Raises:
        MemoryCheckError: names the estimate, the memory available and the Dask command.
    """
    if not is_local_runner(runner):
        return None
    available = available_bytes() if available is None else available
    text = text_bytes(files)
    estimate = local_peak_bytes(text, workers, learn_vocab=config.vocab_file is None)
    if available is None or config.force or estimate <= memory.USABLE_SHARE * available:
        return estimate
    cores = os.cpu_count() or 1
    gb = memory.GB
    limit = f"{max(2, int(6 * text / gb / cores) + 2)}GiB"
    per_input = (estimate - memory.PROCESS_BYTES * (1 + workers)) / text
    raise MemoryCheckError(
        f"the local runner would need about {estimate / gb:.1f} GB for {text / 1e6:,.1f} MB of "
        f"input ({memory.PROCESS_BYTES / gb:.2f} GB a process + about {per_input:.0f}x the "
        f"input), and {available / gb:.1f} GB are available: build on Dask, whose "
        f"workers spill to disk: {DASK_COMMAND.format(cores=cores, limit=limit)}; or pass "
        "--force to try anyway"
    )


def dask_partitions(
    beam_args: list[str],
    runner: str | None,
    ranges: int,
    input_bytes: int = 0,
    shuffle_bytes: int | None = None,
) -> list[str]:
    """The Dask partition options a job on the DaskRunner does not set itself.

    ``--dask_npartitions``, unless either partition option is given: one per
    ``memory.DASK_PARTITION_BYTES`` of input, and at most one per input range, so each task
    holds a few MB of documents, not a 128th of the corpus (Beam's default cuts the list of
    inputs into partitions of 128), while the task count stays low: every partition adds
    tasks to each GroupByKey shuffle (Dask's task shuffle), and their state costs the
    workers and the scheduler memory whatever the data.

    ``--dask_shuffle_partitions`` (pipeline/beam/dask_compat.py, fix 4), with
    ``shuffle_bytes`` and unless given: one per ``shuffle_bytes`` of input, for a job whose
    shuffles carry at most about its input's bytes (curate's).

    ``dask_partitions([], DASK, 480, 500 * 10**6)`` -> ``["--dask_npartitions=60"]``;
    ``dask_partitions([], DASK, 480, 500 * 10**6, 64 << 20)`` -> that and
    ``"--dask_shuffle_partitions=8"``.

    Raises:
        ValueError: a given ``--dask_shuffle_partitions`` below 1.
    """
    if not runner or runner.rsplit(".", 1)[-1] != "DaskRunner":
        return []
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipeline.beam.dask_compat import shuffle_partitions

    def given(*names: str) -> bool:
        return any(a.startswith(names) for a in beam_args)

    out = []
    if not given("--dask_npartitions", "--dask_partition_size"):
        by_size = -(-input_bytes // memory.DASK_PARTITION_BYTES) if input_bytes else ranges
        out.append(f"--dask_npartitions={max(1, min(ranges, by_size))}")
    if given("--dask_shuffle_partitions"):
        shuffle_partitions(PipelineOptions(beam_args))  # raises on a bad value
    elif shuffle_bytes and input_bytes:
        out.append(f"--dask_shuffle_partitions={-(-input_bytes // shuffle_bytes)}")
    return out
