"""The Beam pipeline: raw text -> vocab -> NSP instances -> masked Arrow shards.

    python -m pipeline build --input 'corpus/*.txt' --output shards/ --vocab_size 30522
    python -m pipeline build --input ... --output ... \\
        --direct_num_workers=2 --direct_running_mode=multi_processing

Steps (labels as in the Beam graph)::

    ListFiles -> ReadDocuments -> [CountWords -> LearnVocab] -> Tokenize
      -> AssignBuckets -> GroupBuckets -> MakeInstances (NSP + masking, rows keyed by shard)
      -> GroupShards -> WriteShards [-> GroupParts -> JoinParts: shards in key-range parts]
      -> WriteManifest (empty shards, then the manifest, last)

Randomness is seeded only from (seed, document id, dupe index); documents meet
the others of their bucket sorted by id, and each shard is sorted by a seeded
hash; so every runner and worker count writes byte-identical shards and manifest.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import math
import os
import posixpath
import random
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import NamedTuple

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from . import format as shard_format
from .config import OUTPUT_BYTES_PER_INPUT_BYTE, TARGET_SHARD_BYTES, BuildConfig
from .masking import MaskingConfig, MaskingVocab, mask_flat
from .nsp import BucketLayout, NspConfig, SpecialIds, assemble_rows, plan_document
from .rng import derive_seed_grid, derive_seeds, keys_from_bases
from .rows import RowBlock, take_ragged
from .sources import read_documents
from .text import basic_tokenize
from .vocab import (
    build_tokenizer,
    learn_wordpiece_vocab,
    parse_vocab,
    special_ids,
    vocab_text,
)

logger = logging.getLogger(__name__)
NAMESPACE = "bert_pipeline"


class DocumentBatch(NamedTuple):
    """Documents of one input file, read together (elements carry many documents:
    Beam's per-element cost is paid per batch, not per document)."""

    doc_ids: list[str]  # "<path relative to the inputs' common directory>:<ordinal>"
    documents: list[list[str]]  # each a non-empty list of sentences


class TokenizedBatch(NamedTuple):
    """Documents' WordPiece ids in three flat arrays (a handful of arrays pickle
    far faster than one per sentence)."""

    doc_ids: list[str]
    ids: np.ndarray  # [N] uint16 (int32 for vocabs over 65,536), all sentences concatenated
    lengths: np.ndarray  # int64 [S], each sentence's length (all > 0)
    counts: np.ndarray  # int64 [D], each document's number of sentences (all > 0)

    def take(self, docs: np.ndarray) -> TokenizedBatch:
        """The documents at indices ``docs``, in that order."""
        seg_offsets = _offsets(self.counts)
        token_offsets = _offsets(self.lengths)
        segments, _ = take_ragged(np.arange(len(self.lengths)), seg_offsets, docs)
        ids, _ = take_ragged(self.ids, token_offsets, segments)
        return TokenizedBatch(
            [self.doc_ids[i] for i in docs.tolist()], ids, self.lengths[segments],
            self.counts[docs],
        )  # fmt: skip

    @staticmethod
    def concat(batches: list[TokenizedBatch]) -> TokenizedBatch:
        return TokenizedBatch(
            [doc_id for b in batches for doc_id in b.doc_ids],
            np.concatenate([b.ids for b in batches]),
            np.concatenate([b.lengths for b in batches]),
            np.concatenate([b.counts for b in batches]),
        )


def _offsets(lengths: np.ndarray) -> np.ndarray:
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


class Skipped(NamedTuple):
    """A dropped record, counted under its reason in the manifest's ``skipped``."""

    reason: str


class Noted(NamedTuple):
    """Input kept but worth knowing about, summed per kind into the manifest's
    ``stats.input`` (e.g. ``one_sentence_documents``, ``unk_tokens``)."""

    kind: str
    count: int


# A sentence (txt: a line) this long is kept, and counted as ``long_sentences``.
LONG_SENTENCE_CHARS = 1_000_000


def split_skips(pcoll: beam.PCollection, label: str):
    """(records, Skipped and Noted) -> (records, ((group, kind), count) pairs).

    Two filters rather than a multi-output ParDo: Beam's DaskRunner mishandles
    tagged outputs, and this costs one cheap pass.
    """
    kept = pcoll | f"{label}Kept" >> beam.Filter(lambda x: not isinstance(x, (Skipped, Noted)))
    counts = pcoll | f"{label}Counts" >> beam.FlatMap(_count_pair)
    return kept, counts


def _count_pair(x) -> list:
    if isinstance(x, Skipped):
        return [(("skipped", x.reason), 1)]
    if isinstance(x, Noted):
        return [(("input", x.kind), x.count)]
    return []


def noted(kind: str, count: int) -> list[Noted]:
    """``[Noted(kind, count)]`` when ``count`` is positive (also counted as a Beam metric)."""
    if count <= 0:
        return []
    Metrics.counter(NAMESPACE, kind).inc(count)
    return [Noted(kind, count)]


# ----------------------------------------------------------------------------- files


def match_inputs(patterns: Iterable[str]) -> list[tuple[str, int]]:
    """Expand globs through Beam's FileSystems; returns sorted (path, size_in_bytes).

    Raises:
        FileNotFoundError: a pattern matches no file (names the pattern).
    """
    found: dict[str, int] = {}
    for pattern in patterns:
        result = FileSystems.match([pattern])[0]
        if not result.metadata_list:
            raise FileNotFoundError(f"--input {pattern!r} matched no file")
        for meta in result.metadata_list:
            found[meta.path] = meta.size_in_bytes
    return sorted(found.items())


def common_root(paths: list[str]) -> str:
    """The directory all paths share, so that document ids do not depend on where the
    corpus lies or how its paths are spelt (absolute, relative, a URI).

    Examples: ``["/a/b/x", "/a/c/y"] -> "/a"``, ``["c/x.txt"] -> "c"``,
    ``["gs://b/d/x", "gs://b/d/y"] -> "gs://b/d"``.
    """
    parts = [p.split("/")[:-1] for p in paths]  # each file's directory, as components
    shared = parts[0]
    for other in parts[1:]:
        n = 0
        while n < min(len(shared), len(other)) and shared[n] == other[n]:
            n += 1
        shared = shared[:n]
    return "/".join(shared)


def write_atomic(path: str, data: bytes) -> None:
    """Write through Beam's FileSystems under a temporary name, then rename."""
    directory, name = posixpath.split(path)
    tmp = FileSystems.join(directory, f".{name}.{uuid.uuid4().hex}.tmp")
    try:
        with FileSystems.create(tmp, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            f.write(data)
        FileSystems.rename([tmp], [path])
    except BaseException:
        if FileSystems.exists(tmp):
            FileSystems.delete([tmp])
        raise


def default_num_shards(total_input_bytes: int, dupe_factor: int) -> int:
    estimate = total_input_bytes * dupe_factor * OUTPUT_BYTES_PER_INPUT_BYTE
    return max(1, min(99999, round(estimate / TARGET_SHARD_BYTES)))


def prepare_output(config: BuildConfig) -> None:
    """Create the output directory; refuse to mix with an earlier build unless --overwrite.

    Raises:
        FileExistsError: the directory already holds shards or a manifest.
    """
    out = config.output
    existing = [
        m.path
        for pattern in ("shard-*.arrow", shard_format.MANIFEST_NAME)
        for m in FileSystems.match([FileSystems.join(out, pattern)])[0].metadata_list
    ]
    if existing and not config.overwrite:
        raise FileExistsError(
            f"{out} already holds {len(existing)} shard/manifest file(s) from an earlier build; "
            "pass --overwrite to replace them or choose another --output"
        )
    # Part files of an interrupted build are never output: always removed.
    stale = FileSystems.match([FileSystems.join(out, ".shard-*.part-*")])[0].metadata_list
    if stale:
        FileSystems.delete([m.path for m in stale])
    # The manifest goes first, so an interrupted clean-up never leaves a manifest
    # that lists deleted shards.
    existing.sort(key=lambda p: not p.endswith(shard_format.MANIFEST_NAME))
    if existing:
        FileSystems.delete(existing)
    if not FileSystems.exists(out):
        FileSystems.mkdirs(out)


# ----------------------------------------------------------------------------- DoFns


class ReadDocuments(beam.DoFn):
    """path -> DocumentBatches of up to ``BATCH_DOCUMENTS`` documents, and a
    Skipped per dropped record."""

    BATCH_DOCUMENTS = 512

    def __init__(self, config: BuildConfig, root: str):
        self._config = config
        self._root = root
        self._docs = Metrics.counter(NAMESPACE, "documents_read")
        self._skips = Metrics.counter(NAMESPACE, "records_skipped")

    def process(self, path: str) -> Iterator:
        relative = path[len(self._root) :].lstrip("/") if self._root else path
        ordinal = with_nul = long = 0
        batch = DocumentBatch([], [])
        with FileSystems.open(path) as f:
            items = read_documents(
                f, input_format=self._config.input_format,
                text_field=self._config.text_field, path=path,
            )  # fmt: skip
            for sentences, reason in items:
                if reason is not None:
                    self._skips.inc()
                    yield Skipped(reason)
                    continue
                for sentence in sentences:
                    with_nul += "\x00" in sentence
                    long += len(sentence) >= LONG_SENTENCE_CHARS
                batch.doc_ids.append(f"{relative}:{ordinal}")
                batch.documents.append(sentences)
                ordinal += 1
                if len(batch.doc_ids) == self.BATCH_DOCUMENTS:
                    self._docs.inc(len(batch.doc_ids))
                    yield batch
                    batch = DocumentBatch([], [])
        if batch.doc_ids:
            self._docs.inc(len(batch.doc_ids))
            yield batch
        if not ordinal:
            self._skips.inc()
            yield Skipped("file_without_documents")
        yield from noted("sentences_with_nul", with_nul)  # NUL is dropped by normalisation
        yield from noted("long_sentences", long)


class CountWords(beam.CombineFn):
    """DocumentBatches -> Counter of BERT basic-tokenized words (memory: distinct words)."""

    def __init__(self, do_lower_case: bool):
        self._lower = do_lower_case

    def create_accumulator(self) -> Counter:
        return Counter()

    def add_input(self, counts: Counter, batch: DocumentBatch) -> Counter:
        for sentences in batch.documents:
            for sentence in sentences:
                counts.update(basic_tokenize(sentence, self._lower))
        return counts

    def merge_accumulators(self, accumulators: Iterable[Counter]) -> Counter:
        it = iter(accumulators)
        total = next(it)
        for counts in it:
            total.update(counts)
        return total

    def extract_output(self, counts: Counter) -> dict[str, int]:
        return dict(counts)


def learn_vocab(word_counts: dict[str, int], config: BuildConfig) -> list[str]:
    if not word_counts:
        raise ValueError(f"no words in --input {list(config.input)}: cannot learn a vocab")
    logger.info("learning a %d-token vocab from %d distinct words", config.vocab_size,
                len(word_counts))  # fmt: skip
    return learn_wordpiece_vocab(word_counts, config.vocab_size, min_frequency=config.min_frequency)


class Tokenize(beam.DoFn):
    """DocumentBatch -> TokenizedBatch with the ``tokenizers`` library.

    The tokenizer is built once per worker; one ``encode_batch_fast`` call (no
    offsets) per batch. Sentences that tokenize to nothing are dropped without
    ending the document (Google's rule); documents left empty become ``Skipped``.
    """

    def __init__(self, do_lower_case: bool, threads: int = 0):
        self._lower = do_lower_case
        self._threads = threads
        self._tokenizer = None
        self._tokens = Metrics.counter(NAMESPACE, "wordpiece_tokens")

    def setup(self) -> None:
        # The tokenizers library reads TOKENIZERS_PARALLELISM on every call and
        # RAYON_NUM_THREADS when its thread pool starts (this worker's first batch).
        if self._threads == 1:
            os.environ["TOKENIZERS_PARALLELISM"] = "false"
        elif self._threads > 1:
            os.environ["TOKENIZERS_PARALLELISM"] = "true"
            os.environ["RAYON_NUM_THREADS"] = str(self._threads)

    def process(self, batch: DocumentBatch, vocab: list[str]) -> Iterator:
        if self._tokenizer is None:
            self._tokenizer = build_tokenizer(vocab, self._lower)
            self._unk_id = vocab.index("[UNK]")
        sentences = [s for doc in batch.documents for s in doc]
        encoded = [
            e.ids for e in self._tokenizer.encode_batch_fast(sentences, add_special_tokens=False)
        ]
        lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
        # Each document's number of non-empty sentences.
        per_doc = np.fromiter(map(len, batch.documents), dtype=np.int64,
                              count=len(batch.documents))  # fmt: skip
        owner = np.repeat(np.arange(len(per_doc)), per_doc)
        kept = lengths > 0
        counts = np.bincount(owner[kept], minlength=len(per_doc))
        for _ in range(int((counts == 0).sum())):
            yield Skipped("empty_after_tokenization")
        if not kept.any():
            return
        flat = np.fromiter(itertools.chain.from_iterable(encoded), dtype=id_dtype(len(vocab)),
                           count=int(lengths.sum()))  # fmt: skip
        self._tokens.inc(len(flat))
        doc_ids = [d for d, n in zip(batch.doc_ids, counts.tolist(), strict=True) if n]
        yield TokenizedBatch(doc_ids, flat, lengths[kept], counts[counts > 0])
        # One-sentence documents only ever make random-next rows (Google's rule).
        yield from noted("one_sentence_documents", int((counts == 1).sum()))
        # Words longer than 100 characters, and characters not in the vocab, become [UNK].
        yield from noted("unk_tokens", int((flat == self._unk_id).sum()))


def id_dtype(vocab_size: int) -> type:
    """The narrowest dtype for token ids: rows cross the shuffle in it (half of int32's bytes)."""
    return np.uint16 if vocab_size <= 2**16 else np.int32


def num_buckets(num_docs: int, bucket_size: int) -> int:
    """How many buckets ``num_docs`` documents make, so that each holds ``bucket_size``.

    Documents land in buckets by a seeded hash, so a bucket's size varies around
    the mean by about its square root. Aiming the mean six standard deviations
    above ``bucket_size`` makes a smaller bucket a ~1e-8 event per bucket (the
    manifest's ``stats.buckets`` records the smallest); one bucket holds all
    documents when there are too few for two.
    """
    margin = 6 * math.isqrt(bucket_size) + 6
    return max(1, num_docs // (bucket_size + margin))


def split_into_buckets(batch: TokenizedBatch, num_docs: int, config: BuildConfig):
    """TokenizedBatch -> (bucket, TokenizedBatch) per bucket its documents fall in.

    A document's bucket is a seeded hash of its id, so it is the same on every runner.
    """
    count = num_buckets(num_docs, config.bucket_size)
    hashes = derive_seeds((config.random_seed, "bucket"), batch.doc_ids)
    buckets = np.array(hashes, dtype=np.uint64) % np.uint64(count)
    order = np.argsort(buckets, kind="stable")
    present, starts = np.unique(buckets[order], return_index=True)
    for bucket, part in zip(present.tolist(), np.split(order, starts[1:]), strict=True):
        yield bucket, batch.take(part)


def bucket_summary(sizes: list[int]) -> dict[str, int]:
    """Documents per bucket -> the manifest's ``stats.buckets``."""
    return {"count": len(sizes), "min_documents": min(sizes, default=0),
            "max_documents": max(sizes, default=0)}  # fmt: skip


class MakeInstances(beam.DoFn):
    """(bucket, TokenizedBatches) -> (shard, RowBlock): Google's NSP pairs, then static masks.

    Documents meet the others of their bucket in id order. Each document's NSP
    rng is seeded from (seed, doc id, dupe pass); each row gets a 64-bit key from
    (seed, doc id, dupe pass, index) that places it in a shard and seeds its
    masks. Instances are planned on segment lengths, then the whole bucket is
    assembled and masked in a few vectorised calls.
    """

    def __init__(self, config: BuildConfig, num_shards: int):
        self._config = config
        self._num_shards = num_shards
        self._nsp = NspConfig(config.max_seq_length, config.short_seq_prob)
        self._masking = MaskingConfig(
            config.masked_lm_prob, config.max_predictions_per_seq, config.do_whole_word_mask
        )
        self._vocab = None
        self._instances = Metrics.counter(NAMESPACE, "instances")

    def process(self, element, vocab: list[str]) -> Iterator[tuple[int, RowBlock]]:
        _, batches = element
        if self._vocab is None:
            self._vocab = MaskingVocab.from_tokens(vocab)
            self._special = SpecialIds(self._vocab.cls_id, self._vocab.sep_id)
        bucket = TokenizedBatch.concat(list(batches))
        order = sorted(range(len(bucket.doc_ids)), key=bucket.doc_ids.__getitem__)
        bucket = bucket.take(np.array(order, dtype=np.int64))
        layout = BucketLayout(bucket.lengths, bucket.counts)
        seed, passes = self._config.random_seed, range(self._config.dupe_factor)
        # Grid row i, column d == derive_seed(*prefix, doc_ids[i], d).
        nsp_seeds = derive_seed_grid((seed, "nsp"), bucket.doc_ids, passes)
        key_bases = derive_seed_grid(("shard_key", seed), bucket.doc_ids, passes)
        plans: list[tuple[int, int, int, int, int]] = []
        counts = []
        for index, seeds in enumerate(nsp_seeds):
            for nsp_seed in seeds:
                rng = random.Random(nsp_seed)
                counts.append(plan_document(layout, index, self._nsp, rng, plans))
        bases = [base for row in key_bases for base in row]  # == shard_key_base(seed, id, d)
        keys = keys_from_bases(np.array(bases, dtype=np.uint64), np.array(counts))
        rows = self._masked_block(bucket.ids, np.array(plans, dtype=np.int64), keys)
        self._instances.inc(len(rows))
        # Rows grouped by where they are written: shard, then key range within it.
        groups = write_group(rows.keys, self._num_shards)
        if groups.min() == groups.max():
            yield int(groups[0]), rows
            return
        order = np.argsort(groups, kind="stable")
        present, starts = np.unique(groups[order], return_index=True)
        for group, part in zip(present.tolist(), np.split(order, starts[1:]), strict=True):
            yield group, rows.take(part)

    def _masked_block(self, tokens: np.ndarray, plans: np.ndarray, keys: np.ndarray) -> RowBlock:
        """Assemble and mask all rows at once; each row's randomness comes from its own key."""
        flat, _, offsets = assemble_rows(tokens, plans, self._special)
        masked, selected = mask_flat(flat, offsets, keys, self._masking, self._vocab)
        masked = masked.astype(flat.dtype)
        row_of = np.searchsorted(offsets, selected, side="right") - 1
        return RowBlock(
            keys=keys,
            input_ids=masked,
            b_starts=(plans[:, 1] - plans[:, 0] + 2).astype(np.uint16),  # [CLS] A [SEP]
            row_offsets=offsets,
            masked_lm_positions=(selected - offsets[row_of]).astype(np.uint16),
            masked_lm_ids=flat[selected],
            mlm_offsets=np.searchsorted(selected, offsets).astype(np.int64),
            next_sentence_label=plans[:, 4].astype(np.uint8),
        )


# Shards are written in this many parallel pieces in all (each shard in key ranges
# joined at the end), so a build of fewer shards than workers still writes in parallel.
PARALLEL_WRITES = 16


def parts_per_shard(num_shards: int) -> int:
    """Key ranges each shard is written in: 1 from ``PARALLEL_WRITES`` shards on."""
    return max(1, -(-PARALLEL_WRITES // num_shards))


def write_group(keys: np.ndarray, num_shards: int) -> np.ndarray:
    """Rows' write groups, ``shard * parts + part``: the shard is ``key % num_shards``
    and the part the key's range (the top bits), so parts in order are keys in order."""
    parts = parts_per_shard(num_shards)
    shard = keys % np.uint64(num_shards)
    part = ((keys >> np.uint64(32)) * np.uint64(parts)) >> np.uint64(32)
    return (shard * np.uint64(parts) + part).astype(np.int64)


class WriteShard(beam.DoFn):
    """(write group, RowBlocks) -> the shard's manifest entry and statistics after
    writing it, or (shard, part record) after writing one key range of it."""

    def __init__(self, config: BuildConfig, num_shards: int):
        self._config = config
        self._num_shards = num_shards
        self._parts = parts_per_shard(num_shards)

    def process(self, element, vocab: list[str]) -> Iterator:
        group, blocks = element
        block = RowBlock.concat(list(blocks))
        if self._parts == 1:
            yield write_shard(group, block, vocab, self._config, self._num_shards)
            return
        shard, part = divmod(group, self._parts)
        block = block.sorted_by_key()
        schema = shard_format.shard_schema(len(vocab), self._config.max_seq_length)
        body = shard_format.encode_shard_body(block.columns(), schema)
        path = part_path(self._config.output, shard, part, self._num_shards)
        write_atomic(path, body)
        stats = block_stats(block, vocab.index("[MASK]"), self._config.max_seq_length)
        yield shard, {"part": part, "path": path, "stats": stats}


def part_path(output: str, shard: int, part: int, num_shards: int) -> str:
    """A shard's part file: hidden, beside the shard, removed once the shard is joined."""
    return FileSystems.join(
        output, f".{shard_format.shard_name(shard, num_shards)}.part-{part:03d}"
    )


class JoinParts(beam.DoFn):
    """(shard, part records) -> the shard's manifest entry and statistics, after
    joining its parts, in key order, into the shard file and deleting them."""

    def __init__(self, config: BuildConfig, num_shards: int):
        self._config = config
        self._num_shards = num_shards

    def process(self, element, vocab: list[str]) -> Iterator[dict]:
        shard, parts = element
        parts = sorted(parts, key=lambda p: p["part"])
        bodies = []
        for part in parts:
            with FileSystems.open(
                part["path"], compression_type=CompressionTypes.UNCOMPRESSED
            ) as f:
                bodies.append(f.read())
        schema = shard_format.shard_schema(len(vocab), self._config.max_seq_length)
        data = shard_format.join_shard_bodies(bodies, schema)
        name = shard_format.shard_name(shard, self._num_shards)
        write_atomic(FileSystems.join(self._config.output, name), data)
        FileSystems.delete([part["path"] for part in parts])
        stats = merge_stats(part["stats"] for part in parts)
        yield {
            "entry": {"name": name, "rows": stats["rows"], "bytes": len(data),
                      "sha256": hashlib.sha256(data).hexdigest()},
            "stats": stats,
        }  # fmt: skip


def write_shard(shard: int, block: RowBlock, vocab: list[str], config: BuildConfig,
                num_shards: int) -> dict:  # fmt: skip
    """Sort the rows by key, write the shard atomically, return its entry and statistics."""
    block = block.sorted_by_key()
    schema = shard_format.shard_schema(len(vocab), config.max_seq_length)
    data = shard_format.encode_shard(block.columns(), schema)
    name = shard_format.shard_name(shard, num_shards)
    write_atomic(FileSystems.join(config.output, name), data)
    return {
        "entry": {"name": name, "rows": len(block), "bytes": len(data),
                  "sha256": hashlib.sha256(data).hexdigest()},
        "stats": block_stats(block, vocab.index("[MASK]"), config.max_seq_length),
    }  # fmt: skip


def block_stats(block: RowBlock, mask_id: int, max_seq_length: int) -> dict[str, int | list[int]]:
    """Integer sums (so merging shards is exact and order-free) for the manifest."""
    lengths = np.diff(block.row_offsets)
    at_positions = block.row_offsets[:-1].repeat(np.diff(block.mlm_offsets))
    values = block.input_ids[at_positions + block.masked_lm_positions]
    return {
        "rows": len(block),
        "tokens": int(lengths.sum()),
        "full_length_rows": int((lengths == max_seq_length).sum()),
        "random_next": int(block.next_sentence_label.sum()),
        "masked": len(block.masked_lm_ids),
        "masked_as_mask": int((values == mask_id).sum()),
        "masked_kept": int((values == block.masked_lm_ids).sum()),
        "length_histogram": np.bincount(lengths, minlength=max_seq_length + 1).tolist(),
    }


def merge_stats(parts: Iterable[dict]) -> dict:
    total: dict = {}
    for part in parts:
        for key, value in part.items():
            if isinstance(value, list):
                old = total.get(key, [0] * len(value))
                total[key] = [a + b for a, b in zip(old, value, strict=True)]
            else:
                total[key] = total.get(key, 0) + value
    return total


def summary_stats(stats: dict, documents: int) -> dict:
    """Totals plus the shares a practitioner checks against Google's (see DESIGN.md)."""
    rows, masked = max(stats.get("rows", 0), 1), max(stats.get("masked", 0), 1)
    real = max(stats.get("tokens", 0) - 3 * stats.get("rows", 0), 1)
    return {
        **stats,
        "documents": documents,
        "random_next_share": round(stats.get("random_next", 0) / rows, 6),
        "short_row_share": round(1 - stats.get("full_length_rows", 0) / rows, 6),
        "masks_per_row": round(stats.get("masked", 0) / rows, 6),
        "masked_share_of_real_tokens": round(stats.get("masked", 0) / real, 6),
        "mask_token_share": round(stats.get("masked_as_mask", 0) / masked, 6),
        "kept_share": round(stats.get("masked_kept", 0) / masked, 6),
    }


def vocab_entry(vocab: list[str], config: BuildConfig) -> dict:
    """Write vocab.txt and tokenizer.json; return the manifest's ``vocab`` entry."""
    vocab_bytes = vocab_text(vocab).encode("utf-8")
    tokenizer_bytes = build_tokenizer(vocab, config.do_lower_case).to_str().encode("utf-8")
    write_atomic(FileSystems.join(config.output, shard_format.VOCAB_NAME), vocab_bytes)
    write_atomic(FileSystems.join(config.output, shard_format.TOKENIZER_NAME), tokenizer_bytes)
    ids = special_ids(vocab)
    return {
        "file": shard_format.VOCAB_NAME,
        "sha256": hashlib.sha256(vocab_bytes).hexdigest(),
        "size": len(vocab),
        "do_lower_case": config.do_lower_case,
        "special_ids": {name.removesuffix("_id"): i for name, i in ids.items()},
        "tokenizer_file": shard_format.TOKENIZER_NAME,
        "tokenizer_sha256": hashlib.sha256(tokenizer_bytes).hexdigest(),
    }


def write_manifest(shards: list[dict], vocab: list[str], vocab_info: dict, counts: dict,
                   documents: int, buckets: dict, config: BuildConfig,
                   num_shards: int) -> dict:  # fmt: skip
    """Write the shards no row landed in (empty, so the set of files is always
    complete), then the manifest, last."""
    written = {s["entry"]["name"] for s in shards}
    for index in range(num_shards):
        if shard_format.shard_name(index, num_shards) not in written:
            shards = [*shards, write_shard(index, RowBlock.empty(), vocab, config, num_shards)]
    skipped = {kind: n for (group, kind), n in counts.items() if group == "skipped"}
    noticed = {kind: n for (group, kind), n in counts.items() if group == "input"}
    stats = {**summary_stats(merge_stats(s["stats"] for s in shards), documents),
             "buckets": buckets, "input": dict(sorted(noticed.items()))}  # fmt: skip
    params = {**config.params(), "num_shards": num_shards}
    manifest = shard_format.build_manifest(
        shards=[s["entry"] for s in shards], vocab=vocab_info, params=params, stats=stats,
        skipped=dict(sorted(skipped.items())),
    )  # fmt: skip
    path = FileSystems.join(config.output, shard_format.MANIFEST_NAME)
    write_atomic(path, shard_format.encode_manifest(manifest))
    return manifest


# ----------------------------------------------------------------------------- graph


def read_vocab_file(path: str) -> list[str]:
    try:
        with FileSystems.open(path) as f:
            text = f.read().decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"--vocab_file {path}: not UTF-8 ({e})") from e
    except OSError as e:
        raise FileNotFoundError(f"--vocab_file {path}: {e}") from e
    return parse_vocab(text, path)


class Plan(NamedTuple):
    """What the driver decides before the pipeline runs (fails fast on bad input)."""

    files: list[str]
    root: str  # common directory of the inputs; document ids are relative to it
    num_shards: int
    vocab: list[str] | None  # from --vocab_file, or None to learn one


def make_plan(config: BuildConfig) -> Plan:
    """Match the inputs, size the shards and read --vocab_file.

    Raises:
        FileNotFoundError: an input pattern matches nothing, or no --vocab_file.
        ValueError: the vocab file is malformed (names file and line).
    """
    files = match_inputs(config.input)
    total = sum(size for _, size in files)
    num_shards = config.num_shards or default_num_shards(total, config.dupe_factor)
    vocab = read_vocab_file(config.vocab_file) if config.vocab_file else None
    paths = [path for path, _ in files]
    logger.info("%d input file(s), %.1f MB, %d shard(s)", len(files), total / 1e6, num_shards)
    return Plan(paths, common_root(paths), num_shards, vocab)


def build_graph(p: beam.Pipeline, config: BuildConfig, plan: Plan) -> beam.PCollection:
    """Add the whole job to ``p``; returns the PCollection holding the manifest."""
    num_shards, root = plan.num_shards, plan.root
    documents, read_counts = split_skips(
        p
        | "ListFiles" >> beam.Create(plan.files)
        | "SpreadFiles" >> beam.Reshuffle()
        | "ReadDocuments" >> beam.ParDo(ReadDocuments(config, root)),
        "Read",
    )
    if plan.vocab is not None:
        vocab = p | "VocabFromFile" >> beam.Create([plan.vocab])
    else:
        vocab = (
            documents
            | "CountWords" >> beam.CombineGlobally(CountWords(config.do_lower_case))
            | "LearnVocab" >> beam.Map(learn_vocab, config)
        )
    vocab_side = beam.pvalue.AsSingleton(vocab)
    vocab_info = vocab | "WriteVocab" >> beam.Map(vocab_entry, config)

    tokenized, tokenize_counts = split_skips(
        documents
        | "Tokenize"
        >> beam.ParDo(Tokenize(config.do_lower_case, config.tokenizer_threads), vocab=vocab_side),
        "Tokenized",
    )
    num_docs = (
        tokenized
        | "DocumentsPerBatch" >> beam.Map(lambda batch: len(batch.doc_ids))
        | "CountDocuments" >> beam.CombineGlobally(sum)
    )
    buckets = tokenized | "AssignBuckets" >> beam.FlatMap(
        split_into_buckets, beam.pvalue.AsSingleton(num_docs), config
    )
    bucket_sizes = (
        buckets
        | "DocumentsPerBucket" >> beam.Map(lambda kv: (kv[0], len(kv[1].doc_ids)))
        | "SumPerBucket" >> beam.CombinePerKey(sum)
        | "BucketSizes" >> beam.Values()
        | "CollectBucketSizes" >> beam.combiners.ToList()
        | "SummariseBuckets" >> beam.Map(bucket_summary)
    )
    rows = (
        buckets
        | "GroupBuckets" >> beam.GroupByKey()
        | "MakeInstances" >> beam.ParDo(MakeInstances(config, num_shards), vocab=vocab_side)
    )
    written = (
        rows
        | "GroupShards" >> beam.GroupByKey()
        | "WriteShards" >> beam.ParDo(WriteShard(config, num_shards), vocab=vocab_side)
    )
    if parts_per_shard(num_shards) > 1:
        written = (
            written
            | "GroupParts" >> beam.GroupByKey()
            | "JoinParts" >> beam.ParDo(JoinParts(config, num_shards), vocab=vocab_side)
        )
    counts = (
        (read_counts, tokenize_counts)
        | "MergeCounts" >> beam.Flatten()
        | "SumCounts" >> beam.CombinePerKey(sum)
    )
    return (
        written
        | "CollectShards" >> beam.combiners.ToList()
        | "WriteManifest"
        >> beam.Map(
            write_manifest,
            vocab=vocab_side,
            vocab_info=beam.pvalue.AsSingleton(vocab_info),
            counts=beam.pvalue.AsDict(counts),
            documents=beam.pvalue.AsSingleton(num_docs),
            buckets=beam.pvalue.AsSingleton(bucket_sizes),
            config=config,
            num_shards=num_shards,
        )
    )
