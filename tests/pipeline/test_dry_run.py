"""``--dry_run``: build and export are built and checked, not run, and --output is left alone.

The DataflowRunner's dry run (Beam's TestOptions) validates the options and translates the
job without credentials. It needs the ``gcp`` extra, kept out of .venv because it changes
how Beam's local worker processes log; scripts/test.sh (CI) runs the Dataflow tests in
.venv-gcp, the base install plus that extra (``pip install -e '.[gcp]'``, what
deploy/beam/dataflow.sh asks for), where BERT_GCP_TESTS=1 makes a missing extra a failure:

    .venv-gcp/bin/python -m pytest tests/pipeline/test_dry_run.py   # after scripts/test.sh

The other runners have no dry run: the graph is built and encoded, nothing runs.
"""

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import apache_beam as beam
import pytest

from pipeline.beam import build
from pipeline.beam.runner import split_dry_run
from pipeline.cli.main import main
from tests.helpers import make_corpus

ROOT = Path(__file__).resolve().parents[2]
BASE = [
    "--vocab_size",
    "200",
    "--dupe_factor",
    "1",
    "--max_seq_length",
    "48",
    "--max_predictions_per_seq",
    "8",
    "--num_shards",
    "2",
]
# What Dataflow's validation asks for: a project id, a region, a gs:// temp_location.
# deploy/beam/dataflow.sh passes the same, and --setup_file.
DATAFLOW = [
    "--runner",
    "DataflowRunner",
    "--project",
    "my-project",
    "--region",
    "us-central1",
    "--temp_location",
    "gs://my-bucket/tmp",
    f"--setup_file={ROOT / 'setup.py'}",
]


