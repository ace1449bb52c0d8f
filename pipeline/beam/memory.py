"""The build's memory model: every bound a step keeps its memory under, and the fitted
coefficients of the local runner's memory check, each with what it bounds and why.

A build's memory grows with the corpus only where a runner holds data between steps (the
DirectRunner's driver, Dask's shuffles); every step itself works on a bounded piece of
it. The bounds below set those pieces; none of them changes a byte of the output (the
tests that change them compare shards). Where a number was fitted or chosen on a
measurement, the comment names the script or test that measures it;
``bench/pipeline_memory.py`` measures a whole build's peak per process and runner.

Used by ``instance_steps.py`` (buckets and NSP rows), ``shard_steps.py`` (shard writes),
``sizing.py`` (the memory check and Dask's partitions) and curation's steps (``curation_steps.py``,
``minhash_steps.py``, ``spool.py``, ``curate.py``, ``curate_output.py``). Steps read these as
``memory.NAME`` when they run, so a test can lower one with ``monkeypatch``.

``TARGET_SHARD_BYTES`` is not here: it is the default size of the output files, chosen
for the trainer's reads and kept beside ``--num_shards`` in ``config.py``. It bounds no
memory: a shard of any size is written one ``RANGE_BYTES`` range at a time.
"""

from __future__ import annotations

GB = 10**9

# ----------------------------------------------------------------------- bucketing

# Bytes of token ids in one bucket group, the key of the bucketing shuffle. Keyed by
# bucket, the shuffle carried one element per bucket and AssignBuckets bundle: both grow
# with the corpus, so the elements grew with its square, each ~1 KB of Python objects
# around its ids. Keyed by groups of this many bytes, the element count grows with the
# corpus only, and MakeInstances holds one group's ids at a time.
# (tests/pipeline/test_steps.py checks the group count at 1 GB of ids.)
GROUP_BYTES = 8 << 20

# At least this many bucket groups (or one per bucket, if fewer), so that MakeInstances
# spreads over a local runner's workers on a small corpus, whose ids fill few groups.
MIN_GROUPS = 32

# Token ids (and their lengths) AssignBuckets holds before splitting them into bucket
# groups. Split batch by batch, a batch of 512 documents lands in up to 512 buckets, so
# the shuffle saw about one element per document; held to this size (or the bundle's
# end), a bundle gives about one element per group. Large enough to gather many
# batches, small next to a worker's memory.
HELD_BYTES = 32 << 20

# ----------------------------------------------------------------------- NSP rows

# Rows MakeInstances holds before sending them on (grouped by write group), and at the
# end of each bucket group. Big enough that a normal bucket (1,000 Wikipedia articles at
# dupe factor 10 make a few hundred MB of rows) is sent in a few elements per write
# group; bounded, so the dupe factor multiplies the work, never the memory
# (tests/pipeline/test_steps.py, test_a_bucket_holds_one_pass_of_rows_not_every_dupe_pass).
PENDING_ROW_BYTES = 64 << 20

# ----------------------------------------------------------------------- shard writes

# Shards are written in this many parallel pieces in all: with fewer shards, each shard
# is written in key ranges by parallel workers and joined at the end, so a small build
# does not write on one worker. It sets the parallelism of the writes, and so how much of
# a shard one writer holds.
PARALLEL_WRITES = 16

# A write group is sorted and encoded in key ranges of about this many bytes of rows (as
# sent, compressed), one range at a time. Sorting and encoding a whole group at once held
# several times its rows' bytes, enough to get a 2 GiB Dask worker restarted on
# default-sized shards; a range at a time holds about one range
# (tests/pipeline/test_steps.py, test_a_write_group_holds_one_range_at_a_time).
RANGE_BYTES = 16 << 20

# Rows held back from a range's written record batches and carried into the next range.
# Not a memory bound as such, but the reason writing in ranges keeps the bytes: pyarrow
# pads a sliced buffer to 64 bytes, and a row puts at least one byte in every buffer,
# so 64 rows after a batch make its message what it is in the whole shard.
HELD_ROWS = 64

# ----------------------------------------------------------------------- the local runner

