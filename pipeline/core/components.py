"""Connected components of a graph given as edges, by Kiveris et al.'s alternating
large-star and small-star operations ("Connected Components in MapReduce and Beyond",
2014), as functions over one node's neighbours: near-duplicate clusters of ``--dedup
minhash`` (pipeline/beam/curation_steps.py runs them as Beam steps, one GroupByKey each).

- :func:`key_groups`: MinHash band records (packed keys and ids) -> the ids sharing a key;
  :func:`star_edges`: such ids -> an edge from each to their smallest (a star per key);
- :func:`large_star`: a node u links its larger neighbours to m(u), the smallest of u and
  its neighbours; :func:`small_star`: u links itself and its smaller neighbours to the
  smallest of them. Alternated, they turn the edge set into one star per component around
  its smallest id in O(log^2 n) rounds;
- :func:`connected_components`: the rounds in memory, the reference the Beam steps and the
  tests check against.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator

# packs are large: a Dask task's input, filtered down to its band records, went one record
# an element into 4,096 buckets (hundreds of bytes of objects a record), and a curate's
# workers held all of them in the shuffle's splits at their peak (docs/results.md, "Fewer,
# larger packs, and texts spooled").
# A bucket grouped is its records' packed bytes: 1/256 of 100 GB's is ~0.1 GB.
BAND_BUCKETS = 256
KEY_BYTES = 18  # a band key: 2 bytes of band index and a 16-byte digest (dedup.band_keys)


def band_bucket(key: bytes) -> int:
    """A band key's bucket, from its digest's last 4 bytes: a deterministic, even spread
    (the digest is BLAKE2b's). ``band_bucket(b"\\x00\\x03" + bytes(15) + b"\\x05") == 5``."""
    return int.from_bytes(key[-4:], "big") % BAND_BUCKETS


def key_groups(packs: Iterable[tuple[bytes, str]]) -> Iterator[list[str]]:
    """Packs of band records, (``KEY_BYTES`` bytes per key concatenated, their ids joined
    by newlines) -> the ids of each band key that more than one record holds: the records
    sorted by key bytes, each run of one key a group.

    Example: the packs ``[(k1 + k2, "c\\nb"), (k1, "a")]`` (``k1`` and ``k2`` two keys) ->
    ``["c", "a"]``; ``k2``'s group has one id, so it is left out.

    Raises:
        ValueError: a pack's keys are not 18 bytes per id.
    """
    import numpy as np

    keys, ids = [], []
    for packed_keys, packed_ids in packs:
        names = packed_ids.split("\n")
        if len(packed_keys) != KEY_BYTES * len(names):
            raise ValueError(
                f"a band pack holds {len(packed_keys)} key bytes for {len(names)} ids; "
                f"expected {KEY_BYTES} per id"
            )
        keys.append(packed_keys)
        ids.extend(names)
    table = np.frombuffer(b"".join(keys), np.uint8).reshape(len(ids), KEY_BYTES)
    order = np.lexsort(table.T[::-1])  # by byte 0, then 1, ...: the keys' byte order
    table = table[order]
    starts = np.flatnonzero(np.r_[True, (table[1:] != table[:-1]).any(axis=1)])
    ends = np.r_[starts[1:], len(ids)]
    for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
        if end - start > 1:
            yield [ids[i] for i in order[start:end].tolist()]


def star_edges(element) -> Iterator[tuple[str, str]]:
    """(band key, ids sharing it) -> (id, the smallest of them) for every other id: a star
    per band key. The ids are iterated twice and never held."""
    _, ids = element
    smallest = min(ids, default=None)
    for doc_id in ids:
        if doc_id != smallest:
            yield doc_id, smallest


def ordered(edge) -> tuple[str, str]:
    u, v = edge
    return (u, v) if u <= v else (v, u)


def both_ways(edge) -> Iterator[tuple[str, str]]:
    u, v = edge
    yield u, v
    yield v, u


def large_star(element) -> Iterator[tuple[str, str]]:
    node, neighbours = element
    neighbours = set(neighbours)
    smallest = min(node, min(neighbours))
    for v in neighbours:
        if v > node:
            yield (smallest, v) if smallest < v else (v, smallest)


def small_star(element) -> Iterator[tuple[str, str]]:
    node, neighbours = element
    smaller = {v for v in neighbours if v < node}
    smallest = min([node, *smaller])
    for v in [node, *smaller]:
        if v != smallest:
            yield smallest, v


def connected_components(edges: Iterable[tuple[str, str]], rounds: int) -> dict[str, str]:
    """Edges -> {node: its component's smallest id} for every node but that id, after
    ``rounds`` pairs of large-star and small-star operations in memory (as the Beam steps
    group them). ``connected_components([("b", "a"), ("c", "b")], 2) == {"b": "a", "c": "a"}``
    """
    edges = {ordered(e) for e in edges}
    for _ in range(rounds):
        for star in (large_star, small_star):
            neighbours: dict[str, list[str]] = defaultdict(list)
            for edge in edges:
                for u, v in both_ways(edge):
                    neighbours[u].append(v)
            edges = {ordered(e) for item in neighbours.items() for e in star(item)}
    labels: dict[str, str] = {}
    for u, v in edges:
        labels[v] = min(u, labels.get(v, u))
    return labels
