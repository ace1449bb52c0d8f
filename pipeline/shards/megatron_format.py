"""Megatron-LM's indexed dataset (``PREFIX.bin`` + ``PREFIX.idx``), written with numpy alone.

The input of Megatron's BERT dataset (``megatron.core.datasets.bert_dataset``), which makes
its own sentence pairs and masks: each *sequence* is one sentence's WordPiece ids (no
``[CLS]``/``[SEP]``), and the index says where each document's sentences end, as Megatron's
``tools/preprocess_data.py --split-sentences`` writes it. ``pipeline/beam/export_megatron.py``
runs it over the pipeline's tokenized documents (``python -m pipeline export --to megatron``).

The format (megatron/core/datasets/indexed_dataset.py, ``_IndexWriter``; all little-endian):

    PREFIX.bin   every sequence's ids back to back, in the index's dtype
    PREFIX.idx   b"MMIDIDX\\x00\\x00"          9-byte magic
                 uint64   1                   index version
                 uint8    dtype code          4 = int32, 8 = uint16 (DTYPE_CODES)
                 uint64   S                   sequences (sentences)
                 uint64   D + 1               entries of document_indices
                 int32    [S]                 sequence_lengths: tokens per sentence
                 int64    [S]                 sequence_pointers: byte offset of each in .bin
                 int64    [D + 1]             document_indices: 0, then the sequence index
                                              where each document ends

The dtype is Megatron's ``DType.optimal_dtype(vocab_size)``: uint16 below 65,500 ids, else int32.

Why not megatron-core's ``IndexedDatasetBuilder``: it imports torch (its items are tensors), and
an export runs on Beam workers, which have the base install (no torch: pyproject.toml). The
format is small and fixed, so it is written here and the tests read it back with megatron-core's
own ``IndexedDataset`` in an environment of its own (scripts/test.sh, ``.venv-readers``).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np

INDEX_MAGIC = b"MMIDIDX\x00\x00"
INDEX_VERSION = 1
# megatron.core.datasets.indexed_dataset.DType codes of the two dtypes optimal_dtype chooses.
DTYPE_CODES = {np.dtype(np.uint16): 8, np.dtype(np.int32): 4}
# optimal_dtype's bound: ids of a vocab smaller than this fit uint16.
UINT16_CARDINALITY = 65500


def token_dtype(vocab_size: int) -> np.dtype:
    """Megatron's ``DType.optimal_dtype``: ``token_dtype(30522) -> uint16``,
    ``token_dtype(65500) -> int32``."""
    return np.dtype(np.uint16 if vocab_size < UINT16_CARDINALITY else np.int32)


def index_bytes(sequence_lengths: np.ndarray, document_ends: np.ndarray, dtype: np.dtype) -> bytes:
    """The ``.idx`` file of sequences of these lengths, documents ending at these sequences.

    ``index_bytes([2, 3], [2], uint16)`` is the index of one document of two sentences of 2
    and 3 tokens: pointers ``[0, 4]``, document_indices ``[0, 2]``.

    Args:
        sequence_lengths: int [S], tokens of each sentence (each > 0).
        document_ends: int [D], for each document the index of the sequence after its last
            (strictly increasing, the last one S).
        dtype: the ``.bin``'s dtype (token_dtype).

    Raises:
        ValueError: lengths or ends that do not describe whole documents.
    """
    lengths = np.asarray(sequence_lengths, dtype=np.int64)
    ends = np.asarray(document_ends, dtype=np.int64)
    if lengths.size and lengths.min() <= 0:
        raise ValueError("every sequence must hold at least one token")
    if ends.size and (np.any(np.diff(ends) <= 0) or ends[0] <= 0 or ends[-1] != lengths.size):
        raise ValueError(f"document ends {ends[:5]}... do not split {lengths.size} sequences")
    if not ends.size and lengths.size:
        raise ValueError(f"{lengths.size} sequences in no document")
    itemsize = np.dtype(dtype).itemsize
    pointers = np.zeros(lengths.size, np.int64)
    np.cumsum(lengths[:-1] * itemsize, out=pointers[1:])
    header = INDEX_MAGIC + struct.pack("<Q", INDEX_VERSION)
    header += struct.pack("<B", DTYPE_CODES[np.dtype(dtype)])
    header += struct.pack("<QQ", lengths.size, ends.size + 1)
    documents = np.concatenate([[0], ends]).astype("<i8")
    return b"".join(
        (
            header,
            lengths.astype("<i4").tobytes(),
            pointers.astype("<i8").tobytes(),
            documents.tobytes(),
        )
    )


def dataset_bytes(
    ids: np.ndarray, sentence_lengths: np.ndarray, sentence_counts: np.ndarray, vocab_size: int
) -> tuple[bytes, bytes]:
    """(``.bin``, ``.idx``) bytes of documents given as flat arrays.

    ``dataset_bytes([5, 6, 7], [2, 1], [2], 100)`` -> one document of the sentences
    ``[5, 6]`` and ``[7]``: a 6-byte .bin (uint16) and its index.

    Args:
        ids: int [N], every sentence's ids back to back, documents in order.
        sentence_lengths: int [S], tokens per sentence (sum N).
        sentence_counts: int [D], sentences per document (sum S, each > 0).
        vocab_size: sets the dtype (token_dtype); every id must be below it.

    Raises:
        ValueError: the arrays disagree, or an id is outside the vocab.
    """
    ids = np.asarray(ids)
    lengths = np.asarray(sentence_lengths, dtype=np.int64)
    counts = np.asarray(sentence_counts, dtype=np.int64)
    if int(lengths.sum()) != ids.size or int(counts.sum()) != lengths.size:
        raise ValueError(
            f"{ids.size} ids, {lengths.size} sentences of {int(lengths.sum())} tokens and "
            f"documents of {int(counts.sum())} sentences do not agree"
        )
    if counts.size and counts.min() <= 0:
        raise ValueError("every document must hold at least one sentence")
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(f"an id outside [0, {vocab_size}): {ids.min()}..{ids.max()}")
    dtype = token_dtype(vocab_size)
    data = ids.astype(dtype.newbyteorder("<")).tobytes()
    return data, index_bytes(lengths, np.cumsum(counts), dtype)


def part_prefix(index: int, num_parts: int) -> str:
    """The name of part ``index`` of ``num_parts``, without ``.bin``/``.idx``, after
    preprocess_data.py's ``{prefix}_{key}_sentence``: ``part_prefix(3, 8) ->
    "part-00003-of-00008_text_sentence"``."""
    return f"part-{index:05d}-of-{num_parts:05d}_text_sentence"


def read_index(data: bytes) -> dict[str, np.ndarray | int]:
    """An ``.idx`` file's header and arrays (for checks; Megatron's reader is the reference).

    Raises:
        ValueError: not an index of version 1 (names what differs).
    """
    if data[:9] != INDEX_MAGIC:
        raise ValueError(f"not a Megatron index: magic {data[:9]!r}")
    version, code = struct.unpack_from("<QB", data, 9)
    sequences, documents = struct.unpack_from("<QQ", data, 18)
    if version != INDEX_VERSION:
        raise ValueError(f"index version {version}, not {INDEX_VERSION}")
    at = 34
    lengths = np.frombuffer(data, "<i4", sequences, at)
    at += 4 * sequences
    pointers = np.frombuffer(data, "<i8", sequences, at)
    at += 8 * sequences
    return {
        "dtype_code": code,
        "sequence_lengths": lengths,
        "sequence_pointers": pointers,
        "document_indices": np.frombuffer(data, "<i8", documents, at),
    }


def sentences_of(documents: Sequence[Sequence[Sequence[int]]]) -> tuple[np.ndarray, ...]:
    """Nested documents -> (ids, sentence_lengths, sentence_counts) for dataset_bytes:
    ``[[[5, 6], [7]]] -> ([5, 6, 7], [2, 1], [2])``."""
    lengths = [len(s) for doc in documents for s in doc]
    flat = [i for doc in documents for s in doc for i in s]
    return (
        np.asarray(flat, np.int64),
        np.asarray(lengths, np.int64),
        np.asarray([len(doc) for doc in documents], np.int64),
    )
