"""Static masked-LM masking with Google's rules, vectorised over many rows.

Rules (google-research/bert ``create_masked_lm_predictions``):

- Candidates are all positions except ``[CLS]`` and ``[SEP]`` (found by id).
  With whole-word masking a ``##`` piece joins the group of the candidate
  before it, so a word is masked whole or not at all. (Google's quirk, kept: a
  ``##`` piece right after the middle ``[SEP]`` joins the last word of A.)
  With a word segmenter's joins (:func:`mask_flat`'s ``word_joins``, from
  ``pipeline/core/segment.py``) the characters of a Chinese word form one group too.
- ``num_to_predict = min(max_predictions_per_seq, max(1, round(len(row) *
  masked_lm_prob)))``, where ``len(row)`` counts ``[CLS]`` and both ``[SEP]``
  and ``round`` is Python's (half to even): a full 128-token row gets
  ``round(19.2) = 19`` predictions.
- Candidate groups are shuffled and taken in that order while fewer than
  ``num_to_predict`` positions are masked; a group that would overshoot is
  skipped.
- Each chosen position becomes ``[MASK]`` with probability 0.8, keeps its id
  with 0.1, and becomes a uniformly random id in ``[0, vocab_size)`` with 0.1
  (Google draws from the whole vocabulary, special tokens included).
  ``MaskingConfig.mask_split`` sets other shares (the trainer's ``--mask-split``).

Two entry points apply these rules; each is a pure function of the rows, the config
and the randomness passed in, and neither is draw-for-draw compatible with Google's
``random.Random`` calls (the distribution is the same), as rows are masked in a few
numpy calls instead of per-token Python:

- :func:`mask_flat`, what ``python -m pipeline build`` uses (pipeline/beam/instance_steps.py):
  a row's random numbers are a function of its own 64-bit key, the key that also
  picks its shard and its place in the shard: ``pipeline.core.rng.shard_keys(seed, doc_id,
  dupe_index, count)[i]`` for row ``i`` of a document's dupe pass. So the shards'
  masks are seeded from (seed, document id, dupe index, row index) and a whole
  bucket is masked in one call.
- :func:`mask_instances`, with a ``numpy.random.Generator``: the trainer's dynamic
  re-masking (trainer/data.py, ``numpy_rng(seed, "dynamic", ...)``).

Use (tests: ``python -m pytest tests/pipeline/test_masking.py``):

    vocab = MaskingVocab.from_tokens(vocab_tokens)
    keys = pipeline.core.rng.shard_keys(seed, doc_id, dupe_index, len(offsets) - 1)
    masked, selected = mask_flat(flat, offsets, keys, config, vocab)   # as the pipeline
    rows = mask_instances([x.input_ids for x in nsp_instances], config, vocab, gen)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.core.rng import splitmix64

# Google: 80% [MASK]; then a coin flip between keep (10%) and random id (10%).
# One uniform u per prediction: u < 0.8 mask, u < 0.9 keep, else random id; another split
# (mask, keep, random) moves the two thresholds to mask and 1 - random (1 - 0.1 == 0.9
# exactly, so Google's split draws exactly as before).
GOOGLE_SPLIT = (0.8, 0.1, 0.1)


@dataclass(frozen=True)
class MaskingConfig:
    """Parameters of masking (Google's flag names and defaults)."""

    # Share of a row's tokens (specials counted) to predict, before the cap.
    masked_lm_prob: float = 0.15
    # Cap on predictions per row; the trainer pads masked_lm_positions to it.
    max_predictions_per_seq: int = 20
    # Mask whole words: a "##" piece is masked with the word it continues.
    do_whole_word_mask: bool = False
    # Shares of the predictions that become [MASK], keep their id, get a random id.
    mask_split: tuple[float, float, float] = GOOGLE_SPLIT

    def __post_init__(self) -> None:
        """Raises ValueError naming the field when a value is out of range."""
        p = self.masked_lm_prob
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < p <= 1.0:
            raise ValueError(f"masked_lm_prob must be in (0, 1], got {p!r}")
        cap = self.max_predictions_per_seq
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
            raise ValueError(f"max_predictions_per_seq must be an int >= 1, got {cap!r}")
        if not isinstance(self.do_whole_word_mask, bool):
            raise ValueError(f"do_whole_word_mask must be a bool, got {self.do_whole_word_mask!r}")
        split = self.mask_split
        if (
            not isinstance(split, tuple)
            or len(split) != 3
            or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in split)
            or not all(0.0 <= x <= 1.0 for x in split)
            or abs(sum(split) - 1.0) > 1e-6
        ):
            raise ValueError(
                f"mask_split must be three shares (mask, keep, random) in [0, 1] summing "
                f"to 1, got {split!r}"
            )

    @property
    def thresholds(self) -> tuple[float, float]:
        """(mask_below, keep_below) of the one uniform u per prediction: u < mask_below
        becomes [MASK], else u < keep_below keeps its id, else a random id."""
        return float(self.mask_split[0]), 1.0 - float(self.mask_split[2])


