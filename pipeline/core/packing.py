"""MLM-only rows: contiguous sentences packed up to ``max_seq_length``, RoBERTa's way.

A row is ``[CLS]`` + contiguous sentences + ``[SEP]``, one segment, no NSP label:

- ``doc_sentences``: a row never crosses a document boundary (RoBERTa's DOC-SENTENCES);
- ``full_sentences``: rows fill up across documents, with a ``[SEP]`` where one document
  ends and the next begins (RoBERTa's FULL-SENTENCES).

Sentences go into the current row while they fit; the next one starts a new row, so a
document longer than a row continues in the next row, cut at a sentence boundary. A
sentence longer than a row's room is cut in pieces, never dropped: its first piece fills
the current row's room, whole rows follow, and its last piece starts the next row.

Use (tests: ``python -m pytest tests/pipeline/test_packing.py``):

    pieces, row_docs = plan_packed_rows(lengths, counts, capacity=126, cross_documents=True)
    ids, offsets = assemble_packed_rows(tokens, pieces, cls_id=2, sep_id=3)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

PACKINGS = ("doc_sentences", "full_sentences")


def plan_packed_rows(
    lengths: Sequence[int], counts: Sequence[int], capacity: int, cross_documents: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Which tokens each packed row holds.

    Args:
        lengths: int ``[S]``, the token count of each sentence, documents one after the
            other (their tokens are contiguous in the bucket's flat token array).
        counts: int ``[D]``, sentences per document (sum: S).
        capacity: tokens a row holds besides ``[CLS]`` and the last ``[SEP]``
            (``max_seq_length - 2``); a separating ``[SEP]`` counts as one.
        cross_documents: ``full_sentences`` (True) or ``doc_sentences`` (False).

    Returns:
        ``(pieces, row_docs)``: int64 ``[K, 3]`` rows ``(row, start, stop)`` in row order,
        each a contiguous run ``tokens[start:stop]`` of one document (a row's pieces after
        its first each follow a ``[SEP]``); int64 ``[R]``, the document each row starts in
        (non-decreasing).

    Raises:
        ValueError: ``capacity < 1`` or ``counts`` not summing to ``len(lengths)``.
    """
    if capacity < 1:
        raise ValueError(f"capacity must be at least 1, got {capacity}")
    lengths = [int(n) for n in lengths]
    counts = [int(c) for c in counts]
    if sum(counts) != len(lengths):
        raise ValueError(f"counts sum to {sum(counts)} but there are {len(lengths)} sentences")
    pieces: list[list[int]] = []  # [row, start, stop, doc]
    row_docs: list[int] = []
    used = 0  # tokens of the last row besides [CLS] and its last [SEP]

    def new_row(doc: int, start: int, stop: int) -> None:
        nonlocal used
        row_docs.append(doc)
        pieces.append([len(row_docs) - 1, start, stop, doc])
        used = stop - start

    token = 0
    sentences = iter(lengths)
    for doc, count in enumerate(counts):
        for _ in range(count):
            n = next(sentences)
            start, stop = token, token + n
            token = stop
            if n == 0:
                continue
            last = pieces[-1] if pieces and (cross_documents or pieces[-1][3] == doc) else None
            sep = int(last is not None and last[3] != doc)
            if last is not None and used + sep + n <= capacity:
                if sep or last[2] != start:
                    pieces.append([last[0], start, stop, doc])
                else:
                    last[2] = stop
                used += sep + n
                continue
            if last is not None and n > capacity and capacity - used - sep > 0:
                # A sentence longer than a row: its first piece fills this row's room.
                room = capacity - used - sep
                if sep or last[2] != start:
                    pieces.append([last[0], start, start + room, doc])
                else:
                    last[2] = start + room
                start += room
            while stop - start > capacity:
                new_row(doc, start, start + capacity)
                start += capacity
            new_row(doc, start, stop)
    out = np.array([p[:3] for p in pieces], dtype=np.int64).reshape(-1, 3)
    return out, np.array(row_docs, dtype=np.int64)


def packed_row_lengths(pieces: np.ndarray, num_rows: int) -> np.ndarray:
    """int64 ``[R]``: each row's length, ``[CLS]``, separators and the last ``[SEP]`` in."""
    sizes = np.bincount(pieces[:, 0], weights=pieces[:, 2] - pieces[:, 1], minlength=num_rows)
    separators = np.bincount(pieces[:, 0], minlength=num_rows) - 1
    return sizes.astype(np.int64) + separators + 2


def assemble_packed_rows(
    tokens: np.ndarray, pieces: np.ndarray, num_rows: int, cls_id: int, sep_id: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Lay out the planned rows: ``[CLS] piece ([SEP] piece)* [SEP]``.

    Args:
        tokens: 1-D ids, the bucket's flat token array.
        pieces: from :func:`plan_packed_rows`.
        num_rows: R, its ``len(row_docs)``.
        cls_id, sep_id: the special ids.

    Returns:
        ``(input_ids, source, offsets)``: ids ``[N]`` in ``tokens``' dtype; int64 ``[N]``,
        each position's index into ``tokens`` (-1 at ``[CLS]``/``[SEP]``, -2 at a piece's
        first token: where a word cut by packing restarts); int64 ``[R + 1]``.
    """
    lengths = packed_row_lengths(pieces, num_rows)
    offsets = np.zeros(num_rows + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    sizes = pieces[:, 2] - pieces[:, 1]
    # A piece's first position: after [CLS], or after the row's previous pieces and their
    # separating [SEP]s (the running sum of size + 1 since the row's first piece).
    first = np.ones(len(pieces), dtype=bool)
    first[1:] = pieces[1:, 0] != pieces[:-1, 0]
    before = np.cumsum(sizes + 1) - (sizes + 1)
    at = offsets[pieces[:, 0]] + 1 + before - np.maximum.accumulate(np.where(first, before, 0))
    within = np.arange(int(sizes.sum())) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    source = np.full(int(offsets[-1]), -1, dtype=np.int64)
    source[np.repeat(at, sizes) + within] = np.repeat(pieces[:, 1], sizes) + within
    input_ids = np.full(len(source), sep_id, dtype=tokens.dtype)
    real = source >= 0
    input_ids[real] = tokens[source[real]]
    input_ids[offsets[:-1]] = cls_id
    source[at] = -2  # a piece's first token continues no word of the row
    return input_ids, source, offsets


def continues_word(
    input_ids: np.ndarray,
    source: np.ndarray,
    is_continuation: np.ndarray,
    joins: np.ndarray | None = None,
) -> np.ndarray:
    """bool ``[N]``: True where a token continues the word of the token before it in the
    row: a ``##`` piece, or a segmenter's join (``joins``, per token of the bucket); False
    at ``[CLS]``/``[SEP]`` and at a piece's first token (:func:`assemble_packed_rows`'s
    ``source`` -1 and -2)."""
    out = is_continuation[input_ids.astype(np.int64)]
    if joins is not None:
        real = source >= 0
        out[real] |= joins[source[real]]
    out[source < 0] = False
    return out
