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
from tests.helpers import assert_golden, sha256_files

CORPUS = Path(__file__).resolve().parents[1] / "data" / "golden"
PINNED_WITH = "Python 3.11, numpy 2.4.6, pyarrow 25.0.1, tokenizers 0.23.3, apache-beam 2.77.0"
BUILDS = {
    # Google's defaults scaled down; a learned vocab; 4 buckets of documents.
    "google": [
        "--vocab_size",
        "120",
        "--dupe_factor",
        "2",
        "--max_seq_length",
        "32",
        "--max_predictions_per_seq",
        "5",
        "--num_shards",
        "2",
        "--bucket_size",
        "2",
        "--random_seed",
        "11",
    ],
    # Whole-word masking of a cased vocab, more short rows and masks, 3 shards.
    "whole_word_cased": [
        "--vocab_size",
        "150",
        "--do_lower_case",
        "false",
        "--do_whole_word_mask",
        "true",
        "--dupe_factor",
        "1",
        "--max_seq_length",
        "48",
        "--max_predictions_per_seq",
        "7",
        "--masked_lm_prob",
        "0.2",
        "--short_seq_prob",
        "0.3",
        "--num_shards",
        "3",
        "--bucket_size",
        "3",
        "--random_seed",
        "12",
    ],
    # MLM-only rows (--objective mlm): packed across documents, unmasked; a cased vocab.
    "mlm_full_sentences": [
        "--objective",
        "mlm",
        "--vocab_size",
        "130",
        "--do_lower_case",
        "false",
        "--max_seq_length",
        "40",
        "--num_shards",
        "2",
        "--bucket_size",
        "3",
        "--random_seed",
        "13",
    ],
    # MLM rows within documents, with static whole-word masks at 0.3, two passes.
    "mlm_doc_sentences_static": [
        "--objective",
        "mlm",
        "--mlm_packing",
        "doc_sentences",
        "--static_masks",
        "true",
        "--masked_lm_prob",
        "0.3",
        "--do_whole_word_mask",
        "true",
        "--dupe_factor",
        "2",
        "--vocab_size",
        "140",
        "--max_seq_length",
        "56",
        "--num_shards",
        "3",
        "--bucket_size",
        "2",
        "--random_seed",
        "14",
    ],
}
# Made with format_version 1, algorithm_version 3 (pipeline/shards/shard_format.py): documents
# identified by their content. vocab.txt is unchanged since algorithm_version 1.
VERSIONS = {"format_version": 1, "algorithm_version": 3}
GOLDEN = {
    "google": {
        "manifest.json (placeholders)": "6e169ad7f511120873437955f66c599d89161e3dc5b78ee8b84df829f0ac7c3f",
        "shard-00000-of-00002.arrow": "3ddbf75196ccc6b9513429da5a25ce0ffa9327e2679702a9eb23b7b313250c5e",
        "shard-00001-of-00002.arrow": "28ea1ed366ee93394ad146008e1c9fca05e632ad62b07ae72012339825155138",
        "vocab.txt": "336c1afe6106dde2d511ec9a402d1470b88943642843ec6783b7eab45345473d",
    },
    "whole_word_cased": {
        # Its --max_predictions_per_seq 7 lowers the rate (0.2 of 48 tokens is 10): since
        # the cap follows the rate, the manifest counts the rows it lowered (stats.rows_capped).
        "manifest.json (placeholders)": "a87184bca3ae905693bb9bc76f42917e9bbd8f7713dd5c40b922664bc488442c",
        "shard-00000-of-00003.arrow": "5af20f6c4168f68239abac3e8d0f516dacf930bcb01e0a77b3d88dffadf8534f",
        "shard-00001-of-00003.arrow": "a4c98ad9fa537470f7a921dcdadc12103f2387b8c40a03555485f50212985b5f",
        "shard-00002-of-00003.arrow": "585832dacf6aac2b49ce47529418345adfe5042c0f4a8369518f0aafa85faa9b",
        "vocab.txt": "963526420cbdb35b238e8757d9bc3308622f8e7b89efe3fc6f986a8d54225f92",
    },
    "mlm_full_sentences": {
        "manifest.json (placeholders)": "8694d9ff496bb6047dfa6f3c595e02814a22f02782ab4b07897db97e1178c071",
        "shard-00000-of-00002.arrow": "74bd2c4def382b28df3c69caf3fcc6497eeb27982318911aaa0aff1e3d9d51f2",
        "shard-00001-of-00002.arrow": "c70cc2f124380c44012ac417a7bb3a710e0f2dd6a4477877da6adba9bcb3e00d",
        "vocab.txt": "d8dc1648b171144770677ded4261fb4b31e222e0aed68b683dd8fddd3d8328f1",
    },
    "mlm_doc_sentences_static": {
        "manifest.json (placeholders)": "a7658442bc463ef10842191ffe55e7de51c12ce49020319693a6f4052da2c0be",
        "shard-00000-of-00003.arrow": "607db46bfa46615a28c551c7ab7f714d534c8e81e09e3561f83046c5e0672c7b",
        "shard-00001-of-00003.arrow": "56c5de5f445578c6865d0dddae09faeb99a0be6fe6debd852a3b84c8d177a318",
        "shard-00002-of-00003.arrow": "5463d1625c42dbd72c85b4866f95b9f7df29e79f545984dd8ac5cf06d7212335",
        "vocab.txt": "3ba98c27ffcb138b8dbc52f1768ed3d709a57c1854fcec59525fdc8e7e066470",
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
    names = [entry["name"] for entry in manifest["shards"]] + [shard_format.VOCAB_NAME]
    return {**out, **sha256_files(directory, names)}


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_builds_of_a_fixed_corpus_keep_their_bytes(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative paths: the manifest records --input as given
    shutil.copytree(CORPUS, "corpus")
    assert main(["build", "--input", "corpus/*.txt", "--output", "shards", *BUILDS[name]]) == 0
    manifest = shard_format.verify_directory("shards")
    versions = {key: manifest[key] for key in VERSIONS}
    actual = {"versions": versions, "digests": digests(tmp_path / "shards")}
    expected = {"versions": VERSIONS, "digests": GOLDEN[name]}
    assert_golden(actual, expected, HOW_TO_UPDATE, pinned=PINNED_WITH, name=name)
