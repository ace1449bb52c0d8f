"""``python -m pipeline curate``: exact and near-duplicate removal, connected components as
Beam steps, the report and manifest, determinism, and curate-then-build."""

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import apache_beam as beam
import pyarrow.parquet as pq
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from pipeline.beam import memory
from pipeline.beam.curate_output import (
    FILE_KEYS,
    CombineInBundle,
    add_pairs,
    funnel_lines,
    sample_key,
    smallest,
)
from pipeline.beam.curation_steps import KeepDistinct
from pipeline.beam.minhash_steps import BandKeys, ConnectedComponents, bucket_stars
from pipeline.beam.spool import SpoolRef, SpoolTexts, use_spool
from pipeline.cli.main import main
from pipeline.core.components import band_bucket, star_edges
from pipeline.core.sources import content_id
from tests.helpers import REPO
from tests.pipeline.test_curation_core import expected_labels

# The curate extra (MinHash's xxhash, py3langid): scripts/test.sh's base-install stage has
# none of the extras, and skips here; its main stage installs them.
pytest.importorskip("xxhash", reason="curate needs the curate extra (pip install -e '.[curate]')")
pytest.importorskip(
    "py3langid", reason="curate needs the curate extra (pip install -e '.[curate]')"
)

RUNNER = ["--runner=apache_beam.runners.portability.fn_api_runner.FnApiRunner"]
WORDS = (
    "the river runs north past an old city where a village of farmers lives by water "
    "all year long and boats carry grain to markets on the coast while children learn "
    "songs about storms kings bridges forests mountains and lost ships"
).split()


def components(edges, rounds=8):
    with TestPipeline(options=PipelineOptions(RUNNER)) as p:
        labels, changed = p | beam.Create(edges) | ConnectedComponents(rounds)
        assert_that(labels, equal_to(expected_labels(edges)), label="labels")
        assert_that(changed, equal_to([0]), label="converged")


def test_a_chain_is_one_component_and_a_separate_pair_another():
    # a ~ b ~ ... ~ t (a path of 20, its ids shuffled: label propagation alone needs 19
    # rounds), and x ~ y.
    names = [f"n{i:02d}" for i in range(20)]
    random.Random(3).shuffle(names)
    chain = [(names[i], names[i + 1]) for i in range(19)]
    components([*chain, ("y", "x")], rounds=6)


@pytest.mark.parametrize("seed", range(3))
def test_random_graphs_match_union_find(seed):
    rng = random.Random(seed)
    nodes = [f"d{i:03d}" for i in range(120)]
    edges = [tuple(rng.sample(nodes, 2)) for _ in range(90)]
    components(edges, rounds=6)


def test_combining_in_bundles_first_gives_the_same_sums_and_samples(monkeypatch):
    # Folded every 3 values, the per-key sums and the 4 smallest by key are those of the
    # values combined at once.
    monkeypatch.setattr(memory, "FOLD_AT", 3)
    rng = random.Random(0)
    items = [(f"reason{rng.randrange(3)}", (f"id{i}", f"text {i}")) for i in range(200)]
    key = sample_key(7)
    expected_top = {}
    for reason, item in items:
        expected_top.setdefault(reason, []).append(item)
    expected_top = [(r, sorted(v, key=key)[:4]) for r, v in expected_top.items()]
    pairs = [(reason, (1, len(text))) for reason, (_, text) in items]
    expected_sums = {}
    for reason, (n, b) in pairs:
        a = expected_sums.get(reason, (0, 0))
        expected_sums[reason] = (a[0] + n, a[1] + b)
    with TestPipeline() as p:
        top = (
            p
            | "Items" >> beam.Create(items)
            | "Fold" >> beam.ParDo(CombineInBundle(smallest(4, key)))
            | beam.combiners.Top.PerKey(4, key=key, reverse=True)
        )
        assert_that(top, equal_to(expected_top), label="top")
        sums = (
            p
            | "Pairs" >> beam.Create(pairs)
            | "FoldSums" >> beam.ParDo(CombineInBundle(lambda v: [add_pairs(v)]))
            | beam.CombinePerKey(add_pairs)
        )
        assert_that(sums, equal_to(list(expected_sums.items())), label="sums")


