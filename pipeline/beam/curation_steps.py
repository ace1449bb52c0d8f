"""Curation's Beam steps, shared by ``python -m pipeline curate`` (pipeline/beam/curate.py)
and ``python -m pipeline build`` run with the same flags (pipeline/beam/build.py).

:class:`Curate`: (content id, text) documents -> the documents kept, in groups, and every
removed one tagged with its reason (``REMOVED``), in this order:

1. ``--languages``: language ID (pipeline/core/langid.py) below ``--language_threshold``
   or of another language: ``language``;
2. ``--filters``: rule sets (pipeline/core/filters.py): the rule's name;
3. ``--decontaminate FILES``: a document sharing a word ``--decontaminate_ngram``-gram with
   the evaluation texts: ``decontaminated``;
4. ``--dedup exact`` or ``minhash``: exact copies (the same content id, so the same text)
   are one document: every copy after the first is ``exact_duplicate``;
5. ``--dedup minhash``: MinHash LSH (pipeline/core/dedup.py): documents sharing a band key
   are candidates; clusters are the connected components of the candidate graph
   (:class:`ConnectedComponents`); one document per cluster stays, the others are
   ``near_duplicate``. Which one, ``--minhash_keep``: the smallest id (a rule no runner,
   file name or order changes), or the first in input order (sorted paths, then place in
   the file; datatrove's choice in most clusters): the clusters' members joined with
   every document's position by id, then grouped by cluster (two shuffles of ids).

The filters see every copy (each copy a rule removes counts to the rule), so that the texts
cross the network once: steps 4 and 5 are decided on ids alone, and carried out where the
texts meet in the one grouping by ``group_of`` (curate's output file, or the id), next to
the ids MinHash drops (:class:`KeepDistinct`).
"""

from __future__ import annotations

import glob
import logging
import re
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import apache_beam as beam
from apache_beam.pvalue import TaggedOutput

from pipeline.beam import memory
from pipeline.beam.config import CurationOptions
from pipeline.beam.document_steps import DocumentBatch, ReadDocuments, skipped
from pipeline.beam.minhash_steps import BandKeys, ConnectedComponents, bucket_stars
from pipeline.beam.spool import SpoolTexts, spooled_values
from pipeline.core.idpacks import (
    POSITION_COLUMNS,
    all_but_first,
    member_positions,
    member_records,
)
from pipeline.core.sources import content_id, document_sentences

logger = logging.getLogger(__name__)

REMOVED = "removed"  # tagged output: (reason, (id, text)) of a removed document
STEPS = "steps"  # KeepDistinct's tagged output: (step, (documents, UTF-8 bytes)) after it


def documents_of(batch) -> Iterator[tuple[str, str]]:
    """A DocumentBatch read unsplit -> (content id, text) per document: a jsonl or parquet
    record's text as it was, a txt document's lines one per line."""
    for doc_id, sentences in zip(batch.doc_ids, batch.documents, strict=True):
        yield doc_id, "\n".join(sentences)


def as_sentences(element) -> Iterator:
    """(id, curated text) -> (content id, sentences) as ``build`` reads the text from
    curate's Parquet output (pipeline/core/sources.py), or a counted skip: so a build that
    curates makes the rows of curate-then-build."""
    _, text = element
    sentences, reason = document_sentences(text)
    if reason is not None:
        yield from skipped(reason)
        return
    yield content_id(sentences), sentences


def batch_documents(items) -> Iterator:
    """(content id, sentences) of a bundle -> DocumentBatches of up to 512 documents."""
    batch = DocumentBatch([], [])
    for doc_id, sentences in items:
        batch.doc_ids.append(doc_id)
        batch.documents.append(sentences)
        if len(batch.doc_ids) == ReadDocuments.BATCH_DOCUMENTS:
            yield batch
            batch = DocumentBatch([], [])
    if batch.doc_ids:
        yield batch


def utf8_bytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def document_totals(element, step: str) -> tuple[str, tuple[int, int]]:
    """(id, text) -> (step, (1 document, its UTF-8 bytes))."""
    _, text = element
    return step, (1, utf8_bytes(text))


