"""Tests for pipeline/shards/shard_format.py and the snippets of pipeline/shards/FORMAT.md."""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from pipeline.cli.inspect_cli import validate_main
from pipeline.shards import shard_format, shard_writer

VOCAB_SIZE, MAX_SEQ = 30522, 128
SPECIAL_IDS = {"pad": 0, "unk": 100, "cls": 101, "sep": 102, "mask": 103}
FORMAT_MD = Path(shard_format.__file__).with_name("FORMAT.md")


def make_columns(seed: int, num_rows: int, *, vocab_size=VOCAB_SIZE, max_seq=MAX_SEQ) -> dict:
    """Random but valid rows, as the pipeline produces them (int32 arrays, bool labels):
    special ids only where the format puts them, masks never on [CLS]/[SEP]."""
    rng = np.random.default_rng(seed)
    columns = {name: [] for name in shard_format.COLUMNS}
    text_ids = max(SPECIAL_IDS.values()) + 1  # ids from here on are text, never special
    for _ in range(num_rows):
        length = int(rng.integers(5, max_seq + 1))
        split = int(rng.integers(2, length - 2))
        num_masked = int(rng.integers(0, min(20, length - 3) + 1))
        maskable = np.setdiff1d(np.arange(1, length - 1), [split])
        positions = np.sort(rng.choice(maskable, num_masked, replace=False))
        input_ids = rng.integers(text_ids, vocab_size, length).astype(np.int32)
        cls, sep = SPECIAL_IDS["cls"], SPECIAL_IDS["sep"]
        input_ids[[0, split, length - 1]] = (cls, sep, sep)  # [CLS] A [SEP] B [SEP]
        columns["input_ids"].append(input_ids)
        columns["segment_ids"].append((np.arange(length) > split).astype(np.int8))
        columns["masked_lm_positions"].append(positions.astype(np.int32))
        targets = rng.integers(text_ids, vocab_size, num_masked).astype(np.int32)
        columns["masked_lm_ids"].append(targets)
        columns["next_sentence_label"].append(bool(rng.integers(0, 2)))
    return columns


def write_output(directory: Path, rows_per_shard=(5, 0, 7), *, seed=0) -> dict:
    """A complete output directory (shards, vocab, tokenizer, manifest); returns the manifest."""
    directory.mkdir(parents=True, exist_ok=True)
    schema = shard_format.shard_schema(VOCAB_SIZE, MAX_SEQ)
    entries = []
    for index, num_rows in enumerate(rows_per_shard):
        name = shard_format.shard_name(index, len(rows_per_shard))
        data = shard_writer.encode_shard(make_columns(seed + index, num_rows), schema, batch_size=4)
        shard_writer.atomic_write_bytes(directory / name, data)
        digest = shard_format.sha256_file(directory / name)
        entries.append({"name": name, "rows": num_rows, "bytes": len(data), "sha256": digest})
    (directory / "vocab.txt").write_text("".join(f"tok{i}\n" for i in range(VOCAB_SIZE)))
    (directory / "tokenizer.json").write_text("{}\n")
    vocab = vocab_entry(shard_format.sha256_file(directory / "vocab.txt"))
    vocab["tokenizer_file"] = "tokenizer.json"
    vocab["tokenizer_sha256"] = shard_format.sha256_file(directory / "tokenizer.json")
    manifest = shard_writer.build_manifest(
        shards=entries,
        vocab=vocab,
        params={"max_seq_length": MAX_SEQ, "seed": seed, "masked_lm_prob": 0.15},
        stats={"num_documents": np.int64(3), "mean_length": np.float32(0.5)},
        skipped={"empty_document": 1},
    )
    shard_writer.atomic_write_bytes(
        directory / "manifest.json", shard_writer.encode_manifest(manifest)
    )
    return manifest


def vocab_entry(sha256="0" * 64, size=VOCAB_SIZE) -> dict:
    return {
        "file": "vocab.txt",
        "sha256": sha256,
        "size": size,
        "do_lower_case": True,
        "special_ids": SPECIAL_IDS,
    }


def as_lists(columns: dict) -> dict:
    return {name: [np.asarray(v).tolist() for v in values] for name, values in columns.items()}


def hugging_face():
    """(datasets, torch): how FORMAT.md's Hugging Face readers load the shards; in the test
    extra, not the base install (tests/pipeline runs without them: these tests skip)."""
    why = "reading shards through Hugging Face needs the test extra (datasets, torch)"
    return pytest.importorskip("datasets", reason=why), pytest.importorskip("torch", reason=why)


# ----------------------------------------------------------------------------- names and schema


