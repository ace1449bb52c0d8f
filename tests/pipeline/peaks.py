"""tracemalloc peaks of the build's steps, each measured in a fresh interpreter:
``python -m tests.pipeline.peaks CASE [ARG]`` prints the peak (and what it is compared
with). tracemalloc counts every thread's allocations, and a thread an earlier test left
running (a logger, a runner's worker) allocating during the measured call once made a
dupe-8 bucket's peak 2.9x a dupe-1 bucket's in a full-suite run (130 KB against 385 KB;
alone, 80 KB against 99 KB). Here only the main thread runs."""

import sys
import tempfile
import threading
import tracemalloc
from collections.abc import Callable
from pathlib import Path

from pipeline.beam import memory
from pipeline.beam.instance_steps import MakeInstances
from pipeline.beam.shard_steps import WriteShard
from pipeline.core.rows import RowBlock
from tests.pipeline.test_steps import VOCAB, config, made, tokenized_bucket


def traced_peak(call: Callable[[], object]) -> int:
    """tracemalloc's peak over ``call()``, with no other thread running."""
    assert threading.active_count() == 1, threading.enumerate()
    tracemalloc.start()
    try:
        call()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def held_rows(dupe_factor: int) -> int:
    """MakeInstances making one bucket's rows, each sent element dropped at once (as the
    runner takes it), rows sent after every pass; after one untraced run, since what a
    first call allocates once (lazy imports, caches) is not a pass's working memory."""
    memory.PENDING_ROW_BYTES = 1
    bucket = tokenized_bucket(n_docs=400, seed=3)
    make = MakeInstances(config(Path(tempfile.mkdtemp()), dupe_factor=dupe_factor), 2)

    def run():
        for _ in make.process((0, [bucket]), VOCAB, len(bucket.doc_ids)):
            pass

    run()
    return traced_peak(run)


def write_group() -> tuple[int, int, int]:
    """WriteShard writing a group of ~47,000 rows in 8 key ranges: (peak, the rows'
    bytes, rows written)."""
    tmp = Path(tempfile.mkdtemp())
    cfg = config(tmp, dupe_factor=8, max_seq_length=64)
    (tmp / "out").mkdir()
    blocks = [data for _, data in made(MakeInstances(cfg, 1), [tokenized_bucket(4000, seed=1)])]
    row_bytes = sum(RowBlock.from_bytes(b).nbytes for b in blocks)
    memory.RANGE_BYTES = -(-sum(map(len, blocks)) // 8)
    written = []
    peak = traced_peak(lambda: written.extend(WriteShard(cfg, 16).process((0, blocks), VOCAB)))
    return peak, row_bytes, written[0]["stats"]["rows"]


if __name__ == "__main__":
    case, *arg = sys.argv[1:]
    result = held_rows(int(arg[0])) if case == "held_rows" else write_group()
    print(result if isinstance(result, int) else " ".join(map(str, result)))
