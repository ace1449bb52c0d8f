"""Curate's output pinned across commits: two curates of a fixed corpus against written
digests, as test_golden.py pins the shards.

The corpus, tests/data/golden_curate/ (written once; fixed bytes now), holds 36 documents
of 120-220 words in two jsonl files, exact copies of 4, near copies (1% of words edited) of
4, far copies (30%) of 4, 4 documents too short for gopher_quality, and eval.txt, a passage
of one document. Pinned: the manifest (``created_by`` replaced: a release alone must not
fail this), every Parquet file, report.json and removed_samples.jsonl. Not funnel.png:
matplotlib draws it, and its bytes change with matplotlib's version.
"""

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from pipeline.beam.inputs import CURATE_VERSION
from pipeline.cli.main import main
from tests.helpers import assert_golden, sha256_files

pytest.importorskip("xxhash", reason="curate needs the curate extra (pip install -e '.[curate]')")

CORPUS = Path(__file__).resolve().parents[1] / "data" / "golden_curate"
PINNED_WITH = "Python 3.11, numpy 2.4.6, pyarrow 25.0.1, apache-beam 2.78.0"
CURATES = {
    # Every step: a rule set, decontamination, exact and near copies (smallest id stays).
    "filters_decontaminate_minhash": [
        "--filters",
        "gopher_quality",
        "--decontaminate",
        "corpus/eval.txt",
        "--num_files",
        "2",
    ],
    # Near copies, the first in input order staying; one file.
    "minhash_keep_first": ["--minhash_keep", "first", "--num_files", "1"],
}
VERSIONS = {"curate_version": 1}
GOLDEN = {
    "filters_decontaminate_minhash": {
        "manifest.json (placeholder)": "c2232499d07edf2b30fd098ce98438c6754d1e48f983640b72a26573028595bb",
        "part-00000-of-00002.parquet": "8374738fcb792711c0c4db1f7a593d7fb7f88efa3607e2225b437498106319b0",
        "part-00001-of-00002.parquet": "2c5ed66dcd7153e3709f3b510b5be4c83bb7f130a58220027f27cd194e146278",
        "report.json": "53afd4dd06e3947af32281aaa2328594f25294cfcc1ee9dd2831f8cf54c23cc5",
        "removed_samples.jsonl": "7020b4ed7aa530775bef81dec3e2db6b11f655bde368f75f196725f5cf2139b7",
    },
    "minhash_keep_first": {
        "manifest.json (placeholder)": "b16671d89f38d157d7f8b24292fb027e0ad2b825ed40dce365fce440d970da96",
        "part-00000-of-00001.parquet": "7e2303ee60d52d8c27b2cafeb602628158d28bd7d0f29067060b97527fd67514",
        "report.json": "2987a8c8377e98aeb7926f2358c81f913ec3eabbda8d9db1d8c28f360fa1f09b",
        "removed_samples.jsonl": "441b79a4e1fbf41dacae10c1ba54ad92bad5e7b24386aa7a4cbfdc65eca698e6",
    },
}

HOW_TO_UPDATE = """\
Curating the fixed corpus tests/data/golden_curate/ no longer gives the pinned files: the
same input and flags now give other bytes than before this change.

If that is what you meant (a change to a filter, decontamination, MinHash, the clusters,
which document stays, the output files, report.json or the manifest):
  1. bump CURATE_VERSION in pipeline/beam/inputs.py;
  2. say what changed in docs/curation.md ("The output") and in CHANGELOG.md;
  3. set VERSIONS and GOLDEN in tests/pipeline/test_golden_curate.py to the values below.
If it is not: your change altered curate's output; find out why before going on. (A new
pyarrow, numpy or Python can change the bytes too: these digests were made with {pinned}.)

{name}: expected {expected}
{name}: got      {got}"""


def digests(directory: Path) -> dict[str, str]:
    """sha256 of every output file but funnel.png, the manifest's with its placeholder."""
    manifest = json.loads((directory / "manifest.json").read_text())
    manifest["created_by"] = "bert-pipeline (version not pinned)"
    encoded = json.dumps(manifest, sort_keys=True).encode()
    out = {"manifest.json (placeholder)": hashlib.sha256(encoded).hexdigest()}
    names = [entry["name"] for entry in manifest["files"]]
    return {**out, **sha256_files(directory, [*names, "report.json", "removed_samples.jsonl"])}


@pytest.mark.parametrize("name", sorted(CURATES))
def test_curates_of_a_fixed_corpus_keep_their_bytes(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative paths: the manifest records --input as given
    shutil.copytree(CORPUS, "corpus")
    argv = ["curate", "--input", "corpus/docs-*.jsonl", "--output", "out", *CURATES[name]]
    assert main(argv) == 0
    manifest = json.loads(Path("out/manifest.json").read_text())
    assert manifest["curate_version"] == CURATE_VERSION
    expected = {"versions": VERSIONS, "digests": GOLDEN[name]}
    actual = {"versions": {"curate_version": CURATE_VERSION}, "digests": digests(Path("out"))}
    assert_golden(actual, expected, HOW_TO_UPDATE, pinned=PINNED_WITH, name=name)