def test_bucket_stars_group_packed_records_by_key():
    k1, k2, k3 = (bytes([0, band]) + bytes(15) + b"\x05" for band in (1, 2, 3))
    packs = [(k1 + k2 + k1, "c\nb\nd"), (k1 + k3, "a\nb")]
    assert sorted(bucket_stars((5, packs))) == [("c", "a"), ("d", "a")]
    assert band_bucket(k1) == 5
    with pytest.raises(ValueError, match="18 per id"):
        list(bucket_stars((5, [(k1, "a\nb")])))


@pytest.mark.parametrize("spool", [False, True])
@pytest.mark.parametrize("records", [memory.PACK_RECORDS, 14])  # one pack per bucket, or many
def test_packed_band_keys_give_the_edges_of_one_group_per_band_key(
    monkeypatch, tmp_path, records, spool
):
    """BandKeys packs its bundle's (key, id) records per bucket; grouped by bucket and
    sorted, they give the edges that a GroupByKey on each band key gives. Spooled, the
    bundle emits one reference per bucket when it ends, and the packs are read back."""
    from pipeline.beam.config import CurationOptions
    from pipeline.core.dedup import MinHasher, band_keys, shingle_hashes

    monkeypatch.setattr(memory, "PACK_RECORDS", records)
    rng = random.Random(3)
    originals = [document(rng, 60) for _ in range(30)]
    texts = originals + [edit(rng, t, 0.01) for t in originals[:10]] + [originals[3]]
    docs = [(f"{i:04d}", t) for i, t in enumerate(texts)]
    config = CurationOptions(dedup="minhash")
    dofn = BandKeys(config, spool=str(tmp_path) if spool else None)
    dofn.start_bundle()
    packs = [out for doc in docs for out in dofn.process(doc)]
    assert not (spool and packs)  # nothing through the runner before the bundle ends
    packs += [w.value for w in dofn.finish_bundle()]
    if spool:
        assert all(isinstance(ref, SpoolRef) for _, ref in packs)
        assert len(packs) == len({bucket for bucket, _ in packs})
        assert (max(len(ref.spans) for _, ref in packs) > 1) is (records == 14)
        assert len(list(tmp_path.glob(".bands-*.spool"))) == 1
    else:
        assert (len(packs) > len({bucket for bucket, _ in packs})) is (records == 14)
    buckets: dict = {}
    for bucket, pack in packs:
        buckets.setdefault(bucket, []).append(pack)
    got = sorted(edge for item in buckets.items() for edge in bucket_stars(item))
    hasher, groups = MinHasher(14 * 8, config.minhash_seed), {}
    for doc_id, text in docs:
        signature = hasher.signature(shingle_hashes(text, 5))
        for key in band_keys(signature, 14, 8):
            groups.setdefault(key, []).append(doc_id)
    expected = sorted(edge for item in groups.items() for edge in star_edges(item))
    assert got == expected
    assert len(expected) >= 14 + 10  # the exact copy shares 14 bands, each near copy one


# ----------------------------------------------------------------------------- the job


def document(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


def edit(rng: random.Random, text: str, rate: float) -> str:
    """``text`` with ``rate`` of its words replaced by other words."""
    words = text.split()
    for i in rng.sample(range(len(words)), max(1, round(rate * len(words)))):
        words[i] = rng.choice(WORDS) + "x"
    return " ".join(words)


def planted_corpus(directory: Path, n=80, exact=8, near=8, far=8, seed=0) -> dict:
    """n distinct documents plus exact copies, near copies (1% of words edited) and far
    copies (30% edited) of some of them, as jsonl; returns the planted texts."""
    rng = random.Random(seed)
    originals = [document(rng, rng.randint(150, 300)) for _ in range(n)]
    planted = {
        "exact": [originals[i] for i in range(exact)],
        "near": [edit(rng, originals[exact + i], 0.01) for i in range(near)],
        "far": [edit(rng, originals[exact + near + i], 0.3) for i in range(far)],
    }
    texts = originals + [t for group in planted.values() for t in group]
    rng.shuffle(texts)
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "docs.jsonl", "w") as f:
        for text in texts:
            f.write(json.dumps({"text": text}) + "\n")
    return {"originals": originals, **planted}


def curated_texts(out: Path) -> list[str]:
    manifest = json.loads((out / "manifest.json").read_text())
    return [
        text
        for entry in manifest["files"]
        for text in pq.read_table(out / entry["name"]).column("text").to_pylist()
    ]


