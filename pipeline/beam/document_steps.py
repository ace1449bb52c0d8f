"""Beam steps that read and tokenize: file ranges -> DocumentBatches -> TokenizedBatches
(the vocab learned between them: ``vocab_steps.py``).

Documents travel in batches (one element per up to 512 documents of a range), so
Beam's per-element cost is paid per batch. What the manifest counts leaves the data:
dropped records (``skipped``) and notable kept input (``stats.input``) go to the
``COUNTS`` tagged output as ``((group, kind), count)`` pairs (:func:`skipped`,
:func:`noted`), each also a Beam metric. Part of ``python -m pipeline build`` (see
``pipeline/beam/build.py``).
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Iterable, Iterator
from typing import NamedTuple

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics
from apache_beam.pvalue import TaggedOutput

from pipeline.beam.config import ReadOptions
from pipeline.core.rows import (
    offsets_of,
    pack_array,
    pack_text,
    take_ragged,
    take_rows,
    unpack_array,
    unpack_text,
)
from pipeline.core.segment import load_segmenter, word_joins
from pipeline.core.sources import (
    HEAD_BYTES,
    FileRange,
    check_format,
    content_id,
    format_from_name,
    read_documents,
    sniff_format,
)
from pipeline.core.vocab import build_tokenizer

logger = logging.getLogger(__name__)
NAMESPACE = "bert_pipeline"


class DocumentBatch(NamedTuple):
    """Documents of one input file, read together (elements carry many documents:
    Beam's per-element cost is paid per batch, not per document)."""

    doc_ids: list[str]  # content ids (sources.content_id), numbered in their bucket
    documents: list[list[str]]  # each a non-empty list of sentences
    # Where the batch was read (ReadDocuments): (path, its range's first byte, the number
    # of documents read from that range before this batch's first), so the i-th document
    # is the (index + i)-th of its range: curation's --minhash_keep first orders by it.
    origin: tuple[str, int, int] | None = None

    def __reduce__(self):
        """Pickled (how Beam moves it) as one compressed text: ~3x smaller than the
        strings one by one, which a local runner holds in memory until the vocab is
        learned. Sentences never hold a line break (see sources.content_id)."""
        sentences = [s for document in self.documents for s in document]
        try:
            packed = (pack_text(self.doc_ids), pack_text(sentences))
        except ValueError:  # a line break after all: pickled as it is
            return DocumentBatch, (self.doc_ids, self.documents, self.origin)
        counts = pack_array(np.fromiter(map(len, self.documents), np.uint32, len(self.documents)))
        return _unpack_documents, (*packed, counts, self.origin)


class TokenizedBatch(NamedTuple):
    """Documents' WordPiece ids in three flat arrays (a handful of arrays pickle
    far faster than one per sentence)."""

    doc_ids: list[str]
    ids: np.ndarray  # [N] uint16 (int32 for vocabs over 65,536), all sentences concatenated
    lengths: np.ndarray  # int64 [S], each sentence's length (all > 0)
    counts: np.ndarray  # int64 [D], each document's number of sentences (all > 0)
    # bool [N] with --wwm_segmenter: the token continues the previous token's word
    # (pipeline/core/segment.py); None without one. One byte a token: half the ids' bytes.
    joins: np.ndarray | None = None

    def __reduce__(self):
        """Pickled (how Beam moves it) compactly: ids compressed, lengths and counts as
        uint32, joins as bits; a local runner holds every batch while it buckets them."""
        joins = None
        if self.joins is not None:
            joins = (pack_array(np.packbits(self.joins)), len(self.joins))
        return _unpack_tokenized, (
            pack_text(self.doc_ids),
            pack_array(self.ids),
            pack_array(self.lengths.astype(np.uint32)),
            pack_array(self.counts.astype(np.uint32)),
            joins,
        )

    def take(self, docs: np.ndarray) -> TokenizedBatch:
        """The documents at indices ``docs``, in that order."""
        seg_offsets = offsets_of(self.counts)
        token_offsets = offsets_of(self.lengths)
        segments, _ = take_ragged(np.arange(len(self.lengths)), seg_offsets, docs)
        columns = [self.ids] if self.joins is None else [self.ids, self.joins]
        taken, _ = take_rows(columns, token_offsets, segments)
        return TokenizedBatch(
            [self.doc_ids[i] for i in docs.tolist()],
            taken[0],
            self.lengths[segments],
            self.counts[docs],
            taken[1] if self.joins is not None else None,
        )

    @staticmethod
    def concat(batches: list[TokenizedBatch]) -> TokenizedBatch:
        joins = None
        if batches and batches[0].joins is not None:
            joins = np.concatenate([b.joins for b in batches])
        return TokenizedBatch(
            [doc_id for b in batches for doc_id in b.doc_ids],
            np.concatenate([b.ids for b in batches]),
            np.concatenate([b.lengths for b in batches]),
            np.concatenate([b.counts for b in batches]),
            joins,
        )


def _unpack_documents(
    doc_ids: tuple, sentences: tuple, counts: tuple, origin: tuple | None = None
) -> DocumentBatch:
    flat = unpack_text(sentences)
    ends = np.cumsum(unpack_array(counts)).tolist()
    starts = [0, *ends][: len(ends)]
    return DocumentBatch(
        unpack_text(doc_ids), [flat[a:b] for a, b in zip(starts, ends, strict=True)], origin
    )


def _unpack_tokenized(doc_ids, ids, lengths, counts, joins) -> TokenizedBatch:
    if joins is not None:
        bits, n = joins
        joins = np.unpackbits(unpack_array(bits), count=n).astype(bool)
    return TokenizedBatch(
        unpack_text(doc_ids),
        unpack_array(ids),
        unpack_array(lengths).astype(np.int64),
        unpack_array(counts).astype(np.int64),
        joins,
    )


# A sentence (txt: a line) this long is kept, and counted as ``long_sentences``.
LONG_SENTENCE_CHARS = 1_000_000


# The tagged output of every step that counts something for the manifest: ((group, kind),
# count) pairs, summed per (group, kind); group "skipped" is the manifest's ``skipped``,
# group "input" its ``stats.input``.
COUNTS = "counts"
# ReadDocuments' tagged output: (path, documents) per range read, summed per file.
FILE_DOCUMENTS = "file_documents"


def counted(group: str, kind: str, count: int) -> list[tuple[tuple[str, str], int]]:
    """``[((group, kind), count)]`` when ``count`` is positive, else ``[]``; also a Beam
    metric (``records_skipped`` for group ``skipped``, else ``kind``), for the runner's UI.

    ``counted("skipped", "invalid_json", 2)`` -> ``[(("skipped", "invalid_json"), 2)]``.
    """
    if count <= 0:
        return []
    Metrics.counter(NAMESPACE, "records_skipped" if group == "skipped" else kind).inc(count)
    return [((group, kind), count)]


def skipped(reason: str, count: int = 1) -> list[TaggedOutput]:
    """``count`` dropped records, for the manifest's ``skipped`` under ``reason``: tagged
    ``COUNTS``."""
    return [TaggedOutput(COUNTS, pair) for pair in counted("skipped", reason, count)]


def noted(kind: str, count: int) -> list[TaggedOutput]:
    """``count`` of ``kind``, for the manifest's ``stats.input``: tagged ``COUNTS``."""
    return [TaggedOutput(COUNTS, pair) for pair in counted("input", kind, count)]


def open_at_start(path: str):
    """``path`` opened through Beam's FileSystems, and its first HEAD_BYTES (decompressed):
    the file is rewound for the reader (local, GCS and compressed files seek), or opened
    again where it cannot seek."""
    f = FileSystems.open(path)
    head = f.read(HEAD_BYTES)
    seekable = f.seekable() if callable(f.seekable) else f.seekable  # a property on some
    if seekable:
        f.seek(0)
        return f, head
    f.close()
    return FileSystems.open(path), head


class ReadDocuments(beam.DoFn):
    """FileRange -> DocumentBatches of up to ``BATCH_DOCUMENTS`` documents; tagged, the
    counts of dropped records and notes (``COUNTS``) and the range's document and sentence
    counts (``FILE_DOCUMENTS``: ``(path, (documents, sentences))``).

    The range at the start of a file checks the file's format (its first bytes); every
    range reads the records that start in it (``pipeline/core/sources.py``).
    """

    BATCH_DOCUMENTS = 512

    def __init__(self, options: ReadOptions, format_origin: str = "", split: bool = True):
        self._options = options
        self._origin = format_origin or f"--input_format {options.input_format}"
        self._split = split  # False: records' texts whole (curation: pipeline/beam/curate.py)
        self._docs = Metrics.counter(NAMESPACE, "documents_read")
        self._ranges = Metrics.counter(NAMESPACE, "ranges_read")

    def process(self, part: FileRange) -> Iterator:
        path = part.path
        documents = sentence_count = with_nul = long = 0
        batch = DocumentBatch([], [], (path, part.start, 0))
        f, head = open_at_start(path) if part.start == 0 else (FileSystems.open(path), b"")
        with f:
            for sentences, reason in self._records(f, head, part):
                if reason is not None:
                    yield from skipped(reason)
                    continue
                for sentence in sentences:
                    with_nul += "\x00" in sentence
                    if len(sentence) >= LONG_SENTENCE_CHARS and self._split:
                        long += 1  # the driver warns on the console; this names the file
                        logger.warning(
                            "%s: a document read from byte %d on has a sentence of %d characters",
                            path,
                            part.start,
                            len(sentence),
                        )
                batch.doc_ids.append(content_id(sentences))
                batch.documents.append(sentences)
                documents += 1
                sentence_count += len(sentences)
                if len(batch.doc_ids) == self.BATCH_DOCUMENTS:
                    self._docs.inc(len(batch.doc_ids))
                    yield batch
                    batch = DocumentBatch([], [], (path, part.start, documents))
        if batch.doc_ids:
            self._docs.inc(len(batch.doc_ids))
            yield batch
        self._ranges.inc()
        # One line per range, in the workers' logs: which process read which part of a file.
        logger.info(
            "read %s, bytes %d to %s: %d documents (process %d)",
            path,
            part.start,
            "the end" if part.end is None else part.end,
            documents,
            os.getpid(),
        )
        yield TaggedOutput(FILE_DOCUMENTS, (path, (documents, sentence_count)))
        yield from noted("sentences_with_nul", with_nul)  # NUL is dropped by normalisation
        yield from noted("long_sentences", long)

    def _records(self, f, head: bytes, part: FileRange) -> Iterator:
        """The range's records (pipeline/core/sources.py read_documents), the format
        checked against the file's first bytes where the range starts the file."""
        input_format, origin = self._options.input_format, self._origin
        if input_format == "auto":  # the driver resolves it; a direct caller may not have
            input_format = format_from_name(part.path) or sniff_format(head) or "txt"
            origin = "inferred from its name or first bytes"
        if part.start == 0:
            check_format(part.path, head, input_format, origin)
        return read_documents(
            f,
            input_format=input_format,
            text_field=self._options.text_field,
            path=part.path,
            start=part.start,
            end=part.end,
            split=self._split,
        )


def add_up(counts: Iterable[tuple[int, int]]) -> tuple[int, int]:
    """``(documents, sentences)`` of a file's ranges -> the file's: ``[(2, 9), (1, 4)]`` ->
    ``(3, 13)`` (a CombinePerKey function: partial sums add up the same)."""
    documents = sentences = 0
    for more_documents, more_sentences in counts:
        documents += more_documents
        sentences += more_sentences
    return documents, sentences


def file_notes(element: tuple[str, tuple[int, int]], input_format: str) -> list:
    """(path, (documents, sentences) in all its ranges) -> the ``((group, kind), count)``
    pairs the manifest counts for the file: ``file_without_documents`` skipped, or a txt
    file read as one document (``single_document_files``), named in the log with its
    sentences (lines), since the console's warning can only count them."""
    path, (documents, sentences) = element
    if not documents:
        return counted("skipped", "file_without_documents", 1)
    if documents == 1 and input_format == "txt":
        # Google's txt convention puts a blank line between documents; a file without
        # one is a single document, which is right for a book, wrong for a dump.
        logger.warning(
            "%s was read as one document of %d lines: a txt document ends at a "
            "blank line, and it has none",
            path,
            sentences,
        )
        return counted("input", "single_document_files", 1)
    return []


class Tokenize(beam.DoFn):
    """DocumentBatch -> TokenizedBatch with the ``tokenizers`` library.

    The tokenizer is built once per worker; one ``encode_batch_fast`` call (no
    offsets) per batch. Special-token text (``[MASK]``, ``[CLS]``, ...) is tokenized as
    ordinary text, as Google's tokenizer does. Sentences that tokenize to nothing are dropped
    without ending the document (Google's rule); documents left empty are counted as
    skipped (``COUNTS``), as are the notes of :func:`noted`.

    With a ``segmenter`` (``--wwm_segmenter``, built once per worker), the batch is
    encoded with offsets and each token's word join is found on the original sentence
    (``pipeline/core/segment.py``), here where tokenizing runs, in parallel.
    """

    def __init__(self, do_lower_case: bool, threads: int = 0, segmenter: str = "none"):
        self._lower = do_lower_case
        self._threads = threads
        self._segmenter_name = segmenter
        self._segmenter = None
        self._tokenizer = None
        self._tokens = Metrics.counter(NAMESPACE, "wordpiece_tokens")
        self._bundle_documents = 0

    def start_bundle(self) -> None:
        self._bundle_documents = 0

    def finish_bundle(self) -> None:
        # One line per bundle, in the workers' logs: which process tokenized how much.
        if self._bundle_documents:
            logger.info(
                "tokenized %d documents in a bundle (process %d)",
                self._bundle_documents,
                os.getpid(),
            )

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
            # Text is text: a literal "[MASK]" is "[", "mask", "]", as Google tokenizes it;
            # only the row format puts special ids in a row.
            self._tokenizer = build_tokenizer(vocab, self._lower, specials_in_text=False)
            self._unk_id = vocab.index("[UNK]")
            self._segmenter = load_segmenter(self._segmenter_name)
        sentences = [s for doc in batch.documents for s in doc]
        self._bundle_documents += len(batch.documents)
        joins = None
        if self._segmenter is None:
            encodings = self._tokenizer.encode_batch_fast(sentences, add_special_tokens=False)
        else:  # offsets: which characters each token covers
            encodings = self._tokenizer.encode_batch(sentences, add_special_tokens=False)
            joins = word_joins(sentences, [e.offsets for e in encodings], self._segmenter)
        encoded = [e.ids for e in encodings]
        lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
        per_doc = np.fromiter(map(len, batch.documents), dtype=np.int64, count=len(batch.documents))
        owner = np.repeat(np.arange(len(per_doc)), per_doc)  # each sentence's document
        kept = lengths > 0
        counts = np.bincount(owner[kept], minlength=len(per_doc))  # non-empty sentences per doc
        yield from skipped("empty_after_tokenization", int((counts == 0).sum()))
        if not kept.any():
            return
        flat = np.fromiter(
            itertools.chain.from_iterable(encoded),
            dtype=id_dtype(len(vocab)),
            count=int(lengths.sum()),
        )
        self._tokens.inc(len(flat))
        doc_ids = [d for d, n in zip(batch.doc_ids, counts.tolist(), strict=True) if n]
        yield TokenizedBatch(doc_ids, flat, lengths[kept], counts[counts > 0], joins)
        # One-sentence documents only ever make random-next rows (Google's rule).
        yield from noted("one_sentence_documents", int((counts == 1).sum()))
        # Words longer than 100 characters, and characters not in the vocab, become [UNK].
        yield from noted("unk_tokens", int((flat == self._unk_id).sum()))


def id_dtype(vocab_size: int) -> type:
    """The narrowest dtype for token ids: rows cross the shuffle in it (half of int32's bytes)."""
    return np.uint16 if vocab_size <= 2**16 else np.int32
