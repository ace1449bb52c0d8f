"""The shard format: the one contract between the pipeline (writer) and any trainer (reader).

An output directory holds ``shard-NNNNN-of-MMMMM.arrow`` files (Arrow IPC *stream* format,
uncompressed, unpadded rows), ``vocab.txt``, ``tokenizer.json`` and ``manifest.json``, which is
written last. ``pipeline/FORMAT.md`` documents all of it for readers without this module; this
module is the executable version and depends only on pyarrow, numpy and the standard library.

Version 1 (``FORMAT_VERSION``). Columns, with X = uint16 if vocab_size <= 65536 else uint32 and
Y = uint8 if max_seq_length <= 256 else uint16:

    input_ids            list<X>      [CLS] A [SEP] B [SEP], already masked
    segment_ids          list<uint8>  0 for [CLS] A [SEP], 1 for B [SEP]
    masked_lm_positions  list<Y>      strictly increasing indexes into input_ids
    masked_lm_ids        list<X>      original ids at those positions
    next_sentence_label  uint8        1 = B is a random segment, 0 = B follows A

Schema metadata: ``bert_shard_format_version``, ``bert_shard_vocab_size`` and
``bert_shard_max_seq_length`` (ASCII decimals), so the schema is a pure function of
(vocab_size, max_seq_length) and every shard of a run has the same one.

Check a directory from the shell: ``python -m pipeline.format DIR`` (verifies every shard).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
VOCAB_NAME = "vocab.txt"
TOKENIZER_NAME = "tokenizer.json"
DEFAULT_BATCH_SIZE = 1024  # rows per Arrow record batch
LIST_COLUMNS = ("input_ids", "segment_ids", "masked_lm_positions", "masked_lm_ids")
COLUMNS = (*LIST_COLUMNS, "next_sentence_label")
SPECIAL_TOKENS = ("pad", "unk", "cls", "sep", "mask")

_VERSION_KEY = b"bert_shard_format_version"
_VOCAB_KEY = b"bert_shard_vocab_size"
_SEQ_KEY = b"bert_shard_max_seq_length"
_MAX_LIST_VALUES = 2**31 - 1  # list offsets are int32
_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # Arrow IPC end-of-stream marker
_SHARD_RE = re.compile(r"shard-(\d{5})-of-(\d{5})\.arrow")
_IPC_OPTIONS = pa.ipc.IpcWriteOptions(metadata_version=pa.ipc.MetadataVersion.V5, compression=None)


class ShardFormatError(ValueError):
    """A file of a shard directory is corrupt, truncated, inconsistent or of another version."""


# ----------------------------------------------------------------------------- names and schema


def shard_name(index: int, num_shards: int) -> str:
    """``shard_name(3, 128) -> "shard-00003-of-00128.arrow"``.

    Raises:
        ValueError: unless 0 <= index < num_shards <= 99999.
    """
    if not 0 <= index < num_shards <= 99999:
        raise ValueError(f"shard index must satisfy 0 <= {index} < {num_shards} <= 99999")
    return f"shard-{index:05d}-of-{num_shards:05d}.arrow"


def parse_shard_name(name: str) -> tuple[int, int]:
    """``parse_shard_name("shard-00003-of-00128.arrow") -> (3, 128)``; inverse of shard_name.

    Raises:
        ValueError: ``name`` is not a shard file name.
    """
    match = _SHARD_RE.fullmatch(name)
    if match is None or not int(match[1]) < int(match[2]):
        raise ValueError(f"{name!r} is not a shard name like 'shard-00003-of-00128.arrow'")
    return int(match[1]), int(match[2])


def shard_schema(vocab_size: int, max_seq_length: int) -> pa.Schema:
    """The Arrow schema of every shard written for this vocab size and sequence length.

    Raises:
        ValueError: vocab_size not an int in [1, 2**32] or max_seq_length not in [1, 65536].
    """
    _check_int("vocab_size", vocab_size, 1, 2**32)
    _check_int("max_seq_length", max_seq_length, 1, 2**16)
    token = pa.uint16() if vocab_size <= 2**16 else pa.uint32()
    position = pa.uint8() if max_seq_length <= 2**8 else pa.uint16()
    fields = [
        pa.field("input_ids", pa.list_(token)),
        pa.field("segment_ids", pa.list_(pa.uint8())),
        pa.field("masked_lm_positions", pa.list_(position)),
        pa.field("masked_lm_ids", pa.list_(token)),
        pa.field("next_sentence_label", pa.uint8()),
    ]
    meta = {_VERSION_KEY: str(FORMAT_VERSION).encode(), _VOCAB_KEY: str(vocab_size).encode()}
    return pa.schema(fields, metadata={**meta, _SEQ_KEY: str(max_seq_length).encode()})


def schema_params(schema: pa.Schema, *, where: str = "schema") -> tuple[int, int]:
    """(vocab_size, max_seq_length) of a shard schema, checking it is exactly a version-1 schema.

    Raises:
        ShardFormatError: another format version, or not a schema shard_schema() produces.
    """
    meta = schema.metadata or {}
    version = meta.get(_VERSION_KEY, b"<missing>").decode(errors="replace")
    if version != str(FORMAT_VERSION):
        raise ShardFormatError(
            f"{where} has shard format version {version}; this reader supports {FORMAT_VERSION} "
            "— upgrade bert-pipeline (or regenerate the shards with this version)"
        )
    try:
        params = int(meta[_VOCAB_KEY]), int(meta[_SEQ_KEY])
        expected = shard_schema(*params)
    except (KeyError, ValueError) as err:
        raise ShardFormatError(f"{where} has bad schema metadata {meta!r}: {err}") from err
    if not schema.equals(expected, check_metadata=True):
        raise ShardFormatError(f"{where} has schema\n{schema}\nbut version 1 requires\n{expected}")
    return params


def _check_int(name: str, value, low: int, high: int | None) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < low
        or (high and value > high)
    ):
        raise ValueError(f"{name} must be an int in [{low}, {high or 'inf'}], got {value!r}")


# ----------------------------------------------------------------------------- writing


def encode_shard(
    columns: Mapping[str, Sequence], schema: pa.Schema, *, batch_size: int = DEFAULT_BATCH_SIZE
) -> bytes:
    """Serialise rows to Arrow IPC stream bytes; the same rows give byte-identical bytes.

    Byte-identical for a given pyarrow version: the IPC format is stable, but the writer is
    pyarrow's, so runners that must agree byte for byte should pin the same pyarrow.

    Args:
        columns: one entry per name in COLUMNS. The four list columns are sequences with one
            1-D integer array (any int dtype, e.g. np.int32, or a list of ints) per row, or a
            ``Ragged`` (flat values + offsets);
            ``next_sentence_label`` is a sequence of bools/ints, one per row. Row i of the shard
            is element i of each column.
        schema: from shard_schema(); its metadata gives vocab_size and max_seq_length.
        batch_size: rows per record batch (the last one may be shorter).

    Raises:
        ValueError: a missing/unknown column, rows of different counts or lengths, a value out
            of range (ids >= vocab_size, segment ids or labels not 0/1, positions >= the row's
            length or not strictly increasing, rows empty or longer than max_seq_length), or
            more than 2**31 - 1 values in one list column. Messages name the column and row.
    """
    vocab_size, max_seq_length = schema_params(schema)
    _check_int("batch_size", batch_size, 1, None)
    if set(columns) != set(COLUMNS):
        raise ValueError(f"columns must be exactly {list(COLUMNS)}, got {sorted(columns)}")
    counts = {name: _num_rows(columns[name]) for name in COLUMNS}
    if len(set(counts.values())) != 1:
        raise ValueError(f"all columns must have the same number of rows, got {counts}")
    flat = {name: _flatten(name, columns[name]) for name in LIST_COLUMNS}
    labels = _as_int64(columns["next_sentence_label"], "next_sentence_label", "iub")
    if labels.ndim != 1:
        raise ValueError("next_sentence_label must be a 1-D sequence with one value per row")
    _check_rows(flat, labels, vocab_size, max_seq_length)
    arrays = [_list_array(*flat[name], schema.field(name).type) for name in LIST_COLUMNS]
    arrays.append(_from_numpy(labels.astype(np.uint8), pa.uint8()))
    rows = pa.RecordBatch.from_arrays(arrays, schema=schema)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema, options=_IPC_OPTIONS) as writer:
        # max(n, 1): an empty shard still gets one empty batch, so every table has a chunk
        # (datasets 5.x, for one, fails to cast a table with zero chunks).
        for start in range(0, max(rows.num_rows, 1), batch_size):
            writer.write_batch(rows.slice(start, batch_size))
    return sink.getvalue().to_pybytes()


def stream_header(schema: pa.Schema) -> bytes:
    """The bytes every shard stream of ``schema`` starts with (its schema message)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema, options=_IPC_OPTIONS):
        pass
    data = sink.getvalue().to_pybytes()
    assert data.endswith(_EOS), "pyarrow wrote no end-of-stream marker"
    return data[: -len(_EOS)]