def test_exact_copies_go_and_the_report_counts_them(tmp_path):
    planted = planted_corpus(tmp_path / "corpus")
    out = tmp_path / "out"
    argv = ["curate", "--input", str(tmp_path / "corpus" / "*.jsonl"), "--output", str(out)]
    assert main([*argv, "--dedup", "exact", "--num_files", "2"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["removed"]["exact_duplicate"]["documents"] == 8
    funnel = {row["step"]: row["documents"] for row in report["funnel"]}
    assert funnel == {"read": 104, "exact_dedup": 96}
    texts = curated_texts(out)
    assert len(texts) == len(set(texts)) == 96
    assert set(planted["originals"]) <= set(texts)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["num_documents"] == 96 and len(manifest["files"]) == 2
    samples = [
        json.loads(line) for line in (out / "removed_samples.jsonl").read_text().splitlines()
    ]
    assert samples and {s["reason"] for s in samples} == {"exact_duplicate"}
    # An earlier curate is refused without --overwrite.
    assert main([*argv, "--dedup", "exact"]) == 2


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    directory = tmp_path_factory.mktemp("planted")
    texts = planted_corpus(directory / "corpus", n=120, exact=10, near=10, far=10, seed=1)
    out = directory / "minhash"
    argv = ["curate", "--input", str(directory / "corpus" / "*.jsonl"), "--output", str(out)]
    assert main([*argv, "--num_files", "3"]) == 0
    return directory, texts, out


def test_minhash_removes_exact_and_near_copies_and_keeps_far_ones(planted):
    """120 documents plus 10 exact copies, 10 near copies (1% of words edited: Jaccard of
    5-gram shingles about 0.9) and 10 far copies (30%: about 0.2): the copies of both first
    kinds go, every far copy and every original stays (the bounds: all and none)."""
    _, texts, out = planted
    kept = set(curated_texts(out))
    report = json.loads((out / "report.json").read_text())
    assert report["removed"]["exact_duplicate"]["documents"] == 10
    near_removed = report["removed"].get("near_duplicate", {}).get("documents", 0)
    # One of each near pair goes: the original or its copy, whichever has the smaller id.
    assert near_removed == 10
    for original, copy in zip(texts["originals"][10:20], texts["near"], strict=True):
        assert (original in kept) != (copy in kept)
    assert set(texts["far"]) <= kept
    assert set(texts["originals"][20:]) <= kept
    assert len(kept) == 120 + 10  # originals, one of each near pair counted once, far copies
    assert report["components_changed_in_last_round"] == 0
    assert not list(out.glob(".*"))  # the texts' spool files (SpoolTexts) are gone


@pytest.mark.slow
def test_curated_files_are_the_same_bytes_on_two_workers_and_in_one_file(planted, tmp_path):
    """And through the runner's shuffle (--spool no) against spooled (the reference:
    auto, on the DirectRunner)."""
    directory, _, reference = planted
    corpus = directory / "corpus" / "docs.jsonl"
    lines = corpus.read_text().splitlines(keepends=True)
    split = tmp_path / "split"
    split.mkdir()
    for i in range(3):  # the same documents in three files, in another order
        (split / f"part-{i}.jsonl").write_text("".join(lines[i::3][::-1]))
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "pipeline", "curate", "--input", str(split / "*.jsonl")]
    cmd += ["--output", str(out), "--num_files", "3", "--direct_num_workers=2"]
    cmd += ["--direct_running_mode=multi_processing", "--spool", "no"]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    for name in [f"part-{i:05d}-of-00003.parquet" for i in range(3)]:
        assert (out / name).read_bytes() == (reference / name).read_bytes(), name
    samples = (out / "removed_samples.jsonl").read_bytes()
    assert samples == (reference / "removed_samples.jsonl").read_bytes()


def test_build_reads_curated_output(planted, tmp_path):
    _, _, out = planted
    shards = tmp_path / "shards"
    argv = ["build", "--input", str(out / "*.parquet"), "--output", str(shards)]
    assert main([*argv, "--vocab_size", "150", "--dupe_factor", "1", "--objective", "nsp"]) == 0
    manifest = json.loads((shards / "manifest.json").read_text())
    assert manifest["stats"]["documents"] == 130
    assert manifest["params"]["input_format"] == "parquet"


@pytest.mark.parametrize("damage", ["no_manifest", "killed", "newer_version", "stray_file"])
def test_build_refuses_curated_output_unfinished_newer_or_unlisted(
    planted, tmp_path, capfd, damage
):
    """Curate's output read back is checked against its manifest (pipeline/beam/inputs.py):
    without it (an unfinished curate), of a newer curate_version, or with a part file the
    manifest does not list, build exits 2 naming the file and writes nothing."""
    _, _, out = planted
    copy = tmp_path / "curated"
    shutil.copytree(out, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    if damage == "no_manifest":
        (copy / "manifest.json").unlink()
        said = "without its manifest.json"
    elif damage == "killed":  # before report.json, with its spool files left
        (copy / "manifest.json").unlink()
        (copy / "report.json").unlink()
        (copy / ".texts-0123.spool").write_bytes(b"")
        said = "without its manifest.json"
    elif damage == "newer_version":
        manifest["curate_version"] += 1
        (copy / "manifest.json").write_text(json.dumps(manifest))
        said = f"curate_version {manifest['curate_version']}"
    else:
        shutil.copy(copy / "part-00000-of-00003.parquet", copy / "part-00007-of-00009.parquet")
        said = "part-00007-of-00009.parquet: not among the files"
    shards = tmp_path / "shards"
    argv = ["build", "--input", str(copy / "*.parquet"), "--output", str(shards)]
    assert main([*argv, "--vocab_size", "150"]) == 2
    assert said in capfd.readouterr().err
    assert not shards.exists()


GERMAN = (
    "Der Fluss fließt nach Norden an der alten Stadt vorbei, wo ein Dorf von Bauern das "
    "ganze Jahr am Wasser lebt. Die Kinder lernen Lieder über Stürme, Könige und Brücken, "
    "und die Boote bringen das Getreide zu den Märkten an der Küste."
)


def page(rng: random.Random, sentences: int) -> str:
    """Sentences of 8-20 words, one per line: a page C4's and Gopher's rules keep."""
    return "\n".join(document(rng, rng.randint(8, 20)) for _ in range(sentences))


def test_filters_languages_and_decontamination_remove_with_named_reasons(tmp_path):
    rng = random.Random(5)
    good = [page(rng, rng.randint(6, 10)) for _ in range(30)]
    benchmark = document(rng, 40)  # an evaluation text, 40 words
    junk = {
        "short": document(rng, 30),  # English, under Gopher's 50 words
        "german": " ".join([GERMAN] * 3),
        "lorem": "Lorem ipsum dolor sit amet. " + good[0],
        "leaked": good[1] + "\n" + benchmark,
    }
    chinese = [
        json.loads(line)["text"]
        for line in (REPO / "tests/data/chinese/sample.jsonl").read_text().splitlines()[:5]
    ]
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    with open(corpus / "docs.jsonl", "w") as f:
        for text in [*good[2:], *junk.values()]:
            f.write(json.dumps({"text": text}) + "\n")
    (tmp_path / "eval.txt").write_text(benchmark + "\n")
    out = tmp_path / "out"
    argv = ["curate", "--input", str(corpus / "*.jsonl"), "--output", str(out), "--dedup", "none"]
    argv += ["--languages", "en", "--filters", "gopher_quality,c4"]
    assert main([*argv, "--decontaminate", str(tmp_path / "eval.txt")]) == 0
    removed = json.loads((out / "report.json").read_text())["removed"]
    assert removed["language"]["documents"] == 1  # the German page
    assert removed["decontaminated"]["documents"] == 1
    assert removed["c4.lorem_ipsum"]["documents"] == 1
    assert removed["gopher_quality.word_count"]["documents"] == 1
    assert set(curated_texts(out)) == set(good[2:])
    # Chinese, not split by spaces, passes the rule sets that count words.
    zh = tmp_path / "zh"
    zh.mkdir()
    with open(zh / "docs.jsonl", "w") as f:
        for text in chinese:
            f.write(json.dumps({"text": text}) + "\n")
    argv = ["curate", "--input", str(zh / "*.jsonl"), "--output", str(tmp_path / "zh-out")]
    assert main([*argv, "--languages", "zh", "--filters", "gopher_quality,fineweb"]) == 0
    assert len(curated_texts(tmp_path / "zh-out")) == len(chinese)


def test_the_report_counts_documents_and_bytes_in_and_out_per_input_file(tmp_path):
    """a.jsonl: x, y, a short page (Gopher's word count); b.jsonl: a copy of x, z. A kept
    document counts to the first path of its copies, so x is a's and b keeps z alone."""
    rng = random.Random(7)
    x, y, z = (page(rng, 8) for _ in range(3))
    short = document(rng, 20)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name, texts in {"a.jsonl": [x, y, short], "b.jsonl": [x, z]}.items():
        (corpus / name).write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    (corpus / "c.jsonl").write_text("")  # a file of no documents is in the report too
    out = tmp_path / "out"
    argv = ["curate", "--input", str(corpus / "*.jsonl"), "--output", str(out)]
    assert main([*argv, "--dedup", "exact", "--filters", "gopher_quality"]) == 0
    size = {t: len(t.encode()) for t in (x, y, z, short)}
    assert json.loads((out / "report.json").read_text())["input_files"] == {
        str(corpus / "a.jsonl"): {
            "documents_in": 3,
            "bytes_in": size[x] + size[y] + size[short],
            "documents_out": 2,
            "bytes_out": size[x] + size[y],
        },
        str(corpus / "b.jsonl"): {
            "documents_in": 2,
            "bytes_in": size[x] + size[z],
            "documents_out": 1,
            "bytes_out": size[z],
        },
        str(corpus / "c.jsonl"): dict.fromkeys(FILE_KEYS, 0),
    }


def test_keep_distinct_keeps_one_copy_and_drops_minhash_ids():
    """A group: b twice, a, c (MinHash drops c): a and b stay in id order; the second b is
    an exact copy, c a near copy; the steps count 3 distinct documents and 2 kept."""
    group = {"doc": [("b", "bb"), ("a", "a"), ("c", "ccc"), ("b", "bb")], "drop": ["c"]}
    out = list(KeepDistinct("minhash").process((7, group)))
    tagged = sorted((o.tag, o.value) for o in out if hasattr(o, "tag"))
    assert [o for o in out if not hasattr(o, "tag")] == [(7, [("a", "a"), ("b", "bb")])]
    assert tagged == [
        ("removed", ("exact_duplicate", ("b", "bb"))),
        ("removed", ("near_duplicate", ("c", "ccc"))),
        ("steps", ("exact_dedup", (3, 6))),
        ("steps", ("near_dedup", (2, 3))),
    ]
    # --dedup none: curate still groups its files, and keeps every copy.
    kept = [o for o in KeepDistinct("none").process((7, {"doc": group["doc"]}))]
    assert kept == [(7, [("a", "a"), ("b", "bb"), ("b", "bb"), ("c", "ccc")])]


def test_spooled_texts_reach_keep_distinct_as_references_and_decide_the_same(tmp_path, monkeypatch):
    """SpoolTexts sends one reference per group of a bundle (blocks written whenever its
    held texts pass memory.SPOOL_HELD_CHARS, here every 5 characters), no text; KeepDistinct reads them
    back and gives what it gives the texts themselves."""
    monkeypatch.setattr(memory, "SPOOL_HELD_CHARS", 5)
    docs = [("b", "bb"), ("a", "a"), ("c", "ccc"), ("b", "bb"), ("d", "dddd"), ("e", "é")]
    group_of = {"a": 0, "b": 1, "c": 1, "d": 0, "e": 2}.get
    spool = SpoolTexts(str(tmp_path), group_of)
    spool.start_bundle()
    assert [out for doc in docs for out in (spool.process(doc) or [])] == []
    refs = [w.value for w in spool.finish_bundle()]
    assert sorted(group for group, _ in refs) == [0, 1, 2]
    assert all(isinstance(ref, SpoolRef) for _, ref in refs)
    (spool_file,) = tmp_path.glob(".texts-*.spool")
    assert b"bb" in spool_file.read_bytes()
    assert [len(ref.spans) for _, ref in sorted(refs)] == [2, 2, 1]  # blocks per group

    def decided(grouped) -> list:
        out = KeepDistinct("minhash").process((group, grouped))
        return [(o.tag, o.value) if hasattr(o, "tag") else o for o in out]

    for group, ref in refs:
        sent = [d for d in docs if group_of(d[0]) == group]
        grouped = {"doc": [ref], "drop": ["c"]}
        assert decided(grouped) == decided({"doc": sent, "drop": ["c"]})
    spool_file.write_bytes(spool_file.read_bytes()[:-3])  # cut short: named, never wrong
    with pytest.raises(OSError, match="cut short"):
        for _, ref in refs:
            list(KeepDistinct("minhash").process((0, {"doc": [ref]})))


def test_spool_on_auto_spools_on_the_runners_that_shuffle_in_memory():
    assert use_spool("auto", None, dask=True)
    assert use_spool("auto", "DirectRunner", dask=True)
    dask = "apache_beam.runners.dask.dask_runner.DaskRunner"
    assert use_spool("auto", dask, dask=True) and not use_spool("auto", dask)  # build: no
    assert not use_spool("auto", "DataflowRunner", dask=True)
    assert not use_spool("no", "DirectRunner", dask=True)
    assert use_spool("yes", "FlinkRunner")


@pytest.mark.parametrize("workers", [1, 2])
def test_copies_a_filter_removes_count_to_its_rule_and_kept_ones_to_exact_dedup(tmp_path, workers):
    """Filters run before dedup, on every copy: 3 copies of a short page are 3 removals by
    Gopher's word count; 3 copies of a good page are 2 exact copies. Bundles (1 or 2
    workers, copies in one file and in another) change no count."""
    rng = random.Random(11)
    good, other = page(rng, 8), page(rng, 8)
    short = document(rng, 20)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name, texts in {
        "a.jsonl": [good, short, good, other],
        "b.jsonl": [short, good, short],
    }.items():
        (corpus / name).write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    out = tmp_path / "out"
    argv = ["curate", "--input", str(corpus / "*.jsonl"), "--output", str(out)]
    argv += ["--dedup", "exact", "--filters", "gopher_quality"]
    if workers == 2:
        argv += ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]
    assert main(argv) == 0
    report = json.loads((out / "report.json").read_text())
    removed = {reason: v["documents"] for reason, v in report["removed"].items()}
    assert removed == {"gopher_quality.word_count": 3, "exact_duplicate": 2}
    funnel = [(row["step"], row["documents"]) for row in report["funnel"]]
    assert funnel == [("read", 7), ("filters", 4), ("exact_dedup", 2)]
    assert sorted(curated_texts(out)) == sorted([good, other])


def test_bad_options_exit_2_naming_them(tmp_path, capfd):
    argv = ["curate", "--input", str(tmp_path / "none*.jsonl"), "--output", str(tmp_path / "o")]
    assert main(argv) == 2
    assert "none*.jsonl" in capfd.readouterr().err
    (tmp_path / "a.jsonl").write_text('{"text": "x"}\n')
    argv[2] = str(tmp_path / "a.jsonl")
    assert main([*argv, "--filters", "gopher,c4"]) == 2
    err = capfd.readouterr().err
    assert "--filters" in err and "'gopher'" in err and "gopher_quality" in err
    assert main([*argv, "--minhash_bands", "0"]) == 2
    assert "--minhash_bands" in capfd.readouterr().err
    with pytest.raises(SystemExit, match="2"):  # argparse's choices
        main([*argv, "--minhash_keep", "last"])
    err = capfd.readouterr().err
    assert "--minhash_keep" in err and "'last'" in err
    assert not (tmp_path / "o" / "manifest.json").exists()


def test_a_document_without_words_is_kept_by_minhash(tmp_path):
    corpus = tmp_path / "docs.jsonl"
    texts = ["?!", "... --- ...", document(random.Random(1), 60)]
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in [*texts, "?!"]))
    out = tmp_path / "out"
    assert main(["curate", "--input", str(corpus), "--output", str(out)]) == 0
    assert sorted(curated_texts(out)) == sorted(texts)  # the second "?!" is an exact copy