def test_shard_name_round_trips_and_rejects_bad_names():
    assert shard_format.shard_name(3, 128) == "shard-00003-of-00128.arrow"
    assert shard_format.parse_shard_name("shard-00003-of-00128.arrow") == (3, 128)
    for bad in (
        "shard-3-of-128.arrow",
        "shard-00128-of-00128.arrow",
        "x/shard-00000-of-00001.arrow",
    ):
        with pytest.raises(ValueError, match="is not a shard name"):
            shard_format.parse_shard_name(bad)
    with pytest.raises(ValueError, match="0 <= 5 < 5"):
        shard_format.shard_name(5, 5)


@pytest.mark.parametrize(
    ("vocab_size", "max_seq", "token", "position"),
    [
        (30522, 128, pa.uint16(), pa.uint8()),
        (70000, 512, pa.uint32(), pa.uint16()),
        (65536, 256, pa.uint16(), pa.uint8()),
        (65537, 257, pa.uint32(), pa.uint16()),
    ],
)
def test_schema_uses_narrowest_types(vocab_size, max_seq, token, position):
    schema = shard_format.shard_schema(vocab_size, max_seq)
    assert schema.field("input_ids").type == pa.list_(token)
    assert schema.field("masked_lm_ids").type == pa.list_(token)
    assert schema.field("masked_lm_positions").type == pa.list_(position)
    assert schema.field("segment_ids").type == pa.list_(pa.uint8())
    assert schema.field("next_sentence_label").type == pa.uint8()
    assert schema.metadata[b"bert_shard_format_version"] == b"1"
    assert shard_format.schema_params(schema) == (vocab_size, max_seq)
    assert schema.equals(shard_format.shard_schema(vocab_size, max_seq), check_metadata=True)


@pytest.mark.parametrize(
    ("vocab_size", "max_seq"), [(0, 128), (2**32 + 1, 128), (100, 0), (100, 70000), (True, 8)]
)
def test_schema_rejects_bad_sizes(vocab_size, max_seq):
    with pytest.raises(ValueError, match="must be an int"):
        shard_format.shard_schema(vocab_size, max_seq)


def test_schema_params_rejects_other_versions():
    schema = shard_format.shard_schema(VOCAB_SIZE, MAX_SEQ)
    future = schema.with_metadata({**schema.metadata, b"bert_shard_format_version": b"2"})
    with pytest.raises(shard_format.ShardFormatError, match="version 2; this reader supports 1"):
        shard_format.schema_params(future)


# ----------------------------------------------------------------------------- writing


def test_round_trip_keeps_values_and_exact_types(tmp_path):
    columns = make_columns(0, 23)
    schema = shard_format.shard_schema(VOCAB_SIZE, MAX_SEQ)
    path = tmp_path / shard_format.shard_name(0, 1)
    shard_writer.atomic_write_bytes(path, shard_writer.encode_shard(columns, schema, batch_size=10))
    table = shard_format.open_shard(path)
    assert table.schema.equals(schema, check_metadata=True)
    assert [len(batch) for batch in table.to_batches()] == [10, 10, 3]
    assert table.to_pydict() == {
        **as_lists(columns),
        "next_sentence_label": [int(x) for x in columns["next_sentence_label"]],
    }
    rows = list(shard_format.iter_rows(table))
    assert len(rows) == 23
    for i in (0, 11, 22):
        row = shard_format.row_to_numpy(table, i)
        assert all(value.dtype == np.int64 for value in row.values())
        assert row["next_sentence_label"].shape == ()
        np.testing.assert_array_equal(row["input_ids"], columns["input_ids"][i])
        np.testing.assert_array_equal(
            rows[i]["masked_lm_positions"], columns["masked_lm_positions"][i]
        )
    sliced = list(shard_format.iter_rows(table.slice(7, 9)))  # crosses a batch boundary
    for i, row in enumerate(sliced, start=7):
        for name in shard_format.LIST_COLUMNS:
            np.testing.assert_array_equal(row[name], columns[name][i], err_msg=name)
        assert row["next_sentence_label"] == columns["next_sentence_label"][i]
    with pytest.raises(IndexError, match="row 23 out of range"):
        shard_format.row_to_numpy(table, 23)


def test_encode_is_byte_deterministic_for_any_integer_input():
    schema = shard_format.shard_schema(VOCAB_SIZE, MAX_SEQ)
    columns = make_columns(1, 50)
    as_int64 = {
        name: [np.asarray(v, dtype=np.int64) for v in values] for name, values in columns.items()
    }
    first = shard_writer.encode_shard(columns, schema, batch_size=16)
    assert shard_writer.encode_shard(make_columns(1, 50), schema, batch_size=16) == first
    assert shard_writer.encode_shard(as_int64, schema, batch_size=16) == first
    assert shard_writer.encode_shard(as_lists(columns), schema, batch_size=16) == first
    assert shard_writer.encode_shard(columns, schema, batch_size=17) != first
    rows = [
        dict(zip(columns, values, strict=True)) for values in zip(*columns.values(), strict=True)
    ]
    assert (
        shard_writer.encode_shard(shard_writer.rows_to_columns(rows), schema, batch_size=16)
        == first
    )


