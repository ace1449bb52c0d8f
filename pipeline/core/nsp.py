"""Next-sentence-prediction instances: Google's algorithm on WordPiece ids.

A faithful port of ``create_instances_from_document`` from google-research/bert
``create_pretraining_data.py``, with masking split out (see
``pipeline/core/masking.py``) and token ids instead of token strings. Given the same
``random.Random`` state it makes the same calls to ``rng.random()`` and
``rng.randint()`` in the same order as Google's function (minus the masking
calls) and so returns the same pairs; ``tests/pipeline/test_nsp.py`` checks
this against a transcription of Google's code.

Per document and dupe pass:

1. ``target_seq_length`` is ``max_seq_length - 3``, or with probability
   ``short_seq_prob`` a random length in ``[2, max_seq_length - 3]``.
2. Sentences ("segments") accumulate into a chunk until it reaches the target
   or the document ends. A random split point makes segments ``A`` and ``B``.
3. Half the time (always, for a one-segment chunk) ``B`` is replaced by
   segments from a random other document (``is_random_next``); the unused
   segments of the chunk are put back for the next chunk.
4. ``truncate_seq_pair`` trims the longer side, from a random end, until the
   pair fits; the row is ``[CLS] A [SEP] B [SEP]``.

Speed: no Python loop runs over tokens. A document's segments are
consecutive in its bucket's flat token array, so A and B (truncated or not)
are contiguous ranges: :func:`plan_document` draws the random numbers and
computes four offsets per instance from segment lengths alone, and
:func:`assemble_rows` gathers all the planned rows of a bucket at once. A
truncation of 32 or more tokens draws its coin flips in one ``getrandbits``
call that consumes the Mersenne Twister exactly as the equivalent ``random()``
calls do (shorter ones loop over the cuts, which is cheaper there).

Use (one document of a bucket, one dupe pass; tests: ``python -m pytest
tests/pipeline/test_nsp.py``):

    rng = pipeline.core.rng.python_rng(seed, "nsp", doc_id, dupe_index)  # as pipeline/beam/instance_steps.py
    instances = create_instances_from_document(bucket, index, NspConfig(), rng,
                                               SpecialIds(cls_id=101, sep_id=102))
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

Segment = Sequence[int] | np.ndarray  # one sentence: 1-D WordPiece ids, non-empty
Document = Sequence[Segment]

# Google tries this many times to draw a random document other than the current one.
_RANDOM_DOCUMENT_TRIES = 10
# From this many coin flips on, truncation draws them with one getrandbits() call.
_VECTORISED_TRUNCATION_MIN = 32


@dataclass(frozen=True)
class NspConfig:
    """Parameters of NSP instance creation (Google's flag names and defaults)."""

    # Hard limit on a row's length, [CLS] and both [SEP] included.
    max_seq_length: int = 128
    # Probability, per document and dupe pass, of a random shorter target length.
    short_seq_prob: float = 0.1

    def __post_init__(self) -> None:
        """Raises ValueError naming the field when a value is out of range."""
        if not _is_int(self.max_seq_length) or self.max_seq_length < 5:
            # 3 special tokens + at least one token each in A and B, and Google's
            # randint(2, max_seq_length - 3) needs max_seq_length - 3 >= 2.
            raise ValueError(
                f"max_seq_length must be an int >= 5 ([CLS] A [SEP] B [SEP] with A and B "
                f"non-empty), got {self.max_seq_length!r}"
            )
        if not _is_real(self.short_seq_prob) or not 0.0 <= self.short_seq_prob <= 1.0:
            raise ValueError(f"short_seq_prob must be in [0, 1], got {self.short_seq_prob!r}")


@dataclass(frozen=True)
class SpecialIds:
    """The vocabulary ids of ``[CLS]`` and ``[SEP]``."""

    cls_id: int
    sep_id: int

    def __post_init__(self) -> None:
        """Raises ValueError naming the field when an id is not a distinct int >= 0."""
        for name in ("cls_id", "sep_id"):
            value = getattr(self, name)
            if not _is_int(value) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        if self.cls_id == self.sep_id:
            raise ValueError(f"cls_id and sep_id must differ, both are {self.cls_id}")


@dataclass(frozen=True, eq=False)
class NspInstance:
    """One unmasked NSP row.

    Attributes:
        input_ids: int32 ``[n]``, ``[CLS] tokens_a [SEP] tokens_b [SEP]``,
            ``5 <= n <= max_seq_length`` (A and B are never empty).
        segment_ids: int8 ``[n]``, 0 up to and including the first ``[SEP]``,
            1 after it.
        is_random_next: True when ``tokens_b`` came from a random document.
    """

    input_ids: np.ndarray
    segment_ids: np.ndarray
    is_random_next: bool


class BucketLayout:
    """The documents of a bucket as offsets into one flat token array.

    Segments of a document are consecutive in the flat array, so ``A``, ``B``
    and their truncations are always one contiguous token range: an instance is
    planned as four offsets (:func:`plan_document`) and all rows are gathered
    at once (:func:`assemble_rows`).

    Attributes:
        seg_starts: token offset of every segment, then the total (``S + 1`` ints).
        doc_starts: index of every document's first segment, then ``S`` (``D + 1``).
    """

    def __init__(
        self,
        segment_lengths: Sequence[int] | np.ndarray,
        segments_per_document: Sequence[int] | np.ndarray,
    ):
        """Raises ValueError naming the document when it or one of its segments is empty."""
        lengths = np.asarray(segment_lengths, dtype=np.int64)
        counts = np.asarray(segments_per_document, dtype=np.int64)
        if int(counts.sum()) != len(lengths):
            raise ValueError(
                f"segments_per_document sums to {int(counts.sum())}, "
                f"but there are {len(lengths)} segment lengths"
            )
        bad = np.flatnonzero(counts <= 0)
        if not len(bad) and len(lengths) and lengths.min() <= 0:
            owner = np.repeat(np.arange(len(counts)), counts)
            bad = owner[lengths <= 0][:1]
        if len(bad):
            raise ValueError(
                f"all_documents[{int(bad[0])}] must be a non-empty list of non-empty segments "
                "(empty ones are removed upstream)"
            )
        self.seg_starts: list[int] = np.concatenate([[0], np.cumsum(lengths)]).tolist()
        self.doc_starts: list[int] = np.concatenate([[0], np.cumsum(counts)]).tolist()

    @property
    def num_documents(self) -> int:
        return len(self.doc_starts) - 1


def plan_document(
    layout: BucketLayout,
    document_index: int,
    config: NspConfig,
    rng: random.Random,
    out: list[tuple[int, int, int, int, int]],
) -> int:
    """Plans the NSP instances of one document for one dupe pass (Google's algorithm).

    Draws from ``rng`` exactly as Google's ``create_instances_from_document``
    does (without its masking calls) but touches only lengths: each instance is
    appended to ``out`` as ``(a_start, a_end, b_start, b_end, is_random_next)``,
    token offsets into the bucket's flat array after truncation.

    Quirk kept from Google: the random-next document is drawn up to 10 times
    until it differs from ``document_index``; if all 10 draws hit the current
    document (e.g. the bucket holds only it) that document is used and the row
    is still labelled random.

    Returns:
        The number of instances appended (at least one: the last segment
        always closes a chunk).
    """
    starts, doc_starts = layout.seg_starts, layout.doc_starts
    first, stop = doc_starts[document_index], doc_starts[document_index + 1]
    num_documents = layout.num_documents
    # randint(a, b) is a + _randbelow(b - a + 1) in CPython; calling it directly
    # skips two Python frames per draw and consumes the generator identically.
    randbelow, uniform = rng._randbelow, rng.random
    max_num_tokens = config.max_seq_length - 3  # room for [CLS], [SEP], [SEP]
    # Usually fill the whole row; sometimes (short_seq_prob) aim shorter to reduce
    # the mismatch with short fine-tuning inputs. A target, not a hard limit.
    target = max_num_tokens
    if uniform() < config.short_seq_prob:
        target = 2 + randbelow(max_num_tokens - 1)  # randint(2, max_num_tokens)

    made = len(out)
    chunk_start = first  # the current chunk is segments [chunk_start, i]
    i = first
    while i < stop:
        if i == stop - 1 or starts[i + 1] - starts[chunk_start] >= target:
            num_segments = i + 1 - chunk_start
            # a_end: how many segments of the chunk go into A.
            a_end = 1 if num_segments == 1 else 1 + randbelow(num_segments - 1)
            a0, a1 = starts[chunk_start], starts[chunk_start + a_end]
            if num_segments == 1 or uniform() < 0.5:
                is_random = 1
                for _ in range(_RANDOM_DOCUMENT_TRIES):
                    other = randbelow(num_documents)  # randint(0, D - 1)
                    if other != document_index:
                        break
                other_first, other_stop = doc_starts[other], doc_starts[other + 1]
                j = other_first + randbelow(other_stop - other_first)  # random start
                # Segments from there until B reaches target - len(A) or the
                # document ends; at least one.
                b0, target_b = starts[j], target - (a1 - a0)
                j += 1
                while j < other_stop and starts[j] - b0 < target_b:
                    j += 1
                b1 = starts[j]
                # Put the unused segments back so they start the next chunk.
                i = chunk_start + a_end - 1
            else:
                is_random, b0, b1 = 0, a1, starts[i + 1]
            if (a1 - a0) + (b1 - b0) > max_num_tokens:
                a_front, a_back, b_front, b_back = truncation_cuts(
                    a1 - a0, b1 - b0, max_num_tokens, rng
                )
                a0, a1, b0, b1 = a0 + a_front, a1 - a_back, b0 + b_front, b1 - b_back
            out.append((a0, a1, b0, b1, is_random))
            chunk_start = i + 1
        i += 1
    return len(out) - made


def assemble_rows(
    tokens: np.ndarray, plans: np.ndarray, special_ids: SpecialIds
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Lays out planned rows ``[CLS] A [SEP] B [SEP]`` with one gather.

    Args:
        tokens: 1-D ids, the bucket's flat token array.
        plans: int ``[R, 5]`` rows of :func:`plan_document`.
        special_ids: ids of ``[CLS]`` and ``[SEP]``.

    Returns:
        ``(input_ids, segment_ids, offsets)``: ids ``[N]`` in ``tokens``' dtype,
        int8 ``[N]``, int64 ``[R + 1]`` (row ``r`` is ``[offsets[r], offsets[r + 1])``).
    """
    plans = np.asarray(plans, dtype=np.int64).reshape(-1, 5)
    source, in_b, offsets = _row_sources(plans)
    b_first = offsets[:-1] + (plans[:, 1] - plans[:, 0]) + 1  # the first [SEP]
    padded = np.empty(len(tokens) + 1, dtype=tokens.dtype)
    padded[:-1] = tokens
    padded[-1] = 0
    input_ids = padded[source]
    input_ids[offsets[:-1]] = special_ids.cls_id
    input_ids[b_first] = special_ids.sep_id
    input_ids[offsets[1:] - 1] = special_ids.sep_id
    segment_ids = in_b.view(np.int8)  # 1 after the first [SEP]
    return input_ids, segment_ids, offsets


def assemble_joins(joins: np.ndarray, plans: np.ndarray) -> np.ndarray:
    """A per-token flag of the bucket (e.g. a segmenter's word joins) laid out as
    :func:`assemble_rows` lays out the ids, False at the special tokens and at the first
    token of A and of B: a word cut by truncation, or B's first word after A's last, is
    not joined to what precedes it in the row.

    Args:
        joins: bool ``[T]``, one flag per token of the bucket's flat token array.
        plans: int ``[R, 5]`` rows of :func:`plan_document`.

    Returns:
        bool ``[N]``, aligned with :func:`assemble_rows`' ``input_ids``.
    """
    plans = np.asarray(plans, dtype=np.int64).reshape(-1, 5)
    source, _, offsets = _row_sources(plans)
    padded = np.zeros(len(joins) + 1, dtype=bool)
    padded[:-1] = joins
    out = padded[source]
    len_a = plans[:, 1] - plans[:, 0]
    for first in (offsets[:-1], offsets[:-1] + 1, offsets[:-1] + len_a + 1):
        out[first] = False  # [CLS], A's first token, the first [SEP]
    out[offsets[:-1] + len_a + 2] = False  # B's first token
    out[offsets[1:] - 1] = False  # the last [SEP]
    return out


def _row_sources(plans: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each position of the planned rows, the index of its token in the bucket.

    Returns:
        ``(source, in_b, offsets)``: int64 ``[N]`` indices into the flat tokens padded
        with one value at the end (the special positions read a neighbour or that pad, and
        are overwritten), bool ``[N]`` (after the first ``[SEP]``), int64 ``[R + 1]``.
    """
    a0, a1, b0, b1 = plans[:, 0], plans[:, 1], plans[:, 2], plans[:, 3]
    len_a = a1 - a0
    lengths = len_a + (b1 - b0) + 3
    offsets = np.zeros(len(plans) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    # p: position within the row. Source index: a0 - 1 + p through the first
    # [SEP] (position len_a + 1), then b0 - len_a - 2 + p; the three special
    # positions read a neighbour (or the pad at -1 / len(tokens)) and are overwritten.
    position = np.arange(offsets[-1]) - np.repeat(offsets[:-1], lengths)
    len_a_each = np.repeat(len_a, lengths)
    in_b = position > len_a_each + 1
    source = np.where(in_b, np.repeat(b0 - len_a - 2, lengths), np.repeat(a0 - 1, lengths))
    source += position
    return source, in_b, offsets


def create_instances_from_document(
    all_documents: Sequence[Document],
    document_index: int,
    config: NspConfig,
    rng: random.Random,
    special_ids: SpecialIds,
) -> list[NspInstance]:
    """Creates the NSP instances of one document for one dupe pass (Google's algorithm).

    The one-document form of :func:`plan_document` + :func:`assemble_rows`
    (the pipeline plans whole buckets and assembles them at once).

    Args:
        all_documents: the documents random-next segments are drawn from (a
            bucket of documents at scale; its order must itself be
            deterministic, e.g. sorted by document id, since draws are
            indices). Each document is a non-empty list of non-empty segments;
            a segment is a list of int or a 1-D integer numpy array of
            WordPiece ids (values must fit in int32).
        document_index: index in ``all_documents`` of the document to process.
        config: lengths and probabilities.
        rng: the only source of randomness; advanced exactly as Google's code
            advances it (without the masking calls).
        special_ids: ids of ``[CLS]`` and ``[SEP]``.

    Returns:
        The instances in document order; at least one.

    Raises:
        ValueError: ``document_index`` is out of range, or a document or
            segment is empty.
    """
    if not 0 <= document_index < len(all_documents):
        raise ValueError(
            f"document_index must be in [0, {len(all_documents)}), got {document_index!r}"
        )
    segments = [segment for document in all_documents for segment in document]
    layout = BucketLayout([len(s) for s in segments], [len(d) for d in all_documents])
    plans: list[tuple[int, int, int, int, int]] = []
    plan_document(layout, document_index, config, rng, plans)
    tokens = np.concatenate([np.asarray(s, dtype=np.int32) for s in segments])
    input_ids, segment_ids, offsets = assemble_rows(tokens, np.array(plans), special_ids)
    bounds = zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True)
    return [
        NspInstance(input_ids[start:end], segment_ids[start:end], bool(plan[4]))
        for plan, (start, end) in zip(plans, bounds, strict=True)
    ]


def truncation_cuts(
    len_a: int, len_b: int, max_num_tokens: int, rng: random.Random
) -> tuple[int, int, int, int]:
    """Google's ``truncate_seq_pair``, computed on lengths.

    Google's loop: while ``len(a) + len(b) > max_num_tokens``, take the longer
    list (B on a tie) and, if ``rng.random() < 0.5``, delete its first token,
    else its last. Which side is cut at each step depends only on the lengths,
    so only the coin flips are random; this returns how many tokens to cut from
    each end instead of cutting them one by one. Example: ``(5, 3, 6)`` cuts A
    twice (5 > 3, then 4 > 3), so with flips front, back it returns
    ``(1, 1, 0, 0)``.

    Args:
        len_a: ``len(tokens_a)`` before truncation, >= 1.
        len_b: ``len(tokens_b)`` before truncation, >= 1.
        max_num_tokens: the limit on the sum, >= 2.
        rng: advanced by exactly ``max(0, len_a + len_b - max_num_tokens)``
            ``random()`` draws, as Google's loop does.

    Returns:
        ``(a_front, a_back, b_front, b_back)``: tokens to cut from each end.
    """
    excess = len_a + len_b - max_num_tokens
    if excess <= 0:
        return 0, 0, 0, 0
    # getrandbits() mirrors random() only for the Mersenne Twister itself, not
    # for subclasses that override random().
    if excess < _VECTORISED_TRUNCATION_MIN or type(rng) is not random.Random:
        return _truncation_cuts_loop(len_a, len_b, max_num_tokens, rng)
    front = _coin_flips(rng, excess)
    # Steps [0, n1) cut the longer side X until A == B (X = A) or B == A - 1
    # (X = B); after that the sides alternate, starting with the other side Y.
    a_is_longer = len_a > len_b
    n1 = min(excess, len_a - len_b if a_is_longer else len_b - len_a + 1)
    x_front = int(np.count_nonzero(front[:n1]) + np.count_nonzero(front[n1 + 1 :: 2]))
    x_total = n1 + len(range(n1 + 1, excess, 2))
    y_front = int(np.count_nonzero(front[n1::2]))
    y_total = len(range(n1, excess, 2))
    x_cuts, y_cuts = (x_front, x_total - x_front), (y_front, y_total - y_front)
    return (*x_cuts, *y_cuts) if a_is_longer else (*y_cuts, *x_cuts)


def _truncation_cuts_loop(
    len_a: int, len_b: int, max_num_tokens: int, rng: random.Random
) -> tuple[int, int, int, int]:
    """:func:`truncation_cuts` as Google's loop: one step per cut token."""
    cuts = [0, 0, 0, 0]  # a_front, a_back, b_front, b_back
    while len_a + len_b > max_num_tokens:
        if len_a > len_b:
            side = 0
            len_a -= 1
        else:
            side = 2
            len_b -= 1
        cuts[side if rng.random() < 0.5 else side + 1] += 1
    return cuts[0], cuts[1], cuts[2], cuts[3]


def _coin_flips(rng: random.Random, count: int) -> np.ndarray:
    """Returns ``[rng.random() < 0.5 for _ in range(count)]`` as bool ``[count]``.

    CPython's ``random()`` takes two 32-bit Mersenne Twister outputs ``w1, w2``
    and returns ``((w1 >> 5) * 2**26 + (w2 >> 6)) / 2**53``, which is < 0.5
    exactly when ``w1 < 2**31``. ``getrandbits(64 * count)`` consumes the same
    ``2 * count`` outputs, placing output ``k`` at bits ``[32k, 32k + 32)``, so
    both leave the generator in the same state.
    """
    raw = rng.getrandbits(64 * count).to_bytes(8 * count, "little")
    words = np.frombuffer(raw, dtype="<u4")
    return words[0::2] < 2**31


def _is_int(value: object) -> bool:
    """True for an int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    """True for an int or float that is not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)
