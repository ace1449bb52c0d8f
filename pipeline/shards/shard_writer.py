"""Writing shards and manifests in the format ``pipeline/shards/shard_format.py`` reads.

``encode_shard`` turns rows into the bytes of one shard (checking every value
first), ``encode_shard_body``/``join_shard_bodies`` do the same in parts that
are written in parallel and joined, ``build_manifest``/``encode_manifest`` make
``manifest.json``. The pipeline's writers use these; tests and benchmarks use
them to make shards of their own. The contract is ``pipeline/shards/FORMAT.md``.
``atomic_write_bytes`` (with ``atomic_output``) is the project's one atomic file writer,
local or remote: shards, manifests, vocabularies, checkpoints' JSON, exports, plots.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import posixpath
import secrets
import stat
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import BinaryIO, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from pipeline.shards import validate
from pipeline.shards.shard_format import (
    _EOS,
    _IPC_OPTIONS,
    _MAX_LIST_VALUES,
    _SHARD_SPEC,
    _VOCAB_OPTIONAL,
    _VOCAB_SPEC,
    ALGORITHM_VERSION,
    DEFAULT_BATCH_SIZE,
    FORMAT_VERSION,
    _check_int,
    _check_manifest,
    _reject_unknown,
    is_remote,
    kind_columns,
    resolve,
    schema_kind,
    schema_params,
    shard_schema,
)


def encode_shard(
    columns: Mapping[str, Sequence],
    schema: pa.Schema,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    stop: int | None = None,
) -> bytes:
    """Serialise rows to Arrow IPC stream bytes; the same rows give byte-identical bytes.

    Byte-identical for a given pyarrow version: the IPC format is stable, but the writer is
    pyarrow's, so runners that must agree byte for byte should pin the same pyarrow.

    Args:
        columns: one entry per column of the schema's row kind (``KIND_COLUMNS``; NSP rows:
            COLUMNS). The list columns are sequences with one 1-D integer array (any int
            dtype, e.g. np.int32, or a list of ints; bools for ``continues_word``) per row,
            or a ``Ragged`` (flat values + offsets); ``next_sentence_label`` is a sequence
            of bools/ints, one per row. Row i of the shard is element i of each column.
        schema: from shard_schema(); its metadata gives vocab_size, max_seq_length and kind.
        batch_size: rows per record batch (the last one may be shorter).
        stop: write only the record batches of the first ``stop`` rows (a multiple of
            ``batch_size``; none when 0), sliced from all the rows: the batches are then
            byte for byte those of a longer stream, of which these rows are the start, if
            at least 64 rows follow them (see :func:`encode_shard_body`).

    Raises:
        ValueError: a missing/unknown column, rows of different counts or lengths, a value out
            of range (ids >= vocab_size, segment ids or labels not 0/1, positions >= the row's
            length or not strictly increasing, rows empty or longer than max_seq_length), or
            more than 2**31 - 1 values in one list column. Messages name the column and row.
    """
    _check_int("batch_size", batch_size, 1, None)
    flat, labels = checked_columns(columns, schema)
    list_names = list(flat)
    arrays = [_list_array(*flat[name], schema.field(name).type) for name in list_names]
    if labels is not None:
        arrays.append(_from_numpy(labels.astype(np.uint8), pa.uint8()))
    rows = pa.RecordBatch.from_arrays(arrays, schema=schema)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema, options=_IPC_OPTIONS) as writer:
        # max(n, 1): an empty shard still gets one empty batch, so every table has a chunk
        # (datasets 5.x, for one, fails to cast a table with zero chunks).
        end = max(rows.num_rows, 1) if stop is None else stop
        for start in range(0, end, batch_size):
            writer.write_batch(rows.slice(start, batch_size))
    return sink.getvalue().to_pybytes()


def checked_columns(
    columns: Mapping[str, Sequence], schema: pa.Schema
) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], np.ndarray | None]:
    """:func:`encode_shard`'s ``columns`` checked against ``schema``'s row kind and the
    format's rules (pipeline/shards/validate.py): the list columns flat, (values,
    offsets), in the schema's order, and the labels (None for MLM rows).

    Raises:
        ValueError: as :func:`encode_shard` says.
    """
    vocab_size, max_seq_length = schema_params(schema)
    kind = schema_kind(schema)
    names = kind_columns(kind)
    if set(columns) != set(names):
        raise ValueError(
            f"{kind} rows have exactly the columns {list(names)}, got {sorted(columns)}"
        )
    counts = {name: _num_rows(columns[name]) for name in names}
    if len(set(counts.values())) != 1:
        raise ValueError(f"all columns must have the same number of rows, got {counts}")
    flat = {name: _flatten(name, columns[name]) for name in names if name != "next_sentence_label"}
    labels = None
    if "next_sentence_label" in names:
        labels = _as_int64(columns["next_sentence_label"], "next_sentence_label", "iub")
        if labels.ndim != 1:
            raise ValueError("next_sentence_label must be a 1-D sequence with one value per row")
    validate.check_rows(
        flat, labels, vocab_size=vocab_size, max_seq_length=max_seq_length, kind=kind
    )
    return flat, labels


def stream_header(schema: pa.Schema) -> bytes:
    """The bytes every shard stream of ``schema`` starts with (its schema message)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema, options=_IPC_OPTIONS):
        pass
    data = sink.getvalue().to_pybytes()
    assert data.endswith(_EOS), "pyarrow wrote no end-of-stream marker"
    return data[: -len(_EOS)]