def test_wide_types_round_trip():
    schema = shard_format.shard_schema(70000, 512)
    columns = make_columns(2, 9, vocab_size=70000, max_seq=512)
    columns["input_ids"][0][1] = 69999
    table = pa.ipc.open_stream(shard_writer.encode_shard(columns, schema)).read_all()
    assert table.schema.field("input_ids").type == pa.list_(pa.uint32())
    assert table.column("input_ids").to_pylist()[0][1] == 69999
    assert table.to_pydict()["masked_lm_positions"] == as_lists(columns)["masked_lm_positions"]


def _set_row(column, row, value):
    def mutate(columns):
        columns[column][row] = value

    return mutate


def _set_value(column, row, index, value):
    def mutate(columns):
        columns[column][row][index] = value

    return mutate


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            _set_value("input_ids", 2, 1, 30522),
            r"input_ids values must be in \[0, 30522\), got 30522 in row 2",
        ),
        (
            _set_value("input_ids", 1, 0, -1),
            r"input_ids values must be in \[0, 30522\), got -1 in row 1",
        ),
        (
            _set_row("input_ids", 0, np.arange(129)),
            "input_ids: row 0 is longer than max_seq_length=128",
        ),
        (_set_row("input_ids", 0, np.array([], dtype=np.int32)), "input_ids: row 0 is empty"),
        (
            _set_row("input_ids", 0, np.array([1.0, 2.0])),
            "input_ids: row 0 must hold integers, got dtype float64",
        ),
        (
            _set_row("input_ids", 0, np.ones((2, 3), dtype=np.int32)),
            r"input_ids: row 0 must be 1-D, got shape \(2, 3\)",
        ),
        (
            _set_row("segment_ids", 3, np.array([0, 1])),
            "segment_ids: row 3 has a different length than its input_ids",
        ),
        (
            _set_row("masked_lm_ids", 1, np.arange(30)),
            "masked_lm_ids: row 1 has a different length than its masked_lm_positions",
        ),
        (
            _set_row("next_sentence_label", 4, 2),
            r"next_sentence_label values must be in \[0, 2\), got 2 in row 4",
        ),
    ],
)
def test_encode_rejects_bad_rows_naming_column_and_row(mutate, message):
    columns = make_columns(3, 6)
    mutate(columns)
    with pytest.raises(ValueError, match=message):
        shard_writer.encode_shard(columns, shard_format.shard_schema(VOCAB_SIZE, MAX_SEQ))


def test_encode_rejects_bad_values_in_valid_shapes():
    schema = shard_format.shard_schema(VOCAB_SIZE, MAX_SEQ)
    base = {
        "input_ids": [np.array([101, 7, 102, 8, 102])],
        "segment_ids": [np.array([0, 0, 0, 1, 1])],
        "masked_lm_positions": [np.array([1, 3])],
        "masked_lm_ids": [np.array([5, 6])],
        "next_sentence_label": [0],
    }
    cases = [
        (
            "segment_ids",
            [np.array([0, 0, 0, 1, 2])],
            r"segment_ids values must be in \[0, 2\), got 2 in row 0",
        ),
        (
            "masked_lm_positions",
            [np.array([1, 5])],
            r"masked_lm_positions values must be in \[0, 5 \(the row's length\)\), got 5 in row 0",
        ),
        (
            "masked_lm_positions",
            [np.array([3, 1])],
            "masked_lm_positions: row 0 has value 1 not increasing",
        ),
        (
            "masked_lm_positions",
            [np.array([3, 3])],
            "masked_lm_positions: row 0 has value 3 not increasing",
        ),
        (
            "masked_lm_ids",
            [np.array([5, 30522])],
            r"masked_lm_ids values must be in \[0, 30522\), got 30522 in row 0",
        ),
    ]
    for column, value, message in cases:
        with pytest.raises(ValueError, match=message):
            shard_writer.encode_shard({**base, column: value}, schema)
    with pytest.raises(ValueError, match="rows have exactly the columns"):
        shard_writer.encode_shard({**base, "input_mask": base["segment_ids"]}, schema)
    with pytest.raises(ValueError, match="same number of rows"):
        shard_writer.encode_shard({**base, "next_sentence_label": [0, 1]}, schema)
    with pytest.raises(ValueError, match=r"batch_size must be an int in \[1, inf\], got 0"):
        shard_writer.encode_shard(base, schema, batch_size=0)
    # Positions restart at each row: row 1 may start below where row 0 ended.
    two = {name: values * 2 for name, values in base.items()}
    two["masked_lm_positions"] = [np.array([3, 4]), np.array([1, 2])]
    assert shard_writer.encode_shard(two, schema)


