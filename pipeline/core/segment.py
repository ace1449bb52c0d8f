"""Word segmentation for whole-word masking of Chinese: which tokens continue a word.

Google's whole-word rule (``pipeline/core/masking.py``) joins a token to the word before
it when it is a ``##`` piece. A Chinese word of two or three characters has no ``##``
piece: BERT's basic tokenizer makes every CJK ideograph its own token, so the rule masks
single characters. With a segmenter (``--wwm_segmenter jieba``), words are found on the
original sentence, and an ideograph *joins* the token before it when both are ideographs
of one segmenter word. The ids stay single characters; only the masking units change.
Latin words keep Google's ``##`` rule (masking applies both).

"Ideograph" is BERT's ``_is_chinese_char`` (CJK Unified Ideographs and their
extensions, compatibility ideographs): kana and hangul are not in it, and the
tokenizer keeps them in words with ``##`` pieces, so the ``##`` rule already holds there.

Use (tests: ``python -m pytest tests/pipeline/test_segment.py``):

    segmenter = load_segmenter("jieba")                  # once per worker
    encodings = tokenizer.encode_batch(sentences, add_special_tokens=False)
    joins = word_joins(sentences, [e.offsets for e in encodings], segmenter)
    # joins: bool [total tokens]; True where a token continues the previous token's word
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

import numpy as np

# --wwm_segmenter values; "none" is Google's rule alone.
SEGMENTERS = ("none", "jieba")
# The package extra that installs them: pip install 'bert-pipeline[cjk]'.
EXTRA = "cjk"

# BERT's _is_chinese_char ranges (google-research/bert tokenization.py), inclusive.
IDEOGRAPH_RANGES = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
)
_IDEOGRAPH = re.compile("[" + "".join(f"{chr(a)}-{chr(b)}" for a, b in IDEOGRAPH_RANGES) + "]")


def is_ideograph(codes: np.ndarray) -> np.ndarray:
    """BERT's ``_is_chinese_char`` on code points: uint32 ``[n]`` -> bool ``[n]``.

    Example: the code points of ``"BERT模型"`` -> ``[F, F, F, F, T, T]``.
    """
    out = np.zeros(codes.shape, dtype=bool)
    for low, high in IDEOGRAPH_RANGES:
        out |= (codes >= low) & (codes <= high)
    return out


class JiebaSegmenter:
    """jieba's default ("accurate") mode with its HMM for unknown words, on its own
    dictionary: deterministic, so every worker finds the same words.

    Raises:
        ImportError: jieba is not installed (names the extra to install).
    """

    name = "jieba"

    def __init__(self) -> None:
        jieba = _import_jieba()
        jieba.setLogLevel(logging.WARNING)  # its dictionary-loading lines on every worker
        self.version = jieba.__version__
        self._tokenizer = jieba.Tokenizer()  # its own dictionary, not the global one
        self._tokenizer.initialize()

    def word_lengths(self, sentence: str) -> list[int]:
        """The lengths in characters of the sentence's words, in order (they sum to
        ``len(sentence)``: jieba keeps every character, whitespace included).

        Example: ``"自然语言处理"`` -> ``[4, 2]`` (自然语言 处理).
        """
        return [len(word) for word in self._tokenizer.cut(sentence, HMM=True)]


def load_segmenter(name: str) -> JiebaSegmenter | None:
    """The segmenter called ``name`` (one of :data:`SEGMENTERS`), or None for ``"none"``.

    Raises:
        ValueError: an unknown name.
        ImportError: its package is missing; the message names the extra to install.
    """
    if name == "none":
        return None
    if name == "jieba":
        return JiebaSegmenter()
    raise ValueError(f"--wwm_segmenter must be one of {', '.join(SEGMENTERS)}, got {name!r}")


def segmenter_version(name: str) -> str | None:
    """The installed version of segmenter ``name`` (None for ``"none"``), for the manifest;
    cheap (loads no dictionary), so the driver calls it to fail before the job starts.

    Raises:
        ValueError: an unknown name.
        ImportError: its package is missing (names the extra).
    """
    if name == "none":
        return None
    if name == "jieba":
        return _import_jieba().__version__
    raise ValueError(f"--wwm_segmenter must be one of {', '.join(SEGMENTERS)}, got {name!r}")


def _import_jieba():
    """The jieba module. Raises ImportError naming the extra that installs it."""
    try:
        import jieba
    except ImportError as e:
        raise ImportError(
            f"--wwm_segmenter jieba needs the jieba package: pip install "
            f"'bert-pipeline[{EXTRA}]' (or pip install jieba)"
        ) from e
    return jieba


def word_joins(
    sentences: Sequence[str],
    offsets: Sequence[Sequence[tuple[int, int]]],
    segmenter: JiebaSegmenter,
) -> np.ndarray:
    """For every token of every sentence: does it continue the previous token's word?

    A token joins when it is an ideograph, the character before it is an ideograph too,
    and the segmenter put both in one word. Sentences without ideographs are not
    segmented (their tokens never join here; ``##`` pieces join in masking). The others
    are segmented in one call, joined by newlines: jieba cuts its text into blocks at
    every character that is neither Han nor alphanumeric and segments each block alone,
    so each sentence gets the words it gets on its own, for one call's overhead.

    Args:
        sentences: the sentences as tokenized (the original text).
        offsets: per sentence, each token's ``(start, end)`` character offsets into it,
            as the ``tokenizers`` library's ``Encoding.offsets`` gives them.
        segmenter: from :func:`load_segmenter`.

    Returns:
        bool ``[T]``, T = all tokens of all sentences, in order. Example: ``["自然语言处理"]``
        (six one-character tokens) -> ``[F, T, T, T, F, T]``.
    """
    counts = np.fromiter(map(len, offsets), dtype=np.int64, count=len(offsets))
    total = int(counts.sum())
    if not total:
        return np.zeros(0, dtype=bool)
    # The sentences one after another, each followed by "\n"; base[i]: where i starts.
    lengths = np.fromiter(map(len, sentences), dtype=np.int64, count=len(sentences)) + 1
    base = np.zeros(len(sentences) + 1, dtype=np.int64)
    np.cumsum(lengths, out=base[1:])
    text = "\n".join(sentences) + "\n"
    ideograph = is_ideograph(np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32))
    if not ideograph.any():
        return np.zeros(total, dtype=bool)
    chosen = np.flatnonzero(np.add.reduceat(ideograph, base[:-1]))  # sentences to segment
    joined = "\n".join(sentences[i] for i in chosen.tolist()) + "\n"
    words = np.array(segmenter.word_lengths(joined), dtype=np.int64)
    if int(words.sum()) != len(joined):
        raise AssertionError("the segmenter lost characters")
    # Each character of `joined` at its place in `text`.
    chosen_lengths = lengths[chosen]
    shift = base[chosen] - (np.cumsum(chosen_lengths) - chosen_lengths)
    place = np.repeat(shift, chosen_lengths) + np.arange(len(joined))
    word_start = np.zeros(len(text) + 1, dtype=bool)
    word_start[place[np.cumsum(words) - words]] = True
    # char_joins[i]: character i is in the same word as character i - 1, both ideographs.
    char_joins = np.zeros(len(text), dtype=bool)
    char_joins[1:] = ideograph[1:] & ideograph[:-1] & ~word_start[1:-1]
    starts = np.fromiter(
        (start for token_offsets in offsets for start, _ in token_offsets),
        dtype=np.int64,
        count=total,
    )
    starts += np.repeat(base[:-1], counts)
    return char_joins[starts]