def ordered_near_pairs(directory: Path, copies_first: bool) -> dict:
    """40 documents in ``a.jsonl`` and near copies (1%) of 10 of them in ``b.jsonl``,
    or, with ``copies_first``, the copies first in the same file."""
    rng = random.Random(4)
    originals = [document(rng, rng.randint(150, 300)) for _ in range(40)]
    near = [edit(rng, originals[i], 0.01) for i in range(10)]
    directory.mkdir(parents=True, exist_ok=True)
    files = {"a.jsonl": originals, "b.jsonl": near}
    if copies_first:
        files = {"all.jsonl": near + originals}
    for name, texts in files.items():
        (directory / name).write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return {"originals": originals, "near": near}


@pytest.mark.parametrize("copies_first", [False, True])
def test_minhash_keep_first_keeps_the_first_document_in_input_order(tmp_path, copies_first):
    """Originals in a file whose name sorts first keep every original; the copies first in
    one file keep every copy; the default rule keeps the same set either way."""
    texts = ordered_near_pairs(tmp_path / "corpus", copies_first)
    argv = ["curate", "--input", str(tmp_path / "corpus" / "*.jsonl"), "--num_files", "2"]
    out = tmp_path / "first"
    assert main([*argv, "--output", str(out), "--minhash_keep", "first"]) == 0
    kept = set(curated_texts(out))
    first, second = (texts["near"], texts["originals"][:10])
    if not copies_first:
        first, second = second, first
    assert set(first) <= kept and not set(second) & kept
    assert set(texts["originals"][10:]) <= kept and len(kept) == 40
    report = json.loads((out / "report.json").read_text())
    assert report["removed"]["near_duplicate"]["documents"] == 10
    default = tmp_path / "smallest_id"
    assert main([*argv, "--output", str(default)]) == 0
    pairs = zip(texts["originals"][:10], texts["near"], strict=True)
    by_id = [min(pair, key=lambda t: content_id([t])) for pair in pairs]
    assert set(curated_texts(default)) == set(by_id) | set(texts["originals"][10:])