def encode_shard_body(columns: Mapping[str, Sequence], schema: pa.Schema) -> bytes:
    """The record-batch messages of :func:`encode_shard` for these rows, without the
    header and end marker: bodies of consecutive row ranges, joined by
    :func:`join_shard_bodies`, make one valid shard (written in parallel parts).

    Raises:
        ValueError: as :func:`encode_shard`.
    """
    data = encode_shard(columns, schema)
    header = stream_header(schema)
    if not data.startswith(header) or not data.endswith(_EOS):
        raise AssertionError("unexpected Arrow IPC stream layout")
    return data[len(header) : -len(_EOS)]


def join_shard_bodies(bodies: Sequence[bytes], schema: pa.Schema) -> bytes:
    """One shard stream from the bodies of its parts, in order (none: an empty shard)."""
    if not any(bodies):
        return encode_shard({name: [] for name in COLUMNS}, schema)
    return b"".join([stream_header(schema), *bodies, _EOS])


def _num_rows(column) -> int:
    return len(column.offsets) - 1 if isinstance(column, Ragged) else len(column)


def rows_to_columns(rows: Sequence[Mapping]) -> dict[str, list]:
    """Transpose row dicts into the column mapping encode_shard takes.

    ``[{"input_ids": a0, ...}, {"input_ids": a1, ...}] -> {"input_ids": [a0, a1], ...}``

    Raises:
        ValueError: a row lacks one of COLUMNS (extra keys are ignored).
    """
    for i, row in enumerate(rows):
        missing = [name for name in COLUMNS if name not in row]
        if missing:
            raise ValueError(f"row {i} lacks column(s) {missing}")
    return {name: [row[name] for row in rows] for name in COLUMNS}


