"""Beam steps that group documents into buckets and make masked NSP rows from them.

A document's bucket is a seeded hash of its id; buckets cross the shuffle in groups of
about ``memory.GROUP_BYTES`` of token ids; each bucket's documents are planned with Google's
NSP algorithm (``pipeline/core/nsp.py``), gathered and masked in a few vectorised calls,
and sent on grouped by where they will be written.
Part of ``python -m pipeline build`` (see ``pipeline/beam/build.py``).
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Iterator

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics
from apache_beam.pvalue import TaggedOutput
from apache_beam.transforms.window import GlobalWindows

from pipeline.beam import memory
from pipeline.beam.config import BuildConfig
from pipeline.beam.document_steps import NAMESPACE, TokenizedBatch, noted
from pipeline.beam.shard_steps import write_group
from pipeline.beam.spool import RowSpool
from pipeline.core.masking import MaskingConfig, MaskingVocab, mask_flat
from pipeline.core.nsp import (
    BucketLayout,
    NspConfig,
    SpecialIds,
    assemble_joins,
    assemble_rows,
    plan_document,
)
from pipeline.core.packing import assemble_packed_rows, continues_word, plan_packed_rows
from pipeline.core.rng import derive_seed_grid, derive_seeds, keys_from_bases
from pipeline.core.rows import RowBlock
from pipeline.core.sources import number_duplicates


def num_buckets(num_docs: int, bucket_size: int) -> int:
    """How many buckets ``num_docs`` documents make, so that each holds ``bucket_size``.

    Documents land in buckets by a seeded hash, so a bucket's size varies around
    the mean by about its square root. Aiming the mean six standard deviations
    above ``bucket_size`` makes a smaller bucket a ~1e-8 event per bucket at the
    default 1,000 (the manifest's ``stats.buckets`` records the smallest); one
    bucket holds all documents when there are too few for two.
    """
    margin = 6 * math.isqrt(bucket_size) + 6
    return max(1, num_docs // (bucket_size + margin))


def split_into_buckets(batch: TokenizedBatch, num_docs: int, config: BuildConfig):
    """TokenizedBatch -> (bucket, TokenizedBatch) per bucket its documents fall in,
    in bucket order.

    A document's bucket is a seeded hash of its id, so it is the same on every runner.
    """
    count = num_buckets(num_docs, config.bucket_size)
    yield from _split_by(batch, _buckets_of(batch, count, config))


def _buckets_of(batch: TokenizedBatch, count: int, config: BuildConfig) -> np.ndarray:
    hashes = derive_seeds((config.random_seed, "bucket"), batch.doc_ids)
    return np.array(hashes, dtype=np.uint64) % np.uint64(count)


def _split_by(batch: TokenizedBatch, labels: np.ndarray):
    order = np.argsort(labels, kind="stable")
    present, starts = np.unique(labels[order], return_index=True)
    for label, part in zip(present.tolist(), np.split(order, starts[1:]), strict=True):
        yield label, batch.take(part)


def num_groups(num_docs: int, num_tokens: int, itemsize: int, config: BuildConfig) -> int:
    """How many bucket groups: about ``memory.GROUP_BYTES`` of token ids each, at least
    ``memory.MIN_GROUPS``, at most one per bucket (why: ``pipeline/beam/memory.py``)."""
    buckets = num_buckets(num_docs, config.bucket_size)
    by_bytes = math.ceil(num_tokens * itemsize / memory.GROUP_BYTES)
    return max(1, min(buckets, max(memory.MIN_GROUPS, by_bytes)))


def split_into_groups(batch: TokenizedBatch, num_docs: int, num_tokens: int, config: BuildConfig):
    """TokenizedBatch -> (group, TokenizedBatch) per bucket group its documents fall in.

    Group g holds buckets ``[g * B / G, (g + 1) * B / G)`` of B buckets in G groups, so
    each bucket is whole in one group, which MakeInstances splits into its buckets.
    """
    buckets = num_buckets(num_docs, config.bucket_size)
    groups = num_groups(num_docs, num_tokens, batch.ids.itemsize, config)
    labels = _buckets_of(batch, buckets, config) * np.uint64(groups) // np.uint64(buckets)
    yield from _split_by(batch, labels)


# MakeInstances' tagged output: the documents of each bucket, for ``stats.buckets``.
BUCKET_SIZES = "bucket_sizes"


class SummariseBuckets(beam.CombineFn):
    """Documents per bucket -> the manifest's ``stats.buckets``: how many buckets, the
    fewest and the most documents in one. Constant memory however many buckets there
    are (a list of every bucket's size would grow with the corpus)."""

    def create_accumulator(self) -> tuple[int, int, int]:
        return 0, 2**63, 0  # count, min, max

    def add_input(self, acc: tuple[int, int, int], size: int) -> tuple[int, int, int]:
        return acc[0] + 1, min(acc[1], size), max(acc[2], size)

    def merge_accumulators(self, accs) -> tuple[int, int, int]:
        accs = list(accs)
        return sum(a[0] for a in accs), min(a[1] for a in accs), max(a[2] for a in accs)

    def extract_output(self, acc: tuple[int, int, int]) -> dict[str, int]:
        count, low, high = acc
        return {"count": count, "min_documents": low if count else 0, "max_documents": high}


def by_write_group(rows: RowBlock, num_shards: int) -> Iterator[tuple[int, RowBlock]]:
    """(write group, its rows) for the groups ``rows`` fall in: shard, then key range."""
    groups = write_group(rows.keys, num_shards)
    if groups.min() == groups.max():
        yield int(groups[0]), rows
        return
    order = np.argsort(groups, kind="stable")
    present, starts = np.unique(groups[order], return_index=True)
    for group, part in zip(present.tolist(), np.split(order, starts[1:]), strict=True):
        yield group, rows.take(part)


class AssignBuckets(beam.DoFn):
    """TokenizedBatch -> (bucket group, TokenizedBatch), a bundle's batches split together.

    Split one by one, a batch of 512 documents lands in up to 512 buckets, so at a
    bucket size of 1,000 a large corpus would cross the bucketing shuffle as about one
    element per document, each a tuple, a windowed value and five arrays: more Python
    objects than token ids. Held here until ``memory.HELD_BYTES`` of token ids or the
    bundle's end, a bundle's batches give one element per bucket group
    (:func:`split_into_groups`). The bytes do not change: MakeInstances orders a bucket's
    documents by id.
    """

    def __init__(self, config: BuildConfig):
        self._config = config
        self._held: list[TokenizedBatch] = []
        self._held_bytes = 0
        self._num_docs = self._num_tokens = 0

    def start_bundle(self) -> None:
        self._held, self._held_bytes = [], 0

    def process(self, batch: TokenizedBatch, num_docs: int, num_tokens: int) -> Iterator:
        self._num_docs, self._num_tokens = num_docs, num_tokens
        self._held.append(batch)
        self._held_bytes += batch.ids.nbytes + batch.lengths.nbytes + batch.counts.nbytes
        if self._held_bytes >= memory.HELD_BYTES:
            yield from self._split()

    def finish_bundle(self) -> Iterator:
        for element in self._split():
            yield GlobalWindows.windowed_value(element)

    def _split(self) -> Iterator:
        if not self._held:
            return
        batch = TokenizedBatch.concat(self._held)
        self._held, self._held_bytes = [], 0
        yield from split_into_groups(batch, self._num_docs, self._num_tokens, self._config)


class MakeInstances(beam.DoFn):
    """(bucket group, TokenizedBatches) -> (write group, RowBlock bytes): Google's NSP
    pairs, then static masks; tagged, each bucket's documents (``BUCKET_SIZES``) and the
    copies of documents found (``COUNTS``, :func:`noted`).

    A group is split into its buckets, made one after the other. Documents meet the
    others of their bucket in id order. Each document's NSP rng is seeded from (seed,
    doc id, dupe pass); each row gets a 64-bit key from (seed, doc id, dupe pass, index)
    that places it in a shard and seeds its masks. Instances are planned on segment
    lengths, then a whole dupe pass of the bucket is assembled and masked in a few
    vectorised calls.

    Memory: one group's token ids, one pass's working arrays, plus the rows made and not
    yet sent, which are sent (grouped by write group) whenever they reach
    ``memory.PENDING_ROW_BYTES``, and at the end of the group; so the dupe factor
    multiplies the work, never the memory. With a ``spool`` (:class:`RowSpool`), the rows
    go to a file of the bundle and only references to them go to the runner.
    """

    def __init__(self, config: BuildConfig, num_shards: int, spool: str | None = None):
        self._config = config
        self._num_shards = num_shards
        self._spool_dir = spool
        self._nsp = NspConfig(config.max_seq_length, config.short_seq_prob)
        self._masking = None
        if config.masked:
            self._masking = MaskingConfig(
                config.masked_lm_prob, config.max_predictions_per_seq, config.do_whole_word_mask
            )
        self._vocab = None
        self._spool: RowSpool | None = None
        self._pending: dict[int, list[RowBlock]] = {}  # write group -> rows not yet sent
        self._pending_bytes = 0
        self._instances = Metrics.counter(NAMESPACE, "instances")

    def start_bundle(self) -> None:
        self._spool = RowSpool(self._spool_dir) if self._spool_dir else None

    def finish_bundle(self) -> Iterator:
        if self._spool is not None:
            for element in self._spool.close():
                yield GlobalWindows.windowed_value(element)
            self._spool = None

    def process(self, element, vocab: list[str], num_docs: int) -> Iterator:
        _, batches = element
        if self._vocab is None:
            self._vocab = MaskingVocab.from_tokens(vocab)
            self._special = SpecialIds(self._vocab.cls_id, self._vocab.sep_id)
        group = TokenizedBatch.concat(list(batches))
        del batches
        self._pending, self._pending_bytes = {}, 0
        for _, bucket in split_into_buckets(group, num_docs, self._config):
            yield TaggedOutput(BUCKET_SIZES, len(bucket.doc_ids))
            if self._config.objective == "mlm":
                yield from self._packed_bucket(bucket)
            else:
                yield from self._bucket(bucket)
        yield from self._send(self._pending)
        self._pending = {}

    def _in_order(self, bucket: TokenizedBatch) -> Iterator:
        """The bucket's documents in id order, copies numbered (its last element), after
        the count of copies (a tagged output)."""
        order = sorted(range(len(bucket.doc_ids)), key=bucket.doc_ids.__getitem__)
        bucket = bucket.take(np.array(order, dtype=np.int64))
        # Copies of a document share its content id, and its bucket: number them here.
        ids = number_duplicates(bucket.doc_ids)
        yield from noted("duplicate_documents", sum(not i.endswith(":0") for i in ids))
        yield bucket._replace(doc_ids=ids)

    def _hold(self, rows: RowBlock) -> Iterator:
        """Keep ``rows`` until those held reach ``memory.PENDING_ROW_BYTES``, then send."""
        self._instances.inc(len(rows))
        for group, part in by_write_group(rows, self._num_shards):
            self._pending.setdefault(group, []).append(part)
        self._pending_bytes += rows.nbytes
        if self._pending_bytes >= memory.PENDING_ROW_BYTES:
            yield from self._send(self._pending)
            self._pending, self._pending_bytes = {}, 0

    def _packed_bucket(self, bucket: TokenizedBatch) -> Iterator:
        """MLM rows: the bucket's documents in id order, their sentences packed
        (pipeline/core/packing.py); each row's key from (seed, the id of the document it
        starts in, pass, its index among that document's rows); with static masks,
        ``dupe_factor`` passes of the same rows, each masked from its own keys."""
        *notes, bucket = self._in_order(bucket)
        yield from notes
        cross = self._config.mlm_packing == "full_sentences"
        capacity = self._config.max_seq_length - 2
        pieces, row_docs = plan_packed_rows(bucket.lengths, bucket.counts, capacity, cross)
        if not len(row_docs):
            return
        special = self._special
        flat, source, offsets = assemble_packed_rows(
            bucket.ids, pieces, len(row_docs), special.cls_id, special.sep_id
        )
        words = continues_word(flat, source, self._vocab.is_continuation, bucket.joins)
        lengths = np.diff(offsets)
        counts = np.bincount(row_docs, minlength=len(bucket.doc_ids))
        passes = range(self._config.dupe_factor)
        key_bases = derive_seed_grid(("mlm_key", self._config.random_seed), bucket.doc_ids, passes)
        for dupe in passes:
            keys = keys_from_bases(np.array([row[dupe] for row in key_bases], np.uint64), counts)
            rows = RowBlock(
                keys=keys,
                input_ids=flat,
                b_starts=lengths.astype(np.uint16),  # one segment
                row_offsets=offsets,
                masked_lm_positions=np.zeros(0, np.uint16),
                masked_lm_ids=np.zeros(0, flat.dtype),
                mlm_offsets=np.zeros(len(keys) + 1, np.int64),
                next_sentence_label=np.zeros(len(keys), np.uint8),
                continues_word=words,
            )
            if self._masking is not None:
                joins = words if self._masking.do_whole_word_mask else None
                rows = self._masked(rows, joins)
            yield from self._hold(rows)

    def _masked(self, rows: RowBlock, joins: np.ndarray | None) -> RowBlock:
        """``rows`` with static masks from their keys (Google's rules, ``mask_flat``)."""
        flat, offsets = rows.input_ids, rows.row_offsets
        masked, selected = mask_flat(flat, offsets, rows.keys, self._masking, self._vocab, joins)
        row_of = np.searchsorted(offsets, selected, side="right") - 1
        return dataclasses.replace(
            rows,
            input_ids=masked.astype(flat.dtype),
            masked_lm_positions=(selected - offsets[row_of]).astype(np.uint16),
            masked_lm_ids=flat[selected],
            mlm_offsets=np.searchsorted(selected, offsets).astype(np.int64),
        )

    def _bucket(self, bucket: TokenizedBatch) -> Iterator:
        *notes, bucket = self._in_order(bucket)
        yield from notes
        ids = bucket.doc_ids
        layout = BucketLayout(bucket.lengths, bucket.counts)
        seed, passes = self._config.random_seed, range(self._config.dupe_factor)
        # Grid row i, column d == derive_seed(*prefix, doc_ids[i], d).
        nsp_seeds = derive_seed_grid((seed, "nsp"), ids, passes)
        key_bases = derive_seed_grid(("shard_key", seed), ids, passes)
        for dupe in passes:
            plans: list[tuple[int, int, int, int, int]] = []
            counts = [
                plan_document(layout, index, self._nsp, random.Random(seeds[dupe]), plans)
                for index, seeds in enumerate(nsp_seeds)
            ]
            if not plans:
                continue
            bases = np.array([row[dupe] for row in key_bases], dtype=np.uint64)
            keys = keys_from_bases(bases, np.array(counts))  # == shard_keys(seed, id, dupe, n)
            rows = self._masked_block(bucket, np.array(plans, dtype=np.int64), keys)
            del plans
            yield from self._hold(rows)
            del rows

    def _send(self, pending: dict[int, list[RowBlock]]) -> Iterator:
        """Each write group's rows, as bytes (the runner then groups opaque bytes instead
        of unpickling blocks), or into the spool."""
        for group in sorted(pending):
            data = RowBlock.concat(pending[group]).to_bytes()
            if self._spool is None:
                yield group, data
            else:
                self._spool.write(group, data)

    def _masked_block(
        self, bucket: TokenizedBatch, plans: np.ndarray, keys: np.ndarray
    ) -> RowBlock:
        """Assemble and mask all rows at once; each row's randomness comes from its own key.
        A segmenter's word joins (``--wwm_segmenter``) are laid out as the ids are."""
        flat, _, offsets = assemble_rows(bucket.ids, plans, self._special)
        joins = None if bucket.joins is None else assemble_joins(bucket.joins, plans)
        rows = RowBlock(
            keys=keys,
            input_ids=flat,
            b_starts=(plans[:, 1] - plans[:, 0] + 2).astype(np.uint16),  # [CLS] A [SEP]
            row_offsets=offsets,
            masked_lm_positions=np.zeros(0, np.uint16),
            masked_lm_ids=np.zeros(0, flat.dtype),
            mlm_offsets=np.zeros(len(keys) + 1, np.int64),
            next_sentence_label=plans[:, 4].astype(np.uint8),
        )
        return self._masked(rows, joins)
