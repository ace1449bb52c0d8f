"""The bytes of exported shards: NVIDIA's HDF5 and Google's TFRecord of ``tf.train.Example``.

Pure functions over one shard's Arrow table; ``pipeline/beam/export.py`` runs them as a Beam job
(``python -m pipeline export``). Both formats hold every row padded to ``max_seq_length`` L
and ``max_predictions_per_seq`` P, in the shard's row order, with the same ids and masks:

    field                 HDF5 (N = rows)   TFRecord feature     value
    input_ids             int32 (N, L)      int64 [L]            the row's ids, then 0s
    input_mask            int8  (N, L)      int64 [L]            1 per real token, then 0s
    segment_ids           int8  (N, L)      int64 [L]            the row's segment ids, then 0s
    masked_lm_positions   int32 (N, P)      int64 [P]            the row's positions, then 0s
    masked_lm_ids         int32 (N, P)      int64 [P]            the targets, then 0s
    masked_lm_weights     —                 float [P]            1.0 per target, then 0.0
    next_sentence_labels  int8  (N,)        int64 [1]            next_sentence_label

NVIDIA's loaders find where a row's masks end at the first 0 of ``masked_lm_positions``
(position 0 is ``[CLS]``, never masked); Google's weigh each prediction by
``masked_lm_weights``. Model Garden's v2 names call ``input_ids`` ``input_word_ids`` and
``segment_ids`` ``input_type_ids``. FORMAT.md ("Exports") says why each choice.
"""

from __future__ import annotations

import functools
import io
import struct
from collections.abc import Iterator, Mapping
from typing import BinaryIO

import google_crc32c
import numpy as np
import pyarrow as pa

HDF5 = "nvidia-hdf5"
TFRECORD = "tfrecord"
MDS = "mds"  # pipeline/shards/mds_format.py
MEGATRON = "megatron"  # pipeline/shards/megatron_format.py
FORMATS = (HDF5, TFRECORD, MDS, MEGATRON)
# The formats of padded NSP rows with static masks: they take NSP shards only.
NSP_FORMATS = (HDF5, TFRECORD)
EXTENSIONS = {HDF5: "hdf5", TFRECORD: "tfrecord"}
# NVIDIA's create_pretraining_data.py: int32 ids and positions, int8 masks and labels.
HDF5_DTYPES = {
    "input_ids": "int32",
    "input_mask": "int8",
    "segment_ids": "int8",
    "masked_lm_positions": "int32",
    "masked_lm_ids": "int32",
    "next_sentence_labels": "int8",
}
# gzip as NVIDIA's files, at level 1 with HDF5's byte shuffle: both are filters every HDF5
# build decodes, and level 4 (NVIDIA's, h5py's default) deflates longer for larger files than
# level 1 with shuffle (bench/export_speed.py measures both; docs/results.md).
HDF5_OPTIONS = {"compression": "gzip", "compression_opts": 1, "shuffle": True}
# Feature name of each field: google-research/bert's run_pretraining.py (v1) and TF Model
# Garden's use_v2_feature_names (v2).
TFRECORD_NAMES = {
    "v1": {name: name for name in (*HDF5_DTYPES, "masked_lm_weights")},
    "v2": {
        **{name: name for name in (*HDF5_DTYPES, "masked_lm_weights")},
        "input_ids": "input_word_ids",
        "segment_ids": "input_type_ids",
    },
}
INSTALL_HINT = "pip install h5py (a dependency of bert-pipeline)"


def import_h5py():
    """h5py, or an ImportError that says how to install it (it is only the export's need)."""
    try:
        import h5py
    except ImportError as err:
        raise ImportError(f"--to {HDF5} needs h5py: {INSTALL_HINT}") from err
    return h5py