def _as_int64(values, name: str, kinds: str) -> np.ndarray:
    array = np.asarray(values)
    if array.size and array.dtype.kind not in kinds:
        raise ValueError(f"{name} must hold integers, got dtype {array.dtype}")
    return array.astype(np.int64)


@dataclass(frozen=True)
class Ragged:
    """A list column given flat: row ``i`` is ``values[offsets[i]:offsets[i + 1]]``.

    ``values`` is a 1-D integer array, ``offsets`` int [rows + 1] starting at 0.
    Writers that already hold their rows flat pass this instead of one array per row.
    """

    values: np.ndarray
    offsets: np.ndarray


def _flatten(name: str, rows: Sequence | Ragged) -> tuple[np.ndarray, np.ndarray]:
    """Per-row arrays (or a Ragged) -> (values (total,), offsets int64 (rows + 1,)).

    Values are int64, except that a Ragged's values keep their integer dtype."""
    if isinstance(rows, Ragged):
        values, offsets = np.asarray(rows.values), np.asarray(rows.offsets, dtype=np.int64)
        if values.ndim != 1 or (values.size and values.dtype.kind not in "iu"):
            raise ValueError(f"{name}: values must be a 1-D integer array")
        if (
            offsets.ndim != 1
            or offsets[0] != 0
            or offsets[-1] != len(values)
            or (np.diff(offsets) < 0).any()
        ):
            raise ValueError(f"{name}: offsets must rise from 0 to len(values)")
        if offsets[-1] > _MAX_LIST_VALUES:
            raise ValueError(f"{name} holds {offsets[-1]} values, more than 2**31 - 1")
        if values.dtype == np.uint64:
            return values.astype(np.int64), offsets  # huge values turn negative: still caught
        return values, offsets  # checked and cast in their own dtype: no int64 copy
    arrays = [np.asarray(row) for row in rows]
    for i, array in enumerate(arrays):
        if array.ndim != 1:
            raise ValueError(f"{name}: row {i} must be 1-D, got shape {array.shape}")
        if array.size and array.dtype.kind not in "iu":
            raise ValueError(f"{name}: row {i} must hold integers, got dtype {array.dtype}")
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum([array.size for array in arrays], out=offsets[1:])
    if offsets[-1] > _MAX_LIST_VALUES:
        raise ValueError(
            f"{name} holds {offsets[-1]} values, but a shard holds at most 2**31 - 1 per "
            "column because Arrow list offsets are int32 — write more, smaller shards"
        )
    if not arrays:
        return np.zeros(0, dtype=np.int64), offsets
    return np.concatenate(arrays, dtype=np.int64, casting="unsafe"), offsets


