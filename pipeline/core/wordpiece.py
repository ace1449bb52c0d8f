"""The WordPiece learner: a vocab from a word-count table (``pipeline/core/vocab.py`` saves it).

The Beam pipeline counts words with ``pipeline.core.text.basic_tokenize`` (a
combiner), then this module learns the vocab from the count table in one
process: memory grows with the number of distinct words, not the corpus size.
``tokenizers`` cannot train from counts (huggingface/tokenizers #89, #760), so
the learner is here, in Python, and it is the algorithm of ``tokenizers``'
``WordPieceTrainer`` (BPE with a ``##`` continuing-subword prefix):

1. Alphabet: the ``limit_alphabet`` most frequent characters (counts weighted
   by word counts). Every kept character ``c`` is a token; ``##c`` is one too
   when ``c`` occurs inside a word. Each word starts split into characters:
   ``"low" -> l ##o ##w``.
2. Merges: repeatedly merge the adjacent pair with the highest total count
   (summed over words, weighted by word counts) into one new token, the left
   piece plus the right piece without its ``##`` (``l + ##o -> lo``,
   ``##o + ##w -> ##ow``), until the vocab has ``vocab_size`` tokens or no
   pair occurs ``min_frequency`` times. Ties go to the pair of older tokens
   (smaller ids), so the vocab is a pure function of the count table.

Defaults mirror ``tokenizers.BertWordPieceTokenizer.train``: ``min_frequency=2``,
``limit_alphabet=1000``, the five BERT special tokens first. Two deliberate
differences, both about words WordPiece maps to ``[UNK]`` whatever the vocab:
words longer than ``MAX_INPUT_CHARS_PER_WORD`` and words with a character
outside the alphabet are not used for merges (``tokenizers`` trains on the
latter with the character dropped). ``bench/vocab_quality.py`` compares the
vocab with ``BertWordPieceTokenizer``'s (the tokens both learn, and tokens per word
on held-out text) and times the learner. Memory and time grow with the distinct
words, never with the corpus: the learner sees only the count table.

Use::

    tokens = learn_wordpiece_vocab(word_counts, 30522)
    write_vocab("out/vocab.txt", tokens)
    tokenizer = build_tokenizer(read_vocab("out/vocab.txt"), do_lower_case=True)
    ids = [e.ids for e in tokenizer.encode_batch(sentences, add_special_tokens=False)]
"""

from __future__ import annotations

import heapq
import itertools
import logging
import operator
import re
import time
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence

from pipeline.shards.shard_format import SPECIAL_ID_NAMES

logger = logging.getLogger(__name__)

# BERT's special tokens, in Google's order: their ids are 0..4 in our vocabs.
# ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"), from the manifest's names for them.
SPECIAL_TOKENS = tuple(f"[{name.upper()}]" for name in SPECIAL_ID_NAMES)
# Longer words become a single [UNK] (BERT's WordpieceTokenizer and tokenizers agree).
MAX_INPUT_CHARS_PER_WORD = 100
PREFIX = "##"
_LOG_EVERY_MERGES = 2000
_WHITESPACE = re.compile(r"\s")
_SHIFT = 32  # A pair (left, right) of token ids is keyed as left << 32 | right.
_RIGHT_MASK = (1 << _SHIFT) - 1


def _check_word_counts(word_counts: Mapping[str, int]) -> dict[str, int]:
    """Validates the count table; returns it without words too long for WordPiece.

    Raises:
        ValueError: a word is empty or contains whitespace, or a count is < 1.
        TypeError: a word is not a ``str`` or a count not an integer.
    """
    usable = {}
    for word, count in word_counts.items():
        if not isinstance(word, str):
            raise TypeError(f"word_counts keys must be str, got {type(word).__name__} {word!r}")
        if not word or _WHITESPACE.search(word):
            raise ValueError(
                f"word_counts keys must be basic_tokenize words (non-empty, no whitespace), "
                f"got {word!r}"
            )
        try:
            if isinstance(count, bool):
                raise TypeError
            count = operator.index(count)  # int, numpy integers; not floats or bools
        except TypeError:
            raise TypeError(f"word_counts[{word!r}] must be an integer, got {count!r}") from None
        if count < 1:
            raise ValueError(f"word_counts[{word!r}] must be an integer >= 1, got {count!r}")
        if len(word) <= MAX_INPUT_CHARS_PER_WORD:
            usable[word] = count
    return usable