def test_empty_shard_reads_as_zero_rows(tmp_path):
    schema = shard_format.shard_schema(VOCAB_SIZE, MAX_SEQ)
    path = tmp_path / shard_format.shard_name(0, 1)
    shard_writer.atomic_write_bytes(path, shard_writer.encode_shard(make_columns(0, 0), schema))
    assert [batch.num_rows for batch in pa.ipc.open_stream(path.read_bytes())] == [0]
    assert shard_format.open_shard(path).num_rows == 0
    assert list(shard_format.iter_rows(shard_format.open_shard(path))) == []


def test_datasets_reads_an_empty_shard_as_zero_rows(tmp_path):
    datasets, _ = hugging_face()
    schema = shard_format.shard_schema(VOCAB_SIZE, MAX_SEQ)
    path = tmp_path / shard_format.shard_name(0, 1)
    shard_writer.atomic_write_bytes(path, shard_writer.encode_shard(make_columns(0, 0), schema))
    assert datasets.Dataset.from_file(str(path)).num_rows == 0


# ----------------------------------------------------------------------------- atomic write


def test_atomic_write_replaces_and_leaves_no_temp_files(tmp_path):
    path = tmp_path / "file.bin"
    shard_writer.atomic_write_bytes(path, b"one")
    shard_writer.atomic_write_bytes(path, b"two")
    assert path.read_bytes() == b"two"
    assert os.listdir(tmp_path) == ["file.bin"]
    assert (
        path.stat().st_mode & 0o044
    )  # readable by others (umask permitting), unlike mkstemp's 0600


