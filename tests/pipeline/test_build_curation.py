"""``python -m pipeline build`` with curate's flags: one job that curates and builds makes
the shards of ``curate`` then ``build`` on its output, and counts what it removed."""

import json
import random

import pytest

from pipeline.cli.main import main
from tests.pipeline.test_curate import page, planted_corpus

pytest.importorskip("xxhash", reason="curation needs the curate extra (pip install -e '.[curate]')")
pytest.importorskip(
    "py3langid", reason="curation needs the curate extra (pip install -e '.[curate]')"
)

BUILD = ["--vocab_size", "150", "--dupe_factor", "2", "--num_shards", "2"]


def shard_bytes(out):
    manifest = json.loads((out / "manifest.json").read_text())
    return manifest, {e["name"]: (out / e["name"]).read_bytes() for e in manifest["shards"]}


def curate_then_build(corpus, tmp_path, curation, build=BUILD):
    curated = tmp_path / "curated"
    assert main(["curate", "--input", corpus, "--output", str(curated), *curation]) == 0
    out = tmp_path / "two-jobs"
    assert main(["build", "--input", str(curated / "*.parquet"), "--output", str(out), *build]) == 0
    return shard_bytes(out)


@pytest.mark.parametrize("keep", ["smallest_id", "first"])
def test_minhash_in_build_makes_the_shards_of_curate_then_build(tmp_path, keep):
    planted_corpus(tmp_path / "corpus", n=60, exact=6, near=6, far=6, seed=2)
    corpus = str(tmp_path / "corpus" / "*.jsonl")
    curation = ["--dedup", "minhash", "--minhash_keep", keep]
    two_manifest, two_shards = curate_then_build(corpus, tmp_path, curation)
    out = tmp_path / "one-job"
    argv = ["build", "--input", corpus, "--output", str(out), *BUILD, *curation]
    assert main(argv) == 0
    manifest, shards = shard_bytes(out)
    assert shards == two_shards
    assert manifest["num_rows"] == two_manifest["num_rows"] > 0
    assert manifest["vocab"]["sha256"] == two_manifest["vocab"]["sha256"]
    assert manifest["stats"]["documents"] == 66 == two_manifest["stats"]["documents"]
    assert manifest["stats"]["curation"] == {
        "removed": {"exact_duplicate": 6, "near_duplicate": 6},
        "components_changed_in_last_round": 0,
    }
    assert manifest["params"]["dedup"] == "minhash"
    assert manifest["params"]["minhash_keep"] == keep
    # Without curation flags the manifest says nothing of curation (its bytes are as before).
    plain = tmp_path / "plain"
    assert main(["build", "--input", corpus, "--output", str(plain), *BUILD]) == 0
    plain_manifest, _ = shard_bytes(plain)
    assert "curation" not in plain_manifest["stats"]
    assert "dedup" not in plain_manifest["params"]
    assert plain_manifest["stats"]["documents"] == 78  # 60 + 18 planted copies, all kept


def test_filters_and_exact_dedup_on_txt_in_build_match_curate_then_build(tmp_path, capfd):
    """txt documents (blank-line separated), an exact copy and a page too short for
    Gopher's word count: both go, in one job as in two."""
    rng = random.Random(4)
    pages = [page(rng, rng.randint(6, 9)) for _ in range(20)]
    short = "Too short to keep.\nIt has few words."
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("\n\n".join([*pages, pages[3], short]) + "\n")
    curation = ["--dedup", "exact", "--filters", "gopher_quality"]
    _, two_shards = curate_then_build(str(corpus / "*.txt"), tmp_path, curation)
    out = tmp_path / "one-job"
    argv = ["build", "--input", str(corpus / "*.txt"), "--output", str(out), *BUILD, *curation]
    capfd.readouterr()
    assert main(argv) == 0
    assert "curation removed 2 documents before tokenizing" in capfd.readouterr().err
    manifest, shards = shard_bytes(out)
    assert shards == two_shards
    assert manifest["stats"]["documents"] == 20
    assert manifest["stats"]["curation"]["removed"] == {
        "exact_duplicate": 1,
        "gopher_quality.word_count": 1,
    }


def test_a_bad_curation_flag_in_build_exits_2_naming_it(tmp_path, capfd):
    (tmp_path / "a.txt").write_text("one line.\n")
    argv = ["build", "--input", str(tmp_path / "a.txt"), "--output", str(tmp_path / "o")]
    assert main([*argv, "--filters", "gopher_quality,nonsense"]) == 2
    assert "--filters" in capfd.readouterr().err
    assert not (tmp_path / "o").exists()