def _alphabet(word_counts: Mapping[str, int], limit_alphabet: int | None) -> list[str]:
    """The kept characters, in code-point order.

    Worked example: ``{"ab": 3, "b": 1, "c": 1}`` with ``limit_alphabet=2``
    -> ``["a", "b"]`` (counts a=3, b=4, c=1; ties go to the smaller character).
    """
    char_counts: Counter[str] = Counter()
    for word, count in word_counts.items():
        for char in word:
            char_counts[char] += count
    kept = sorted(char_counts, key=lambda c: (-char_counts[c], c))
    return sorted(kept[:limit_alphabet] if limit_alphabet is not None else kept)


def _initial_tokens(
    word_counts: Mapping[str, int], special_tokens: Sequence[str], alphabet: list[str]
) -> tuple[list[str], list[str]]:
    """Returns (tokens, words): specials, then ``c`` for each kept character,
    then ``##c`` for those seen inside words (code-point order); and the words
    made only of kept characters, sorted (the words merges learn from).

    Worked example: ``{"low": 5, "wow": 1, "x": 1}``, alphabet ``l o w`` ->
    tokens ``[*specials, "l", "o", "w", "##o", "##w"]``, words ``["low", "wow"]``.
    """
    kept = set(alphabet)
    words = sorted(w for w in word_counts if all(c in kept for c in w))
    inner = sorted({c for w in words for c in w[1:]})
    return [*special_tokens, *alphabet, *(PREFIX + c for c in inner)], words


def _merge_word(
    symbols: list[int], left: int, right: int, new_id: int
) -> tuple[list[int], list[tuple[int, int]]] | None:
    """Merges each ``left right`` in ``symbols`` into ``new_id``, left to right.

    Returns the merged symbols and the pair-count changes ``(pair key, +1/-1)``
    next to each merge (the merged pair itself excluded: it disappears), as
    ``tokenizers``' ``Word::merge`` does; ``None`` when the pair does not occur
    (the pair index may list words that lost it). A pair key is
    ``left << 32 | right``: one int per pair keeps the tables small and makes
    heap ties break by (left id, right id).

    Worked example, ``[1, 2, 1, 2, 3]`` with ``(1, 2) -> 9``::

        -> [9, 9, 3], changes (2,1) -1, (9,1) +1, (9,1) -1, (9,9) +1, (2,3) -1, (9,3) +1

    and ``[1, 1, 1]`` with ``(1, 1) -> 9`` -> ``[9, 1]``, changes (1,1) -1, (9,1) +1.
    """
    out: list[int] = []
    changes: list[tuple[int, int]] = []
    i, n, found = 0, len(symbols), False
    while i < n:
        if symbols[i] == left and i + 1 < n and symbols[i + 1] == right:
            if out:  # out[-1] is new_id when the previous pair was merged too
                changes += ((out[-1] << _SHIFT | left, -1), (out[-1] << _SHIFT | new_id, 1))
            if i + 2 < n:
                following = symbols[i + 2]
                changes += ((right << _SHIFT | following, -1), (new_id << _SHIFT | following, 1))
            out.append(new_id)
            i += 2
            found = True
        else:
            out.append(symbols[i])
            i += 1
    return (out, changes) if found else None


