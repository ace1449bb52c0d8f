"""Next-sentence-prediction instances: Google's algorithm on WordPiece ids.

A faithful port of ``create_instances_from_document`` from google-research/bert
``create_pretraining_data.py``, with masking split out (see
``pipeline/masking.py``) and token ids instead of token strings. Given the same
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

Speed: no Python loop runs over tokens. Truncation is computed on lengths
(tokens to cut per end) and the row is assembled with list/numpy slices; a
truncation of 32 or more tokens draws its coin flips in one ``getrandbits``
call that consumes the Mersenne Twister exactly as the equivalent ``random()``
calls do (shorter ones loop over the cuts, which is cheaper there).

Use (one document of a bucket, one dupe pass; tests: ``python -m pytest
tests/pipeline/test_nsp.py``):

    rng = pipeline.rng.python_rng(seed, doc_id, dupe_index)
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


def create_instances_from_document(
    all_documents: Sequence[Document],
    document_index: int,
    config: NspConfig,
    rng: random.Random,
    special_ids: SpecialIds,
) -> list[NspInstance]:
    """Creates the NSP instances of one document for one dupe pass (Google's algorithm).

    Quirk kept from Google: the random-next document is drawn up to 10 times
    until it differs from ``document_index``; if all 10 draws hit the current
    document (e.g. ``all_documents`` holds only it) that document is used and
    the row is still labelled ``is_random_next=True``.

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
        The instances in document order; at least one, since the last segment
        always closes a chunk.

    Raises:
        ValueError: ``document_index`` is out of range, the document is empty,
            or a segment used (of this document or the random document) is empty.
    """
    if not 0 <= document_index < len(all_documents):
        raise ValueError(
            f"document_index must be in [0, {len(all_documents)}), got {document_index!r}"
        )
    document = all_documents[document_index]
    lengths = _segment_lengths(document, document_index)
    max_num_tokens = config.max_seq_length - 3  # room for [CLS], [SEP], [SEP]
    # Usually fill the whole row; sometimes (short_seq_prob) aim shorter to reduce
    # the mismatch with short fine-tuning inputs. A target, not a hard limit.
    target_seq_length = max_num_tokens
    if rng.random() < config.short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)

    instances = []
    chunk_start = 0  # the current chunk is document[chunk_start : i + 1]
    current_length = 0
    i = 0
    while i < len(document):
        current_length += lengths[i]
        if i == len(document) - 1 or current_length >= target_seq_length:
            chunk = document[chunk_start : i + 1]
            # a_end: how many segments of the chunk go into A.
            a_end = 1 if len(chunk) == 1 else rng.randint(1, len(chunk) - 1)
            segments_a = chunk[:a_end]
            len_a = sum(lengths[chunk_start : chunk_start + a_end])
            is_random_next = len(chunk) == 1 or rng.random() < 0.5
            if is_random_next:
                segments_b = _random_next_segments(
                    all_documents, document_index, target_seq_length - len_a, rng
                )
                # Put the unused segments back so they start the next chunk.
                i -= len(chunk) - a_end
            else:
                segments_b = chunk[a_end:]
            input_ids, segment_ids = _make_row(
                segments_a, segments_b, max_num_tokens, rng, special_ids
            )
            instances.append(NspInstance(input_ids, segment_ids, is_random_next))
            chunk_start = i + 1
            current_length = 0
        i += 1
    return instances


def _random_next_segments(
    all_documents: Sequence[Document],
    document_index: int,
    target_b_length: int,
    rng: random.Random,
) -> list[Segment]:
    """Draws segments B from a random document, Google's way.

    Args:
        all_documents: as for :func:`create_instances_from_document`.
        document_index: the current document, avoided for up to 10 draws.
        target_b_length: segments are taken from a random start until B has
            at least this many tokens (or the document ends); may be <= 0,
            in which case one segment is taken.
        rng: advanced by the document draws and one start draw.

    Returns:
        One or more consecutive segments of the random document.

    Raises:
        ValueError: the random document is empty or a taken segment is empty.
    """
    for _ in range(_RANDOM_DOCUMENT_TRIES):
        random_document_index = rng.randint(0, len(all_documents) - 1)
        if random_document_index != document_index:
            break
    random_document = all_documents[random_document_index]
    if not len(random_document):
        raise ValueError(f"all_documents[{random_document_index}] is empty")
    random_start = rng.randint(0, len(random_document) - 1)
    segments_b = []
    len_b = 0
    for segment in random_document[random_start:]:
        if not len(segment):
            raise ValueError(f"all_documents[{random_document_index}] has an empty segment")
        segments_b.append(segment)
        len_b += len(segment)
        if len_b >= target_b_length:
            break
    return segments_b


def _make_row(
    segments_a: Sequence[Segment],
    segments_b: Sequence[Segment],
    max_num_tokens: int,
    rng: random.Random,
    special_ids: SpecialIds,
) -> tuple[np.ndarray, np.ndarray]:
    """Truncates the pair (Google's ``truncate_seq_pair``) and lays out the row.

    Args:
        segments_a: the segments of A, in order.
        segments_b: the segments of B, in order.
        max_num_tokens: the limit on ``len(tokens_a) + len(tokens_b)``.
        rng: advanced by one ``random()`` per truncated token.
        special_ids: ids of ``[CLS]`` and ``[SEP]``.

    Returns:
        ``(input_ids, segment_ids)``: int32 ``[n]`` and int8 ``[n]``.
    """
    tokens_a = _concat(segments_a)
    tokens_b = _concat(segments_b)
    a_front, a_back, b_front, b_back = truncation_cuts(
        len(tokens_a), len(tokens_b), max_num_tokens, rng
    )
    tokens_a = tokens_a[a_front : len(tokens_a) - a_back]
    tokens_b = tokens_b[b_front : len(tokens_b) - b_back]
    len_a, len_b = len(tokens_a), len(tokens_b)
    assert len_a >= 1 and len_b >= 1, (len_a, len_b)  # as Google asserts
    input_ids = np.empty(len_a + len_b + 3, dtype=np.int32)
    input_ids[0] = special_ids.cls_id
    input_ids[1 : len_a + 1] = tokens_a
    input_ids[len_a + 1] = special_ids.sep_id
    input_ids[len_a + 2 : -1] = tokens_b
    input_ids[-1] = special_ids.sep_id
    segment_ids = np.zeros(len_a + len_b + 3, dtype=np.int8)
    segment_ids[len_a + 2 :] = 1
    return input_ids, segment_ids


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


def _concat(segments: Sequence[Segment]) -> Segment:
    """Concatenates segments: one segment as is, numpy arrays with numpy, lists as a list.

    Lists of Python ints are cheaper to join as lists than via numpy (which
    would convert each list first); the row is converted once, on assembly.
    """
    if len(segments) == 1:
        return segments[0]
    if isinstance(segments[0], np.ndarray):
        return np.concatenate(segments)
    tokens: list[int] = []
    for segment in segments:
        tokens.extend(segment)
    return tokens


def _segment_lengths(document: Document, document_index: int) -> list[int]:
    """Returns the segment lengths, refusing empty documents and segments.

    Raises:
        ValueError: the document or one of its segments is empty.
    """
    lengths = [len(segment) for segment in document]
    if not lengths or min(lengths) == 0:
        raise ValueError(
            f"all_documents[{document_index}] must be a non-empty list of non-empty segments "
            "(empty ones are removed upstream)"
        )
    return lengths


def _is_int(value: object) -> bool:
    """True for an int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    """True for an int or float that is not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)