def _check_rows(flat: dict, labels: np.ndarray, vocab_size: int, max_seq_length: int) -> None:
    offsets = flat["input_ids"][1]
    lengths = np.diff(offsets)
    _require(lengths >= 1, offsets, "input_ids", "is empty")
    _require(lengths <= max_seq_length, offsets, "input_ids", f"is longer than {max_seq_length=}")
    for name, other in (("segment_ids", "input_ids"), ("masked_lm_ids", "masked_lm_positions")):
        bad = np.flatnonzero(np.diff(flat[name][1]) != np.diff(flat[other][1]))
        if bad.size:
            raise ValueError(f"{name}: row {bad[0]} has a different length than its {other}")
    for name in ("input_ids", "masked_lm_ids"):
        values, name_offsets = flat[name]
        if not _within(values, 0, vocab_size - 1):
            bad = (values < 0) | (values >= vocab_size)
            _require_values(~bad, values, name_offsets, name, f"outside [0, {vocab_size=})")
    segments, _ = flat["segment_ids"]
    if not _within(segments, 0, 1):
        ok = (segments == 0) | (segments == 1)
        _require_values(ok, segments, offsets, "segment_ids", "not 0/1")
    positions, position_offsets = flat["masked_lm_positions"]
    row_length = np.repeat(lengths, np.diff(position_offsets))
    inside = (positions >= 0) & (positions < row_length)
    _require_values(inside, positions, position_offsets, "masked_lm_positions", "outside the row")
    increasing = np.ones(positions.size, dtype=bool)
    increasing[1:] = positions[1:] > positions[:-1]
    increasing[position_offsets[:-1][np.diff(position_offsets) > 0]] = True  # row starts
    _require_values(
        increasing, positions, position_offsets, "masked_lm_positions", "not increasing"
    )
    bad = np.flatnonzero((labels != 0) & (labels != 1))
    if bad.size:
        raise ValueError(f"next_sentence_label: row {bad[0]} has {labels[bad[0]]}, not 0/1")


def _within(values: np.ndarray, low: int, high: int) -> bool:
    """All values in [low, high]: two reductions, no temporary arrays (the fast path;
    the caller finds the first bad value only when this fails)."""
    return not values.size or (int(values.min()) >= low and int(values.max()) <= high)


def check_table_rows(table: pa.Table, vocab_size: int, max_seq_length: int) -> dict:
    """The row checks :func:`encode_shard` makes before writing, on a shard read back.

    Returns:
        ``{list column: (values int64, offsets int64)}``, the columns as checked.

    Raises:
        ValueError: the first bad value, naming the column and row.
    """
    flat = {}
    for name in LIST_COLUMNS:
        offsets, values = _list_to_numpy(table.column(name).combine_chunks())
        flat[name] = (values, offsets.astype(np.int64))
    labels = table.column("next_sentence_label").to_numpy().astype(np.int64)
    _check_rows(flat, labels, vocab_size, max_seq_length)
    return flat


def _require(ok: np.ndarray, offsets: np.ndarray, name: str, what: str) -> None:
    bad = np.flatnonzero(~ok)
    if bad.size:
        raise ValueError(
            f"{name}: row {bad[0]} {what} (length {offsets[bad[0] + 1] - offsets[bad[0]]})"
        )


def _require_values(ok: np.ndarray, values: np.ndarray, offsets: np.ndarray, name: str, what: str):
    bad = np.flatnonzero(~ok)
    if bad.size:
        row = int(np.searchsorted(offsets, bad[0], side="right")) - 1
        raise ValueError(f"{name}: row {row} has value {values[bad[0]]} {what}")


def _list_array(values: np.ndarray, offsets: np.ndarray, list_type: pa.DataType) -> pa.Array:
    target = np.dtype(str(list_type.value_type))
    narrow = _from_numpy(values.astype(target, copy=False), list_type.value_type)
    return pa.ListArray.from_arrays(
        _from_numpy(offsets.astype(np.int32), pa.int32()), narrow, type=list_type
    )


