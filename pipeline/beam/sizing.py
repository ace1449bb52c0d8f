"""What a build needs from its runner, decided before it starts: the local runner's memory,
and the Dask runner's partitions.

The local runner (the DirectRunner: its driver and ``--direct_num_workers`` worker
processes on one machine) holds every PCollection between its steps in its driver's memory,
so its peak grows with the corpus. :func:`local_peak_bytes` estimates it from the input's
size, fitted on ``bench/pipeline_memory.py`` measurements (deploy/beam/README.md, "Memory
and parallelism"); :func:`check_local_memory` stops a build that would not fit before it
starts, naming the estimate, what the machine has, and the Dask command that would run it
in bounded memory. ``--force`` builds anyway.
"""

from __future__ import annotations

import os

from pipeline.beam.config import BuildConfig, is_local_runner
from pipeline.core.sources import is_compressed

GB = 10**9
# Fitted on bench/pipeline_memory.py (deploy/beam/README.md, "Memory and parallelism"):
# English prose, --max_seq_length 128, dupe factor 5, 2 worker processes; the peak of all
# processes together was 1.68 GB at 200 MB and 3.04 GB at 1 GB (1.7 bytes per input byte
# from 200 MB to 1 GB; the driver alone 0.62 and 2.28 GB), and learning the vocab added
# 0.12 GB at 50 MB (the documents are held until the vocab is learned). So: every process
# starts at PROCESS_BYTES (Python, Beam, pyarrow, the tokenizer); the driver (the
# tokenized documents it holds between steps) and the workers (their share of a step's
# input) add DRIVER_PER_INPUT and WORKERS_PER_INPUT bytes per input byte, 3.0 in all
# (1.65 GB at 200 MB, 2% under the measured peak; 4.05 GB at 1 GB, 33% over it; the
# check keeps the estimate under USABLE_SHARE of the memory), and LEARNING_PER_INPUT more
# when the build learns its vocab (rounded up from one point, measured before the last
# fit, which lowered the rest from 7.5).
PROCESS_BYTES = int(0.35 * GB)
DRIVER_PER_INPUT = 2.0
WORKERS_PER_INPUT = 1.0
LEARNING_PER_INPUT = 3.0
# A compressed input file is assumed to hold this many times its size in text.
COMPRESSION_RATIO = 3.0
# Input bytes per Dask partition (pipeline.beam.sizing.dask_partitions): 500 MB in 64
# partitions (7.8 MB each) ran on 2 GiB workers where 480 did not.
DASK_PARTITION_BYTES = 8 << 20
# Headroom: the estimate is kept under this share of the memory available.
USABLE_SHARE = 0.8

DASK_COMMAND = (
    "dask scheduler --port 8786 & dask worker tcp://127.0.0.1:8786 --nworkers {cores} "
    "--nthreads 1 --memory-limit {limit} &  python -m pipeline build ... "
    "--runner=apache_beam.runners.dask.dask_runner.DaskRunner "
    "--dask_client_address=tcp://127.0.0.1:8786  (deploy/beam/README.md, 'Dask')"
)


def text_bytes(files: list[tuple[str, int]]) -> int:
    """The input's size as text: a compressed file counts COMPRESSION_RATIO times its size."""
    return int(sum(n * (COMPRESSION_RATIO if is_compressed(p) else 1) for p, n in files))


def local_peak_bytes(input_bytes: int, workers: int, learn_vocab: bool) -> int:
    """The local runner's estimated peak memory, all its processes together, for
    ``input_bytes`` of text on ``workers`` worker processes (0: in the driver's process)."""
    per_input = DRIVER_PER_INPUT + WORKERS_PER_INPUT + (LEARNING_PER_INPUT if learn_vocab else 0)
    return int(PROCESS_BYTES * (1 + workers) + per_input * input_bytes)


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


def check_local_memory(config: BuildConfig, files: list[tuple[str, int]], runner: str | None,
                       workers: int, available: int | None = None) -> int | None:  # fmt: skip
    """Refuse a local build whose estimated peak exceeds USABLE_SHARE of the memory
    available; returns the estimate (None on other runners or when nothing is known).

    Raises:
        MemoryCheckError: names the estimate, the memory available and the Dask command.
    """
    if not is_local_runner(runner):
        return None
    available = available_bytes() if available is None else available
    text = text_bytes(files)
    estimate = local_peak_bytes(text, workers, learn_vocab=config.vocab_file is None)
    if available is None or config.force or estimate <= USABLE_SHARE * available:
        return estimate
    cores = os.cpu_count() or 1
    limit = f"{max(2, int(6 * text / GB / cores) + 2)}GiB"
    raise MemoryCheckError(
        f"the local runner would need about {estimate / GB:.1f} GB for {text / 1e6:,.1f} MB of "
        f"input ({PROCESS_BYTES / GB:.2f} GB a process + about "
        f"{(estimate - PROCESS_BYTES * (1 + workers)) / text:.0f}x the input), and {available / GB:.1f} GB are available: build on Dask, whose "
        f"workers spill to disk: {DASK_COMMAND.format(cores=cores, limit=limit)}; or pass "
        "--force to try anyway"
    )


def dask_partitions(
    beam_args: list[str], runner: str | None, ranges: int, input_bytes: int = 0
) -> list[str]:
    """``--dask_npartitions`` for a Dask build that sets neither partition option: one per
    ``DASK_PARTITION_BYTES`` of input, and at most one per input range, so each task holds
    a few MB of documents, not a 128th of the corpus (Beam's default cuts the list of
    inputs into partitions of 128), while the task count stays low: at one partition per
    1 MB range a 500 MB build's GroupByKey shuffles (Dask's task shuffle) made ~130,000
    tasks, whose state held a worker at 1.4 GB with no data in memory and the scheduler at
    1.55 GB. ``dask_partitions([], DASK, 480, 500 * 10**6)`` -> ``["--dask_npartitions=60"]``.
    """
    if not runner or runner.rsplit(".", 1)[-1] != "DaskRunner":
        return []
    if any(a.startswith(("--dask_npartitions", "--dask_partition_size")) for a in beam_args):
        return []
    by_size = -(-input_bytes // DASK_PARTITION_BYTES) if input_bytes else ranges
    return [f"--dask_npartitions={max(1, min(ranges, by_size))}"]
