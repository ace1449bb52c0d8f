"""``python -m pipeline export --to mds``, read back by Mosaic's own ``streaming.StreamingDataset``.

mosaicml-streaming pins numpy < 2.2 and needs torch, so it is not in .venv: scripts/test.sh
runs this file in .venv-readers (scripts/readers.sh: the base install, mosaicml-streaming
0.13.0 and torch 2.13.0 for CPU), where BERT_MDS_TESTS=1 makes a missing package a failure; elsewhere the tests that
need it skip, naming the environment:

    .venv-readers/bin/python -m pytest tests/pipeline/test_export_mds.py

The Arrow rows are read with pyarrow, as FORMAT.md says; the samples with StreamingDataset
(local, no remote), and the token column also by the pre-tokenized readers' own rule,
``np.frombuffer(sample[column], dtype=np.int64)`` (ModernBERT's and mosaicml's text_data.py).
"""

import json
import os
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from pipeline.cli.main import main
from tests.helpers import make_corpus

FLAGS = ["--vocab_size", "200", "--max_seq_length", "48", "--random_seed", "7"]
KINDS = {
    "mlm": ["--objective", "mlm", "--num_shards", "3"],
    "mlm_masked": ["--objective", "mlm", "--static_masks", "true", "--dupe_factor", "2"],
    "nsp": ["--dupe_factor", "2", "--num_shards", "2"],
}
MDS_VENV = (
    "mosaicml-streaming ({}) is not in this environment: scripts/test.sh runs these tests in "
    ".venv-readers, which bash scripts/readers.sh makes (mosaicml-streaming==0.13.0, torch==2.13.0)"
)


def streaming():
    """The streaming package: skipped without it, failed with BERT_MDS_TESTS=1."""
    try:
        import streaming
    except ImportError as err:
        if os.environ.get("BERT_MDS_TESTS") == "1":
            pytest.fail(MDS_VENV.format(err))
        pytest.skip(MDS_VENV.format(err))
    return streaming


class Builds(dict):
    """kind -> a shard directory of that row kind, each built when first asked for (the
    tests that run without streaming need two of the three)."""

    def __init__(self, tmp_path_factory):
        super().__init__()
        self._tmp = tmp_path_factory
        self._corpus = make_corpus(tmp_path_factory.mktemp("corpus"), n_docs=60)

    def __missing__(self, kind: str) -> Path:
        out = self[kind] = self._tmp.mktemp(kind)
        args = ["build", "--input", self._corpus, "--output", str(out), *FLAGS, *KINDS[kind]]
        assert main(args) == 0
        return out


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Builds:
    return Builds(tmp_path_factory)


def export(shards: Path, out: Path, *args: str) -> int:
    return main(["export", str(shards), "--output", str(out), "--to", "mds", *args])


def arrow_rows(directory: Path) -> list[dict]:
    """Every row of every shard, in manifest order, read with pyarrow (FORMAT.md)."""
    manifest = json.loads((directory / "manifest.json").read_text())
    rows = []
    for shard in manifest["shards"]:
        table = pa.ipc.open_stream(pa.memory_map(str(directory / shard["name"]))).read_all()
        rows += table.to_pylist()
    return rows


def read_all(local: Path) -> list[dict]:
    dataset = streaming().StreamingDataset(local=str(local), shuffle=False, batch_size=1)
    return [dataset[i] for i in range(len(dataset))]


@pytest.mark.parametrize("kind", KINDS)
def test_streaming_dataset_reads_every_row_back(built, tmp_path, kind):
    streaming()
    assert export(built[kind], tmp_path / "mds") == 0
    rows, samples = arrow_rows(built[kind]), read_all(tmp_path / "mds")
    assert len(samples) == len(rows) > 20
    assert set(samples[0]) == set(rows[0])  # every column, no other
    for row, sample in zip(rows, samples, strict=True):
        assert sample["input_ids"].dtype == np.int64
        for name, value in row.items():
            if isinstance(value, list):
                assert sample[name].tolist() == [int(v) for v in value], name
            else:
                assert int(sample[name]) == value, name
    manifest = json.loads((tmp_path / "mds" / "manifest.json").read_text())
    assert manifest["num_rows"] == len(rows) and manifest["format"] == "mds"
    assert manifest["fields"]["input_ids"] == {"encoding": "ndarray:int64"}