def _from_numpy(array: np.ndarray, arrow_type: pa.DataType) -> pa.Array:
    """Zero-copy 1-D numpy -> Arrow, without pa.array(), which imports pandas (0.3 s) if present."""
    array = np.ascontiguousarray(array)
    return pa.Array.from_buffers(arrow_type, len(array), [None, pa.py_buffer(array)])


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to the local ``path`` so readers see the old file or the whole new one.

    Writes a temp file in the same directory, fsyncs it, renames it over ``path`` (atomic on
    POSIX) and fsyncs the directory. On failure the temp file is removed and ``path`` untouched.

    Raises:
        OSError: from the file system.
    """
    path = os.fspath(path)
    directory = os.path.dirname(path) or "."
    temp = os.path.join(directory, f".{os.path.basename(path)}.{secrets.token_hex(6)}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # mode honours the umask
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        if os.path.exists(temp):
            os.remove(temp)
        raise
    if hasattr(os, "O_DIRECTORY"):  # make the rename itself durable
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


# ----------------------------------------------------------------------------- reading


def _resolve(path_or_uri: str | os.PathLike) -> tuple[pafs.FileSystem | None, str]:
    """Local paths -> (None, path); URIs (gs://, s3://, file://, ...) -> (filesystem, path)."""
    text = os.fspath(path_or_uri)
    if "://" in text:
        return pafs.FileSystem.from_uri(text)
    return None, text


def join_path(directory: str | os.PathLike, name: str) -> str:
    """``directory/name`` for a local directory or a URI."""
    text = os.fspath(directory)
    return f"{text.rstrip('/')}/{name}" if "://" in text else os.path.join(text, name)


def _open_buffer(path_or_uri: str | os.PathLike):
    """A readable, seekable view of the whole file: memory-mapped locally, one read remotely."""
    filesystem, path = _resolve(path_or_uri)
    if filesystem is None:
        return pa.memory_map(path, "r")
    with filesystem.open_input_file(path) as f:
        return pa.BufferReader(f.read_buffer())


def open_shard(path_or_uri: str | os.PathLike) -> pa.Table:
    """Read one shard; zero-copy from a memory map for local paths.

    Args:
        path_or_uri: a local path, or a URI pyarrow.fs understands (gs://, s3://, file://),
            which is read into memory in one request.

    Returns:
        The table, in record batches of the writer's batch size; see COLUMNS for the types.

    Raises:
        ShardFormatError: not an Arrow stream, truncated (no end-of-stream marker), or a schema
            that is not version 1. Use verify_shard() to also check the sha256.
        OSError: the file cannot be opened.
    """
    where = os.fspath(path_or_uri)
    source = _open_buffer(path_or_uri)
    size = source.size()
    # A stream cut at a message boundary reads cleanly as a shorter table; the marker catches it.
    if size < len(_EOS) or bytes(source.read_at(len(_EOS), size - len(_EOS))) != _EOS:
        raise ShardFormatError(
            f"{where} is truncated: it does not end with the end-of-stream marker"
        )
    try:
        reader = pa.ipc.open_stream(source)
        schema_params(reader.schema, where=where)
        return reader.read_all()
    except (pa.ArrowInvalid, OSError) as err:
        raise ShardFormatError(f"{where} is not a readable Arrow stream (corrupt?): {err}") from err


def iter_rows(table: pa.Table) -> Iterator[dict[str, np.ndarray]]:
    """Yield each row as {column: np.int64 array}: lists of shape (n,), the label of shape ()."""
    for batch in table.to_batches():
        lists = {name: _list_to_numpy(batch.column(name)) for name in LIST_COLUMNS}
        labels = batch.column("next_sentence_label").to_numpy().astype(np.int64)
        for i in range(batch.num_rows):
            row = {
                name: values[offsets[i] : offsets[i + 1]]
                for name, (offsets, values) in lists.items()
            }
            row["next_sentence_label"] = labels[i].reshape(())
            yield row


def _list_to_numpy(column: pa.ListArray) -> tuple[np.ndarray, np.ndarray]:
    """(offsets from 0, int64 values) of a possibly sliced list array, converting only its rows."""
    offsets = column.offsets.to_numpy()
    return offsets - offsets[0], column.flatten().to_numpy().astype(np.int64)


def row_to_numpy(table: pa.Table, index: int) -> dict[str, np.ndarray]:
    """Row ``index`` of a shard table as {column: np.int64 array} (see iter_rows).

    Raises:
        IndexError: index not in [0, table.num_rows).
    """
    if not 0 <= index < table.num_rows:
        raise IndexError(f"row {index} out of range for a shard of {table.num_rows} rows")
    return next(iter_rows(table.slice(index, 1)))


def sha256_file(path_or_uri: str | os.PathLike) -> str:
    """Hex sha256 of a local file or URI, read in 1 MiB chunks."""
    filesystem, path = _resolve(path_or_uri)
    digest = hashlib.sha256()
    with open(path, "rb") if filesystem is None else filesystem.open_input_stream(path) as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _file_size(path_or_uri: str | os.PathLike) -> int:
    filesystem, path = _resolve(path_or_uri)
    if filesystem is None:
        return os.path.getsize(path)
    info = filesystem.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        raise FileNotFoundError(f"{os.fspath(path_or_uri)} does not exist")
    return info.size


def verify_shard(path_or_uri: str | os.PathLike, entry: Mapping) -> pa.Table:
    """Check a shard against its manifest entry (bytes, sha256, then rows) and return it.

    Raises:
        ShardFormatError: size, sha256 or row count differ from ``entry``, or open_shard fails.
        OSError: the file cannot be opened.
    """
    where = os.fspath(path_or_uri)
    size = _file_size(path_or_uri)
    if size != entry["bytes"]:
        raise ShardFormatError(
            f"{where} has {size} bytes, manifest says {entry['bytes']} (truncated?)"
        )
    digest = sha256_file(path_or_uri)
    if digest != entry["sha256"]:
        raise ShardFormatError(
            f"{where} has sha256 {digest}, manifest says {entry['sha256']} (corrupt)"
        )
    table = open_shard(path_or_uri)
    if table.num_rows != entry["rows"]:
        raise ShardFormatError(f"{where} has {table.num_rows} rows, manifest says {entry['rows']}")
    return table


def verify_directory(directory: str | os.PathLike) -> dict:
    """Verify every shard, vocab.txt and tokenizer.json of an output directory; return the manifest.

    Raises:
        ShardFormatError: see read_manifest and verify_shard; vocab.txt's (or tokenizer.json's)
            sha256 differs, or a shard's schema disagrees with the manifest's.
    """
    manifest = read_manifest(directory)
    expected = shard_schema(manifest["schema"]["vocab_size"], manifest["schema"]["max_seq_length"])
    for entry in manifest["shards"]:
        path = join_path(directory, entry["name"])
        if not verify_shard(path, entry).schema.equals(expected, check_metadata=True):
            raise ShardFormatError(f"{path} has another schema than {MANIFEST_NAME} describes")
    vocab = manifest["vocab"]
    for name, digest in (
        (vocab["file"], vocab["sha256"]),
        (vocab.get("tokenizer_file"), vocab.get("tokenizer_sha256")),
    ):
        if name is not None and sha256_file(join_path(directory, name)) != digest:
            raise ShardFormatError(
                f"{join_path(directory, name)} has another sha256 than {MANIFEST_NAME} says"
            )
    return manifest


# ----------------------------------------------------------------------------- manifest

_MANIFEST_SPEC = {"format_version": int, "created_by": str, "schema": dict, "num_rows": int}
_MANIFEST_SPEC |= {"shards": list, "vocab": dict, "params": dict, "stats": dict, "skipped": dict}
_SCHEMA_SPEC = {"vocab_size": int, "max_seq_length": int, "columns": dict}
_SHARD_SPEC = {"name": str, "rows": int, "bytes": int, "sha256": str}
_VOCAB_SPEC = {"file": str, "sha256": str, "size": int, "do_lower_case": bool, "special_ids": dict}
_VOCAB_OPTIONAL = {"tokenizer_file": str, "tokenizer_sha256": str}


def created_by() -> str:
    """``"bert-pipeline 0.1.0"`` from package metadata, or ``"bert-pipeline"`` if not installed."""
    try:
        return f"bert-pipeline {metadata.version('bert-pipeline')}"
    except metadata.PackageNotFoundError:
        return "bert-pipeline"


def build_manifest(
    *, shards: Sequence[Mapping], vocab: Mapping, params: Mapping, stats: Mapping, skipped: Mapping
) -> dict:
    """Assemble and validate a run's manifest. It holds no timestamps, hosts or output paths,
    so the same input and seed give byte-identical manifests on any runner.

    Args:
        shards: one {name, rows, bytes, sha256} per shard, all of shard-*-of-N, in any order.
        vocab: {file, sha256, size, do_lower_case, special_ids: {pad, unk, cls, sep, mask}},
            optionally tokenizer_file and tokenizer_sha256.
        params: every pipeline parameter and the seed; must include max_seq_length.
        stats: summary statistics (JSON values; numpy scalars are converted).
        skipped: {reason: count} of dropped records.

    Raises:
        ValueError: a missing, unknown or mistyped key, or an incomplete set of shards.
    """
    _reject_unknown(vocab, {*_VOCAB_SPEC, *_VOCAB_OPTIONAL}, "vocab")
    for i, entry in enumerate(shards):
        _reject_unknown(entry, _SHARD_SPEC, f"shards[{i}]")
    if "max_seq_length" not in params or "size" not in vocab:
        raise ValueError("params.max_seq_length and vocab.size are required: they fix the schema")
    schema = shard_schema(int(vocab["size"]), int(params["max_seq_length"]))
    draft = {
        "format_version": FORMAT_VERSION,
        "created_by": created_by(),
        "schema": {
            "vocab_size": vocab["size"],
            "max_seq_length": params["max_seq_length"],
            "columns": {field.name: str(field.type) for field in schema},
        },
        "num_rows": sum(int(entry.get("rows", 0)) for entry in shards),
        "shards": sorted(
            (dict(entry) for entry in shards), key=lambda entry: str(entry.get("name"))
        ),
        "vocab": dict(vocab),
        "params": dict(params),
        "stats": dict(stats),
        "skipped": dict(skipped),
    }
    manifest = json.loads(encode_manifest(draft))  # plain JSON types from here on
    _check_manifest(manifest, "build_manifest")
    return manifest


def encode_manifest(manifest: Mapping) -> bytes:
    """Deterministic UTF-8 JSON: sorted keys, indent 2, trailing newline; numpy scalars allowed.

    Raises:
        TypeError: a value JSON cannot hold.
        ValueError: NaN or infinity.
    """
    text = json.dumps(
        manifest, sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False, default=_to_json
    )
    return (text + "\n").encode("utf-8")


def _to_json(value):
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"manifest values must be JSON types, got {type(value).__name__} {value!r}")