class DropBundleCopies(beam.DoFn):
    """(id, text) -> the same, but a copy of an id this bundle already gave is ``REMOVED``
    as ``exact_duplicate`` here, before it crosses the network (:class:`KeepDistinct` finds
    the copies of other bundles; either way each copy after the first is counted once, so
    the counts do not depend on bundles). Holds up to ``memory.BUNDLE_IDS`` ids, never texts."""

    def start_bundle(self):
        self._seen: set[str] = set()

    def process(self, element) -> Iterator:
        doc_id = element[0]
        if doc_id in self._seen:
            yield TaggedOutput(REMOVED, ("exact_duplicate", element))
            return
        if len(self._seen) >= memory.BUNDLE_IDS:
            self._seen.clear()
        self._seen.add(doc_id)
        yield element


class KeepDistinct(beam.DoFn):
    """(group key, {"doc": its documents (id, text) or :class:`SpoolTexts`' references to
    them, exact copies included, "drop": the ids MinHash removes}) -> (group key, [(id,
    text) kept, in id order]); each copy after an id's first, and each dropped id,
    ``REMOVED`` (``exact_duplicate``, ``near_duplicate``); and tagged ``STEPS``: (step,
    (documents, UTF-8 bytes)) after each dedup step. With ``--dedup none`` (curate groups
    its output files all the same) nothing is removed.

    ``finish``: (group key, kept) -> what to give instead, here: curate writes its file in
    the same task, so that a file's texts are never a task's result that the runner holds
    until its next steps have run (one of the changes that kept a curate without filters
    within a Dask worker's memory: docs/results.md, "Fewer, larger packs, and texts
    spooled")."""

    def __init__(self, dedup: str, finish=None):
        super().__init__()
        self._dedup, self._finish = dedup, finish

    def process(self, element) -> Iterator:
        key, grouped = element
        dedup = self._dedup
        drop = set(grouped.get("drop", ()))
        kept, previous = [], None
        distinct = distinct_bytes = kept_bytes = 0  # after exact dedup; kept
        for doc_id, text in sorted(spooled_values(grouped["doc"]), key=lambda d: d[0]):
            if dedup != "none" and doc_id == previous:
                yield TaggedOutput(REMOVED, ("exact_duplicate", (doc_id, text)))
                continue
            previous, nbytes = doc_id, utf8_bytes(text)
            distinct += 1
            distinct_bytes += nbytes
            if doc_id in drop:
                yield TaggedOutput(REMOVED, ("near_duplicate", (doc_id, text)))
                continue
            kept.append((doc_id, text))
            kept_bytes += nbytes
        if dedup != "none":
            yield TaggedOutput(STEPS, ("exact_dedup", (distinct, distinct_bytes)))
        if dedup == "minhash":
            yield TaggedOutput(STEPS, ("near_dedup", (len(kept), kept_bytes)))
        if kept and self._finish is not None:
            yield from self._finish((key, kept))
        elif kept:
            yield key, kept


class Filter(beam.DoFn):
    """(id, text) -> (id, text) kept, or ``REMOVED`` (reason, (id, text)): language ID,
    then quality rule sets (which may drop lines: the text goes on without them), then
    decontamination against a side input of n-gram hashes."""

    def __init__(self, config: CurationOptions):
        self._config = config

    def process(self, element, eval_ngrams=()) -> Iterator:
        doc_id, text = element
        config = self._config
        language = "en"  # Gopher's stop words without language ID (CJK text picks its own)
        if config.language_list:
            from pipeline.core.langid import detect

            language, score = detect(text)
            if language not in config.language_list or score < config.language_threshold:
                yield TaggedOutput(REMOVED, ("language", (doc_id, text)))
                return
        if config.rule_sets:
            from pipeline.core.filters import apply_filters

            failed, text = apply_filters(text, config.rule_sets, language=language)
            if failed is not None:
                yield TaggedOutput(REMOVED, (failed, (doc_id, text)))
                return
        if eval_ngrams:
            from pipeline.core.dedup import ngram_set

            if not eval_ngrams.isdisjoint(ngram_set(text, config.decontaminate_ngram)):
                yield TaggedOutput(REMOVED, ("decontaminated", (doc_id, text)))
                return
        yield doc_id, text