def encode_shard_body(
    columns: Mapping[str, Sequence], schema: pa.Schema, *, stop: int | None = None
) -> bytes:
    """The record-batch messages of :func:`encode_shard` for these rows, without the
    header and end marker: bodies of consecutive row ranges, joined by
    :func:`join_shard_bodies`, make one valid shard (written in parallel parts).

    With ``stop``, the messages of the first ``stop`` rows only. A message's bytes depend
    on what follows its rows in the batch it is sliced from: pyarrow writes a sliced
    buffer padded to 64 bytes where the buffer goes on that far, and only to its end
    where it does not (measured with pyarrow 25; tests/pipeline/test_steps.py checks it).
    With at least 64 rows after ``stop`` (a row puts at least one byte in every buffer:
    a token, a masked position, a label), the messages are those of any longer stream
    these rows start.

    Raises:
        ValueError: as :func:`encode_shard`.
    """
    data = encode_shard(columns, schema, stop=stop)
    header = stream_header(schema)
    if not data.startswith(header) or not data.endswith(_EOS):
        raise AssertionError("unexpected Arrow IPC stream layout")
    return data[len(header) : -len(_EOS)]


def join_shard_bodies(bodies: Sequence[bytes], schema: pa.Schema) -> bytes:
    """One shard stream from the bodies of its parts, in order (none: an empty shard)."""
    if not any(bodies):
        return encode_shard({name: [] for name in kind_columns(schema_kind(schema))}, schema)
    return b"".join(shard_chunks(bodies, schema))


def shard_chunks(bodies: Iterable[bytes], schema: pa.Schema) -> Iterator[bytes]:
    """:func:`join_shard_bodies` as a stream of chunks (header, bodies, end marker), so a
    large shard is joined without holding it whole; give at least one non-empty body."""
    yield stream_header(schema)
    yield from bodies
    yield _EOS


def _num_rows(column) -> int:
    return len(column.offsets) - 1 if isinstance(column, Ragged) else len(column)


def rows_to_columns(rows: Sequence[Mapping], kind: str = "nsp") -> dict[str, list]:
    """Transpose row dicts into the column mapping encode_shard takes.

    ``[{"input_ids": a0, ...}, {"input_ids": a1, ...}] -> {"input_ids": [a0, a1], ...}``

    Raises:
        ValueError: a row lacks one of ``kind``'s columns (extra keys are ignored).
    """
    names = kind_columns(kind)
    for i, row in enumerate(rows):
        missing = [name for name in names if name not in row]
        if missing:
            raise ValueError(f"row {i} lacks column(s) {missing}")
    return {name: [row[name] for row in rows] for name in names}


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
        if values.ndim != 1 or (values.size and values.dtype.kind not in "iub"):
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
        if array.size and array.dtype.kind not in "iub":
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


def _list_array(values: np.ndarray, offsets: np.ndarray, list_type: pa.DataType) -> pa.Array:
    if pa.types.is_boolean(list_type.value_type):
        flags = pa.Array.from_buffers(
            pa.bool_(),
            len(values),
            [None, pa.py_buffer(np.packbits(values != 0, bitorder="little"))],
        )
        return pa.ListArray.from_arrays(
            _from_numpy(offsets.astype(np.int32), pa.int32()), flags, type=list_type
        )
    target = np.dtype(str(list_type.value_type))
    narrow = _from_numpy(values.astype(target, copy=False), list_type.value_type)
    return pa.ListArray.from_arrays(
        _from_numpy(offsets.astype(np.int32), pa.int32()), narrow, type=list_type
    )


def _from_numpy(array: np.ndarray, arrow_type: pa.DataType) -> pa.Array:
    """Zero-copy 1-D numpy -> Arrow, without pa.array(), which imports pandas if present."""
    array = np.ascontiguousarray(array)
    return pa.Array.from_buffers(arrow_type, len(array), [None, pa.py_buffer(array)])


class RemoteFiles(Protocol):
    """How :func:`atomic_write_bytes` reaches a URI: pyarrow.fs by default (:class:`ArrowFiles`);
    the Beam jobs pass Beam's FileSystems, so a build writes wherever its runner can."""

    def create(self, uri: str) -> contextlib.AbstractContextManager[BinaryIO]: ...
    def rename(self, source: str, target: str) -> None: ...
    def discard(self, uri: str) -> None: ...  # delete if it exists


