"""Content ids packed per bucket, and the joins curation makes on them: a document's
first position in the input (``--minhash_keep first``) and the per-file counts of
curate's report. Each record is 16 bytes of id digest and 8 bytes per integer column
(:class:`IdPacks`), unpacked into numpy arrays (:func:`unpack_ids`) and joined by sorting,
never as one Python object per document (pipeline/beam/curation_steps.py and
pipeline/beam/curate.py run them as Beam steps).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Sequence

ID_BYTES = 16  # a content id's digest (pipeline/core/sources.py content_id: 32 hex digits)
# IdPacks' keys: a bucket holds 1/64 of the documents' records. Few, for large packs (a
# Dask task's ~3,600 documents go ~56 a pack: ~20 bytes of objects a record besides its own
# 48); a bucket grouped is 1/64 of the records, ~35 MB at 100 GB.
ID_BUCKETS = 64


def id_bucket(doc_id: str) -> int:
    """A content id's bucket: its last 8 hex digits modulo ``ID_BUCKETS``."""
    return int(doc_id[-8:], 16) % ID_BUCKETS


class IdPacks:
    """(content id, ``columns`` integers) records, packed per bucket of ids: ``packed()``
    gives ``(bucket, (ids, column, ...))`` per bucket, ``ids`` the digests' bytes
    concatenated, each column int64 bytes in the same order, and empties the packs.

    One Beam element per document (a tuple, its id, its path, a ``WindowedValue``: about
    250 bytes of Python objects) was most of what a Dask worker held at a 1 GB curate's
    peak (docs/results.md); packed, a record is 16 bytes and 8 per column. A bucket is
    the id's last 8 hex digits modulo ``ID_BUCKETS``, so every copy of a document (the
    same id) meets in one, whichever bundle read it.
    """

    def __init__(self, columns: int):
        self._columns = columns
        self._packs: dict[int, tuple[bytearray, list[array]]] = {}
        self._held = 0

    def __len__(self) -> int:
        return self._held

    def add(self, doc_id: str, *numbers: int) -> None:
        try:
            digest = bytes.fromhex(doc_id)
        except ValueError:
            digest = b""
        if len(digest) != ID_BYTES:
            raise ValueError(f"document id {doc_id!r} is not a content id ({ID_BYTES} bytes hex)")
        bucket = id_bucket(doc_id)
        pack = self._packs.get(bucket)
        if pack is None:
            pack = self._packs[bucket] = (bytearray(), [array("q") for _ in range(self._columns)])
        pack[0].extend(digest)
        for column, number in zip(pack[1], numbers, strict=True):
            column.append(number)
        self._held += 1

    def packed(self) -> Iterator[tuple[int, tuple[bytes, ...]]]:
        packs, self._packs, self._held = self._packs, {}, 0
        for bucket, (ids, columns) in sorted(packs.items()):
            yield bucket, (bytes(ids), *(column.tobytes() for column in columns))


def unpack_ids(packs: Iterable[tuple[bytes, ...]], columns: int):
    """:meth:`IdPacks.packed`'s values -> (ids as a numpy ``S16`` array, [int64 array per
    column]), the packs concatenated.

    Raises:
        ValueError: a pack's columns do not hold 8 bytes per id, or ids 16 bytes each.
    """
    import numpy as np

    ids, cols = [], [[] for _ in range(columns)]
    for packed_ids, *packed_cols in packs:
        n = len(packed_ids) // ID_BYTES
        sizes = [len(packed_ids) - ID_BYTES * n] + [len(c) - 8 * n for c in packed_cols]
        if len(packed_cols) != columns or any(sizes):
            raise ValueError(
                f"an id pack holds {len(packed_ids)} id bytes and columns of "
                f"{[len(c) for c in packed_cols]} bytes; expected {ID_BYTES} and 8 per id, "
                f"{columns} column(s)"
            )
        ids.append(packed_ids)
        for col, packed in zip(cols, packed_cols, strict=True):
            col.append(packed)
    return (
        np.frombuffer(b"".join(ids), f"S{ID_BYTES}"),
        [np.frombuffer(b"".join(col), np.int64) for col in cols],
    )


POSITION_COLUMNS = 3  # rank, range start, index: the first columns of a positions pack
# curate's origins: a position's three columns and the document's UTF-8 bytes.
ORIGIN_COLUMNS = 4


def member_records(label) -> Iterator[tuple[int, tuple[str, str]]]:
    """(node, its cluster's smallest id) -> (bucket, (id, that smallest id)) for the node
    and for the smallest id itself (a member too; its copies meet in one bucket)."""
    node, root = label
    yield id_bucket(node), (node, root)
    yield id_bucket(root), (root, root)