def digest(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def test_dry_run_flag_spellings():
    assert split_dry_run([]) == (False, [])
    assert split_dry_run(["--runner", "X", "--dry_run"]) == (True, ["--runner", "X"])
    assert split_dry_run(["--dry_run", "true", "--project", "p"]) == (True, ["--project", "p"])
    # Beam would read "False" as a non-empty string, so as a dry run: here it is false.
    assert split_dry_run(["--dry_run=False"]) == (False, [])
    assert split_dry_run(["--dry-run", "no", "--region=r"]) == (False, ["--region=r"])
    with pytest.raises(SystemExit) as stop:
        split_dry_run(["--dry_run", "maybe"])
    assert stop.value.code == 2


@pytest.fixture
def temp_dir(tmp_path, monkeypatch):
    """The process's temporary directory (``tempfile.gettempdir()``) for this test: an empty
    directory whose leftovers the test can see."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    return temp


def beam_leftovers(temp: Path) -> list[str]:
    """Beam's local temporary directories (``beam-pipeline-temp*``) left in ``temp``."""
    return sorted(p.name for p in temp.glob("beam-pipeline-temp*"))


def test_a_local_dry_run_builds_the_graph_and_writes_nothing(tmp_path, capfd, temp_dir):
    corpus = make_corpus(tmp_path / "corpus", n_docs=20)
    out = tmp_path / "shards"
    assert main(["build", "--input", corpus, "--output", str(out), *BASE, "--dry_run"]) == 0
    err = capfd.readouterr().err
    assert "dry run: FnApiRunner has no dry run of its own: the build graph was built" in err
    # No output, no log beside it, and no temporary directory of Beam's left behind.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus", "tmp"]
    assert beam_leftovers(temp_dir) == []


class Unpicklable:
    def __reduce__(self):
        raise TypeError("an Unpicklable cannot be pickled")


def test_a_dry_run_encodes_every_step(tmp_path, capfd, monkeypatch, temp_dir):
    """The graph is really encoded: a step that cannot be pickled fails the dry run."""
    held = Unpicklable()

    def graph_with_an_unpicklable_step(p, config, plan):
        return p | beam.Create([1]) | "HoldsIt" >> beam.Map(lambda x: (x, held))

    monkeypatch.setattr(build, "build_graph", graph_with_an_unpicklable_step)
    corpus = make_corpus(tmp_path / "corpus", n_docs=20)
    out = tmp_path / "shards"
    assert main(["build", "--input", corpus, "--output", str(out), *BASE, "--dry_run"]) == 1
    err = capfd.readouterr().err
    assert "the dry run of the build failed" in err and "cannot be pickled" in err, err
    assert not out.exists()
    assert beam_leftovers(temp_dir) == []


def test_a_dry_run_leaves_an_earlier_build_as_it_was(small_shards, tmp_path, capfd):
    out = tmp_path / "shards"
    shutil.copytree(small_shards, out)
    before = digest(out)
    corpus = make_corpus(tmp_path / "corpus", n_docs=20)
    argv = ["build", "--input", corpus, "--output", str(out), *BASE, "--overwrite", "--dry_run"]
    assert main(argv) == 0
    assert digest(out) == before  # --overwrite would have deleted it all first
    # Without --overwrite the dry run refuses, as the build would.
    assert main([a for a in argv if a != "--overwrite"]) == 2
    assert "already holds" in capfd.readouterr().err and digest(out) == before
    exported = tmp_path / "exported"
    assert (
        main(["export", str(out), "--to", "tfrecord", "--output", str(exported), "--dry_run"]) == 0
    )
    assert not exported.exists() and digest(out) == before
    # The export's checks of --output still run: its own source is refused.
    assert main(["export", str(out), "--to", "tfrecord", "--output", str(out), "--dry_run"]) == 2
    assert "holds Arrow shards" in capfd.readouterr().err


GCP_EXTRA = (
    "the DataflowRunner needs the gcp extra ({}); scripts/test.sh runs these tests "
    "in .venv-gcp (pip install -e '.[gcp]')"
)


@pytest.fixture
def dataflow_spy(monkeypatch):
    """The DataflowRunner's translated pipelines. Without the gcp extra: skipped, or with
    BERT_GCP_TESTS=1 (scripts/test.sh's .venv-gcp) failed, so CI cannot pass without them."""
    from apache_beam.runners.dataflow import dataflow_runner

    try:
        from apache_beam.runners.dataflow.internal import apiclient  # noqa: F401
    except ImportError as err:
        if os.environ.get("BERT_GCP_TESTS") == "1":
            pytest.fail(GCP_EXTRA.format(err))
        pytest.skip(GCP_EXTRA.format(err))
    translated = []
    run = dataflow_runner.DataflowRunner.run_pipeline

    def spy(self, pipeline, options, pipeline_proto=None):
        result = run(self, pipeline, options, pipeline_proto)
        translated.append(self.proto_pipeline)
        return result

    monkeypatch.setattr(dataflow_runner.DataflowRunner, "run_pipeline", spy)
    return translated


def transform_names(proto) -> set[str]:
    return {t.unique_name for t in proto.components.transforms.values()}


@pytest.mark.slow
def test_dataflow_dry_runs_of_build_and_export(small_shards, tmp_path, capfd, dataflow_spy):
    corpus = make_corpus(tmp_path / "corpus", n_docs=20)
    out = tmp_path / "shards"
    assert (
        main(["build", "--input", corpus, "--output", str(out), *BASE, *DATAFLOW, "--dry_run"]) == 0
    )
    err = capfd.readouterr().err
    assert "the build job was translated and validated for DataflowRunner" in err
    # Local files pass the dry run (Beam checks its own options only), with a warning.
    assert f"--output {out} is a path on this machine" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus"]  # no output, no log beside
    assert {"ReadCorpus", "LearnVocabulary", "MakeRows", "WriteShards"} <= transform_names(
        dataflow_spy[-1]
    )

    exported = tmp_path / "exported"
    assert (
        main(
            [
                "export",
                str(small_shards),
                "--to",
                "nvidia-hdf5",
                "--output",
                str(exported),
                *DATAFLOW,
                "--dry_run",
            ]
        )
        == 0
    )
    assert "the export job was translated and validated for DataflowRunner" in (
        capfd.readouterr().err
    )
    assert {"ListShards", "ExportShards", "WriteManifest"} <= transform_names(dataflow_spy[-1])
    assert not exported.exists() and len(dataflow_spy) == 2


@pytest.mark.slow
def test_dataflow_dry_run_refuses_what_dataflow_would(tmp_path, capfd, dataflow_spy):
    """Beam's validation runs: a project id Dataflow would refuse is named, in one line."""
    corpus = make_corpus(tmp_path / "corpus", n_docs=20)
    out = tmp_path / "shards"
    # Not a local --temp_location: Beam then tries to make a default bucket (the network).
    bad_project = [a if a != "my-project" else "p" for a in DATAFLOW]
    argv = ["build", "--input", corpus, "--output", str(out), *BASE, *bad_project, "--dry_run"]
    assert main(argv) == 1
    err = capfd.readouterr().err
    assert "the dry run of the build failed: Invalid Project ID (p)" in err, err
    assert not out.exists() and not dataflow_spy