@pytest.mark.parametrize("failing", ["fsync", "replace"])
def test_failed_atomic_write_keeps_old_file_and_removes_temp(tmp_path, monkeypatch, failing):
    path = tmp_path / "file.bin"
    shard_writer.atomic_write_bytes(path, b"old")

    def fail(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(shard_format.os, failing, fail)
    with pytest.raises(OSError, match="No space left"):
        shard_writer.atomic_write_bytes(path, b"new" * 1000)
    with pytest.raises(OSError, match="No space left"):
        shard_writer.atomic_write_bytes(tmp_path / "new.bin", b"data")
    monkeypatch.undo()
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["file.bin"]


def test_atomic_write_streams_chunks_to_a_uri_and_returns_size_and_sha256(tmp_path):
    """A URI goes through pyarrow.fs (file:// here): chunks in, one file out, no temp left."""
    uri = (tmp_path / "file.bin").as_uri()
    chunks = [b"one", b"", b"two" * 1000]
    size, sha256 = shard_writer.atomic_write_bytes(uri, iter(chunks))
    data = b"".join(chunks)
    assert (size, sha256) == (len(data), hashlib.sha256(data).hexdigest())
    assert shard_format.read_bytes(uri) == data and os.listdir(tmp_path) == ["file.bin"]

    def broken():
        yield b"half"
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        shard_writer.atomic_write_bytes(uri, broken())
    assert shard_format.read_bytes(uri) == data and os.listdir(tmp_path) == ["file.bin"]


# ----------------------------------------------------------------------------- reading


def test_open_shard_is_zero_copy_and_reads_file_uri(tmp_path):
    write_output(tmp_path, (300,))
    path = tmp_path / shard_format.shard_name(0, 1)
    before = pa.total_allocated_bytes()
    table = shard_format.open_shard(path)
    assert pa.total_allocated_bytes() - before < 1024  # buffers point into the memory map
    from_uri = shard_format.open_shard(path.as_uri())
    assert from_uri.equals(table)
    assert shard_format.read_manifest(tmp_path.as_uri())["num_rows"] == 300
    assert shard_format.verify_directory(tmp_path.as_uri())["num_rows"] == 300


def test_datasets_reads_shards_with_integer_formats(tmp_path):
    datasets, torch = hugging_face()
    manifest = write_output(tmp_path / "shards")
    files = [str(tmp_path / "shards" / entry["name"]) for entry in manifest["shards"]]
    one = datasets.Dataset.from_file(files[0])
    assert one.num_rows == 5
    assert one.features["input_ids"].feature.dtype == "uint16"
    train = datasets.load_dataset(
        "arrow", data_files=files, split="train", cache_dir=str(tmp_path / "cache")
    )
    assert train.num_rows == 12
    expected = shard_format.open_shard(files[2]).to_pylist()
    assert [train[5 + i] for i in range(7)] == expected
    torch_row = train.with_format("torch")[0]
    for name in shard_format.COLUMNS:
        assert torch_row[name].dtype == torch.int64, name
    # As FORMAT.md says: "numpy" widens the unsigned lists to int64 (not uint16/uint8) ...
    numpy_row = train.with_format("numpy")[0]
    for name in shard_format.LIST_COLUMNS:
        assert numpy_row[name].dtype == np.int64, name
    assert numpy_row["input_ids"].tolist() == train[0]["input_ids"]
    # ... while the features and the "arrow" format keep the stored types.
    assert train.features["masked_lm_positions"].feature.dtype == "uint8"
    arrow = train.with_format("arrow")[:1].schema
    assert arrow.field("input_ids").type == pa.list_(pa.uint16())


def test_verify_directory_accepts_a_complete_output(tmp_path, capsys):
    manifest = write_output(tmp_path)
    assert shard_format.verify_directory(tmp_path) == manifest
    assert validate_main([str(tmp_path)]) == 0
    assert f"OK: 3 shard(s), 12 rows checked in {tmp_path}" in capsys.readouterr().out
    (tmp_path / "tokenizer.json").write_text('{"changed": true}\n')
    with pytest.raises(shard_format.ShardFormatError, match=r"tokenizer\.json has another sha256"):
        shard_format.verify_directory(tmp_path)


def test_truncated_shards_are_detected_naming_the_file(tmp_path):
    manifest = write_output(tmp_path, (9,))
    path = tmp_path / manifest["shards"][0]["name"]
    data = path.read_bytes()
    path.write_bytes(data[:-8])  # cut exactly before the end-of-stream marker: the dangerous case
    assert pa.ipc.open_stream(path.read_bytes()).read_all().num_rows > 0  # pyarrow alone says fine
    with pytest.raises(shard_format.ShardFormatError, match=f"{re.escape(str(path))} is truncated"):
        shard_format.open_shard(path)
    with pytest.raises(
        shard_format.ShardFormatError, match=f"{re.escape(str(path))} has {len(data) - 8} bytes"
    ):
        shard_format.verify_shard(path, manifest["shards"][0])
    path.write_bytes(data[: len(data) // 2] + data[-8:])  # cut mid-batch, marker present
    with pytest.raises(shard_format.ShardFormatError, match=re.escape(str(path))):
        shard_format.open_shard(path)
    path.write_bytes(b"")
    with pytest.raises(shard_format.ShardFormatError, match="is truncated"):
        shard_format.open_shard(path)
    assert validate_main([str(tmp_path)]) == 1


def test_python_m_pipeline_validate_checks_files_and_rows(tmp_path):
    write_output(tmp_path / "ok")
    # A row that does not start with [CLS] in a shard whose size and sha256 are the
    # manifest's: only the row checks of `validate` find it.
    bad = tmp_path / "bad"
    manifest = write_output(bad, (9,))
    columns = make_columns(0, 9)
    columns["input_ids"][4][0] = SPECIAL_IDS["sep"]
    schema = shard_format.shard_schema(VOCAB_SIZE, MAX_SEQ)
    path = bad / manifest["shards"][0]["name"]
    shard_writer.atomic_write_bytes(path, shard_writer.encode_shard(columns, schema))
    manifest["shards"][0].update(bytes=path.stat().st_size, sha256=shard_format.sha256_file(path))
    shard_writer.atomic_write_bytes(bad / "manifest.json", shard_writer.encode_manifest(manifest))
    root = Path(shard_format.__file__).parents[1]
    for directory, returncode, expected in (
        (tmp_path / "ok", 0, "OK: 3 shard(s), 12 rows"),
        (bad, 1, "row 4 does not start with [CLS]"),
    ):
        runs = [
            subprocess.run(
                [sys.executable, "-m", *command, str(directory)],
                cwd=root,
                capture_output=True,
                text=True,
                timeout=120,
            )
            for command in (["pipeline", "validate"],)
        ]
        outputs = [(run.returncode, run.stdout, run.stderr) for run in runs]
        assert outputs[0][0] == returncode and expected in outputs[0][1] + outputs[0][2], outputs


def rewrite_rows(directory: Path, manifest: dict, columns: dict) -> Path:
    """Replace the only shard of ``directory`` with ``columns``' rows, its manifest entry
    updated (size and sha256 right), so that only the row checks can find a fault."""
    schema = shard_format.shard_schema(VOCAB_SIZE, MAX_SEQ)
    path = directory / manifest["shards"][0]["name"]
    shard_writer.atomic_write_bytes(path, shard_writer.encode_shard(columns, schema))
    manifest["shards"][0].update(bytes=path.stat().st_size, sha256=shard_format.sha256_file(path))
    data = shard_writer.encode_manifest(manifest)
    shard_writer.atomic_write_bytes(directory / "manifest.json", data)
    return path


@pytest.mark.parametrize(
    "token, where, expected",
    [
        ("cls", "text", "has [CLS] at position 3, where the format allows none"),
        ("sep", "text", "has [SEP] at position 3, where the format allows none"),
        ("pad", "text", "has [PAD] at position 3, where the format allows none"),
        ("mask", "text", "has [MASK] at position 3, where the format allows none"),
        ("sep", "end of A", "has no [SEP] at position"),
        ("mask", "target", "masks a [MASK] at position"),
        ("sep", "masked slot", "masks position 0"),
    ],
)
def test_validate_rejects_a_special_token_where_the_format_puts_none(
    tmp_path, token, where, expected
):
    from pipeline.shards.validate import validate

    manifest = write_output(tmp_path, (9,))
    columns = make_columns(0, 9)
    row = next(r for r, ids in enumerate(columns["input_ids"]) if len(ids) > 8)
    ids, positions = columns["input_ids"][row], columns["masked_lm_positions"][row]
    split = int(np.flatnonzero(columns["segment_ids"][row])[0]) - 1  # A's [SEP]
    if where == "text":  # a literal special token in the middle of A or B
        position = 3 if split != 3 else 4
        columns["masked_lm_positions"][row] = positions = positions[positions != position]
        columns["masked_lm_ids"][row] = columns["masked_lm_ids"][row][: len(positions)]
        ids[position] = SPECIAL_IDS[token]
        expected = expected.replace("position 3", f"position {position}")
    elif where == "end of A":
        ids[split] = 1000
    elif where == "target":
        columns["masked_lm_positions"][row] = np.array([1], np.int32)
        columns["masked_lm_ids"][row] = np.array([SPECIAL_IDS[token]], np.int32)
    else:  # the [CLS] slot masked
        columns["masked_lm_positions"][row] = np.array([0], np.int32)
        columns["masked_lm_ids"][row] = np.array([SPECIAL_IDS["cls"]], np.int32)
        ids[0] = SPECIAL_IDS["mask"]
    path = rewrite_rows(tmp_path, manifest, columns)
    with pytest.raises(shard_format.ShardFormatError) as caught:
        validate(str(tmp_path))
    assert str(caught.value).startswith(f"{path}: row {row} ") and expected in str(caught.value)


def test_validate_allows_unk_anywhere_and_any_id_at_a_masked_position(tmp_path):
    from pipeline.shards.validate import validate

    manifest = write_output(tmp_path, (9,))
    columns = make_columns(0, 9)
    for ids, positions, targets in zip(
        columns["input_ids"], columns["masked_lm_positions"], columns["masked_lm_ids"], strict=True
    ):
        ids[1] = SPECIAL_IDS["unk"]  # a word not in the vocab
        targets[:] = SPECIAL_IDS["unk"]  # it may be masked
        # The masked input: [MASK] (80%) or a random id, which may be any special (10%).
        ids[positions] = np.resize(list(SPECIAL_IDS.values()), len(positions))
    rewrite_rows(tmp_path, manifest, columns)
    assert validate(str(tmp_path))["num_rows"] == 9


def test_the_readers_public_names_are_its_all():
    public = {
        name
        for name, value in vars(shard_format).items()
        if not name.startswith("_") and getattr(value, "__module__", "") == shard_format.__name__
    }
    constants = {name for name in vars(shard_format) if name.isupper() and not name.startswith("_")}
    assert set(shard_format.__all__) == public | constants


def test_flipped_byte_is_detected_by_sha256(tmp_path):
    manifest = write_output(tmp_path, (9,))
    path = tmp_path / manifest["shards"][0]["name"]
    data = bytearray(path.read_bytes())
    data[len(data) - 100] ^= 0x01  # inside a data buffer: still a readable stream
    path.write_bytes(bytes(data))
    shard_format.open_shard(path)  # reads; only the checksum can tell
    with pytest.raises(
        shard_format.ShardFormatError,
        match=f"{re.escape(str(path))} has sha256 .* manifest says .* \\(corrupt\\)",
    ):
        shard_format.verify_shard(path, manifest["shards"][0])
    with pytest.raises(shard_format.ShardFormatError, match="corrupt"):
        shard_format.verify_directory(tmp_path)


def test_row_count_mismatch_is_detected(tmp_path):
    manifest = write_output(tmp_path, (9,))
    entry = {**manifest["shards"][0], "rows": 10}
    with pytest.raises(shard_format.ShardFormatError, match="has 9 rows, manifest says 10"):
        shard_format.verify_shard(tmp_path / entry["name"], entry)


# ----------------------------------------------------------------------------- manifest


def test_manifest_bytes_are_deterministic_and_hold_no_paths(tmp_path):
    first = shard_writer.encode_manifest(write_output(tmp_path / "a"))
    second = shard_writer.encode_manifest(write_output(tmp_path / "b"))
    assert first == second == (tmp_path / "a" / "manifest.json").read_bytes()
    assert first.endswith(b"}\n") and str(tmp_path).encode() not in first
    text = first.decode()
    assert text == json.dumps(json.loads(text), sort_keys=True, indent=2, ensure_ascii=False) + "\n"
    manifest = json.loads(text)
    assert manifest["format_version"] == 1 and manifest["algorithm_version"] == 3
    assert manifest["created_by"].startswith("bert-pipeline")
    assert manifest["schema"]["columns"]["input_ids"] == "list<item: uint16>"
    assert manifest["stats"] == {"num_documents": 3, "mean_length": 0.5}


def test_build_manifest_sorts_shards_and_rejects_bad_input():
    entries = [
        {"name": shard_format.shard_name(i, 2), "rows": 1, "bytes": 10, "sha256": "ab"}
        for i in (1, 0)
    ]
    kwargs = {"vocab": vocab_entry(), "params": {"max_seq_length": 128}, "stats": {}, "skipped": {}}
    manifest = shard_writer.build_manifest(shards=entries, **kwargs)
    assert [entry["name"] for entry in manifest["shards"]] == [
        "shard-00000-of-00002.arrow",
        "shard-00001-of-00002.arrow",
    ]
    assert manifest["num_rows"] == 2
    with pytest.raises(ValueError, match="shards must be shard-00000-of-N"):
        shard_writer.build_manifest(shards=entries[:1], **kwargs)
    with pytest.raises(ValueError, match=r"shards\[0\] has unknown key\(s\) \['tokens'\]"):
        shard_writer.build_manifest(shards=[{**entries[0], "tokens": 5}, entries[1]], **kwargs)
    with pytest.raises(ValueError, match=r"vocab has unknown key\(s\) \['lower'\]"):
        shard_writer.build_manifest(
            shards=entries, **{**kwargs, "vocab": {**vocab_entry(), "lower": True}}
        )
    with pytest.raises(ValueError, match=r"vocab\.special_ids lacks key 'mask'"):
        special = {key: value for key, value in SPECIAL_IDS.items() if key != "mask"}
        shard_writer.build_manifest(
            shards=entries, **{**kwargs, "vocab": {**vocab_entry(), "special_ids": special}}
        )
    with pytest.raises(ValueError, match=r"params\.max_seq_length and vocab\.size are required"):
        shard_writer.build_manifest(shards=entries, **{**kwargs, "params": {}})
    with pytest.raises(ValueError, match=r"skipped.bad_utf8 must be a non-negative int, got -1"):
        shard_writer.build_manifest(shards=entries, **{**kwargs, "skipped": {"bad_utf8": -1}})
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        shard_writer.build_manifest(shards=entries, **{**kwargs, "stats": {"ratio": float("nan")}})


def write_manifest(directory: Path, manifest: dict) -> None:
    directory.mkdir(exist_ok=True)
    (directory / "manifest.json").write_bytes(shard_writer.encode_manifest(manifest))


def test_read_manifest_explains_version_and_key_errors(tmp_path):
    manifest = write_output(tmp_path / "ok")
    write_manifest(tmp_path / "v2", {**manifest, "format_version": 2})
    with pytest.raises(
        shard_format.ShardFormatError,
        match=r"manifest.json in .*v2 has format_version 2; this reader supports 1 — upgrade",
    ):
        shard_format.read_manifest(tmp_path / "v2")
    write_manifest(
        tmp_path / "nokey", {key: value for key, value in manifest.items() if key != "vocab"}
    )
    with pytest.raises(shard_format.ShardFormatError, match="lacks key 'vocab'"):
        shard_format.read_manifest(tmp_path / "nokey")
    older = {key: value for key, value in manifest.items() if key != "algorithm_version"}
    write_manifest(tmp_path / "older", older)  # written before algorithm_version was added
    assert shard_format.read_manifest(tmp_path / "older")["num_rows"] == 12
    write_manifest(tmp_path / "algo", {**manifest, "algorithm_version": "1"})
    with pytest.raises(shard_format.ShardFormatError, match="algorithm_version must be a non-neg"):
        shard_format.read_manifest(tmp_path / "algo")
    write_manifest(tmp_path / "extra", {**manifest, "added_in_1_1": {"x": 1}})
    assert shard_format.read_manifest(tmp_path / "extra")["num_rows"] == 12  # unknown keys ignored
    write_manifest(tmp_path / "rows", {**manifest, "num_rows": 11})
    with pytest.raises(shard_format.ShardFormatError, match="num_rows 11 != the sum"):
        shard_format.read_manifest(tmp_path / "rows")
    (tmp_path / "empty").mkdir()
    with pytest.raises(
        shard_format.ShardFormatError,
        match="not found: it is written last, so the run did not finish",
    ):
        shard_format.read_manifest(tmp_path / "empty")
    (tmp_path / "empty" / "manifest.json").write_text("{not json")
    with pytest.raises(shard_format.ShardFormatError, match="is not valid JSON"):
        shard_format.read_manifest(tmp_path / "empty")


def test_check_vocab_compat_names_both_values(tmp_path):
    manifest = write_output(tmp_path, (1,))
    shard_format.check_vocab_compat(manifest, vocab_size=VOCAB_SIZE, special_ids=SPECIAL_IDS)
    shard_format.check_vocab_compat(manifest, vocab_size=VOCAB_SIZE, special_ids={"pad": 0})
    with pytest.raises(
        ValueError,
        match="the model has vocab_size 30528 but the shards were tokenized with a vocabulary of 30522",
    ):
        shard_format.check_vocab_compat(manifest, vocab_size=30528)
    with pytest.raises(ValueError, match=r"the model uses id 1 for \[PAD\] but the shards use 0"):
        shard_format.check_vocab_compat(manifest, vocab_size=VOCAB_SIZE, special_ids={"pad": 1})
    with pytest.raises(ValueError, match="unknown special token 'bos'"):
        shard_format.check_vocab_compat(manifest, vocab_size=VOCAB_SIZE, special_ids={"bos": 1})


# ----------------------------------------------------------------------------- FORMAT.md


def _code_blocks(language: str) -> list[str]:
    """The ``language`` fenced blocks of FORMAT.md, each padded so line numbers match the file."""
    text = FORMAT_MD.read_text()
    blocks = re.finditer(rf"```{language}\n(.*?)```", text, flags=re.DOTALL)
    return ["\n" * text.count("\n", 0, block.start(1)) + block[1] for block in blocks]


def test_format_md_manifest_example_is_valid(tmp_path):
    example = _code_blocks("json")[0]  # the shards' manifest (the export's, abridged, follows)
    encoded = shard_writer.encode_manifest(json.loads(example)).decode()
    # The writer's bytes, its keys in its order, but for the doc's wrapping of number lists.
    assert re.sub(r"\s+", "", encoded) == re.sub(r"\s+", "", example)
    write_manifest(tmp_path, json.loads(example))
    manifest = shard_format.read_manifest(tmp_path)  # consistent: rows, shards, statistics
    assert manifest["num_rows"] == sum(shard["rows"] for shard in manifest["shards"]) > 0
    assert (
        json.loads(example)["schema"]["columns"]
        == write_output(tmp_path / "real")["schema"]["columns"]
    )


def test_format_md_snippets_run_on_real_shards(tmp_path, monkeypatch):
    datasets, torch = hugging_face()
    write_output(tmp_path / "shards", (5, 0, 7))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")
    namespace: dict = {}
    snippets = _code_blocks("python")
    assert len(snippets) == 3
    for snippet in snippets:
        exec(compile(snippet, str(FORMAT_MD), "exec"), namespace)
    assert (
        namespace["row"]
        == shard_format.open_shard("shards/shard-00000-of-00003.arrow").slice(0, 1).to_pylist()[0]
    )
    assert namespace["train"].num_rows == namespace["mapped"].num_rows == 12
    assert namespace["example"]["input_ids"].dtype == torch.int64
    batch = namespace["batch"]
    lengths = batch["attention_mask"].sum(1)
    assert batch["input_ids"].shape == (8, int(lengths.max()))
    assert batch["labels"].dtype == torch.int64
    for i in range(8):  # labels hold masked_lm_ids exactly at masked_lm_positions
        weights = batch["masked_lm_weights"][i].bool()
        positions = batch["masked_lm_positions"][i][weights]
        assert torch.equal(batch["labels"][i][positions], batch["masked_lm_ids"][i][weights])
        assert int((batch["labels"][i] != -100).sum()) == int(weights.sum())


@pytest.mark.skipif(
    shutil.which("jq") is None or shutil.which("sha256sum") is None, reason="needs jq"
)
def test_format_md_shell_check_passes_and_catches_corruption(tmp_path):
    (command,) = _code_blocks("bash")
    manifest = write_output(tmp_path / "shards", (3, 4))
    check = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    with open(tmp_path / "shards" / manifest["shards"][1]["name"], "ab") as f:
        f.write(b"x")
    check = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True)
    assert check.returncode != 0 and "shard-00001-of-00002.arrow: FAILED" in check.stdout


def test_shard_bodies_join_into_a_readable_shard():
    schema = shard_format.shard_schema(100, 16)
    encode_body, join = shard_writer.encode_shard_body, shard_writer.join_shard_bodies
    to_columns = shard_writer.rows_to_columns
    rows = [
        {
            "input_ids": [2, 5 + i, 3],
            "segment_ids": [0, 0, 1],
            "masked_lm_positions": [1],
            "masked_lm_ids": [7],
            "next_sentence_label": i % 2,
        }
        for i in range(5)
    ]
    parts = [rows[:2], rows[2:]]
    data = join([encode_body(to_columns(p), schema) for p in parts], schema)
    table = pa.ipc.open_stream(data).read_all()
    assert table.schema.equals(schema, check_metadata=True)
    assert table.column("input_ids").to_pylist() == [r["input_ids"] for r in rows]
    assert table.column("next_sentence_label").to_pylist() == [i % 2 for i in range(5)]
    # One part: the same bytes as writing the shard at once.
    whole = shard_writer.encode_shard(to_columns(rows), schema)
    assert join([encode_body(to_columns(rows), schema)], schema) == whole
    empty = pa.ipc.open_stream(join([], schema)).read_all()
    assert empty.num_rows == 0 and empty.schema.equals(schema, check_metadata=True)