class ArrowFiles:
    """:class:`RemoteFiles` through pyarrow.fs, as the reader (shard_format) reads."""

    def create(self, uri: str) -> contextlib.AbstractContextManager[BinaryIO]:
        filesystem, path = resolve(uri)
        return filesystem.open_output_stream(path)

    def rename(self, source: str, target: str) -> None:
        filesystem, path = resolve(source)
        filesystem.move(path, resolve(target)[1])

    def discard(self, uri: str) -> None:
        filesystem, path = resolve(uri)
        if filesystem.get_file_info(path).type != pafs.FileType.NotFound:
            filesystem.delete_file(path)


def atomic_write_bytes(
    path: str | os.PathLike, data: bytes | Iterable[bytes], *, remote: RemoteFiles | None = None
) -> tuple[int, str]:
    """Write ``data`` to ``path`` so readers see the old file or the whole new one.

    The one atomic writer of the project: the data is written under a temporary name
    beside ``path`` (``.NAME.HEX.tmp``), then renamed over it; on failure the temporary
    file is removed and ``path`` untouched. A local file is also fsynced, and its
    directory after the rename (:func:`atomic_output`); a URI goes through ``remote``.

    Args:
        path: a local path or a URI (gs://, s3://, file://, ...).
        data: the bytes, or chunks of them (a large file is written without being held
            whole).
        remote: how to reach a URI (default :class:`ArrowFiles`); unused for local paths.

    Returns:
        (size in bytes, hex sha256) of what was written.

    Raises:
        OSError: from the file system.
    """
    chunks = [data] if isinstance(data, bytes | bytearray | memoryview) else data
    path = os.fspath(path)
    if not is_remote(path):
        with atomic_output(path) as temp, open(temp, "wb") as f:
            return _write_chunks(chunks, f)
    remote = remote or ArrowFiles()
    directory, name = posixpath.split(path)
    temp = f"{directory}/.{name}.{secrets.token_hex(6)}.tmp"
    try:
        with remote.create(temp) as f:
            written = _write_chunks(chunks, f)
        remote.rename(temp, path)
    except BaseException:
        remote.discard(temp)
        raise
    return written


def _write_chunks(chunks: Iterable[bytes], f: BinaryIO) -> tuple[int, str]:
    size, digest = 0, hashlib.sha256()
    for chunk in chunks:
        f.write(chunk)
        digest.update(chunk)
        size += len(chunk)
    return size, digest.hexdigest()


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike) -> Iterator[Path]:
    """A temp path beside the local ``path`` for the caller to write; renamed over ``path``
    on success (what :func:`atomic_write_bytes` does for a local file).

    Readers see the old file or the whole new one. The parent directory is created if
    missing. The file gets mode 0o666 less the umask (0644 under umask 022), as ``open``
    would create ``path`` itself: not the 0600 of ``tempfile.mkstemp`` or of safetensors'
    ``save_file`` (0.8), which would leave exports and checkpoints unreadable to the group
    and others. After the block the file is fsynced, renamed (atomic on POSIX) and the
    directory fsynced; if the block raises, the temp file is removed and ``path`` is
    untouched.

        with atomic_output("hf/model.safetensors") as temp:
            safetensors.torch.save_file(state, temp)

    Raises:
        OSError: from the file system.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    mode = stat.S_IMODE(os.fstat(fd).st_mode)  # 0o666 less the umask, learnt without os.umask
    os.close(fd)
    try:
        yield temp
        os.chmod(temp, mode)  # a writer may have replaced the file (safetensors: 0600)
        fd = os.open(temp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    if hasattr(os, "O_DIRECTORY"):  # make the rename itself durable
        fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


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
    kind = params_kind(params)
    schema = shard_schema(int(vocab["size"]), int(params["max_seq_length"]), kind)
    described = {
        "vocab_size": vocab["size"],
        "max_seq_length": params["max_seq_length"],
        "columns": {field.name: str(field.type) for field in schema},
    }
    if kind != "nsp":  # NSP manifests keep the bytes they had before the MLM kinds
        described["kind"] = kind
    draft = {
        "format_version": FORMAT_VERSION,
        "algorithm_version": ALGORITHM_VERSION,
        "created_by": created_by(),
        "schema": described,
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


def params_kind(params: Mapping) -> str:
    """The row kind a build's parameters make: ``objective`` (absent: nsp) and, for MLM
    rows, ``static_masks``."""
    objective = params.get("objective", "nsp")
    if objective == "nsp":
        return "nsp"
    if objective != "mlm":
        raise ValueError(f"params.objective must be nsp or mlm, got {objective!r}")
    return "mlm_masked" if params.get("static_masks") else "mlm"


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