class _PairTable:
    """Pair counts over all words, a pair -> words index and a max-heap.

    The index may list a word for a pair it no longer has (and twice):
    ``_merge_word`` skips those. The heap holds ``(-count, key)`` entries with
    lazy deletion: a popped entry whose count is stale is pushed back with the
    current count when that is lower, and dropped when higher (a count only
    rises with a fresh push).
    """

    def __init__(self, words: list[list[int]], counts: list[int]):
        self.words, self.counts = words, counts
        self.pair_counts: defaultdict[int, int] = defaultdict(int)
        self.where: defaultdict[int, list[int]] = defaultdict(list)
        for index, symbols in enumerate(words):
            count = counts[index]
            for a, b in itertools.pairwise(symbols):
                self.pair_counts[a << _SHIFT | b] += count
                self.where[a << _SHIFT | b].append(index)
        self.heap = [(-count, key) for key, count in self.pair_counts.items()]
        heapq.heapify(self.heap)

    def pop_best(self) -> tuple[int, int, int] | None:
        """Removes and returns the most frequent pair ``(left, right, count)``, or None."""
        while self.heap:
            negative, key = heapq.heappop(self.heap)
            count = self.pair_counts.get(key, 0)
            if count == -negative:
                return key >> _SHIFT, key & _RIGHT_MASK, count
            if 0 < count < -negative:
                heapq.heappush(self.heap, (-count, key))
        return None

    def merge(self, left: int, right: int, new_id: int) -> None:
        """Merges ``left right -> new_id`` in every word, updating counts and index."""
        key = left << _SHIFT | right
        delta: defaultdict[int, int] = defaultdict(int)
        for index in self.where.pop(key, ()):
            merged = _merge_word(self.words[index], left, right, new_id)
            if merged is None:
                continue
            self.words[index], changes = merged
            count = self.counts[index]
            for pair, sign in changes:
                delta[pair] += sign * count
                if sign > 0:
                    self.where[pair].append(index)
        self.pair_counts.pop(key, None)
        for pair, change in delta.items():
            if change == 0 or pair == key:  # "a a a": (a, a) is gone wholesale
                continue
            count = self.pair_counts.get(pair, 0) + change
            assert count >= 0, "pair count went negative"
            if count > 0:
                self.pair_counts[pair] = count
                if change > 0:
                    heapq.heappush(self.heap, (-count, pair))
            else:
                del self.pair_counts[pair]
                self.where.pop(pair, None)


class VocabSizeError(ValueError):
    """``vocab_size`` cannot hold the special tokens and the alphabet; ``needed`` is the
    smallest ``vocab_size`` that can (kept when pickled: an exception's ``__dict__`` is)."""

    needed: int = 0


def _check_learn_args(
    vocab_size: int, min_frequency: int, limit_alphabet: int | None, special_tokens: Sequence[str]
) -> None:
    """Raises ValueError naming the first invalid argument of learn_wordpiece_vocab."""
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
        raise ValueError(f"vocab_size must be a positive int, got {vocab_size!r}")
    if isinstance(min_frequency, bool) or not isinstance(min_frequency, int) or min_frequency < 1:
        raise ValueError(f"min_frequency must be an int >= 1, got {min_frequency!r}")
    if limit_alphabet is not None and (not isinstance(limit_alphabet, int) or limit_alphabet < 1):
        raise ValueError(f"limit_alphabet must be None or an int >= 1, got {limit_alphabet!r}")
    check_vocab_tokens(list(special_tokens), "special_tokens")