def read_manifest(directory: str | os.PathLike) -> dict:
    """Load and validate ``manifest.json`` of a local directory or a URI.

    Unknown keys are ignored: version 1 may gain keys, never change or drop them.

    Raises:
        ShardFormatError: no manifest (the run did not finish), not JSON, another
            format_version, or a missing, mistyped or inconsistent key.
        OSError: the file exists but cannot be read.
    """
    path = join_path(directory, MANIFEST_NAME)
    try:
        manifest = json.loads(read_bytes(path))
    except FileNotFoundError as err:
        raise ShardFormatError(
            f"{path} not found: it is written last, so the run did not finish"
        ) from err
    except ValueError as err:  # JSONDecodeError and UnicodeDecodeError
        raise ShardFormatError(f"{path} is not valid JSON: {err}") from err
    version = manifest.get("format_version") if isinstance(manifest, dict) else None
    if version != FORMAT_VERSION:
        raise ShardFormatError(
            f"{MANIFEST_NAME} in {os.fspath(directory)} has format_version {version}; this reader "
            f"supports {FORMAT_VERSION} — upgrade bert-pipeline (or regenerate the shards with it)"
        )
    try:
        _check_manifest(manifest, path)
    except ValueError as err:
        raise ShardFormatError(str(err)) from err
    return manifest


