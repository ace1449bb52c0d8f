"""``python -m pipeline export``, checked the way each consumer reads the files, without our code.

HDF5: h5py, and NVIDIA's loader rule (a row's masks end at the first 0 of masked_lm_positions).
TFRecord: framing and both masked CRCs by Beam's reader and by the tfrecord package's crc32c,
Examples parsed by the tfrecord package with run_pretraining.py's feature spec (and by
TensorFlow where it is installed). The Arrow shards are read with pyarrow as FORMAT.md says.
"""

import hashlib
import io
import json
import shutil
import struct
import sys
from pathlib import Path

import h5py
import numpy as np
import pyarrow as pa
import pytest

from pipeline.cli.main import main
from tests.helpers import make_corpus

# A cap of 5 masks where a full row of 48 tokens would get round(0.15 * 45) = 7: rows hit it.
FLAGS = [
    "--vocab_size",
    "200",
    "--dupe_factor",
    "2",
    "--max_seq_length",
    "48",
    "--max_predictions_per_seq",
    "5",
    "--num_shards",
    "3",
    "--bucket_size",
    "10",
    "--random_seed",
    "7",
]
L, P = 48, 5
# google-research/bert run_pretraining.py's name_to_features, as the tfrecord package spells it.
GOOGLE_SPEC = {
    "input_ids": "int",
    "input_mask": "int",
    "segment_ids": "int",
    "masked_lm_positions": "int",
    "masked_lm_ids": "int",
    "masked_lm_weights": "float",
    "next_sentence_labels": "int",
}


def tfrecord(module: str):
    """``tfrecord.MODULE`` (reader, writer, example_pb2): how Google's consumers read the
    records, outside TensorFlow; in the test extra, not the base install (a test that needs
    it calls this first and skips there)."""
    why = "the tfrecord package (the test extra) parses the records as Google's readers do"
    return pytest.importorskip(f"tfrecord.{module}", reason=why)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    corpus = make_corpus(tmp_path_factory.mktemp("corpus"), n_docs=80)
    out = tmp_path_factory.mktemp("shards")
    assert main(["build", "--input", corpus, "--output", str(out), *FLAGS]) == 0
    return out


def arrow_shards(directory: Path) -> list[list[dict]]:
    """Each shard's rows, in manifest order, read with pyarrow (FORMAT.md, "Reading")."""
    manifest = json.loads((directory / "manifest.json").read_text())
    return [
        pa.ipc.open_stream(pa.memory_map(str(directory / s["name"]))).read_all().to_pylist()
        for s in manifest["shards"]
    ]


def export(shards: Path, out: Path, *args: str) -> int:
    return main(["export", str(shards), "--output", str(out), *args])


def nvidia_rows(path: Path, max_pred: int) -> list[dict]:
    """NVIDIA's pretraining_dataset.__getitem__, minus torch: the masks end at the first 0."""
    with h5py.File(path, "r") as f:
        data = {key: np.asarray(f[key][:]) for key in f}
    rows = []
    for i in range(len(data["input_ids"])):
        positions = data["masked_lm_positions"][i].astype(np.int64)
        zeros = np.flatnonzero(positions == 0)
        index = int(zeros[0]) if zeros.size else max_pred
        length = int(data["input_mask"][i].sum())
        rows.append(
            {
                "input_ids": data["input_ids"][i],
                "input_mask": data["input_mask"][i],
                "segment_ids": data["segment_ids"][i],
                "length": length,
                "masked_lm_positions": positions[:index].tolist(),
                "masked_lm_ids": data["masked_lm_ids"][i][:index].tolist(),
                "next_sentence_labels": int(data["next_sentence_labels"][i]),
            }
        )
    return rows


def records(path: Path) -> list[bytes]:
    """TFRecord framing, both masked CRCs checked by Beam's reader and by the tfrecord package."""
    from apache_beam.io.tfrecordio import _TFRecordUtil

    data, out, handle = path.read_bytes(), [], io.BytesIO(path.read_bytes())
    while (record := _TFRecordUtil.read_record(handle)) is not None:
        out.append(record)
    offset = 0
    for record in out:  # the same bytes, the other crc32c implementation
        (length,) = struct.unpack("<Q", data[offset : offset + 8])
        assert data[offset + 8 : offset + 12] == tfrecord("writer").TFRecordWriter.masked_crc(
            data[offset : offset + 8]
        )
        body = data[offset + 12 : offset + 12 + length]
        assert body == record
        end = offset + 12 + length
        assert data[end : end + 4] == tfrecord("writer").TFRecordWriter.masked_crc(body)
        offset = end + 4
    assert offset == len(data)
    return out