def eval_ngram_set(patterns: Sequence[str], n: int) -> frozenset[int]:
    """The n-gram hashes of every evaluation passage, read here, on the driver (they are
    small; a missing file is an error naming it).

    A passage is a block of a file between blank lines (the corpus's document convention; a
    file without blank lines is one passage). One of fewer than ``n`` words shares no n-gram
    with a training document, so it checks nothing: such passages are counted and named in a
    warning, never dropped silently.

    Raises:
        FileNotFoundError: a file that does not exist.
        ValueError: no passage of ``n`` words in them all: nothing to check against.
    """
    from pipeline.core.dedup import ngram_set, normalize, words

    out: set[int] = set()
    files = passages = 0
    short: list[str] = []
    for pattern in patterns:
        for path in sorted(glob.glob(pattern)) or [pattern]:
            with open(path, encoding="utf-8") as f:  # FileNotFoundError names it
                text = f.read()
            files += 1
            for passage in re.split(r"\n[ \t]*\n", text):
                count = len(words(normalize(passage)))
                if not count:
                    continue
                passages += 1
                if count < n:
                    short.append(f"{path}: {' '.join(passage.split())[:50]!r} ({count} words)")
                    continue
                out |= ngram_set(passage, n)
    if not out:
        raise ValueError(
            f"--decontaminate {list(patterns)}: no passage of {n} words or more in "
            f"{files} file(s) ({passages} shorter): nothing to check against; lower "
            "--decontaminate_ngram or give longer passages"
        )
    logger.info(
        "decontamination: %d held-out passage(s) from %d file(s), %d %d-grams",
        passages - len(short),
        files,
        len(out),
        n,
    )
    if short:
        logger.warning(
            "decontamination: %d of %d held-out passages have fewer than %d words "
            "(--decontaminate_ngram) and check nothing, e.g. %s",
            len(short),
            passages,
            n,
            "; ".join(short[:3]),
        )
    return frozenset(out)


class Curated(NamedTuple):
    """What :class:`Curate` gives."""

    kept: beam.PCollection  # (group key, [(id, text) kept, in id order]) per group, or
    # what Curate's finish_group gives for it
    removed: beam.PCollection  # (reason, (id, text)) removed
    steps: beam.PCollection  # (step name, (documents, UTF-8 bytes)) after it, to be summed
    changed: beam.PCollection  # one int: edges the components' last round changed (0: converged)