def read_bytes(path_or_uri: str | os.PathLike) -> bytes:
    """The bytes of a local file or a URI (gs://, s3://, ...)."""
    filesystem, path = _resolve(path_or_uri)
    if filesystem is None:
        with open(path, "rb") as f:
            return f.read()
    with filesystem.open_input_stream(path) as f:
        return f.read()


def _reject_unknown(obj: Mapping, allowed, where: str) -> None:
    unknown = sorted(set(obj) - set(allowed))
    if unknown:
        raise ValueError(f"{where} has unknown key(s) {unknown}; allowed: {sorted(allowed)}")


def _check_fields(obj, spec: Mapping[str, type], where: str) -> None:
    """Raise ValueError unless ``obj`` is a dict whose ``spec`` keys have those types (int: >= 0)."""
    if not isinstance(obj, dict):
        raise ValueError(f"{where} must be a JSON object, got {obj!r}")
    for key, kind in spec.items():
        if key not in obj:
            raise ValueError(f"{where} lacks key {key!r}")
        value = obj[key]
        if kind is int:
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
        else:
            ok = isinstance(value, kind)
        if not ok:
            wanted = "a non-negative int" if kind is int else f"a JSON {kind.__name__}"
            raise ValueError(f"{where}.{key} must be {wanted}, got {value!r}")