@dataclass(frozen=True, eq=False)
class MaskingVocab:
    """What masking needs to know about the vocabulary.

    Attributes:
        cls_id: id of ``[CLS]`` (never masked).
        sep_id: id of ``[SEP]`` (never masked).
        mask_id: id of ``[MASK]``.
        vocab_size: number of ids; random replacements are drawn from
            ``[0, vocab_size)``.
        is_continuation: bool ``[vocab_size]``, True for ``##`` pieces; needed
            only for whole-word masking. Stored as a read-only copy.
    """

    cls_id: int
    sep_id: int
    mask_id: int
    vocab_size: int
    is_continuation: np.ndarray | None = None

    def __post_init__(self) -> None:
        """Raises ValueError naming the field when a value is invalid."""
        if isinstance(self.vocab_size, bool) or not isinstance(self.vocab_size, int):
            raise ValueError(f"vocab_size must be an int, got {self.vocab_size!r}")
        for name in ("cls_id", "sep_id", "mask_id"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an int, got {value!r}")
            if not 0 <= value < self.vocab_size:
                raise ValueError(f"{name} must be in [0, {self.vocab_size}), got {value}")
        if len({self.cls_id, self.sep_id, self.mask_id}) != 3:
            raise ValueError("cls_id, sep_id and mask_id must be distinct")
        if self.is_continuation is not None:
            flags = np.array(self.is_continuation, dtype=bool)  # a private copy
            if flags.shape != (self.vocab_size,):
                raise ValueError(
                    f"is_continuation must have shape ({self.vocab_size},), got {flags.shape}"
                )
            flags.setflags(write=False)
            object.__setattr__(self, "is_continuation", flags)

    @classmethod
    def from_tokens(cls, tokens: Sequence[str]) -> MaskingVocab:
        """Builds the vocab info from the tokens of ``vocab.txt``, in id order.

        Args:
            tokens: the vocabulary, ``tokens[i]`` being the token of id ``i``.

        Returns:
            A ``MaskingVocab`` with ``is_continuation`` set from ``##`` prefixes.

        Raises:
            ValueError: ``[CLS]``, ``[SEP]`` or ``[MASK]`` is missing.
        """
        index = {token: i for i, token in enumerate(tokens)}
        missing = [t for t in ("[CLS]", "[SEP]", "[MASK]") if t not in index]
        if missing:
            raise ValueError(f"vocabulary lacks special tokens {missing}")
        return cls(
            cls_id=index["[CLS]"],
            sep_id=index["[SEP]"],
            mask_id=index["[MASK]"],
            vocab_size=len(tokens),
            is_continuation=np.array([t.startswith("##") for t in tokens], dtype=bool),
        )


@dataclass(frozen=True, eq=False)
class MaskedInstance:
    """One masked row.

    Attributes:
        input_ids: int32 ``[n]``, the row with predictions replaced.
        masked_lm_positions: int32 ``[k]``, strictly increasing positions.
        masked_lm_ids: int32 ``[k]``, the original ids at those positions.
    """

    input_ids: np.ndarray
    masked_lm_positions: np.ndarray
    masked_lm_ids: np.ndarray


def num_to_predict(num_tokens: np.ndarray | int, config: MaskingConfig) -> np.ndarray:
    """Google's prediction count per row: ``min(cap, max(1, round(n * p)))``.

    ``np.rint`` rounds half to even on the same float64 product, exactly as
    Python 3's ``round`` does (e.g. ``round(2.5) == 2``).

    Args:
        num_tokens: int ``[R]`` (or a scalar), row lengths with specials.
        config: the masking config.

    Returns:
        int64 ``[R]`` (0-d for a scalar), e.g. 19 for 128 tokens at p=0.15.
    """
    rounded = np.rint(np.asarray(num_tokens, dtype=np.int64) * config.masked_lm_prob)
    return np.minimum(config.max_predictions_per_seq, np.maximum(1, rounded)).astype(np.int64)


def mask_instances(
    rows: Sequence[np.ndarray],
    config: MaskingConfig,
    vocab: MaskingVocab,
    gen: np.random.Generator,
    word_joins: Sequence[np.ndarray] | None = None,
) -> list[MaskedInstance]:
    """Masks many rows at once (e.g. all NSP rows of one document's dupe pass).

    Args:
        rows: R rows, each an integer ``[n_r]`` array of ids in
            ``[0, vocab_size)``, such as ``NspInstance.input_ids``. Not modified.
        config: the masking config.
        vocab: special ids, vocabulary size and (for whole-word masking)
            ``is_continuation``.
        gen: the only source of randomness; the result depends only on its state.
        word_joins: optional, one bool ``[n_r]`` array per row: True where a token
            continues the word of the token before it (an MLM shard's ``continues_word``
            column); as :func:`mask_flat`'s ``word_joins``, with whole-word masking only.

    Returns:
        R masked rows, in order. A row without candidates gets no predictions.

    Raises:
        ValueError: a row is not a 1-D integer array, an id is outside
            ``[0, vocab_size)``, whole-word masking is asked for without
            ``vocab.is_continuation``, or ``word_joins`` without whole-word masking or
            not one flag per id.
    """
    if config.do_whole_word_mask and vocab.is_continuation is None:
        raise ValueError("do_whole_word_mask needs MaskingVocab.is_continuation")
    if not rows:
        return []
    flat, offsets = _pack(rows, vocab.vocab_size)
    joins = None
    if word_joins is not None:
        lengths = [len(j) for j in word_joins]
        if not config.do_whole_word_mask or lengths != np.diff(offsets).tolist():
            raise ValueError(
                "word_joins needs do_whole_word_mask and one flag per id of each row: "
                f"{sum(lengths)} flags in {len(lengths)} rows, {len(flat)} ids in {len(rows)}"
            )
        joins = np.concatenate(word_joins).astype(bool, copy=False)
    counts = num_to_predict(offsets[1:] - offsets[:-1], config)
    selected = _select(flat, offsets, counts, vocab, gen, config.do_whole_word_mask, joins)
    masked_flat = flat.copy()
    masked_flat[selected] = _replacements(flat[selected], vocab, gen, config)
    return _unpack(masked_flat, flat, offsets, selected)


def mask_flat(
    flat: np.ndarray,
    offsets: np.ndarray,
    row_keys: np.ndarray,
    config: MaskingConfig,
    vocab: MaskingVocab,
    word_joins: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Masks R rows held flat, with all randomness derived from one key per row.

    The same rules as :func:`mask_instances`, but the random numbers are
    counter-based: the uniform for (row, column, purpose) is SplitMix64 of the
    row's 64-bit key mixed with the column and purpose. A row's masks therefore
    depend only on its key and its ids, never on which rows share the call, so
    a whole bucket of documents is masked in one vectorised call while each
    row stays seeded from (seed, document id, dupe index) through its key.

    Args:
        flat: int ``[N]``, the rows' ids concatenated, each in ``[0, vocab_size)``.
        offsets: int64 ``[R + 1]``, row ``r`` is ``flat[offsets[r]:offsets[r + 1]]``.
        row_keys: uint64 ``[R]``, e.g. from :func:`pipeline.core.rng.shard_keys`.
        word_joins: optional bool ``[N]``, True where a token continues the word of the
            token before it by a word segmenter's words (``pipeline/core/segment.py``;
            a Chinese word's characters). With whole-word masking such a token joins the
            group before it, as a ``##`` piece does; ``##`` pieces still join too.
            None (the default): Google's rule alone.

    Returns:
        (masked int32 ``[N]``, selected int64 ``[S]``): the masked ids and the
        ascending indices into ``flat`` of the predictions; their original ids
        are ``flat[selected]``.

    Raises:
        ValueError: ids outside ``[0, vocab_size)``, mismatched lengths, or
            whole-word masking without ``vocab.is_continuation``, ``word_joins``
            without whole-word masking or of another length than ``flat``.
    """
    if config.do_whole_word_mask and vocab.is_continuation is None:
        raise ValueError("do_whole_word_mask needs MaskingVocab.is_continuation")
    if word_joins is not None and (not config.do_whole_word_mask or len(word_joins) != len(flat)):
        raise ValueError(
            f"word_joins needs do_whole_word_mask and one flag per id: "
            f"{len(word_joins)} flags, {len(flat)} ids"
        )
    flat = np.asarray(flat, dtype=np.int32)
    offsets = np.asarray(offsets, dtype=np.int64)
    if len(row_keys) != len(offsets) - 1 or offsets[-1] != len(flat):
        raise ValueError(
            f"need one key per row and offsets ending at len(flat): {len(row_keys)} keys, "
            f"{len(offsets) - 1} rows, offsets end {offsets[-1]}, {len(flat)} ids"
        )
    if flat.size and (int(flat.min()) < 0 or int(flat.max()) >= vocab.vocab_size):
        raise ValueError(
            f"ids must be in [0, {vocab.vocab_size}), got [{flat.min()}, {flat.max()}]"
        )
    if not len(row_keys):
        return flat.copy(), np.zeros(0, dtype=np.int64)
    draws = _KeyedUniforms(np.asarray(row_keys, dtype=np.uint64))
    counts = num_to_predict(np.diff(offsets), config)
    whole_words = config.do_whole_word_mask
    selected = _select(flat, offsets, counts, vocab, draws, whole_words, word_joins)
    rows = np.searchsorted(offsets, selected, side="right") - 1
    columns = selected - offsets[rows]
    u, v = draws.at(rows, columns, 1), draws.at(rows, columns, 2)
    masked = flat.copy()
    masked[selected] = _replace_with(flat[selected], u, v, vocab, config)
    return masked, selected


class _KeyedUniforms:
    """Uniforms in [0, 1) as a pure function of (row key, column, purpose).

    Stands in for ``np.random.Generator`` in :func:`_select`, which asks it for
    one ``(R, width)`` matrix of shuffle keys (purpose 0).
    """

    _COLUMN = np.uint64(0x9E3779B97F4A7C15)
    _PURPOSE = np.uint64(0xD1B54A32D192ED03)

    def __init__(self, row_keys: np.ndarray):
        self._keys = row_keys

    def at(self, rows: np.ndarray, columns: np.ndarray, purpose: int) -> np.ndarray:
        with np.errstate(over="ignore"):
            x = (
                self._keys[rows]
                + np.asarray(columns, dtype=np.uint64) * self._COLUMN
                + np.uint64(purpose) * self._PURPOSE
            )
        return (splitmix64(x) >> np.uint64(11)).astype(np.float64) * (1.0 / 2**53)

    def random(self, shape: tuple[int, int]) -> np.ndarray:
        rows, width = shape
        if rows != len(self._keys):
            raise AssertionError(f"expected {len(self._keys)} rows of keys, got {rows}")
        grid = np.arange(width, dtype=np.uint64)[None, :]
        return self.at(np.arange(rows)[:, None], grid, 0)


def mask_instance(
    input_ids: np.ndarray,
    config: MaskingConfig,
    vocab: MaskingVocab,
    gen: np.random.Generator,
) -> MaskedInstance:
    """Masks one row; see :func:`mask_instances` for Args and Raises."""
    return mask_instances([input_ids], config, vocab, gen)[0]


def _pack(rows: Sequence[np.ndarray], vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Concatenates rows into int32 ``flat [N]`` with int64 ``offsets [R + 1]``.

    Raises:
        ValueError: a row is not 1-D or not integer, or holds an id outside
            ``[0, vocab_size)``.
    """
    if any(np.ndim(row) != 1 for row in rows):
        raise ValueError("each row must be a 1-D array of ids")
    lengths = np.fromiter((len(row) for row in rows), dtype=np.int64, count=len(rows))
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.concatenate(rows)
    if flat.dtype.kind not in "iu":
        raise ValueError(f"rows must hold integer ids, got dtype {flat.dtype}")
    if flat.size and (int(flat.min()) < 0 or int(flat.max()) >= vocab_size):
        raise ValueError(f"ids must be in [0, {vocab_size}), got [{flat.min()}, {flat.max()}]")
    return flat.astype(np.int32, copy=False), offsets


def _select(
    flat: np.ndarray,
    offsets: np.ndarray,
    counts: np.ndarray,
    vocab: MaskingVocab,
    gen: np.random.Generator,
    whole_words: bool,
    joins: np.ndarray | None = None,
) -> np.ndarray:
    """Google's selection for all rows at once: group, shuffle, take greedily.

    Candidates are grouped into words (one position each unless
    ``whole_words``) and each row's words are shuffled. Without whole words,
    every word has size 1, so Google's walk just takes the first ``count``
    shuffled candidates; with whole words the walk is done per row in
    :func:`_take_words_greedily`.

    Args:
        flat: int32 ``[N]``, all rows concatenated.
        offsets: int64 ``[R + 1]``, row ``r`` is ``flat[offsets[r]:offsets[r + 1]]``.
        counts: int64 ``[R]``, the prediction budget of each row.
        vocab: special ids and ``is_continuation``.
        gen: the source of the shuffles.
        whole_words: group ``##`` pieces with their word.
        joins: with ``whole_words``, optional bool ``[N]`` (``mask_flat``'s
            ``word_joins``): the tokens it marks join the group before them too.

    Returns:
        int64 ``[S]``: chosen indices into ``flat``, ascending.
    """
    (candidates,) = np.nonzero((flat != vocab.cls_id) & (flat != vocab.sep_id))  # (C,)
    bounds = np.searchsorted(candidates, offsets)  # (R + 1,): row r's candidates
    if not whole_words:
        per_row = bounds[1:] - bounds[:-1]
        chosen = _shuffled_prefixes(bounds, np.minimum(per_row, counts), gen)
        return candidates[np.sort(chosen)]
    # A "##" piece continues the previous candidate's word (even across the
    # middle [SEP], as in Google's code), but never across rows.
    starts = ~vocab.is_continuation[flat[candidates]]  # (C,)
    if joins is not None:  # a segmenter's words: a Chinese word's characters are one group
        starts &= ~joins[candidates]
    row_firsts = bounds[:-1]
    starts[row_firsts[row_firsts < len(candidates)]] = True
    word_first = np.flatnonzero(starts)  # (W,) index into candidates
    word_bounds = np.searchsorted(word_first, bounds)  # (R + 1,): row r's words
    shuffled = _shuffled_prefixes(word_bounds, word_bounds[1:] - word_bounds[:-1], gen)
    sizes = np.diff(word_first, append=len(candidates))  # (W,)
    taken = _take_words_greedily(sizes[shuffled], word_bounds, counts)
    word_taken = np.zeros(len(word_first), dtype=bool)
    word_taken[shuffled[taken]] = True
    return candidates[word_taken[np.cumsum(starts) - 1]]


def _shuffled_prefixes(
    bounds: np.ndarray, limits: np.ndarray, gen: np.random.Generator
) -> np.ndarray:
    """Per row, the first ``limits[r]`` items of a random permutation of its range.

    Row ``r`` owns the indices ``[bounds[r], bounds[r + 1])``. They are
    shuffled by argsorting iid uniform keys in a padded ``[R, max size]``
    matrix (one numpy call for all rows); padding gets key 2.0 so it sorts
    after every real key. Taking a prefix of a uniform permutation is Google's
    shuffle-then-walk when every item has size 1.

    Args:
        bounds: int ``[R + 1]``, ascending.
        limits: int ``[R]``, ``0 <= limits[r] <= bounds[r + 1] - bounds[r]``.
        gen: draws ``R * max size`` uniform keys.

    Returns:
        int64 ``[sum(limits)]``: the chosen indices, grouped by row, each row's
        in shuffled order.
    """
    sizes = bounds[1:] - bounds[:-1]  # (R,)
    columns = np.arange(int(sizes.max()) if len(sizes) else 0)
    keys = gen.random((len(sizes), len(columns)))  # (R, width)
    keys[columns >= sizes[:, None]] = 2.0
    order = np.argsort(keys, axis=1)  # (R, width): real items first, shuffled
    return order[columns < limits[:, None]] + np.repeat(bounds[:-1], limits)


def _take_words_greedily(sizes: np.ndarray, bounds: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Google's walk over shuffled words: stop at the budget, skip overshooters.

    Args:
        sizes: int ``[W]``, word sizes in shuffled order, grouped by row.
        bounds: int ``[R + 1]``, row ``r``'s words are ``[bounds[r], bounds[r+1])``.
        counts: int ``[R]``, the budget of each row.

    Returns:
        bool ``[W]``: which of the shuffled words are taken.
    """
    size_list, bound_list = sizes.tolist(), bounds.tolist()
    taken = np.zeros(len(size_list), dtype=bool)
    chosen = []
    for r, budget in enumerate(counts.tolist()):
        masked = 0
        for j in range(bound_list[r], bound_list[r + 1]):
            if masked >= budget:
                break
            if masked + size_list[j] > budget:
                continue  # this word would overshoot the budget
            chosen.append(j)
            masked += size_list[j]
    taken[chosen] = True
    return taken


def _replacements(
    original: np.ndarray, vocab: MaskingVocab, gen: np.random.Generator, config: MaskingConfig
) -> np.ndarray:
    """The 80/10/10 rule (``config.mask_split``): ``[MASK]``, the original id, or a random id.

    Args:
        original: int32 ``[S]``, the ids at the chosen positions.

    Returns:
        int32 ``[S]``, the ids to write there.
    """
    u, v = gen.random((2, len(original)))
    return _replace_with(original, u, v, vocab, config)


def _replace_with(
    original: np.ndarray, u: np.ndarray, v: np.ndarray, vocab: MaskingVocab, config: MaskingConfig
) -> np.ndarray:
    """:func:`_replacements` given its uniforms: ``u`` picks the rule, ``v`` the random id."""
    # floor(v * vocab_size) is uniform on [0, vocab_size) up to ~vocab_size / 2**53;
    # cheaper than gen.integers for small batches. min() guards a round-up.
    random_ids = np.minimum((v * vocab.vocab_size).astype(np.int32), vocab.vocab_size - 1)
    mask_below, keep_below = config.thresholds
    replaced = np.where(u < keep_below, original, random_ids)
    return np.where(u < mask_below, np.int32(vocab.mask_id), replaced).astype(np.int32)


def _unpack(
    masked_flat: np.ndarray, flat: np.ndarray, offsets: np.ndarray, selected: np.ndarray
) -> list[MaskedInstance]:
    """Splits the flat results back into rows (views into shared buffers)."""
    # Predictions per row: selected is ascending, so each row's are contiguous.
    bounds = np.searchsorted(selected, offsets).tolist()
    positions = (selected - np.repeat(offsets[:-1], np.diff(bounds))).astype(np.int32)
    labels = flat[selected]
    starts = offsets.tolist()
    return [
        MaskedInstance(
            input_ids=masked_flat[starts[r] : starts[r + 1]],
            masked_lm_positions=positions[bounds[r] : bounds[r + 1]],
            masked_lm_ids=labels[bounds[r] : bounds[r + 1]],
        )
        for r in range(len(starts) - 1)
    ]