def export_name(index: int, num_shards: int, fmt: str) -> str:
    """The file one shard becomes.

    ``export_name(3, 10, "tfrecord") -> "shard-00003-of-00010.tfrecord"``;
    ``export_name(3, 10, "nvidia-hdf5") -> "training-part-00003-of-00010.hdf5"``: NVIDIA's
    and DeepSpeed's loaders take the files whose name holds ``training``, academic-budget-bert's
    ``train``, MLPerf's ``part``. ``export_name(3, 10, "mds") -> "shard-00003-of-00010"``: a
    directory (an MDS dataset of its own).
    """
    if fmt == MDS:
        return f"shard-{index:05d}-of-{num_shards:05d}"
    stem = "training-part" if fmt == HDF5 else "shard"
    return f"{stem}-{index:05d}-of-{num_shards:05d}.{EXTENSIONS[fmt]}"


# ----------------------------------------------------------------------------- padding


def _list_column(column: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(offsets from 0, values) of a possibly sliced list array, without copying the values."""
    offsets = column.offsets.to_numpy()
    return offsets - offsets[0], column.flatten().to_numpy()


def pad_rows(offsets: np.ndarray, values: np.ndarray, width: int, dtype) -> np.ndarray:
    """Rows of a list column as an (n, width) matrix, zero-padded on the right.

    ``pad_rows([0, 2, 3], [5, 6, 7], 3, np.int32) -> [[5, 6, 0], [7, 0, 0]]``

    Raises:
        ValueError: a row longer than ``width`` (names the first, counted from 0).
    """
    lengths = np.diff(offsets)
    too_long = np.flatnonzero(lengths > width)
    if too_long.size:
        row = int(too_long[0])
        raise ValueError(f"row {row} has {int(lengths[row])} values, more than {width}")
    out = np.zeros((len(lengths), width), dtype)
    out[np.arange(width) < lengths[:, None]] = values  # row-major, as the values lie
    return out


def padded_batch(
    batch: pa.RecordBatch, max_seq_length: int, max_predictions_per_seq: int, first_row: int = 0
) -> dict[str, np.ndarray]:
    """One record batch of a shard as NVIDIA's padded arrays (see the module docstring), plus
    ``lengths`` and ``num_predictions`` (n,) int64.

    Raises:
        ValueError: a row with more than ``max_predictions_per_seq`` masked positions or more
            than ``max_seq_length`` tokens (names it, counting from ``first_row``).
    """
    out = {}
    for name, width, what in (
        ("input_ids", max_seq_length, "tokens, more than max_seq_length"),
        ("segment_ids", max_seq_length, "segment ids, more than max_seq_length"),
        (
            "masked_lm_positions",
            max_predictions_per_seq,
            "masked positions, more than --max_predictions_per_seq",
        ),
        ("masked_lm_ids", max_predictions_per_seq, "targets, more than --max_predictions_per_seq"),
    ):
        offsets, values = _list_column(batch.column(name))
        counts = np.diff(offsets)
        over = np.flatnonzero(counts > width)
        if over.size:
            row = int(over[0])
            raise ValueError(f"row {first_row + row} has {int(counts[row])} {what} {width}")
        out[name] = pad_rows(offsets, values, width, HDF5_DTYPES[name])
        if name == "input_ids":
            out["lengths"] = counts
        elif name == "masked_lm_positions":
            out["num_predictions"] = counts
    out["input_mask"] = (np.arange(max_seq_length) < out["lengths"][:, None]).astype(np.int8)
    out["next_sentence_labels"] = batch.column("next_sentence_label").to_numpy().astype(np.int8)
    return out


# ----------------------------------------------------------------------------- HDF5


def hdf5_bytes(table: pa.Table, max_seq_length: int, max_predictions_per_seq: int) -> bytes:
    """One shard as an HDF5 file of NVIDIA's six datasets (see HDF5_DTYPES, HDF5_OPTIONS).

    Memory: the padded arrays of the whole shard (929 bytes a row at L 128, P 20: about
    twice the Arrow shard) plus the compressed file.

    Raises:
        ValueError: see padded_batch.
        ImportError: h5py is missing.
    """
    h5py = import_h5py()
    n, seq, pred = table.num_rows, max_seq_length, max_predictions_per_seq
    shapes = {
        "input_ids": (n, seq),
        "input_mask": (n, seq),
        "segment_ids": (n, seq),
        "masked_lm_positions": (n, pred),
        "masked_lm_ids": (n, pred),
        "next_sentence_labels": (n,),
    }
    arrays = {name: np.zeros(shapes[name], dtype) for name, dtype in HDF5_DTYPES.items()}
    start = 0
    for batch in table.to_batches():
        padded = padded_batch(batch, max_seq_length, max_predictions_per_seq, start)
        for name, array in arrays.items():
            array[start : start + batch.num_rows] = padded[name]
        start += batch.num_rows
    buffer = io.BytesIO()
    with h5py.File(buffer, "w") as f:
        for name, array in arrays.items():
            # h5py cannot chunk (so cannot compress) an empty dataset; it stays contiguous.
            f.create_dataset(name, data=array, **(HDF5_OPTIONS if n else {}))
    return buffer.getvalue()


# ----------------------------------------------------------------------------- TFRecord


def message_field(message, name: str, number: int, type_name: str, repeated=False, **more):
    """Add to a DescriptorProto ``message`` the field ``name`` of message type ``type_name``."""
    from google.protobuf.descriptor_pb2 import FieldDescriptorProto as field

    label = field.LABEL_REPEATED if repeated else field.LABEL_OPTIONAL
    message.field.add(
        name=name, number=number, type=field.TYPE_MESSAGE, label=label, type_name=type_name, **more
    )


@functools.cache
def example_classes() -> dict[str, type]:
    """Message classes of tensorflow/core/example/{feature,example}.proto, declared here.

    The schema (package ``tensorflow``, message names, field numbers and packing) is
    TensorFlow's, so TensorFlow parses the bytes; declaring it keeps the dependency to
    ``protobuf`` (Beam needs it anyway), without TensorFlow. A private pool, so a process that
    also imports TensorFlow (which registers the same names) does not clash.

    Returns:
        {"Example", "Features", "Feature", "BytesList", "FloatList", "Int64List"}: classes.
    """
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    field = descriptor_pb2.FieldDescriptorProto
    feature = descriptor_pb2.FileDescriptorProto(
        name="tensorflow/core/example/feature.proto", package="tensorflow", syntax="proto3"
    )
    for name, kind in (
        ("BytesList", field.TYPE_BYTES),
        ("FloatList", field.TYPE_FLOAT),
        ("Int64List", field.TYPE_INT64),
    ):
        value = feature.message_type.add(name=name).field.add(
            name="value", number=1, type=kind, label=field.LABEL_REPEATED
        )
        if kind != field.TYPE_BYTES:
            value.options.packed = True
    one = feature.message_type.add(name="Feature")
    one.oneof_decl.add(name="kind")
    for number, name in enumerate(("bytes_list", "float_list", "int64_list"), start=1):
        type_name = ".tensorflow." + name.title().replace("_", "")
        message_field(one, name, number, type_name, oneof_index=0)
    features = feature.message_type.add(name="Features")
    entry = features.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=field.TYPE_STRING, label=field.LABEL_OPTIONAL)
    message_field(entry, "value", 2, ".tensorflow.Feature")
    message_field(features, "feature", 1, ".tensorflow.Features.FeatureEntry", repeated=True)
    example = descriptor_pb2.FileDescriptorProto(
        name="tensorflow/core/example/example.proto",
        package="tensorflow",
        syntax="proto3",
        dependency=[feature.name],
    )
    message_field(example.message_type.add(name="Example"), "features", 1, ".tensorflow.Features")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(feature)
    pool.Add(example)
    classes = message_factory.GetMessageClassesForFiles([feature.name, example.name], pool)
    return {name.removeprefix("tensorflow."): cls for name, cls in classes.items()}


class ExampleEncoder:
    """Serialises padded rows as ``tf.train.Example`` bytes through one reused message.

    A fresh message per row costs several times more (building the feature map dominates,
    and every value is converted again; bench/export_speed.py). Here the message keeps its map and each row rewrites
    only the values that differ from the row before: for each field the span from the first
    to the last differing value, found for a whole batch at once with numpy. Padding, masks,
    weights and labels mostly repeat from row to row, so most of the cost left is input_ids
    and the serialisation (bench/export_speed.py). Keys serialise sorted
    (``deterministic=True``): the same rows give the same bytes.

    Args:
        names: field -> feature name, one of TFRECORD_NAMES.
        max_seq_length, max_predictions_per_seq: L and P.
    """

    FIELDS = (
        "input_ids",
        "input_mask",
        "segment_ids",
        "masked_lm_positions",
        "masked_lm_ids",
        "masked_lm_weights",
        "next_sentence_labels",
    )

    def __init__(self, names: Mapping[str, str], max_seq_length: int, max_predictions_per_seq: int):
        self._example = example_classes()["Example"]()
        feature = self._example.features.feature
        self._values = []
        for field in self.FIELDS:
            if field == "next_sentence_labels":
                width = 1
            elif field.startswith("masked"):
                width = max_predictions_per_seq
            else:
                width = max_seq_length
            if field == "masked_lm_weights":
                values = feature[names[field]].float_list.value
                values.extend([0.0] * width)
            else:
                values = feature[names[field]].int64_list.value
                values.extend([0] * width)  # every update below keeps the length
            self._values.append(values)
        self._pred = max_predictions_per_seq

    def encode(self, padded: Mapping[str, np.ndarray]) -> Iterator[bytes]:
        """One ``Example`` per row of ``padded`` (from padded_batch), in order."""
        weights = np.arange(self._pred) < padded["num_predictions"][:, None]
        matrices = {
            **padded,
            "masked_lm_weights": weights.astype(np.float32),
            "next_sentence_labels": padded["next_sentence_labels"][:, None],
        }
        updates = [
            (values, *_changed_spans(matrices[field]))
            for values, field in zip(self._values, self.FIELDS, strict=True)
        ]
        for i in range(len(padded["lengths"])):
            for values, flat, width, starts, stops in updates:
                start, stop = starts[i], stops[i]
                if start < stop:  # a memoryview slice: converted straight from the buffer
                    values[start:stop] = flat[i * width + start : i * width + stop]
            yield self._example.SerializeToString(deterministic=True)


def _changed_spans(matrix: np.ndarray) -> tuple[memoryview, int, list[int], list[int]]:
    """(flat view of ``matrix``, its width, per row the start and stop of the span that
    differs from the row before). Row 0 spans the whole width: the message may hold any
    earlier row. ``[[1, 2, 3], [1, 5, 3], [1, 5, 3]] -> starts [0, 1, 0], stops [3, 2, 0]``.
    """
    matrix = np.ascontiguousarray(matrix)
    width = matrix.shape[1]
    changed = matrix[1:] != matrix[:-1]  # (n - 1, width)
    some = changed.any(axis=1)
    starts = np.where(some, changed.argmax(axis=1), 0)
    stops = np.where(some, width - changed[:, ::-1].argmax(axis=1), 0)
    return (memoryview(matrix.reshape(-1)), width, [0, *starts.tolist()], [width, *stops.tolist()])


def tfrecord_chunks(
    table: pa.Table, encoder: ExampleEncoder, max_seq_length: int, max_predictions_per_seq: int
) -> Iterator[bytes]:
    """One shard as TFRecord bytes, one chunk per record batch (memory: one batch).

    Raises:
        ValueError: see padded_batch.
    """
    start = 0
    for batch in table.to_batches():
        padded = padded_batch(batch, max_seq_length, max_predictions_per_seq, start)
        start += batch.num_rows
        out = io.BytesIO()
        for record in encoder.encode(padded):
            write_tfrecord(out, record)
        yield out.getvalue()


def write_tfrecord(out: BinaryIO, record: bytes) -> None:
    """One TFRecord: length (uint64 LE), its masked CRC32C, the data, the data's masked CRC32C.

    The framing TensorFlow's reader checks (tensorflow/core/lib/io/record_writer.h). Written
    here over google-crc32c, the CRC library Beam's own TFRecord writer takes, so that the
    contract layer needs no Beam (Beam's framing helper is private API besides); the tests
    compare the bytes with Beam's writer and read them back with TensorFlow's reader.
    """
    length = struct.pack("<Q", len(record))
    out.write(length + struct.pack("<I", _masked_crc32c(length)))
    out.write(record + struct.pack("<I", _masked_crc32c(record)))


def _masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC32C: the CRC rotated right by 15 bits plus 0xA282EAD8 (mod 2**32)."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