def google_examples(path: Path, spec: dict, seq: int, pred: int) -> list[dict]:
    """Parsed with the tfrecord package as run_pretraining.py's fixed-length features."""
    parsed = list(tfrecord("reader").tfrecord_loader(str(path), None, spec))
    for example in parsed:
        for name, values in example.items():
            width = 1 if name == "next_sentence_labels" else pred if "masked" in name else seq
            assert values.shape == (width,), (name, values.shape)  # FixedLenFeature([width])
    return parsed


def assert_same_row(arrow: dict, ids, mask, segments, positions, targets, label, seq: int):
    n = len(arrow["input_ids"])
    assert list(ids[:n]) == arrow["input_ids"] and not np.any(ids[n:])
    assert list(mask) == [1] * n + [0] * (seq - n)
    assert list(segments[:n]) == arrow["segment_ids"] and not np.any(segments[n:])
    assert list(positions) == arrow["masked_lm_positions"]
    assert list(targets) == arrow["masked_lm_ids"]
    assert label == arrow["next_sentence_label"]


def test_hdf5_rows_are_the_arrow_rows_by_nvidias_rule(shards, tmp_path):
    out = tmp_path / "hdf5"
    assert export(shards, out, "--to", "nvidia-hdf5") == 0
    manifest = json.loads((out / "manifest.json").read_text())
    source = shards / "manifest.json"
    assert manifest["source"]["manifest_sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()
    built = json.loads(source.read_text())
    assert manifest["source"]["algorithm_version"] == built["algorithm_version"] == 3
    assert (out / "vocab.txt").read_bytes() == (shards / "vocab.txt").read_bytes()
    assert (
        manifest["vocab"]["sha256"] == hashlib.sha256((out / "vocab.txt").read_bytes()).hexdigest()
    )
    assert manifest["format"] == "nvidia-hdf5"
    assert (manifest["max_seq_length"], manifest["max_predictions_per_seq"]) == (L, P)
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [f["name"] for f in manifest["files"]] + ["manifest.json", "vocab.txt"]
    )
    at_cap = 0
    for entry, arrow in zip(manifest["files"], arrow_shards(shards), strict=True):
        path = out / entry["name"]
        assert "training" in entry["name"] and "part" in entry["name"]  # the loaders' filters
        assert hashlib.sha256(path.read_bytes()).hexdigest() == entry["sha256"]
        with h5py.File(path, "r") as f:
            assert {k: (str(f[k].dtype), f[k].shape, f[k].compression) for k in f} == {
                "input_ids": ("int32", (len(arrow), L), "gzip"),
                "input_mask": ("int8", (len(arrow), L), "gzip"),
                "segment_ids": ("int8", (len(arrow), L), "gzip"),
                "masked_lm_positions": ("int32", (len(arrow), P), "gzip"),
                "masked_lm_ids": ("int32", (len(arrow), P), "gzip"),
                "next_sentence_labels": ("int8", (len(arrow),), "gzip"),
            }
        rows = nvidia_rows(path, P)
        assert len(rows) == entry["rows"] == len(arrow)
        for want, got in zip(arrow, rows, strict=True):
            assert_same_row(
                want,
                got["input_ids"],
                got["input_mask"],
                got["segment_ids"],
                got["masked_lm_positions"],
                got["masked_lm_ids"],
                got["next_sentence_labels"],
                L,
            )
            at_cap += len(want["masked_lm_positions"]) == P
    assert at_cap > 50  # rows with exactly max_predictions_per_seq masks survived whole


