"""Mosaic ``streaming``'s MDS (Mosaic Data Shard) of one Arrow shard, written with ``MDSWriter``.

Read by ``streaming.StreamingDataset`` and the trainers on it: composer, mosaicml/examples'
BERT (MosaicBERT), llm-foundry and ModernBERT. ``pipeline/beam/export.py`` runs it per shard
(``python -m pipeline export --to mds``): shard ``shard-00003-of-00010.arrow`` becomes the MDS
directory ``shard-00003-of-00010/`` (``index.json`` + ``shard.00000.mds``, ...), and the
export's ``index.json`` at the top lists them all, as streaming's ``merge_index`` writes it,
so ``StreamingDataset(local=OUTPUT)`` reads every shard, and any one directory alone too.

One sample per row, the row's order and values, unpadded. The columns (MDS encodings):

    input_ids            ndarray:int64   the row's ids (the token column, see TOKEN_COLUMNS)
    continues_word       ndarray:uint8   mlm kinds: 1 where the token continues a word
    segment_ids          ndarray:uint8   nsp: 0 for [CLS] A [SEP], 1 for B [SEP]
    masked_lm_positions  ndarray:uint8   nsp, mlm_masked (uint16 when max_seq_length > 256)
    masked_lm_ids        ndarray:uint16  nsp, mlm_masked (uint32 for vocabs over 65,536)
    next_sentence_label  uint8           nsp

Why these: the pre-tokenized readers decode the token column as int64 (ModernBERT's
``StreamingTextDataset``: ``np.frombuffer(sample["input_ids"], dtype=np.int64)``; mosaicml's
and llm-foundry's: ``np.frombuffer(sample["tokens"], dtype=np.int64)``), and an ``ndarray:int64``
column is that buffer as well as a numpy array (ModernBERT's ``NoStreamingDataset`` keeps
only ndarray columns); its name is ModernBERT's ``input_ids`` by default or mosaicml's
``tokens`` (``--mds_token_column tokens``). The other columns are ours, in the shards' own
types (bool as uint8: MDS has no bool). Uncompressed (ModernBERT's ``NoStreamingDataset``
reads raw shards only; ``StreamingDataset`` reads both).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pyarrow as pa

MDS = "mds"
INDEX_NAME = "index.json"  # streaming's get_index_basename()
# The token column's name: ModernBERT's text_data.py (default), or mosaicml/examples' and
# llm-foundry's convert_dataset.py ("tokens").
TOKEN_COLUMNS = ("input_ids", "tokens")
# MDS shard files roll over at this size (MDSWriter's own default, 64 MiB).
SIZE_LIMIT = 1 << 26
INSTALL_HINT = "pip install 'bert-pipeline[mds]' (mosaicml-streaming)"


def import_streaming():
    """The ``streaming`` package, or an ImportError that names the extra to install."""
    try:
        import streaming
    except ImportError as err:
        raise ImportError(f"--to {MDS} needs mosaicml-streaming ({err}): {INSTALL_HINT}") from err
    return streaming


def mds_columns(schema: pa.Schema, token_column: str = "input_ids") -> dict[str, str]:
    """The MDS encoding of each column of a shard schema (see the module docstring).

    ``mds_columns(shard_schema(200, 48, "mlm")) -> {"input_ids": "ndarray:int64",
    "continues_word": "ndarray:uint8"}``

    Raises:
        ValueError: an unknown token column name.
    """
    if token_column not in TOKEN_COLUMNS:
        raise ValueError(f"the token column must be one of {TOKEN_COLUMNS}, got {token_column!r}")
    out = {}
    for field in schema:
        if field.name == "input_ids":
            out[token_column] = "ndarray:int64"
        elif pa.types.is_list(field.type):
            value = field.type.value_type
            out[field.name] = "ndarray:" + ("uint8" if pa.types.is_boolean(value) else str(value))
        else:
            out[field.name] = str(field.type)
    return out


def mds_samples(table: pa.Table, token_column: str = "input_ids") -> Iterator[dict]:
    """Each row of a shard table as an MDS sample: {column: np.ndarray or int}, in order."""
    for batch in table.to_batches():
        lists, scalars = {}, {}
        for name, column in zip(batch.schema.names, batch.columns, strict=True):
            if pa.types.is_list(column.type):
                offsets = column.offsets.to_numpy()
                values = column.flatten().to_numpy(zero_copy_only=False)
                if name == "input_ids":
                    name, values = token_column, values.astype(np.int64)
                elif values.dtype == np.bool_:
                    values = values.view(np.uint8)
                lists[name] = (offsets - offsets[0], values)
            else:
                scalars[name] = column.to_numpy().tolist()
        for i in range(batch.num_rows):
            sample = {name: v[o[i] : o[i + 1]] for name, (o, v) in lists.items()}
            sample.update((name, values[i]) for name, values in scalars.items())
            yield sample


def write_mds(
    table: pa.Table, directory: str, token_column: str = "input_ids", size_limit: int = SIZE_LIMIT
) -> list[str]:
    """One shard as an MDS dataset in the local ``directory`` (new or empty), written by
    ``streaming.MDSWriter``, uncompressed. Memory: one MDS shard file (``size_limit``) and a
    record batch's samples.

    Returns:
        The file names written: ``shard.00000.mds`` (more past size_limit), then
        ``index.json``.

    Raises:
        ImportError: mosaicml-streaming is not installed (names the extra).
    """
    streaming = import_streaming()
    columns = mds_columns(table.schema, token_column)
    with streaming.MDSWriter(
        out=directory, columns=columns, compression=None, size_limit=size_limit
    ) as writer:
        for sample in mds_samples(table, token_column):
            writer.write(sample)
    names = sorted(os.listdir(directory))
    return sorted(names, key=lambda name: name == INDEX_NAME)


def merged_index(parts: list[tuple[str, dict]]) -> dict:
    """The dataset's index.json over MDS directories, as streaming's ``merge_index`` makes it:
    every directory's shards, each file's basename prefixed with its directory.

    ``merged_index([("shard-00000-of-00001", {"shards": [{"raw_data": {"basename":
    "shard.00000.mds"}, ...}]})])`` -> ``{"version": 2, "shards": [{"raw_data": {"basename":
    "shard-00000-of-00001/shard.00000.mds"}, ...}]}``

    Args:
        parts: (directory name, its index.json as a dict), in dataset order.
    """
    shards = []
    for directory, index in parts:
        for shard in index["shards"]:
            shard = dict(shard)
            for key in ("raw_data", "zip_data", "raw_meta", "zip_meta"):
                if shard.get(key):
                    shard[key] = {**shard[key], "basename": f"{directory}/{shard[key]['basename']}"}
            shards.append(shard)
    return {"version": 2, "shards": shards}
