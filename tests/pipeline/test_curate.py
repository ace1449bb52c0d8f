"""``python -m pipeline curate``: exact and near-duplicate removal, connected components as
Beam steps, the report and manifest, determinism, and curate-then-build."""

import json
import random
from pathlib import Path

import apache_beam as beam
import pyarrow.parquet as pq
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from pipeline.beam.curate import ConnectedComponents, star_edges
from pipeline.cli.main import main

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


def expected_labels(edges):
    """Each node but its component's smallest: that smallest, by a plain union-find."""
    parent = {}

    def find(x):
        while parent.setdefault(x, x) != x:
            x = parent[x]
        return x

    for u, v in edges:
        a, b = sorted((find(u), find(v)))
        parent[b] = a
    return [(node, find(node)) for node in parent if find(node) != node]


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


def test_star_edges_point_every_member_of_a_band_at_its_smallest():
    assert sorted(star_edges(("key", ["c", "a", "b"]))) == [("b", "a"), ("c", "a")]
    assert list(star_edges(("key", ["a"]))) == []


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
