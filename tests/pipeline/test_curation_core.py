"""Curation's algorithms as plain functions, without Beam: connected components
(pipeline/core/components.py) against a union-find, and the joins on packed content ids
(pipeline/core/idpacks.py). tests/pipeline/test_curate.py runs them as Beam steps."""

import random

import pytest

from pipeline.core.components import connected_components, key_groups, star_edges
from pipeline.core.idpacks import (
    IdPacks,
    all_but_first,
    file_counts,
    member_positions,
    member_records,
)


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


def test_a_chain_and_a_pair_are_two_components_after_few_rounds():
    # a path of 20 with shuffled ids (label propagation alone needs 19 rounds), and x ~ y
    names = [f"n{i:02d}" for i in range(20)]
    random.Random(3).shuffle(names)
    edges = [*((names[i], names[i + 1]) for i in range(19)), ("y", "x")]
    assert sorted(connected_components(edges, rounds=6).items()) == sorted(expected_labels(edges))


@pytest.mark.parametrize("seed", range(20))
def test_random_graphs_match_union_find(seed):
    rng = random.Random(seed)
    nodes = [f"d{i:03d}" for i in range(rng.choice([10, 120, 400]))]
    edges = [tuple(rng.sample(nodes, 2)) for _ in range(rng.randrange(1, len(nodes)))]
    assert sorted(connected_components(edges, rounds=8).items()) == sorted(expected_labels(edges))


def test_star_edges_point_every_member_of_a_band_at_its_smallest():
    assert sorted(star_edges(("key", ["c", "a", "b"]))) == [("b", "a"), ("c", "a")]
    assert list(star_edges(("key", ["a"]))) == []


def test_key_groups_are_the_ids_of_each_key_held_more_than_once():
    k1, k2, k3 = (bytes([0, band]) + bytes(15) + b"\x05" for band in (1, 2, 3))
    packs = [(k1 + k2 + k1, "c\nb\nd"), (k1 + k3, "a\nb")]
    assert sorted(sorted(ids) for ids in key_groups(packs)) == [["a", "c", "d"]]
    with pytest.raises(ValueError, match="18 per id"):
        list(key_groups([(k1, "a\nb")]))


def packed_counts(origins, kept, paths, packs=1):
    """file_counts over IdPacks of the records, split into ``packs`` per side."""
    groups = {"origin": [], "kept": []}
    # an origin (id, rank, bytes) -> (id, rank, range start, index, bytes)
    origins = [(doc_id, rank, 0, 0, size) for doc_id, rank, size in origins]
    for side, records, columns in (("origin", origins, 4), ("kept", kept, 1)):
        for i in range(packs):
            ids = IdPacks(columns)
            for doc_id, *numbers in records[i::packs]:
                ids.add(doc_id, *numbers)
            groups[side] += [pack for _, pack in ids.packed()]
    return sorted(file_counts((0, groups), paths))


def test_file_counts_count_a_kept_document_to_its_first_path():
    d1, d2 = "0" * 30 + "a1", "f" * 28 + "0000"  # d2's digest ends in zero bytes
    paths = ["a", "b", "c"]
    assert packed_counts([(d1, 1, 5), (d1, 0, 5), (d2, 2, 7)], [(d1, 4)], paths) == [
        ("a", (1, 5, 1, 4)),
        ("b", (1, 5, 0, 0)),
        ("c", (1, 7, 0, 0)),
    ]
    assert packed_counts([(d2, 2, 7), (d2, 1, 7)], [(d2, 7)], paths) == [
        ("b", (1, 7, 1, 7)),
        ("c", (1, 7, 0, 0)),
    ]
    with pytest.raises(ValueError, match=d2):  # a kept id that no origin has: named
        packed_counts([(d1, 0, 5)], [(d2, 7)], paths)
    with pytest.raises(ValueError, match="id pack holds"):
        list(file_counts((0, {"origin": [(b"x" * 16, b"")], "kept": []}), paths))
    with pytest.raises(ValueError, match="not a content id"):
        IdPacks(1).add("abc", 1)


@pytest.mark.parametrize("packs", [1, 3])
def test_packed_file_counts_equal_a_per_document_count(packs):
    rng = random.Random(5)
    paths = [f"in/{i}.jsonl" for i in range(4)]
    docs = [f"{rng.getrandbits(128):032x}" for _ in range(60)]
    origins, kept, expected = [], [], {}
    for doc_id in docs:
        copies = [(rng.randrange(4), rng.randrange(1, 99)) for _ in range(rng.randrange(1, 4))]
        size = copies[0][1]
        for rank, _ in copies:
            origins.append((doc_id, rank, size))
            row = expected.setdefault(paths[rank], [0, 0, 0, 0])
            row[0], row[1] = row[0] + 1, row[1] + size
        for _ in range(rng.choice([0, 1, 1, 2])):  # dropped, kept, or kept twice (--dedup none)
            kept.append((doc_id, size - 1))
            row = expected[paths[min(rank for rank, _ in copies)]]
            row[2], row[3] = row[2] + 1, row[3] + size - 1
    rng.shuffle(origins)
    got = {}
    for path, counts in packed_counts(origins, kept, paths, packs):
        got[path] = [a + b for a, b in zip(got.get(path, [0] * 4), counts, strict=True)]
    assert got == expected


def test_first_positions_pick_each_clusters_first_member_in_input_order():
    d1, d2, d3 = "0" * 31 + "1", "0" * 31 + "2", "f" * 28 + "0000"  # d3's digest ends in 0s
    packs = IdPacks(4)  # curate's origins: (rank, range start, index, bytes)
    for record in [(d1, 1, 0, 4, 9), (d1, 0, 70, 2, 9), (d2, 0, 70, 1, 8), (d3, 0, 0, 5, 7)]:
        packs.add(*record)
    by_bucket = dict(packs.packed())
    # d2 and d3 joined d1's cluster (labelled by the smallest id, d1)
    members = [m for label in [(d2, d1), (d3, d1)] for m in member_records(label)]
    positions = []
    for bucket in sorted({b for b, _ in members}):
        grouped = {
            "position": [by_bucket[bucket]] if bucket in by_bucket else [],
            "member": [m for b, m in members if b == bucket],
        }
        positions += list(member_positions((bucket, grouped), 4))
    assert sorted(positions) == [(d1, (0, 0, 5, d3)), (d1, (0, 70, 1, d2)), (d1, (0, 70, 2, d1))]
    assert sorted(all_but_first((d1, [p for _, p in positions]))) == [d1, d2]  # d3 stays
    assert list(all_but_first((d1, []))) == []
    with pytest.raises(ValueError, match=d2):  # a member no position names: a bug, named
        list(member_positions((0, {"position": [], "member": [(d2, d1)]}), 4))