def learn_wordpiece_vocab(
    word_counts: Mapping[str, int],
    vocab_size: int,
    *,
    min_frequency: int = 2,
    limit_alphabet: int | None = 1000,
    special_tokens: Sequence[str] = SPECIAL_TOKENS,
) -> list[str]:
    """Learns a WordPiece vocab from word counts (see the module docstring).

    Worked example (``min_frequency=1``; see tests/pipeline/test_vocab.py)::

        {"low": 5, "lower": 2, "newest": 6, "widest": 3}, vocab_size=30
        -> 5 specials + alphabet d e i l n o r s t w ##d ##e ##i ##o ##r ##s ##t ##w
        -> merges ##e+##s (count 9, tied with ##s+##t: older ids first),
           ##es+##t (9), l+##o (7), lo+##w (7), n+##e (6), ##w+##est (6), ne+##west (6)
        -> [*specials, *alphabet, "##es", "##est", "lo", "low", "ne", "##west", "newest"]

    Args:
        word_counts: word -> count, words as ``basic_tokenize`` returns them
            (non-empty, no whitespace), counts ``int >= 1``. Words longer than
            ``MAX_INPUT_CHARS_PER_WORD`` characters are ignored.
        vocab_size: the most tokens to return, special tokens included.
        min_frequency: stop when no pair occurs this many times.
        limit_alphabet: keep at most this many characters (the most frequent);
            words with other characters are ignored. ``None``: keep all.
        special_tokens: the first tokens, in order; must include the five
            ``SPECIAL_TOKENS`` (extra ones, e.g. ``[unused0]``, are allowed).

    Returns:
        The vocab as a ``list[str]``: ``special_tokens``, the alphabet, the
        learned tokens; token id = list index. Shorter than ``vocab_size``
        (with a warning) when the merges run out first.

    Raises:
        VocabSizeError: ``vocab_size`` cannot hold the special tokens plus the
            alphabet (a ValueError; ``needed`` says the smallest size that can).
        ValueError: an argument is out of range, a special token is missing or
            repeated, or a word/count is invalid.
        TypeError: a word is not a ``str`` or a count not an integer.
    """
    _check_learn_args(vocab_size, min_frequency, limit_alphabet, special_tokens)
    started = time.perf_counter()
    usable = _check_word_counts(word_counts)
    tokens, words = _initial_tokens(usable, special_tokens, _alphabet(usable, limit_alphabet))
    if vocab_size < len(tokens):
        err = VocabSizeError(
            f"vocab_size={vocab_size} cannot hold the {len(special_tokens)} special tokens and "
            f"the {len(tokens) - len(special_tokens)} alphabet tokens (each character kept, "
            f"and ##c for those inside words): vocab_size must be at least {len(tokens)}, or "
            f"limit_alphabet (now {limit_alphabet}) lower"
        )
        err.needed = len(tokens)
        raise err
    token_ids = {token: i for i, token in enumerate(tokens)}
    table = _PairTable(
        [[token_ids[w[0]], *(token_ids[PREFIX + c] for c in w[1:])] for w in words],
        [usable[w] for w in words],
    )
    logger.info(
        "learning WordPiece: %d distinct words, %d alphabet tokens, target vocab %d",
        len(words),
        len(tokens) - len(special_tokens),
        vocab_size,
    )
    merges = 0
    while len(tokens) < vocab_size:
        best = table.pop_best()
        if best is None or best[2] < min_frequency:
            logger.warning(
                "WordPiece stopped at %d tokens (< vocab_size %d): no pair occurs "
                "min_frequency=%d times",
                len(tokens),
                vocab_size,
                min_frequency,
            )
            break
        left, right, count = best
        new_token = tokens[left] + tokens[right].removeprefix(PREFIX)
        if new_token not in token_ids:  # "a"+"##bc" and "ab"+"##c" are the same token
            token_ids[new_token] = len(tokens)
            tokens.append(new_token)
        table.merge(left, right, token_ids[new_token])
        merges += 1
        if merges % _LOG_EVERY_MERGES == 0:
            logger.info(
                "merge %d: vocab %d/%d, %r (count %d), %.1fs",
                merges,
                len(tokens),
                vocab_size,
                new_token,
                count,
                time.perf_counter() - started,
            )
    logger.info("learned %d tokens in %.1fs", len(tokens), time.perf_counter() - started)
    return tokens


def check_vocab_tokens(tokens: list[str], source: str) -> None:
    """Raises ValueError (naming ``source`` and the line) unless ``tokens`` can be
    a vocab.txt: non-empty ``str`` tokens without surrounding whitespace or line
    breaks, no repeats, and every one of ``SPECIAL_TOKENS`` present."""
    seen: dict[str, int] = {}
    for line, token in enumerate(tokens, start=1):
        if not isinstance(token, str) or not token:
            raise ValueError(f"{source}: line {line}: empty or non-str token {token!r}")
        if token != token.strip() or "\n" in token or "\r" in token:
            raise ValueError(f"{source}: line {line}: token {token!r} has whitespace or a newline")
        if token in seen:
            raise ValueError(
                f"{source}: line {line}: token {token!r} repeats line {seen[token]} "
                "(ids must be unique)"
            )
        seen[token] = line
    missing = [t for t in SPECIAL_TOKENS if t not in seen]
    if missing:
        raise ValueError(f"{source}: missing special tokens {missing}")