@pytest.mark.parametrize("names", ["v1", "v2"])
def test_tfrecord_rows_are_the_arrow_rows_by_googles_spec(shards, tmp_path, names):
    tfrecord("reader")
    out, pred = tmp_path / names, P if names == "v1" else P + 3  # a larger P pads
    assert (
        export(
            shards,
            out,
            "--to",
            "tfrecord",
            "--tfrecord_names",
            names,
            "--max_predictions_per_seq",
            str(pred),
        )
        == 0
    )
    manifest = json.loads((out / "manifest.json").read_text())
    spec = dict(GOOGLE_SPEC)
    if names == "v2":  # Model Garden's use_v2_feature_names
        spec["input_word_ids"], spec["input_type_ids"] = (
            spec.pop("input_ids"),
            spec.pop("segment_ids"),
        )
    assert set(manifest["fields"]) == set(spec) and manifest["tfrecord_names"] == names
    for entry, arrow in zip(manifest["files"], arrow_shards(shards), strict=True):
        path = out / entry["name"]
        assert entry["name"] == entry["source"].replace(".arrow", ".tfrecord")
        assert len(records(path)) == entry["rows"] == len(arrow)
        for want, got in zip(arrow, google_examples(path, spec, L, pred), strict=True):
            ids = got["input_ids" if names == "v1" else "input_word_ids"]
            segments = got["segment_ids" if names == "v1" else "input_type_ids"]
            k = len(want["masked_lm_positions"])
            assert list(got["masked_lm_weights"]) == [1.0] * k + [0.0] * (pred - k)
            assert not got["masked_lm_positions"][k:].any() and not got["masked_lm_ids"][k:].any()
            label = int(got["next_sentence_labels"][0])
            assert_same_row(
                want,
                ids,
                got["input_mask"],
                segments,
                got["masked_lm_positions"][:k],
                got["masked_lm_ids"][:k],
                label,
                L,
            )


def test_tensorflow_parses_the_records(shards, tmp_path):
    tfrecord("reader")
    tf = pytest.importorskip("tensorflow", reason="TensorFlow itself, as run_pretraining.py parses")
    out = tmp_path / "tf"
    assert export(shards, out, "--to", "tfrecord") == 0
    spec = {
        name: tf.io.FixedLenFeature(
            [1 if name == "next_sentence_labels" else P if "masked" in name else L],
            tf.float32 if kind == "float" else tf.int64,
        )
        for name, kind in GOOGLE_SPEC.items()
    }
    path = out / "shard-00000-of-00003.tfrecord"
    for record, want in zip(records(path), google_examples(path, GOOGLE_SPEC, L, P), strict=True):
        parsed = tf.io.parse_single_example(record, spec)
        for name in GOOGLE_SPEC:
            np.testing.assert_array_equal(parsed[name].numpy(), want[name])


def test_exports_are_byte_identical_run_to_run(shards, tmp_path):
    for fmt in ("nvidia-hdf5", "tfrecord"):
        assert export(shards, tmp_path / f"{fmt}-1", "--to", fmt) == 0
        assert export(shards, tmp_path / f"{fmt}-2", "--to", fmt) == 0
        first, second = ((tmp_path / f"{fmt}-{i}" / "manifest.json").read_bytes() for i in (1, 2))
        assert first == second  # it lists every file's sha256


def test_a_corrupt_shard_is_named_and_nothing_is_left(shards, tmp_path, capfd):
    bad = tmp_path / "bad"
    shutil.copytree(shards, bad)
    path = bad / "shard-00001-of-00003.arrow"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    for fmt in ("nvidia-hdf5", "tfrecord"):
        out = tmp_path / fmt
        assert export(bad, out, "--to", fmt) == 1
        err = capfd.readouterr().err
        assert "shard-00001-of-00003.arrow has sha256" in err and "(corrupt)" in err
        assert list(out.iterdir()) == []  # no manifest, no files, no temp files


def test_a_row_over_the_requested_p_fails_the_job_naming_it(shards, tmp_path, capfd):
    """Shards whose manifest has no P: the rows themselves are checked."""
    loose = tmp_path / "loose"
    shutil.copytree(shards, loose)
    manifest = json.loads((loose / "manifest.json").read_text())
    del manifest["params"]["max_predictions_per_seq"]
    (loose / "manifest.json").write_text(json.dumps(manifest))
    assert export(loose, tmp_path / "none", "--to", "tfrecord") == 2
    assert "--max_predictions_per_seq" in capfd.readouterr().err
    assert (
        export(loose, tmp_path / "out", "--to", "tfrecord", "--max_predictions_per_seq", "4") == 1
    )
    err = capfd.readouterr().err
    assert (
        "shard-00000-of-00003.arrow: row" in err and "more than --max_predictions_per_seq 4" in err
    )
    assert list((tmp_path / "out").iterdir()) == []