class Curate(beam.PTransform):
    """(content id, text) -> :class:`Curated`: the steps of this module's docstring that
    the options ask for (``eval_ngrams``: :func:`eval_ngram_set` of ``--decontaminate``).

    ``group_of``: id -> the key of the group the kept documents come in (curate: its output
    file); None: each document its own group, grouped only when deduplicating.
    ``positions``: with ``--minhash_keep first``, every document's :class:`IdPacks` of
    ``position_columns`` columns, the first three its position (:class:`BatchPositions`).
    ``spool``: a directory for the spool files of :class:`SpoolTexts` and
    :class:`BandKeys` (with ``group_of`` only); None: the texts and the band keys go
    through the runner's shuffle. ``finish_group``: (group key, [(id, text) kept]) -> what
    ``kept`` gives instead of each group (:class:`KeepDistinct`'s ``finish``).

    Raises:
        ValueError: ``--minhash_keep first`` without ``positions``; ``spool`` without
            ``group_of``.
    """

    def __init__(
        self,
        config: CurationOptions,
        eval_ngrams: frozenset[int],
        group_of=None,
        positions=None,
        position_columns: int = POSITION_COLUMNS,
        spool: str | None = None,
        finish_group=None,
    ):
        super().__init__()
        self._finish = finish_group
        self._config, self._eval_ngrams, self._group_of = config, eval_ngrams, group_of
        self._positions, self._position_columns = positions, position_columns
        self._spool = spool
        if config.dedup == "minhash" and config.minhash_keep == "first" and positions is None:
            raise ValueError("--minhash_keep first: the documents' positions are not given")
        if spool is not None and group_of is None:
            raise ValueError("spooled texts need group_of: one spool block per document")

    def expand(self, docs):
        config, eval_ngrams, p = self._config, self._eval_ngrams, docs.pipeline
        group_of = self._group_of or _same
        steps = [docs | "ReadTotals" >> beam.Map(document_totals, "read")]
        removed = []
        if config.language_list or config.rule_sets or eval_ngrams:
            side = p | "EvalNgrams" >> beam.Create([eval_ngrams])
            kept = docs | "Filter" >> beam.ParDo(
                Filter(config), eval_ngrams=beam.pvalue.AsSingleton(side)
            ).with_outputs(REMOVED, main="kept")
            docs = kept.kept
            removed.append(kept[REMOVED])
            steps.append(docs | "FilteredTotals" >> beam.Map(document_totals, "filters"))
        changed = p | "NoComponents" >> beam.Create([0])
        groups = {}
        if config.dedup != "none":
            kept = docs | "DropBundleCopies" >> beam.ParDo(DropBundleCopies()).with_outputs(
                REMOVED, main="kept"
            )
            docs = kept.kept
            removed.append(kept[REMOVED])
        if config.dedup == "minhash":
            dropped, changed = self._near_copies(docs)
            groups["drop"] = dropped | "DropByGroup" >> beam.Map(lambda i: (group_of(i), i))
        if config.dedup == "none" and self._group_of is None:
            kept_groups = docs | "OwnGroups" >> beam.Map(lambda d: (d[0], [d]))
        else:
            if self._spool is not None:
                groups["doc"] = docs | "SpoolTexts" >> beam.ParDo(SpoolTexts(self._spool, group_of))
            else:
                groups["doc"] = docs | "DocByGroup" >> beam.Map(lambda d: (group_of(d[0]), d))
            decided = (
                groups
                | "GroupDocuments" >> beam.CoGroupByKey()
                | "KeepDistinct"
                >> beam.ParDo(KeepDistinct(config.dedup, self._finish)).with_outputs(
                    REMOVED, STEPS, main="kept"
                )
            )
            kept_groups = decided.kept
            removed.append(decided[REMOVED])
            steps.append(decided[STEPS])
        removed_all = (
            removed or [p | "NothingRemoved" >> beam.Create([])]
        ) | "AllRemoved" >> beam.Flatten()
        return Curated(kept_groups, removed_all, steps | "AllSteps" >> beam.Flatten(), changed)

    def _near_copies(self, docs):
        """MinHash: the ids of the documents to drop, one per near copy (every cluster member
        but the one ``--minhash_keep`` keeps), and how many edges the last round changed."""
        config = self._config
        edges = (
            docs
            | "BandKeys" >> beam.ParDo(BandKeys(config, self._spool))
            | "GroupBands" >> beam.GroupByKey()
            | "StarEdges" >> beam.FlatMap(bucket_stars)
        )
        labels, changed = edges | "Components" >> ConnectedComponents(config.cc_rounds)
        if config.minhash_keep != "first":  # every member but the smallest id: the labelled
            return labels | "NotSmallest" >> beam.Keys(), changed
        members = labels | "Members" >> beam.FlatMap(member_records)
        dropped = (
            {"position": self._positions, "member": members}
            | "JoinPositions" >> beam.CoGroupByKey()
            | "FirstPositions" >> beam.FlatMap(member_positions, self._position_columns)
            | "GroupClusters" >> beam.GroupByKey()
            | "AllButFirst" >> beam.FlatMap(all_but_first)
        )
        return dropped, changed


def _same(doc_id: str) -> str:
    return doc_id


def unconverged(cc_rounds: int, changed: int) -> str:
    """The warning of near-duplicate clusters that did not converge (build and curate)."""
    return (
        f"near-duplicate clusters had not converged after --cc_rounds {cc_rounds} ({changed} "
        "documents changed cluster in the last round): some near copies may remain; raise it"
    )


def check_packages(config: CurationOptions) -> None:
    """Import the curate extra's packages that the options need, here on the driver rather
    than in every worker (ImportError names the extra)."""
    if config.dedup == "minhash" or config.decontaminate:
        from pipeline.core.dedup import shingle_hashes

        shingle_hashes("a package check")
    if config.language_list:
        from pipeline.core.langid import detect

        detect("a package check")
