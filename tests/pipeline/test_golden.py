"""Shard bytes pinned across commits: two builds of a fixed corpus against written digests.

The determinism tests (test_build.py) compare runners of one commit; these compare with
the digests below, so a change to vocab learning, NSP pairs, masking, bucketing, sharding
or row order fails here even when every other test still passes. The corpus is
tests/data/golden/ (written once by tests.helpers.make_corpus(n_docs=40, n_files=2,
seed=3); now fixed bytes, so edits to the helper cannot move the digests).

Pinned: every shard's and vocab.txt's sha256, and the manifest's sha256 with two values
replaced by placeholders because they change for reasons other than our data:
``created_by`` (the package version: a release alone must not fail this test) and
``vocab.tokenizer_sha256`` (tokenizer.json is serialised by the `tokenizers` library,
whose JSON may change between its versions; its content is vocab.txt plus
``do_lower_case``, both pinned). The shards' bytes are pyarrow's IPC writer's too
(PINNED_WITH says which versions made the digests: numpy's random streams and the
tokenizers library's WordPiece encoding shape them as well).
"""

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from pipeline.cli.main import main
from pipeline.shards import shard_format
from pipeline.shards.shard_writer import encode_manifest

CORPUS = Path(__file__).resolve().parents[1] / "data" / "golden"
PINNED_WITH = "Python 3.11, numpy 2.4.6, pyarrow 25.0.1, tokenizers 0.23.3, apache-beam 2.77.0"
BUILDS = {
    # Google's defaults scaled down; a learned vocab; 4 buckets of documents.
    "google": ["--vocab_size", "120", "--dupe_factor", "2", "--max_seq_length", "32",
               "--max_predictions_per_seq", "5", "--num_shards", "2", "--bucket_size", "2",
               "--random_seed", "11"],
    # Whole-word masking of a cased vocab, more short rows and masks, 3 shards.
    "whole_word_cased": ["--vocab_size", "150", "--do_lower_case", "false",
                         "--do_whole_word_mask", "true", "--dupe_factor", "1",
                         "--max_seq_length", "48", "--max_predictions_per_seq", "7",
                         "--masked_lm_prob", "0.2", "--short_seq_prob", "0.3",
                         "--num_shards", "3", "--bucket_size", "3", "--random_seed", "12"],
}  # fmt: skip
# Made with format_version 1, algorithm_version 2 (pipeline/shards/shard_format.py); the shards and
# vocab.txt are algorithm_version 1's (the corpus holds no literal special-token text).
VERSIONS = {"format_version": 1, "algorithm_version": 2}
GOLDEN = {
    "google": {
        "manifest.json (placeholders)": "50fdfadfde58fcd545d2722c83fb52a01314d8b7b8990e181ca419f372792a3c",
        "shard-00000-of-00002.arrow": "2ae2e0821d168c7affa3ba2dc5aa70f9c9f29f947b3b87960eb634d3d7bf7c20",
        "shard-00001-of-00002.arrow": "a91b3c7dffc0540e158e1e7be00d759aa2083f9833b463e5c871cec33fa69261",
        "vocab.txt": "336c1afe6106dde2d511ec9a402d1470b88943642843ec6783b7eab45345473d",
    },
    "whole_word_cased": {
        "manifest.json (placeholders)": "d32f9cbdc54d01eb1e94585e74ebe77c04b6960cd7cbeedee8f1a5b3932b3321",
        "shard-00000-of-00003.arrow": "f6a4ebcd16c6b7a2cc58324991e0485f0a7331c4cf86f1069c9548d3b255fa2c",
        "shard-00001-of-00003.arrow": "3025187a33a10e7b6ea9778904ba7ed24fa139f78ad81880862f7c2a9be0df92",
        "shard-00002-of-00003.arrow": "0b8b1b62677ead70d55adc8be8da85b835a28b1a96cdb3d539cdd494e0c77477",
        "vocab.txt": "963526420cbdb35b238e8757d9bc3308622f8e7b89efe3fc6f986a8d54225f92",
    },
}

HOW_TO_UPDATE = """\
The shards built from the fixed corpus tests/data/golden/ are not the pinned ones: every
build of the same input and seed now gives other bytes than before this change.

If that is what you meant (a change to vocab learning, NSP pairs, masking, bucketing,
sharding, row order or the shard layout):
  1. bump ALGORITHM_VERSION in pipeline/shards/shard_format.py (FORMAT_VERSION too if readers must
     change: it makes every reader refuse older shards);
  2. say what changed in pipeline/shards/FORMAT.md (the algorithm_version list) and in
     CHANGELOG.md under "Shard bytes" of the coming release;
  3. set VERSIONS and GOLDEN in tests/pipeline/test_golden.py to the values printed below.
If it is not: your change altered the pipeline's output; find out why before going on.
(A new pyarrow, numpy, tokenizers or Python can change the bytes too: these digests were
made with {pinned}.)

{name}: expected {expected}
{name}: got      {got}"""


def digests(directory: Path) -> dict[str, str]:
    """sha256 of every shard and vocab.txt, and of the manifest with its placeholders."""
    manifest = json.loads((directory / shard_format.MANIFEST_NAME).read_text())
    manifest["created_by"] = "bert-pipeline (version not pinned)"
    manifest["vocab"]["tokenizer_sha256"] = "(not pinned: the tokenizers library writes it)"
    out = {"manifest.json (placeholders)": hashlib.sha256(encode_manifest(manifest)).hexdigest()}
    for name in [entry["name"] for entry in manifest["shards"]] + [shard_format.VOCAB_NAME]:
        out[name] = hashlib.sha256((directory / name).read_bytes()).hexdigest()
    return out


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_builds_of_a_fixed_corpus_keep_their_bytes(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative paths: the manifest records --input as given
    shutil.copytree(CORPUS, "corpus")
    assert main(["build", "--input", "corpus/*.txt", "--output", "shards", *BUILDS[name]]) == 0
    manifest = shard_format.verify_directory("shards")
    versions = {key: manifest[key] for key in VERSIONS}
    got = digests(tmp_path / "shards")
    expected = {"versions": VERSIONS, "digests": GOLDEN[name]}
    actual = {"versions": versions, "digests": got}
    message = HOW_TO_UPDATE.format(
        pinned=PINNED_WITH,
        name=name,
        expected=json.dumps(expected, indent=2),
        got=json.dumps(actual, indent=2),
    )
    assert actual == expected, message
