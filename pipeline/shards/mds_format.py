"""Mosaic ``streaming``'s MDS (Mosaic Data Shard) of one Arrow shard, as ``MDSWriter`` writes it.

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

import json
import os
from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from .shard_writer import atomic_write_bytes

MDS = "mds"
INDEX_NAME = "index.json"  # streaming's get_index_basename()
# The token column's name: ModernBERT's text_data.py (default), or mosaicml/examples' and
# llm-foundry's convert_dataset.py ("tokens").
TOKEN_COLUMNS = ("input_ids", "tokens")
# MDS shard files roll over at this size (MDSWriter's own default, 64 MiB).
SIZE_LIMIT = 1 << 26


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


def _encode_column(encoding: str, value) -> bytes:
    """One value in an MDS encoding of :func:`mds_columns`: ``ndarray:DTYPE`` (dtype fixed in
    the index, shape not: one byte ``ndim << 2 | shape dtype`` (uint8 0, uint16 1, uint32 2),
    the shape, then the values) or a scalar ``uint8`` ... ``int64`` (its bytes).

    ``_encode_column("ndarray:uint8", np.array([7, 9], np.uint8)) -> b"\\x04\\x02\\x07\\x09"``

    Raises:
        ValueError: an empty array (MDS cannot hold one), or another dtype than the column's.
    """
    if not encoding.startswith("ndarray:"):
        return np.dtype(encoding).type(value).tobytes()
    dtype = encoding.split(":", 1)[1]
    if value.dtype != np.dtype(dtype):
        raise ValueError(f"MDS column {encoding}: got an array of {value.dtype}")
    if not value.size:
        raise ValueError(f"MDS column {encoding}: an empty array cannot be written in MDS")
    length = len(value)
    shape_code, shape_dtype = next(
        (code, dt)
        for code, dt in enumerate((np.uint8, np.uint16, np.uint32))
        if length < 256 ** (1 << code)
    )
    return (
        bytes([(1 << 2) | shape_code]) + np.array([length], shape_dtype).tobytes() + value.tobytes()
    )


def _mds_shard(samples: list[bytes], config: bytes) -> bytes:
    """An MDS shard file: the sample count (uint32), each sample's offset in the file and the
    end's (uint32), the writer's config as JSON, then the samples."""
    sizes = np.array([0, *map(len, samples)], np.int64).cumsum()
    head = 4 + 4 * len(sizes) + len(config)
    offsets = (sizes + head).astype(np.uint32)
    return np.uint32(len(samples)).tobytes() + offsets.tobytes() + config + b"".join(samples)


def write_mds(
    table: pa.Table, directory: str, token_column: str = "input_ids", size_limit: int = SIZE_LIMIT
) -> list[str]:
    """One shard as an MDS dataset in the local ``directory`` (new or empty), uncompressed,
    byte for byte as ``streaming.MDSWriter(out=directory, columns=mds_columns(...),
    compression=None, size_limit=size_limit)`` writes it (tests/pipeline/test_export_mds.py
    compares them). Written here rather than by streaming because ``import streaming`` needs
    torch and torchvision, which a CPU machine cannot install from PyPI alone beside a CPU
    torch (docs/exports.md); the format is streaming's documented MDS (its
    ``format/mds/writer.py`` and ``encodings.py``), and streaming reads it back. Memory: one
    MDS shard file (``size_limit``) and a record batch's samples.

    Returns:
        The file names written: ``shard.00000.mds`` (more past size_limit), then
        ``index.json``.

    Raises:
        ValueError: a value MDS cannot hold (an empty list column).
    """
    columns = mds_columns(table.schema, token_column)
    names = sorted(columns)
    encodings = [columns[name] for name in names]
    sizes = [None if e.startswith("ndarray:") else np.dtype(e).itemsize for e in encodings]
    config = {
        "version": 2,
        "format": MDS,
        "compression": None,
        "hashes": [],
        "size_limit": size_limit,
        "column_names": names,
        "column_encodings": encodings,
        "column_sizes": sizes,
    }
    config_bytes = json.dumps(config, sort_keys=True).encode("utf-8")
    shards: list[dict] = []
    pending: list[bytes] = []
    fixed = 4 + 4 + len(config_bytes)  # MDSWriter's count of a shard's bytes besides samples
    pending_size = fixed

    def flush() -> None:
        name = f"shard.{len(shards):05d}.{MDS}"
        data = _mds_shard(pending, config_bytes)
        atomic_write_bytes(os.path.join(directory, name), [data])
        raw = {"basename": name, "bytes": len(data), "hashes": {}}
        shards.append({"samples": len(pending), "raw_data": raw, "zip_data": None, **config})

    for sample in mds_samples(table, token_column):
        parts = [_encode_column(e, sample[n]) for n, e in zip(names, encodings, strict=True)]
        variable = [len(p) for p, size in zip(parts, sizes, strict=True) if size is None]
        encoded = np.array(variable, np.uint32).tobytes() + b"".join(parts)
        if size_limit and size_limit < pending_size + len(encoded) + 4:
            flush()
            pending, pending_size = [], fixed
        pending.append(encoded)
        pending_size += len(encoded) + 4
    if pending:
        flush()
    index = json.dumps({"version": 2, "shards": shards}, sort_keys=True)
    atomic_write_bytes(os.path.join(directory, INDEX_NAME), [index.encode("utf-8")])
    return [shard["raw_data"]["basename"] for shard in shards] + [INDEX_NAME]


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
