"""The shard format: the one contract between the pipeline (writer) and any trainer (reader).

An output directory holds ``shard-NNNNN-of-MMMMM.arrow`` files (Arrow IPC *stream* format,
uncompressed, unpadded rows), ``vocab.txt``, ``tokenizer.json`` and ``manifest.json``, which is
written last. ``pipeline/shards/FORMAT.md`` documents all of it for readers without this module; this
module is the executable reader (``pipeline/shards/shard_writer.py`` the writer,
``pipeline/shards/validate.py`` the checker) and depends only on pyarrow, numpy and the
standard library.

Version 1 (``FORMAT_VERSION``). Columns, with X = uint16 if vocab_size <= 65536 else uint32 and
Y = uint8 if max_seq_length <= 256 else uint16:

    input_ids            list<X>      [CLS] A [SEP] B [SEP], already masked
    segment_ids          list<uint8>  0 for [CLS] A [SEP], 1 for B [SEP]
    masked_lm_positions  list<Y>      strictly increasing indexes into input_ids
    masked_lm_ids        list<X>      original ids at those positions
    next_sentence_label  uint8        1 = B is a random segment, 0 = B follows A

Schema metadata: ``bert_shard_format_version``, ``bert_shard_vocab_size`` and
``bert_shard_max_seq_length`` (ASCII decimals), so the schema is a pure function of
(vocab_size, max_seq_length, kind) and every shard of a run has the same one.

Those are NSP rows, Google's recipe. MLM-only rows (``KINDS``: ``mlm``, ``mlm_masked``) are
packed sentences with ``input_ids`` and ``continues_word`` (list<bool>), plus the two mask
columns for ``mlm_masked``; their schemas carry ``bert_shard_kind`` and their manifests
``schema.kind``. FORMAT.md, "Row kinds".

Check a directory from the shell: ``python -m pipeline validate DIR`` (every shard's files and
rows).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterator, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

# The reader's public names.
__all__ = [
    "ALGORITHM_VERSION",
    "COLUMNS",
    "DEFAULT_BATCH_SIZE",
    "FORMAT_VERSION",
    "KINDS",
    "KIND_COLUMNS",
    "LIST_COLUMNS",
    "MANIFEST_NAME",
    "SPECIAL_ID_NAMES",
    "TOKENIZER_NAME",
    "VOCAB_NAME",
    "ShardFormatError",
    "check_vocab_compat",
    "file_size",
    "is_remote",
    "iter_rows",
    "join_path",
    "kind_columns",
    "manifest_kind",
    "open_shard",
    "parse_shard_name",
    "read_bytes",
    "read_manifest",
    "resolve",
    "row_to_numpy",
    "schema_kind",
    "schema_params",
    "sha256_file",
    "shard_name",
    "shard_schema",
    "verify_directory",
    "verify_shard",
]

FORMAT_VERSION = 1
# What the bytes hold for a given input, seed and parameters: vocab learning, NSP pairs,
# masking, bucketing, sharding and row order. Bump it (FORMAT.md, CHANGELOG.md) whenever a
# change gives other shards for the same build; tests/pipeline/test_golden.py pins the bytes.
# FORMAT_VERSION, by contrast, changes only when readers must change.
ALGORITHM_VERSION = 3
MANIFEST_NAME = "manifest.json"
VOCAB_NAME = "vocab.txt"
TOKENIZER_NAME = "tokenizer.json"
DEFAULT_BATCH_SIZE = 1024  # rows per Arrow record batch
LIST_COLUMNS = ("input_ids", "segment_ids", "masked_lm_positions", "masked_lm_ids")
COLUMNS = (*LIST_COLUMNS, "next_sentence_label")
# Row kinds (FORMAT.md, "Row kinds"): Google's NSP rows with static masks; MLM-only rows of
# packed sentences, unmasked (the trainer masks them) or with static masks.
KINDS = ("nsp", "mlm", "mlm_masked")
KIND_COLUMNS = {
    "nsp": COLUMNS,
    "mlm": ("input_ids", "continues_word"),
    "mlm_masked": ("input_ids", "continues_word", "masked_lm_positions", "masked_lm_ids"),
}
# The keys of the manifest's vocab.special_ids, in Google's order (ids 0..4 in our vocabs);
# the tokens themselves are "[PAD]", ... (pipeline/core/wordpiece.py SPECIAL_TOKENS).
SPECIAL_ID_NAMES = ("pad", "unk", "cls", "sep", "mask")

_VERSION_KEY = b"bert_shard_format_version"
_VOCAB_KEY = b"bert_shard_vocab_size"
_SEQ_KEY = b"bert_shard_max_seq_length"
_KIND_KEY = b"bert_shard_kind"  # absent: nsp (every shard written before the MLM kinds)
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


def kind_columns(kind: str) -> tuple[str, ...]:
    """The columns of a row kind, in schema order.

    Raises:
        ShardFormatError: a kind this reader does not know (naming the ones it knows).
    """
    if kind not in KIND_COLUMNS:
        raise ShardFormatError(
            f"row kind {kind!r} is unknown to this reader, which knows {list(KINDS)} — "
            "upgrade bert-pipeline (or regenerate the shards with this version)"
        )
    return KIND_COLUMNS[kind]


def manifest_kind(manifest: Mapping) -> str:
    """The row kind a manifest describes: ``schema.kind``, absent (``nsp``) in manifests
    written before the MLM kinds, which NSP builds still write byte for byte."""
    return manifest["schema"].get("kind", "nsp")


def shard_schema(vocab_size: int, max_seq_length: int, kind: str = "nsp") -> pa.Schema:
    """The Arrow schema of every shard written for this vocab size, sequence length and row
    kind. NSP schemas carry no kind in their metadata (their bytes are those of every NSP
    shard before the MLM kinds); MLM schemas carry ``bert_shard_kind``.

    Raises:
        ValueError: vocab_size not an int in [1, 2**32] or max_seq_length not in [1, 65536].
        ShardFormatError: an unknown kind.
    """
    _check_int("vocab_size", vocab_size, 1, 2**32)
    _check_int("max_seq_length", max_seq_length, 1, 2**16)
    token = pa.uint16() if vocab_size <= 2**16 else pa.uint32()
    position = pa.uint8() if max_seq_length <= 2**8 else pa.uint16()
    types = {
        "input_ids": pa.list_(token),
        "segment_ids": pa.list_(pa.uint8()),
        "continues_word": pa.list_(pa.bool_()),
        "masked_lm_positions": pa.list_(position),
        "masked_lm_ids": pa.list_(token),
        "next_sentence_label": pa.uint8(),
    }
    fields = [pa.field(name, types[name]) for name in kind_columns(kind)]
    meta = {_VERSION_KEY: str(FORMAT_VERSION).encode(), _VOCAB_KEY: str(vocab_size).encode()}
    meta[_SEQ_KEY] = str(max_seq_length).encode()
    if kind != "nsp":
        meta[_KIND_KEY] = kind.encode()
    return pa.schema(fields, metadata=meta)


def schema_kind(schema: pa.Schema) -> str:
    """The row kind of a shard schema (``bert_shard_kind``; absent: ``nsp``)."""
    return (schema.metadata or {}).get(_KIND_KEY, b"nsp").decode(errors="replace")


def schema_params(schema: pa.Schema, *, where: str = "schema") -> tuple[int, int]:
    """(vocab_size, max_seq_length) of a shard schema, checking it is exactly a version-1
    schema of a known row kind (:func:`schema_kind` gives the kind).

    Raises:
        ShardFormatError: another format version, an unknown kind, or not a schema
            shard_schema() produces.
    """
    meta = schema.metadata or {}
    version = meta.get(_VERSION_KEY, b"<missing>").decode(errors="replace")
    if version != str(FORMAT_VERSION):
        raise ShardFormatError(
            f"{where} has shard format version {version}; this reader supports {FORMAT_VERSION} "
            "— upgrade bert-pipeline (or regenerate the shards with this version)"
        )
    kind = schema_kind(schema)
    try:
        kind_columns(kind)
    except ShardFormatError as err:
        raise ShardFormatError(f"{where}: {err}") from None
    try:
        params = int(meta[_VOCAB_KEY]), int(meta[_SEQ_KEY])
        expected = shard_schema(*params, kind)
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


# ----------------------------------------------------------------------------- reading


def is_remote(path_or_uri: str | os.PathLike) -> bool:
    """Whether this is a URI (``gs://b/x``, ``s3://``, ``file:///tmp/x``) rather than a
    local path: ``is_remote("gs://b/shards") -> True``, ``is_remote("runs/shards") -> False``."""
    return "://" in os.fspath(path_or_uri)


def resolve(path_or_uri: str | os.PathLike) -> tuple[pafs.FileSystem | None, str]:
    """Local paths -> (None, path); URIs (gs://, s3://, file://, ...) -> (filesystem, path)."""
    text = os.fspath(path_or_uri)
    if is_remote(text):
        return pafs.FileSystem.from_uri(text)
    return None, text


def join_path(directory: str | os.PathLike, name: str) -> str:
    """``directory/name`` for a local directory or a URI."""
    text = os.fspath(directory)
    return f"{text.rstrip('/')}/{name}" if is_remote(text) else os.path.join(text, name)


def _open_buffer(path_or_uri: str | os.PathLike):
    """A readable, seekable view of the whole file: memory-mapped locally, one read remotely."""
    filesystem, path = resolve(path_or_uri)
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
    """Yield each row as {column: np.int64 array}: lists of shape (n,), the label of shape ()
    (``continues_word`` as bool)."""
    names = table.column_names
    list_names = [name for name in names if name != "next_sentence_label"]
    for batch in table.to_batches():
        lists = {name: _list_to_numpy(batch.column(name)) for name in list_names}
        labels = None
        if "next_sentence_label" in names:
            labels = batch.column("next_sentence_label").to_numpy().astype(np.int64)
        for i in range(batch.num_rows):
            row = {
                name: values[offsets[i] : offsets[i + 1]]
                for name, (offsets, values) in lists.items()
            }
            if labels is not None:
                row["next_sentence_label"] = labels[i].reshape(())
            yield row


def _list_to_numpy(column: pa.ListArray) -> tuple[np.ndarray, np.ndarray]:
    """(offsets from 0, values) of a possibly sliced list array, converting only its rows:
    int64 values, or bool for a list of bools."""
    offsets = column.offsets.to_numpy()
    values = column.flatten()
    if pa.types.is_boolean(values.type):
        return offsets - offsets[0], values.to_numpy(zero_copy_only=False)
    return offsets - offsets[0], values.to_numpy().astype(np.int64)


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
    filesystem, path = resolve(path_or_uri)
    digest = hashlib.sha256()
    with open(path, "rb") if filesystem is None else filesystem.open_input_stream(path) as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def file_size(path_or_uri: str | os.PathLike) -> int:
    """Bytes of a local file or a URI.

    Raises:
        FileNotFoundError: there is no such file.
    """
    filesystem, path = resolve(path_or_uri)
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
    size = file_size(path_or_uri)
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
    schema = manifest["schema"]
    expected = shard_schema(schema["vocab_size"], schema["max_seq_length"], manifest_kind(manifest))
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
    filesystem, path = resolve(path_or_uri)
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
    if "algorithm_version" in manifest:  # added within version 1: older manifests lack it
        _check_fields(manifest, {"algorithm_version": int}, where)
    schema, vocab, shards = manifest["schema"], manifest["vocab"], manifest["shards"]
    _check_fields(schema, _SCHEMA_SPEC, f"{where}: schema")
    _check_fields(vocab, _VOCAB_SPEC, f"{where}: vocab")
    _check_fields(
        vocab["special_ids"], dict.fromkeys(SPECIAL_ID_NAMES, int), f"{where}: vocab.special_ids"
    )
    _check_fields(manifest["skipped"], dict.fromkeys(manifest["skipped"], int), f"{where}: skipped")
    for i, entry in enumerate(shards):
        _check_fields(entry, _SHARD_SPEC, f"{where}: shards[{i}]")
    if "kind" in schema and not isinstance(schema["kind"], str):
        raise ValueError(f"{where}: schema.kind must be a JSON str, got {schema['kind']!r}")
    try:
        expected = shard_schema(
            schema["vocab_size"], schema["max_seq_length"], manifest_kind(manifest)
        )
    except ShardFormatError as err:
        raise ValueError(f"{where}: {err}") from None
    if schema["columns"] != {field.name: str(field.type) for field in expected}:
        raise ValueError(f"{where}: schema.columns {schema['columns']} do not match\n{expected}")
    if schema["vocab_size"] != vocab["size"]:
        raise ValueError(
            f"{where}: schema.vocab_size {schema['vocab_size']} != vocab.size {vocab['size']}"
        )
    for token, token_id in vocab["special_ids"].items():
        if token in SPECIAL_ID_NAMES and token_id >= vocab["size"]:
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
        if token not in SPECIAL_ID_NAMES:
            raise ValueError(
                f"unknown special token {token!r}; expected one of {list(SPECIAL_ID_NAMES)}"
            )
        if model_id != data_ids[token]:
            raise ValueError(
                f"the model uses id {model_id} for [{token.upper()}] but the shards use "
                f"{data_ids[token]} (manifest vocab.special_ids.{token})"
            )
