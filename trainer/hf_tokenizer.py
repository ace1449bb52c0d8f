"""Tokenizer files of a Hugging Face export, made from the vocab of the shards it trained on.

A shard directory (pipeline/shards/FORMAT.md) holds ``vocab.txt`` and, in ``manifest.json``, its
sha256, size and ``vocab.do_lower_case``. :func:`save_tokenizer` writes what
``transformers.AutoTokenizer.from_pretrained`` needs beside ``config.json``::

    vocab.txt                   the shards' vocab, byte for byte
    tokenizer.json              the same vocab and casing for the `tokenizers` library
    tokenizer_config.json       tokenizer class, do_lower_case, model_max_length, special tokens
    special_tokens_map.json     [UNK] [SEP] [PAD] [CLS] [MASK]

so that ``transformers.pipeline("fill-mask", model=EXPORT_DIR)`` works offline. Shard
directories may be local or a URI pyarrow.fs reads (gs://, s3://), as for training.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.vocab import build_tokenizer, parse_vocab, vocab_text
from pipeline.shards import shard_format
from pipeline.shards.shard_writer import atomic_write_bytes

TOKENIZER_CONFIG_NAME = "tokenizer_config.json"
SPECIAL_TOKENS_MAP_NAME = "special_tokens_map.json"
# The files save_tokenizer writes, in the order it writes them.
TOKENIZER_FILES = (
    shard_format.VOCAB_NAME,
    shard_format.TOKENIZER_NAME,
    TOKENIZER_CONFIG_NAME,
    SPECIAL_TOKENS_MAP_NAME,
)
# transformers' names for BERT's special tokens (pipeline/core/wordpiece.py SPECIAL_TOKENS).
_SPECIAL_TOKENS = {
    "unk_token": "[UNK]",
    "sep_token": "[SEP]",
    "pad_token": "[PAD]",
    "cls_token": "[CLS]",
    "mask_token": "[MASK]",
}


@dataclass(frozen=True)
class Vocab:
    """A WordPiece vocab and its casing, as the pipeline tokenized with it."""

    tokens: tuple[str, ...]  # id = index
    do_lower_case: bool
    source: str  # where it was read (for messages)


def shard_dir_of(path: str) -> str:
    """The shard directory named by ``path``: the directory itself, or the one holding the
    ``vocab.txt`` that ``path`` names. ``"gs://b/shards/vocab.txt" -> "gs://b/shards"``."""
    path = os.fspath(path)
    if posixpath.basename(path.rstrip("/")) == shard_format.VOCAB_NAME:
        return posixpath.dirname(path.rstrip("/"))
    return path


def read_shard_vocab(directory: str | os.PathLike) -> Vocab:
    """The vocab of a shard directory (local or URI), checked against its manifest.

    Args:
        directory: holds manifest.json and vocab.txt (pipeline/shards/FORMAT.md).

    Raises:
        ShardFormatError: no manifest.json (the shards are gone or unfinished) or a bad one.
        FileNotFoundError: the manifest's vocab file is missing.
        ValueError: vocab.txt is not the one the manifest describes (sha256 or size), or
            is not a valid vocab.
    """
    directory = os.fspath(directory)
    manifest = shard_format.read_manifest(directory)
    entry = manifest["vocab"]
    path = shard_format.join_path(directory, entry["file"])
    data = shard_format.read_bytes(path)
    if hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise ValueError(f"{path} does not match the sha256 in {directory}'s manifest.json")
    tokens = parse_vocab(data.decode("utf-8"), path)
    if len(tokens) != entry["size"]:
        raise ValueError(f"{path} has {len(tokens)} tokens, the manifest says {entry['size']}")
    return Vocab(tuple(tokens), entry["do_lower_case"], directory)


def tokenizer_config(vocab: Vocab, model_max_length: int) -> dict:
    """The ``tokenizer_config.json`` of ``vocab``: BertTokenizer with the shards' casing.

    ``strip_accents`` is None: accents are stripped exactly when lowercasing, as in the
    pipeline's tokenizer (pipeline/core/vocab.py ``build_tokenizer``).
    """
    return {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": vocab.do_lower_case,
        "strip_accents": None,
        "tokenize_chinese_chars": True,
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
        **_SPECIAL_TOKENS,
    }


def save_tokenizer(
    directory: str | os.PathLike, vocab: Vocab, *, model_max_length: int
) -> list[Path]:
    """Write the tokenizer files (:data:`TOKENIZER_FILES`) into a local ``directory``.

    Each file is written atomically (temp file, fsync, rename).

    Args:
        vocab: from :func:`read_shard_vocab`.
        model_max_length: the model's ``max_position_embeddings`` (longest input).

    Returns:
        The paths written.

    Raises:
        ValueError: ``vocab.tokens`` is not a valid vocab (e.g. a special token is missing).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(vocab.tokens, vocab.do_lower_case)
    config = tokenizer_config(vocab, model_max_length)
    contents = {
        shard_format.VOCAB_NAME: vocab_text(vocab.tokens, vocab.source),
        shard_format.TOKENIZER_NAME: tokenizer.to_str(),
        TOKENIZER_CONFIG_NAME: json.dumps(config, indent=2, sort_keys=True) + "\n",
        SPECIAL_TOKENS_MAP_NAME: json.dumps(_SPECIAL_TOKENS, indent=2) + "\n",
    }
    paths = []
    for name in TOKENIZER_FILES:
        atomic_write_bytes(directory / name, contents[name].encode("utf-8"))
        paths.append(directory / name)
    return paths