def test_bad_requests_are_refused_before_the_job(shards, tmp_path, capfd, monkeypatch):
    out = tmp_path / "out"
    assert export(shards, out, "--to", "tfrecord", "--max_predictions_per_seq", "4") == 2
    assert "smaller than the shards' max_predictions_per_seq 5" in capfd.readouterr().err
    assert export(tmp_path / "nothing", out, "--to", "tfrecord") == 2
    assert "manifest.json not found" in capfd.readouterr().err
    assert export(shards, shards, "--to", "tfrecord") == 2  # would mix with the shards
    assert export(shards, out, "--to", "nvidia-hdf5", "--tfrecord_names", "v2") == 2
    assert export(shards, out, "--to", "tfrecord", "--max_prediction_per_seq=6") == 2
    assert "did you mean --max_predictions_per_seq" in capfd.readouterr().err
    monkeypatch.setitem(sys.modules, "h5py", None)  # import h5py raises ImportError
    assert export(shards, out, "--to", "nvidia-hdf5") == 2
    assert "pip install h5py" in capfd.readouterr().err


def test_an_earlier_export_is_kept_unless_overwrite(shards, tmp_path, capfd):
    out = tmp_path / "out"
    assert export(shards, out, "--to", "tfrecord") == 0
    before = (out / "manifest.json").read_bytes()
    assert export(shards, out, "--to", "nvidia-hdf5") == 2
    assert "pass --overwrite" in capfd.readouterr().err
    assert (out / "manifest.json").read_bytes() == before
    assert export(shards, out, "--to", "nvidia-hdf5", "--overwrite") == 0
    assert not list(out.glob("*.tfrecord"))  # the earlier export is gone, not mixed in
    assert json.loads((out / "manifest.json").read_text())["format"] == "nvidia-hdf5"


@pytest.mark.slow
def test_the_main_jobs_build_exports_on_its_runner(tmp_path):
    """scripts/quickstart.sh's build flags and Beam runner, on a small corpus."""
    tfrecord("reader")
    runner = ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]
    corpus = make_corpus(tmp_path / "corpus", n_docs=60)
    built = tmp_path / "shards"
    assert (
        main(
            [
                "build",
                "--input",
                corpus,
                "--output",
                str(built),
                "--overwrite",
                "--vocab_size",
                "8000",
                "--dupe_factor",
                "2",
                "--max_seq_length",
                "128",
                *runner,
            ]
        )
        == 0
    )
    seq, pred = (
        128,
        json.loads((built / "manifest.json").read_text())["params"]["max_predictions_per_seq"],
    )
    assert export(built, tmp_path / "h5", "--to", "nvidia-hdf5", *runner) == 0
    assert export(built, tmp_path / "tf", "--to", "tfrecord", *runner) == 0
    assert export(built, tmp_path / "tf-local", "--to", "tfrecord") == 0
    manifests = {d: (tmp_path / d / "manifest.json").read_bytes() for d in ("tf", "tf-local")}
    assert manifests["tf"] == manifests["tf-local"]  # same bytes on either runner
    for i, arrow in enumerate(arrow_shards(built)):
        name = f"{i:05d}-of-{len(list(built.glob('*.arrow'))):05d}"
        nvidia = nvidia_rows(tmp_path / "h5" / f"training-part-{name}.hdf5", pred)
        google = google_examples(tmp_path / "tf" / f"shard-{name}.tfrecord", GOOGLE_SPEC, seq, pred)
        for want, a, b in zip(arrow, nvidia, google, strict=True):
            assert_same_row(
                want,
                a["input_ids"],
                a["input_mask"],
                a["segment_ids"],
                a["masked_lm_positions"],
                a["masked_lm_ids"],
                a["next_sentence_labels"],
                seq,
            )
            k = len(want["masked_lm_positions"])
            assert_same_row(
                want,
                b["input_ids"],
                b["input_mask"],
                b["segment_ids"],
                b["masked_lm_positions"][:k],
                b["masked_lm_ids"][:k],
                int(b["next_sentence_labels"][0]),
                seq,
            )


def test_pad_rows_and_changed_spans_known_answers():
    from pipeline.shards.export_formats import _changed_spans, pad_rows

    padded = pad_rows(np.array([0, 2, 3]), np.array([5, 6, 7]), 3, np.int32)
    assert padded.tolist() == [[5, 6, 0], [7, 0, 0]] and padded.dtype == np.int32
    with pytest.raises(ValueError, match="row 0 has 2 values, more than 1"):
        pad_rows(np.array([0, 2, 3]), np.array([5, 6, 7]), 1, np.int32)
    _, width, starts, stops = _changed_spans(np.array([[1, 2, 3], [1, 5, 3], [1, 5, 3]]))
    assert (width, starts, stops) == (3, [0, 1, 0], [3, 2, 0])


