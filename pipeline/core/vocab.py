"""WordPiece vocab files: Google's ``vocab.txt`` and a ``tokenizers`` tokenizer for it.

``pipeline/core/wordpiece.py`` learns a vocab from the pipeline's word-count table;
this module writes and reads ``vocab.txt`` (one token per line, id = line
number, the five BERT special tokens first), finds the special ids and builds
the ``tokenizers`` tokenizer (BERT normalisation and pre-tokenization,
WordPiece with ``##``) whose ids equal transformers' ``BertTokenizerFast``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from pipeline.core.wordpiece import (
    MAX_INPUT_CHARS_PER_WORD,
    PREFIX,
    SPECIAL_TOKENS,
    check_vocab_tokens,
    learn_wordpiece_vocab,
)
from pipeline.shards.shard_format import SPECIAL_ID_NAMES
from pipeline.shards.shard_writer import atomic_write_bytes

__all__ = [
    "MAX_INPUT_CHARS_PER_WORD",
    "SPECIAL_TOKENS",
    "build_tokenizer",
    "learn_wordpiece_vocab",
    "parse_vocab",
    "read_vocab",
    "save_tokenizer_json",
    "special_ids",
    "vocab_text",
    "write_vocab",
]

logger = logging.getLogger(__name__)


def write_vocab(path: str | os.PathLike, tokens: Sequence[str]) -> None:
    """Writes Google's vocab.txt: one token per line, id = line number - 1, UTF-8.

    Atomic (temp file + ``os.replace``). Example: ``["[PAD]", ..., "the"]`` ->
    ``"[PAD]\\n...\\nthe\\n"``.

    Raises:
        ValueError: a token is empty, has whitespace around it or a newline in
            it, repeats, or a special token is missing.
    """
    atomic_write_bytes(path, vocab_text(tokens, os.fspath(path)).encode("utf-8"))


def vocab_text(tokens: Sequence[str], source: str = "tokens") -> str:
    """The contents of vocab.txt for ``tokens``: ``["[PAD]", "the"] -> "[PAD]\\nthe\\n"``.

    Raises:
        ValueError: as for :func:`write_vocab` (naming ``source``).
    """
    tokens = list(tokens)
    check_vocab_tokens(tokens, source)
    return "".join(token + "\n" for token in tokens)


def parse_vocab(text: str, source: str) -> list[str]:
    """Tokens of a vocab.txt's text (as ``transformers``' ``load_vocab``: ``\\n``-split lines).

    Raises:
        ValueError: naming ``source`` and the line, as for :func:`read_vocab`.
    """
    tokens = text.split("\n")
    if tokens and tokens[-1] == "":
        tokens.pop()  # the final newline ends the last line; it is not a token
    check_vocab_tokens(tokens, source)
    return tokens


def read_vocab(path: str | os.PathLike) -> list[str]:
    """Reads a vocab.txt (as ``transformers``' ``load_vocab`` does: lines, ``\\n``-split).

    Returns:
        The tokens, ``list[str]``, token id = index.

    Raises:
        ValueError: naming the file and line, for an empty line, a token with
            surrounding whitespace, a repeated token or a missing special token.
    """
    with open(path, encoding="utf-8") as f:
        return parse_vocab(f.read(), os.fspath(path))


def special_ids(tokens: Sequence[str]) -> dict[str, int]:
    """Ids of the special tokens: ``{"pad_id": 0, "unk_id": 1, "cls_id": 2,
    "sep_id": 3, "mask_id": 4}`` for our vocabs (read from ``tokens``, not assumed).

    Raises:
        ValueError: a special token is missing from ``tokens``.
    """
    index = {token: i for i, token in enumerate(tokens)}
    missing = [t for t in SPECIAL_TOKENS if t not in index]
    if missing:
        raise ValueError(f"tokens: missing special tokens {missing}")
    names = [f"{name}_id" for name in SPECIAL_ID_NAMES]
    return {name: index[token] for name, token in zip(names, SPECIAL_TOKENS, strict=True)}


def build_tokenizer(
    tokens: Sequence[str], do_lower_case: bool, *, specials_in_text: bool = True
) -> Tokenizer:
    """A ``tokenizers.Tokenizer`` configured exactly like ``BertTokenizerFast``.

    ``BertNormalizer`` (clean text, CJK, accents stripped iff lowercased),
    ``BertPreTokenizer``, ``WordPiece`` (``[UNK]``, ``##``, words over 100
    characters -> ``[UNK]``), WordPiece decoder, ``[CLS] $A [SEP]`` /
    ``[CLS] $A [SEP] $B:1 [SEP]:1`` post-processing. Example:
    ``build_tokenizer(tokens, True).encode("Hello world", add_special_tokens=False)
    .ids -> [7592, 2088]`` with Google's uncased vocab.

    Args:
        tokens: the vocab, token id = index.
        do_lower_case: lowercase and strip accents (an uncased vocab).
        specials_in_text: ``True`` (``transformers``' behaviour, for the tokenizer.json
            users load): the five special tokens are registered as special, so a literal
            ``[MASK]`` typed into text is the mask id. ``False`` (Google's
            ``FullTokenizer``, what the pipeline tokenizes the corpus with): text is
            text, ``"use [MASK] here"`` -> ``use [ mask ] here`` uncased, and no special
            id but ``[UNK]`` ever comes out of text. The two agree on any text without
            those five strings.

    Raises:
        ValueError: ``tokens`` is not a valid vocab (see ``write_vocab``).
        TypeError: ``do_lower_case`` is not a ``bool``.
    """
    tokens = list(tokens)
    check_vocab_tokens(tokens, "tokens")
    if not isinstance(do_lower_case, bool):
        raise TypeError(f"do_lower_case must be a bool, got {do_lower_case!r}")
    vocab = {token: i for i, token in enumerate(tokens)}
    tokenizer = Tokenizer(
        models.WordPiece(
            vocab,
            unk_token="[UNK]",
            max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD,
            continuing_subword_prefix=PREFIX,
        )
    )
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=do_lower_case
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix=PREFIX)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0",
        pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    if specials_in_text:
        tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    return tokenizer


def save_tokenizer_json(path: str | os.PathLike, tokenizer: Tokenizer) -> None:
    """Saves ``tokenizer`` as a ``tokenizer.json`` atomically (temp file + rename);
    ``BertTokenizerFast(tokenizer_file=path, do_lower_case=...)`` loads it. Pass the vocab's
    casing: without it transformers records ``do_lower_case=True``, and a cased tokenizer's
    ``save_pretrained`` copy lowercases when loaded."""
    atomic_write_bytes(path, tokenizer.to_str().encode("utf-8"))