# The DirectRunner holds every PCollection between its steps in its driver's memory, so
# its peak grows with the input. sizing.local_peak_bytes estimates it as
#     PROCESS_BYTES * (1 + workers) + per_input * input bytes,
#     per_input = DRIVER_PER_INPUT + WORKERS_PER_INPUT (+ LEARNING_PER_INPUT).
# Fitted on bench/pipeline_memory.py's peaks of all processes together (English prose,
# --max_seq_length 128, --dupe_factor 5, --direct_num_workers=2 multi_processing) at
# 200 MB and 1 GB of input; the table is in deploy/beam/README.md ("Memory and
# parallelism"). The slopes are rounded up from the growth between the two points, so the
# estimate is a little under the smaller build's peak and well over the larger's: the
# check errs towards refusing, and --force overrides it.
#
# What every process holds before any data: Python, Beam, pyarrow, the tokenizer.
PROCESS_BYTES = int(0.35 * GB)
# The driver: the tokenized documents it holds between steps, per input byte.
DRIVER_PER_INPUT = 2.0
# The worker processes: their share of a step's input, per input byte.
WORKERS_PER_INPUT = 1.0
# Learning the vocab: the read documents are held until the vocab is learned. Rounded up
# from one 50 MB point of bench/pipeline_memory.py --learn_vocab.
LEARNING_PER_INPUT = 3.0
# A compressed input file is assumed to hold this many times its size in text (the
# ratio of English text under gzip, rounded down: the estimate should not miss a file).
COMPRESSION_RATIO = 3.0
# Headroom: the estimate is kept under this share of the memory available, for the rest
# of the machine and the estimate's own error.
USABLE_SHARE = 0.8

# ----------------------------------------------------------------------- Dask

# Input bytes per Dask partition (sizing.dask_partitions). A task holds its partition's
# documents and tokens, so partitions must be small; but each partition adds tasks to
# every shuffle, whose state costs the workers and the scheduler memory of its own. Chosen
# with bench/pipeline_memory.py --runners dask at 500 MB on 2 GiB workers, where this
# size finished and one partition per 1 MB range did not.
DASK_PARTITION_BYTES = 8 << 20
# Input bytes per partition of a curate's shuffles on Dask (--dask_shuffle_partitions;
# sizing.dask_partitions). Its shuffles carry ids, or each kept text once, so a partition
# holds at most about this much text; fewer partitions make far fewer shuffle tasks (Dask's
# task shuffle: ~n * sqrt(n) for n partitions), whose state the scheduler and the workers
# keep until the job ends. Chosen with bench/pipeline_memory.py --command curate at 200 MB
# and 1 GB on 2 GiB workers.
CURATE_SHUFFLE_BYTES = 64 << 20


# ----------------------------------------------------------------------- curation

# Content ids a bundle of DropBundleCopies remembers (curation_steps.py): exact copies in
# one bundle are dropped before the shuffle; past this many the set starts over (the copies
# it then misses are KeepDistinct's, so the output is the same). About 10 MB of strings.
BUNDLE_IDS = 100_000
# Records a bundle packs before it emits them (minhash_steps.BandKeys' band keys,
# BatchPositions' positions, curate.ReadTexts' origins): one Beam element per record was
# most of a Dask worker's memory at a 1 GB curate's peak (docs/results.md); packed, a
# record is a few dozen bytes, so a bundle holds about 7-20 MB of them.
PACK_RECORDS = 1 << 18
# Characters of text a bundle of spool.SpoolTexts holds before it writes them to its spool
# file (16 M characters: tens of MB of Python strings).
SPOOL_HELD_CHARS = 16 << 20
# Values of a key curate_output.CombineInBundle holds before folding them: the combiner
# lifting Beam's DaskRunner does not do, so that a key's group holds a few values a bundle.
FOLD_AT = 256


def estimate_rule() -> str:
    """The memory check's estimate in words, from the coefficients above, for ``--force``'s
    help: ``"0.35 GB a process + about 3x the input, 6x when learning the vocab"``."""
    per_input = DRIVER_PER_INPUT + WORKERS_PER_INPUT
    return (
        f"{PROCESS_BYTES / GB:.2f} GB a process + about {per_input:.0f}x the input, "
        f"{per_input + LEARNING_PER_INPUT:.0f}x when learning the vocab"
    )