@pytest.mark.slow
def test_minhash_keep_first_is_the_same_on_two_workers_and_in_byte_ranges(tmp_path):
    """The first in input order does not depend on the runner, nor on how a file is cut
    into ranges: one file of copies then originals, read whole in-process, and in ranges
    of 20 kB by two worker processes, gives the same bytes."""
    texts = ordered_near_pairs(tmp_path / "corpus", copies_first=True)
    argv = ["curate", "--input", str(tmp_path / "corpus" / "*.jsonl"), "--num_files", "2"]
    argv += ["--minhash_keep", "first"]
    whole, ranges = tmp_path / "whole", tmp_path / "ranges"
    assert main([*argv, "--output", str(whole)]) == 0
    cmd = [sys.executable, "-m", "pipeline", *argv, "--output", str(ranges)]
    cmd += ["--input_split_mb", "0.02", "--direct_num_workers=2"]
    cmd += ["--direct_running_mode=multi_processing"]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert "range(s)" in done.stderr and " 1 range(s)" not in done.stderr
    for name in [f"part-{i:05d}-of-00002.parquet" for i in range(2)]:
        assert (ranges / name).read_bytes() == (whole / name).read_bytes(), name
    assert set(texts["near"]) <= set(curated_texts(ranges))


def test_a_hot_band_key_of_many_near_copies_is_one_cluster(tmp_path):
    """2,000 copies of a boilerplate page, each with its own number: one band key holds
    them all (ids only), and one page stays."""
    rng = random.Random(7)
    page = document(rng, 120)
    corpus = tmp_path / "docs.jsonl"
    with open(corpus, "w") as f:
        for i in range(2000):
            f.write(json.dumps({"text": f"{page} Page {i}."}) + "\n")
        f.write(json.dumps({"text": document(rng, 120)}) + "\n")
    out = tmp_path / "out"
    assert main(["curate", "--input", str(corpus), "--output", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["removed"]["near_duplicate"]["documents"] == 1999
    assert len(curated_texts(out)) == 2
    assert report["components_changed_in_last_round"] == 0


@pytest.mark.slow
def test_dask_gives_the_same_curated_bytes(planted, tmp_path):
    pytest.importorskip("distributed", reason="Beam's DaskRunner needs the [dask] extra")
    directory, _, reference = planted
    out = tmp_path / "dask"
    cmd = [sys.executable, "-m", "pipeline", "curate", "--input"]
    cmd += [str(directory / "corpus" / "*.jsonl"), "--output", str(out), "--num_files", "3"]
    cmd += ["--runner=apache_beam.runners.dask.dask_runner.DaskRunner"]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    for name in [f"part-{i:05d}-of-00003.parquet" for i in range(3)]:
        assert (out / name).read_bytes() == (reference / name).read_bytes(), name
    assert (out / "report.json").read_bytes() == (reference / "report.json").read_bytes()
    samples = (out / "removed_samples.jsonl").read_bytes()
    assert samples == (reference / "removed_samples.jsonl").read_bytes()


def test_a_dask_curate_gets_partitions_of_its_input_size(planted, tmp_path, capfd, monkeypatch):
    # Beam's default puts 128 input ranges in one Dask partition: at 1 GB a task held
    # 2.6 GB. curate sizes them as build does (sizing.dask_partitions), here at 50 kB each.
    pytest.importorskip("dask.bag", reason="Beam's DaskRunner needs the [dask] extra")
    from apache_beam import ParDo
    from apache_beam.runners.dask import transform_evaluator
    from apache_beam.runners.dask.dask_runner import DaskRunner

    from pipeline.beam import memory

    monkeypatch.setattr(memory, "DASK_PARTITION_BYTES", 50_000)
    # the dry run installs pipeline.beam.dask_compat's fixes in this process: undone after
    monkeypatch.setitem(
        transform_evaluator.TRANSLATIONS, ParDo, transform_evaluator.TRANSLATIONS[ParDo]
    )
    visitor = DaskRunner.__dict__["to_dask_bag_visitor"]
    monkeypatch.setattr(DaskRunner, "to_dask_bag_visitor", visitor)
    directory, _, _ = planted
    corpus = directory / "corpus"
    size = sum(f.stat().st_size for f in corpus.glob("*.jsonl"))
    args = ["curate", "--input", str(corpus / "*.jsonl"), "--output", str(tmp_path / "out")]
    args += ["--dry_run", "--input_split_mb", "0.01"]
    args += ["--runner=apache_beam.runners.dask.dask_runner.DaskRunner"]
    assert main(args) == 0
    err = capfd.readouterr().err
    ranges = int(err.split(" range(s)")[0].rsplit("read in ", 1)[1])
    expected = min(ranges, -(-size // 50_000))
    assert 1 < expected < ranges
    shuffles = -(-size // (64 << 20))  # memory.CURATE_SHUFFLE_BYTES of input each
    assert f"--dask_npartitions={expected} --dask_shuffle_partitions={shuffles})" in err
    assert not (tmp_path / "out").exists()  # a dry run writes nothing


def test_the_console_says_what_each_rule_removed_and_warns_past_half(tmp_path, caplog):
    rng = random.Random(3)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    texts = [document(rng, 60) for _ in range(4)] + [document(rng, 20) for _ in range(6)]
    (corpus / "docs.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    out = tmp_path / "out"
    argv = ["curate", "--input", str(corpus / "*.jsonl"), "--output", str(out), "--dedup", "none"]
    assert main([*argv, "--filters", "gopher_quality"]) == 0
    said = caplog.text
    assert "removed by gopher_quality.word_count:      6 (60.0%)" in said
    assert "kept:      4 (40.0%)" in said
    assert "!! gopher_quality.word_count removed 6 of 10 documents (60%): more than half" in said


def test_an_empty_input_exits_2_keeping_nothing(tmp_path, caplog):
    (tmp_path / "empty.txt").write_text("")
    out = tmp_path / "out"
    assert main(["curate", "--input", str(tmp_path / "empty.txt"), "--output", str(out)]) == 2
    assert "0 documents read" in caplog.text and "nothing is kept" in caplog.text
    assert not (out / "manifest.json").exists()


def test_funnel_lines_give_counts_and_shares_of_what_was_read():
    report = {
        "funnel": [{"step": "read", "documents": 6625, "bytes": 1}],
        "removed": {"exact_dup": {"documents": 220}, "gopher_quality": {"documents": 6000}},
    }
    assert funnel_lines(report, 405) == [
        "  removed by gopher_quality:   6000 (90.6%)",
        "  removed by exact_dup:    220 (3.3%)",
        "  kept:    405 (6.1%)",
    ]


def test_decontamination_counts_its_passages_and_names_the_short_ones(tmp_path, caplog):
    rng = random.Random(5)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "docs.jsonl").write_text(json.dumps({"text": document(rng, 60)}) + "\n")
    # Two passages (blank-line separated): one of 40 words, one of 5, under the 13-gram.
    (tmp_path / "eval.txt").write_text(document(rng, 40) + "\n\nonly five words are here\n")
    out = tmp_path / "out"
    argv = ["curate", "--input", str(corpus / "*.jsonl"), "--output", str(out), "--dedup", "none"]
    assert main([*argv, "--decontaminate", str(tmp_path / "eval.txt")]) == 0
    assert "decontamination: 1 held-out passage(s) from 1 file(s), 28 13-grams" in caplog.text
    assert "1 of 2 held-out passages have fewer than 13 words" in caplog.text
    assert "'only five words are here' (5 words)" in caplog.text
    # Nothing long enough to check against: said, exit 2, nothing written.
    (tmp_path / "short.txt").write_text("a few words\n\nand a few more\n")
    caplog.clear()
    assert main([*argv, "--decontaminate", str(tmp_path / "short.txt"), "--overwrite"]) == 2
    assert "no passage of 13 words or more in 1 file(s) (2 shorter)" in caplog.text