def test_each_shards_directory_is_a_dataset_of_its_rows(built, tmp_path):
    streaming()
    assert export(built["mlm"], tmp_path / "mds") == 0
    manifest = json.loads((built["mlm"] / "manifest.json").read_text())
    first = manifest["shards"][1]
    table = pa.ipc.open_stream(pa.memory_map(str(built["mlm"] / first["name"]))).read_all()
    samples = read_all(tmp_path / "mds" / first["name"].removesuffix(".arrow"))
    assert [s["input_ids"].tolist() for s in samples] == table.column("input_ids").to_pylist()


@pytest.mark.parametrize("column", ["input_ids", "tokens"])
def test_the_token_column_is_int64_for_the_pretokenized_readers(built, tmp_path, column):
    """ModernBERT's StreamingTextDataset reads ``input_ids``, mosaicml's and llm-foundry's
    ``tokens``, both with ``np.frombuffer(..., dtype=np.int64)``."""
    streaming()
    assert export(built["mlm"], tmp_path / "mds", "--mds_token_column", column) == 0
    samples = read_all(tmp_path / "mds")
    ids = [row["input_ids"] for row in arrow_rows(built["mlm"])]
    assert [np.frombuffer(s[column], dtype=np.int64).tolist() for s in samples] == ids
    assert ("input_ids" in samples[0]) == (column == "input_ids")


def test_exports_are_byte_identical_run_to_run(built, tmp_path):
    digests = []
    for name in ("a", "b"):
        assert export(built["nsp"], tmp_path / name) == 0
        files = sorted(p for p in (tmp_path / name).rglob("*") if p.is_file())
        digests.append({str(p.relative_to(tmp_path / name)): p.read_bytes() for p in files})
    assert digests[0] == digests[1]
    assert "shard-00001-of-00002/shard.00000.mds" in digests[0]


def test_a_failed_export_leaves_nothing(built, tmp_path, capfd):
    """A shard that fails its sha256: exit 1, and the directories written for the others are
    removed with their files."""
    broken = tmp_path / "broken"
    broken.mkdir()
    for path in built["mlm"].iterdir():
        (broken / path.name).write_bytes(path.read_bytes())
    last = sorted(broken.glob("shard-*.arrow"))[-1]
    data = bytearray(last.read_bytes())
    data[200] ^= 1
    last.write_bytes(bytes(data))
    assert export(broken, tmp_path / "mds") == 1
    assert last.name in capfd.readouterr().err
    assert not list((tmp_path / "mds").iterdir())


def test_the_export_needs_no_streaming(built, tmp_path, monkeypatch):
    # import streaming needs torch and torchvision, which PyPI cannot give a CPU machine
    # beside a CPU torch: the export writes MDS itself (pipeline/shards/mds_format.py).
    monkeypatch.setitem(sys.modules, "streaming", None)  # import streaming raises ImportError
    assert export(built["mlm"], tmp_path / "mds") == 0
    index = json.loads((tmp_path / "mds" / "index.json").read_text())
    assert sum(shard["samples"] for shard in index["shards"]) == len(arrow_rows(built["mlm"]))


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("size_limit", [1 << 26, 3000])  # one MDS file, and several
def test_our_mds_files_are_mdswriters_byte_for_byte(built, tmp_path, kind, size_limit):
    from pipeline.shards import mds_format, shard_format

    mds = streaming()
    (shard, *_) = sorted(built[kind].glob("shard-*.arrow"))
    table = shard_format.open_shard(shard)
    ours = mds_format.write_mds(table, str(tmp_path / "ours"), size_limit=size_limit)
    columns = mds_format.mds_columns(table.schema)
    with mds.MDSWriter(
        out=str(tmp_path / "theirs"), columns=columns, compression=None, size_limit=size_limit
    ) as writer:
        for sample in mds_format.mds_samples(table):
            writer.write(sample)
    theirs = sorted(os.listdir(tmp_path / "theirs"))
    assert sorted(ours) == theirs and (len(ours) > 2) == (size_limit == 3000)
    for name in theirs:
        assert (tmp_path / "ours" / name).read_bytes() == (tmp_path / "theirs" / name).read_bytes()


def test_requests_that_do_not_apply_are_refused(built, tmp_path, capfd):
    out = str(tmp_path / "out")
    assert export(built["mlm"], tmp_path / "o", "--max_predictions_per_seq", "9") == 2
    assert "writes no padding" in capfd.readouterr().err
    assert main(["export", str(built["mlm"]), "--to", "nvidia-hdf5", "--output", out]) == 2
    assert "holds mlm rows: export those --to mds" in capfd.readouterr().err
    assert (
        main(
            [
                "export",
                str(built["nsp"]),
                "--to",
                "tfrecord",
                "--output",
                out,
                "--mds_token_column",
                "tokens",
            ]
        )
        == 2
    )
    assert "applies to --to mds only" in capfd.readouterr().err