def test_rows_survive_many_record_batches_and_a_reused_message(tmp_path):
    """Random rows in batches of 3 (the encoder rewrites only what changed, across batches
    and shards): every field of every row as the consumers read it."""
    from pipeline.shards import export_formats, shard_format, shard_writer

    example_pb2 = tfrecord("example_pb2")

    rng = np.random.default_rng(0)
    seq, pred = 12, 4
    encoder = export_formats.ExampleEncoder(export_formats.TFRECORD_NAMES["v1"], seq, pred)
    for shard in range(2):
        rows = []
        for _ in range(20):
            n = int(rng.integers(5, seq + 1))
            split = int(rng.integers(2, n - 1))
            k = int(rng.integers(0, pred + 1))
            positions = sorted(rng.choice(np.arange(1, n - 1), size=min(k, n - 2), replace=False))
            rows.append(
                {
                    "input_ids": rng.integers(5, 50, n).tolist(),
                    "segment_ids": [0] * (split + 1) + [1] * (n - split - 1),
                    "masked_lm_positions": [int(p) for p in positions],
                    "masked_lm_ids": rng.integers(5, 50, len(positions)).tolist(),
                    "next_sentence_label": int(rng.integers(0, 2)),
                }
            )
        columns = shard_writer.rows_to_columns(rows)
        data = shard_writer.encode_shard(columns, shard_format.shard_schema(50, seq), batch_size=3)
        table = pa.ipc.open_stream(data).read_all()
        assert table.num_rows == 20 and len(table.to_batches()) == 7
        path = tmp_path / f"{shard}.tfrecord"
        path.write_bytes(b"".join(export_formats.tfrecord_chunks(table, encoder, seq, pred)))
        (tmp_path / f"{shard}.hdf5").write_bytes(export_formats.hdf5_bytes(table, seq, pred))
        nvidia = nvidia_rows(tmp_path / f"{shard}.hdf5", pred)
        for want, record, a in zip(rows, records(path), nvidia, strict=True):
            example = example_pb2.Example.FromString(record)
            got = {
                k: list(getattr(v, v.WhichOneof("kind")).value)
                for k, v in example.features.feature.items()
            }
            k = len(want["masked_lm_positions"])
            assert got["masked_lm_weights"] == [1.0] * k + [0.0] * (pred - k)
            assert got["masked_lm_positions"][k:] == got["masked_lm_ids"][k:] == [0] * (pred - k)
            for ids, mask, segments, positions, targets, label in (
                (
                    got["input_ids"],
                    got["input_mask"],
                    got["segment_ids"],
                    got["masked_lm_positions"][:k],
                    got["masked_lm_ids"][:k],
                    got["next_sentence_labels"][0],
                ),
                (
                    a["input_ids"],
                    a["input_mask"],
                    a["segment_ids"],
                    a["masked_lm_positions"],
                    a["masked_lm_ids"],
                    a["next_sentence_labels"],
                ),
            ):
                assert_same_row(
                    want,
                    np.asarray(ids),
                    mask,
                    np.asarray(segments),
                    positions,
                    targets,
                    label,
                    seq,
                )


def test_an_empty_shard_exports_to_empty_files(tmp_path):
    from pipeline.shards import export_formats, shard_format, shard_writer

    columns = {name: [] for name in shard_format.COLUMNS}
    data = shard_writer.encode_shard(columns, shard_format.shard_schema(50, 12))
    table = pa.ipc.open_stream(data).read_all()
    (tmp_path / "empty.hdf5").write_bytes(export_formats.hdf5_bytes(table, 12, 4))
    with h5py.File(tmp_path / "empty.hdf5", "r") as f:
        assert {k: f[k].shape for k in f} == {
            "input_ids": (0, 12),
            "input_mask": (0, 12),
            "segment_ids": (0, 12),
            "masked_lm_positions": (0, 4),
            "masked_lm_ids": (0, 4),
            "next_sentence_labels": (0,),
        }
    encoder = export_formats.ExampleEncoder(export_formats.TFRECORD_NAMES["v1"], 12, 4)
    assert b"".join(export_formats.tfrecord_chunks(table, encoder, 12, 4)) == b""