def _check_manifest(manifest, where: str) -> None:
    """Raise ValueError unless ``manifest`` (plain JSON types) is a consistent version-1 manifest."""
    _check_fields(manifest, _MANIFEST_SPEC, where)
    schema, vocab, shards = manifest["schema"], manifest["vocab"], manifest["shards"]
    _check_fields(schema, _SCHEMA_SPEC, f"{where}: schema")
    _check_fields(vocab, _VOCAB_SPEC, f"{where}: vocab")
    _check_fields(
        vocab["special_ids"], dict.fromkeys(SPECIAL_TOKENS, int), f"{where}: vocab.special_ids"
    )
    _check_fields(manifest["skipped"], dict.fromkeys(manifest["skipped"], int), f"{where}: skipped")
    for i, entry in enumerate(shards):
        _check_fields(entry, _SHARD_SPEC, f"{where}: shards[{i}]")
    expected = shard_schema(schema["vocab_size"], schema["max_seq_length"])
    if schema["columns"] != {field.name: str(field.type) for field in expected}:
        raise ValueError(f"{where}: schema.columns {schema['columns']} do not match\n{expected}")
    if schema["vocab_size"] != vocab["size"]:
        raise ValueError(
            f"{where}: schema.vocab_size {schema['vocab_size']} != vocab.size {vocab['size']}"
        )
    for token, token_id in vocab["special_ids"].items():
        if token in SPECIAL_TOKENS and token_id >= vocab["size"]:
            raise ValueError(
                f"{where}: vocab.special_ids.{token} {token_id} >= vocab.size {vocab['size']}"
            )
    names = [entry["name"] for entry in shards]
    if not names or names != [shard_name(i, len(names)) for i in range(len(names))]:
        raise ValueError(
            f"{where}: shards must be shard-00000-of-N .. shard-(N-1)-of-N, got {names}"
        )
    if manifest["num_rows"] != sum(entry["rows"] for entry in shards):
        raise ValueError(f"{where}: num_rows {manifest['num_rows']} != the sum of the shards' rows")


def check_vocab_compat(
    manifest: Mapping, *, vocab_size: int, special_ids: Mapping[str, int] | None = None
) -> None:
    """Refuse a model whose vocabulary differs from the shards'.

    Args:
        manifest: from read_manifest().
        vocab_size: the model's vocabulary size (must equal the shards' exactly).
        special_ids: any of {pad, unk, cls, sep, mask} the model relies on.

    Raises:
        ValueError: naming both values of the first mismatch, or an unknown special token name.
    """
    data_size = manifest["vocab"]["size"]
    if vocab_size != data_size:
        raise ValueError(
            f"the model has vocab_size {vocab_size} but the shards were tokenized with a "
            f"vocabulary of {data_size} (manifest vocab.size); use a model config with "
            f"vocab_size {data_size} or regenerate the shards with the model's vocab"
        )
    data_ids = manifest["vocab"]["special_ids"]
    for token, model_id in (special_ids or {}).items():
        if token not in SPECIAL_TOKENS:
            raise ValueError(
                f"unknown special token {token!r}; expected one of {list(SPECIAL_TOKENS)}"
            )
        if model_id != data_ids[token]:
            raise ValueError(
                f"the model uses id {model_id} for [{token.upper()}] but the shards use "
                f"{data_ids[token]} (manifest vocab.special_ids.{token})"
            )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pipeline.format DIR``: verify DIR, print a one-line summary; 1 on failure."""
    args = sys.argv[1:] if argv is None else list(argv)
    if len(args) != 1:
        print("usage: python -m pipeline.format DIR_OR_URI", file=sys.stderr)
        return 2
    try:
        manifest = verify_directory(args[0])
    except (ShardFormatError, OSError) as err:
        print(f"FAILED: {err}", file=sys.stderr)
        return 1
    print(
        f"OK: {len(manifest['shards'])} shards, {manifest['num_rows']} rows, {manifest['created_by']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