def member_positions(element, columns: int) -> Iterator[tuple[str, tuple[int, int, int, str]]]:
    """(bucket, {"position": positions packs of ``columns`` columns, the first three (rank,
    range start, index), "member": (id, cluster)}) -> (cluster, (rank, start, index, id))
    per member, its first copy's position.

    Example, as records: positions ``(d1, 1, 0, 4), (d1, 0, 9, 2)`` and members ``(d1, c)``
    twice -> ``(c, (0, 9, 2, d1))`` once.

    Raises:
        ValueError: a member never read (a bug upstream, named here).
    """
    import numpy as np

    _, grouped = element
    members = dict(grouped["member"])
    if not members:
        return
    ids, cols = unpack_ids(grouped["position"], columns)
    rank, start, index = cols[:POSITION_COLUMNS]
    order = np.lexsort((index, start, rank, ids))  # by id, then position
    ids, rank, start, index = ids[order], rank[order], start[order], index[order]
    first = np.r_[True, ids[1:] != ids[:-1]] if len(ids) else np.zeros(0, bool)
    ids, rank, start, index = ids[first], rank[first], start[first], index[first]
    names = list(members)
    wanted = np.array([bytes.fromhex(name) for name in names], f"S{ID_BYTES}")
    at = np.searchsorted(ids, wanted)
    found = at < len(ids)
    found[found] = ids[at[found]] == wanted[found]
    if not found.all():
        missing = names[int(np.flatnonzero(~found)[0])]
        raise ValueError(f"near-duplicate {missing} has no position among the documents read")
    places = zip(rank[at].tolist(), start[at].tolist(), index[at].tolist(), strict=True)
    for name, place in zip(names, places, strict=True):
        yield members[name], (*place, name)


def all_but_first(element) -> Iterator[str]:
    """(cluster, [(rank, start, index, id)] of its members) -> the id of every member but
    the first in input order. The members are iterated twice and never held."""
    _, members = element
    first = min(members, default=None)
    for member in members:
        if member[3] != first[3]:
            yield member[3]


def file_counts(element, paths: Sequence[str]) -> Iterator[tuple[str, tuple[int, int, int, int]]]:
    """(bucket, {"origin": packs of every copy read: (id, path rank, range start, index,
    bytes), "kept": packs of the kept documents: (id, bytes)}) -> (path, (documents in,
    bytes in, documents out, bytes out)) per path in the bucket: one in per copy read, and
    one out per kept document, counted to the first path (in ``paths``' sorted order) of
    its copies (they are identical, so the rule only names the file; no runner or file
    order changes it).

    Example, as records: origins ``(d1, 1, 0, 0, 5), (d1, 0, 0, 3, 5)`` and kept
    ``(d1, 4)`` with ``paths == ["a", "b"]`` -> ``("a", (1, 5, 1, 4)), ("b", (1, 5, 0, 0))``.

    Raises:
        ValueError: a kept id was never read (a bug upstream, named here).
    """
    import numpy as np

    _, grouped = element
    ids, (ranks, _, _, sizes) = unpack_ids(grouped["origin"], ORIGIN_COLUMNS)
    kept_ids, (kept_sizes,) = unpack_ids(grouped["kept"], 1)
    order = np.lexsort((ranks, ids))  # by id, then by path rank
    ids, first_ranks = ids[order], ranks[order]
    first = np.r_[True, ids[1:] != ids[:-1]] if len(ids) else np.zeros(0, bool)
    ids, first_ranks = ids[first], first_ranks[first]
    at = np.searchsorted(ids, kept_ids)
    found = at < len(ids)
    found[found] = ids[at[found]] == kept_ids[found]
    if not found.all():
        missing = kept_ids[~found][0].ljust(ID_BYTES, b"\0").hex()
        raise ValueError(f"kept document {missing} has no origin among the documents read")
    kept_ranks = first_ranks[at]
    rows = np.unique(np.concatenate([ranks, kept_ranks]))
    counts = np.zeros((len(rows), 4), np.int64)
    inputs, outputs = np.searchsorted(rows, ranks), np.searchsorted(rows, kept_ranks)
    np.add.at(counts[:, 0], inputs, 1)
    np.add.at(counts[:, 1], inputs, sizes)
    np.add.at(counts[:, 2], outputs, 1)
    np.add.at(counts[:, 3], outputs, kept_sizes)
    for rank, row in zip(rows.tolist(), counts.tolist(), strict=True):
        yield paths[rank], tuple(row)


def add_counts(counts: Iterable[tuple[int, ...]]) -> tuple[int, ...]:
    """Element-wise sums: ``[(1, 5, 0, 0), (0, 0, 1, 4)]`` -> ``(1, 5, 1, 4)``."""
    total = (0, 0, 0, 0)
    for more in counts:
        total = tuple(a + b for a, b in zip(total, more, strict=True))
    return total
