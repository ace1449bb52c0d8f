"""MLM-only rows: contiguous sentences packed up to ``max_seq_length``, RoBERTa's way.

A row is ``[CLS]`` + contiguous sentences + ``[SEP]``, one segment, no NSP label:

- ``doc_sentences``: a row never crosses a document boundary (RoBERTa's DOC-SENTENCES);
- ``full_sentences``: rows fill up across documents, with a ``[SEP]`` between the runs of
  two documents (RoBERTa's FULL-SENTENCES).

A document's sentences go into rows in order, whole, while they fit; the next one goes on
in another row, so a document longer than a row is cut at sentence boundaries. A sentence
longer than a row is cut in pieces, never dropped: its first piece fills the room a row
has left, whole rows follow, and its last piece starts a row.

``full_sentences`` keeps ``PACKING_WINDOW`` documents in flight (a bucket's, in its order):
a row takes the next sentence of the document it holds last while it fits, then the next
sentence of the first other document in flight that fits the room left, and so on; a
document that leaves a row does not come back into it, and one that ends makes room for
the next. Filling the room this way instead of closing the row at the first sentence that
does not fit is what fills the rows: on the main job's corpus (mean sentence 23 tokens),
0.971 of a row's slots hold a token at 128 instead of 0.881 with one document at a time
(0.994 and 0.961 at 512; bench/mlm_rows.py, docs/results.md).

Use (tests: ``python -m pytest tests/pipeline/test_mlm_rows.py``):

    pieces, row_docs = plan_packed_rows(lengths, counts, capacity=126, cross_documents=True)
    ids, offsets = assemble_packed_rows(tokens, pieces, cls_id=2, sep_id=3)
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import numpy as np

PACKINGS = ("doc_sentences", "full_sentences")
# full_sentences: documents in flight whose next sentence may fill a row's room. 16: 0.964
# of the slots at 128 on the main job's corpus (4: 0.942; 1, RoBERTa's one document after
# the other: 0.881).
PACKING_WINDOW = 16


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
        its first each follow a ``[SEP]``, and are of other documents); int64 ``[R]``, the
        document each row starts in.

    Raises:
        ValueError: ``capacity < 1`` or ``counts`` not summing to ``len(lengths)``.
    """
    if capacity < 1:
        raise ValueError(f"capacity must be at least 1, got {capacity}")
    lengths = [int(n) for n in lengths]
    counts = [int(c) for c in counts]
    if sum(counts) != len(lengths):
        raise ValueError(f"counts sum to {sum(counts)} but there are {len(lengths)} sentences")
    if cross_documents:
        return _plan_in_flight(lengths, counts, capacity, PACKING_WINDOW)
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


def _plan_in_flight(
    lengths: list[int], counts: list[int], capacity: int, window: int
) -> tuple[np.ndarray, np.ndarray]:
    """``full_sentences`` with ``window`` documents in flight (module docstring).

    A document in flight is ``[doc, ends, i, at]``: the token ends of its sentences, the
    next sentence ``i`` and the next token ``at`` (inside sentence ``i`` when a sentence
    longer than a row was cut). The whole sentences that fit a row's room are found with
    one bisection, not one step per sentence (the plan's cost is per piece of a row)."""
    documents, token, sentence = [], 0, 0
    for doc, count in enumerate(counts):
        ends, first = [], None
        for n in lengths[sentence : sentence + count]:
            if n:
                first = token if first is None else first
                ends.append(token + n)
            token += n
        if ends:
            documents.append([doc, ends, 0, first])
        sentence += count
    documents.reverse()  # a stack: pop() gives the next document in bucket order
    flight: list[list] = []
    pieces: list[list[int]] = []  # [row, start, stop]
    row_docs: list[int] = []

    def fits(entry, room: int) -> int:
        """Tokens of ``entry`` that go into ``room``: its whole sentences that fit, or for
        a sentence longer than a row, ``room`` of it; 0 if neither."""
        _, ends, i, at = entry
        j = bisect.bisect_right(ends, at + room, lo=i)
        if j > i:
            return ends[j - 1] - at
        return room if ends[i] - at > capacity and room > 0 else 0

    while documents or flight:
        while documents and len(flight) < window:
            flight.append(documents.pop())
        row, used, last, left = len(row_docs), 0, None, set()
        while used < capacity:
            # The document the row holds last (no [SEP]), then the others in flight, in order.
            chosen, take, sep = None, 0, 0
            if last is not None:
                take = fits(flight[last], capacity - used)
                chosen = last if take else None
            if chosen is None:
                sep = int(used > 0)
                for d, entry in enumerate(flight):
                    if d != last and entry[0] not in left:
                        take = fits(entry, capacity - used - sep)
                        if take:
                            chosen = d
                            break
            if chosen is None:
                break
            entry = flight[chosen]
            doc, ends, _, start = entry
            if chosen == last:
                pieces[-1][2] = start + take
            else:
                if last is not None:
                    left.add(flight[last][0])
                if not used:
                    row_docs.append(doc)
                pieces.append([row, start, start + take])
            used += take + sep
            entry[3] = start + take
            entry[2] = bisect.bisect_right(ends, entry[3], lo=entry[2])
            last = chosen
            if entry[2] == len(ends):  # the document ends: the next one comes into flight
                flight.pop(chosen)
                left.add(doc)
                last = None
                if documents:
                    flight.append(documents.pop())
        if not used:
            raise AssertionError("no sentence fits an empty row")
    out = np.array(pieces, dtype=np.int64).reshape(-1, 3)
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
