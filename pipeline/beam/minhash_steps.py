"""MinHash's near-duplicate clusters as Beam steps (curation_steps.Curate runs them):
each document's band keys packed per bucket (:class:`BandKeys`, spooled or not), the
edges of each key's group (:func:`bucket_stars`), their connected components
(:class:`ConnectedComponents`; the operations themselves in pipeline/core/components.py),
and with ``--minhash_keep first`` each document's position in the input
(:class:`BatchPositions`; the joins in pipeline/core/idpacks.py).
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Iterator, Sequence

import apache_beam as beam

from pipeline.beam import memory
from pipeline.beam.config import CurationOptions
from pipeline.beam.spool import RowSpool, spooled_values
from pipeline.core.components import (
    band_bucket,
    both_ways,
    key_groups,
    large_star,
    ordered,
    small_star,
    star_edges,
)
from pipeline.core.idpacks import POSITION_COLUMNS, IdPacks

logger = logging.getLogger(__name__)


class BandKeys(beam.DoFn):
    """(id, text) -> (bucket, (keys, ids)): the MinHash LSH band keys of the bundle's
    documents, packed per bucket of keys (:func:`band_bucket`): ``keys`` the 18-byte keys
    concatenated (pipeline/core/dedup.py ``band_keys``), ``ids`` their documents' ids
    joined by newlines, in the same order. Emitted when the bundle ends, or when it holds
    ``memory.PACK_RECORDS`` keys.

    One element per (key, id) costs the shuffle about 200 bytes of Python objects (a Beam
    ``WindowedValue``, a tuple, the key), 14 per document: on Dask, a worker's peak
    followed the band records it held. Packed, a record is its 18 bytes and its id. Which
    records travel together changes nothing: :func:`bucket_stars` finds the same groups.

    With a ``spool`` directory the packs go to the bundle's spool file
    (spool.RowSpool, ``.bands-<random>.spool``) and the bundle emits (bucket,
    SpoolRef) when it ends: a task shuffle holds all of its splits until the last input is
    read, and the band records are 14 a document (what a worker held so:
    docs/results.md, "Fewer, larger packs, and texts spooled").
    """

    def __init__(self, config: CurationOptions, spool: str | None = None):
        self._config, self._spool_dir = config, spool
        self._hasher = None

    def start_bundle(self):
        self._buckets: dict[int, tuple[list[bytes], list[str]]] = {}
        self._held = 0
        self._spool = RowSpool(self._spool_dir, kind="bands") if self._spool_dir else None

    def process(self, element) -> Iterator:
        from pipeline.core.dedup import MinHasher, band_keys, shingle_hashes

        config = self._config
        if self._hasher is None:
            self._hasher = MinHasher(
                config.minhash_bands * config.minhash_rows, config.minhash_seed
            )
        doc_id, text = element
        shingles = shingle_hashes(text, config.minhash_ngram)
        if not shingles.size:  # no word at all ("?!"): only its exact copies are its copies
            return
        signature = self._hasher.signature(shingles)
        for key in band_keys(signature, config.minhash_bands, config.minhash_rows):
            keys, ids = self._buckets.setdefault(band_bucket(key), ([], []))
            keys.append(key)
            ids.append(doc_id)
        self._held += config.minhash_bands
        if self._held >= memory.PACK_RECORDS:
            yield from self._emitted()

    def _emitted(self) -> Iterator[tuple[int, tuple[bytes, str]]]:
        """The held packs, or nothing when they went to the spool file."""
        if self._spool is None:
            yield from self._packed()
            return
        for bucket, pack in self._packed():
            self._spool.write(bucket, pickle.dumps([pack], protocol=pickle.HIGHEST_PROTOCOL))

    def finish_bundle(self):
        from apache_beam.transforms.window import GlobalWindow
        from apache_beam.utils.windowed_value import WindowedValue

        window = GlobalWindow()
        elements = list(self._emitted())
        if self._spool is not None:
            elements = self._spool.close()
        for element in elements:
            yield WindowedValue(element, window.max_timestamp(), [window])

    def _packed(self) -> Iterator[tuple[int, tuple[bytes, str]]]:
        buckets, self._buckets, self._held = self._buckets, {}, 0
        for bucket, (keys, ids) in sorted(buckets.items()):
            yield bucket, (b"".join(keys), "\n".join(ids))


# GroupBands' keys: a bucket holds 1/256 of the band records. Few, so that a bundle's
def bucket_stars(element) -> Iterator[tuple[str, str]]:
    """(bucket, [(keys, ids)] packed by :class:`BandKeys`, or SpoolRefs to them) ->
    :func:`~pipeline.core.components.star_edges` of each band key in it
    (:func:`~pipeline.core.components.key_groups`)."""
    _, packs = element
    for ids in key_groups(spooled_values(packs)):
        yield from star_edges((None, ids))


class ConnectedComponents(beam.PTransform):
    """Edges (u, v) -> (node, label): for each node but its component's smallest id, that
    id, by Kiveris et al.'s alternating large-star and small-star operations ("Connected
    Components in MapReduce and Beyond", 2014) as Beam steps, ``rounds`` pairs of them:

    - large-star: each node u links its larger neighbours to m(u), the smallest of u and
      its neighbours;
    - small-star: each node u links itself and its smaller neighbours to the smallest of
      them.

    Each operation is one GroupByKey on node ids (a node's neighbours' ids, never texts).
    An edge two nodes both emit comes twice; the next operation's group takes each node's
    neighbours as a set, so no Distinct (a shuffle more per operation) is needed between
    them. The edge set
    becomes one star per component around its smallest id in O(log^2 n) rounds (a chain of
    1,000 documents: 10; random graphs of 120 nodes: 4). Also returns, as a second
    PCollection, the number of edges the last round changed: 0 when the components converged
    within the bound; before that, a node's label is its smallest neighbour, which still
    joins only connected documents.
    """

    def __init__(self, rounds: int):
        super().__init__()
        self._rounds = rounds

    def expand(self, edges):
        edges = edges | "Ordered" >> beam.Map(ordered) | "Unique" >> beam.Distinct()
        previous = edges
        for r in range(self._rounds):
            previous = edges
            for name, star in (("Large", large_star), ("Small", small_star)):
                edges = (
                    edges
                    | f"{name}Adjacency{r}" >> beam.FlatMap(both_ways)
                    | f"{name}Group{r}" >> beam.GroupByKey()
                    | f"{name}Star{r}" >> beam.FlatMap(star)
                )
        changed = (
            {
                "before": previous | "KeyBefore" >> beam.Map(lambda e: (e, 1)),
                "after": edges | "KeyAfter" >> beam.Map(lambda e: (e, 1)),
            }
            | "CompareLastRound" >> beam.CoGroupByKey()
            | "Changed" >> beam.Map(lambda kv: int(not (kv[1]["before"] and kv[1]["after"])))
            | "CountChanged" >> beam.CombineGlobally(sum)
        )
        labels = (
            edges
            | "Larger" >> beam.Map(lambda e: (e[1], e[0]))  # (larger id, smaller id)
            | "SmallestNeighbour" >> beam.CombinePerKey(min)
        )
        return labels, changed


# ----------------------------------------------------------------------------- positions
# --minhash_keep first: each document's place in the input, (its path's rank among the
# plan's sorted paths, its range's first byte, its number among that range's documents),
# packed per bucket of ids (IdPacks), and joined with the clusters' members by id.


class BatchPositions(beam.DoFn):
    """DocumentBatch (read unsplit, with its ``origin``) -> :class:`IdPacks` of (id, path
    rank, range start, index) per document, emitted when the bundle ends or holds
    ``memory.PACK_RECORDS``. ``paths``: the plan's, sorted.

    Raises:
        ValueError: a batch without an origin (made elsewhere than ReadDocuments).
    """

    def __init__(self, paths: Sequence[str]):
        super().__init__()
        self._ranks = {path: rank for rank, path in enumerate(paths)}

    def start_bundle(self):
        self._packs = IdPacks(columns=POSITION_COLUMNS)

    def process(self, batch) -> Iterator:
        if batch.origin is None:
            raise ValueError("a document batch without its origin: --minhash_keep first")
        path, start, index = batch.origin
        rank, packs = self._ranks[path], self._packs
        for i, doc_id in enumerate(batch.doc_ids):
            packs.add(doc_id, rank, start, index + i)
        if len(packs) >= memory.PACK_RECORDS:
            yield from packs.packed()

    def finish_bundle(self):
        from apache_beam.transforms.window import GlobalWindow
        from apache_beam.utils.windowed_value import WindowedValue

        window = GlobalWindow()
        for element in self._packs.packed():
            yield WindowedValue(element, window.max_timestamp(), [window])
