"""The Beam pipeline: raw text -> vocab -> NSP instances -> masked Arrow shards.

    python -m pipeline build --input 'corpus/*.txt' --output shards/ --vocab_size 30522
    python -m pipeline build --input ... --output ... \\
        --direct_num_workers=2 --direct_running_mode=multi_processing

Stages (labels as in the Beam graph; each a PTransform of the steps in brackets)::

    ReadCorpus [ListRanges -> ReadDocuments (-> SumPerFile -> FileNotes)]
      -> LearnVocabulary [CountWords -> LearnVocab] (or VocabFromFile), WriteVocab
      -> MakeRows [Tokenize -> AssignBuckets (bucket groups) -> GroupBuckets
                   -> MakeInstances (per bucket: NSP + masking, rows keyed by shard)]
      -> WriteShards [GroupShards -> WriteGroups
                      (-> GroupParts -> JoinParts: shards in key-range parts) -> CollectShards]
      -> WriteManifest (empty shards, then the manifest, last)

Files are read in byte ranges, spread over the workers, so one big file is read by all of
them. A document's id is a hash of its content; randomness is seeded only from (seed,
document id, dupe index); documents meet the others of their bucket sorted by id, and each
shard is sorted by a seeded hash; so every runner and worker count, and any way of putting
the same documents into files (names, number, order, compression), writes byte-identical
shards and manifest.

This module plans the job and composes the graph from the stages above; the steps live
in ``document_steps.py`` (read, tokenize), ``vocab_steps.py`` (count words, learn the
vocab), ``instance_steps.py`` (buckets, NSP pairs, masking), ``shard_steps.py`` (shards)
and ``manifest_steps.py`` (vocab files, manifest); the bounds on their memory in
``memory.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Iterable
from typing import NamedTuple

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import StandardOptions

from pipeline.beam.config import (
    OUTPUT_BYTES_PER_INPUT_BYTE,
    TARGET_SHARD_BYTES,
    BuildConfig,
)
from pipeline.beam.curation_steps import (
    Curate,
    as_sentences,
    batch_documents,
    check_packages,
    documents_of,
    eval_ngram_set,
)
from pipeline.beam.document_steps import (
    COUNTS,
    FILE_DOCUMENTS,
    ReadDocuments,
    Tokenize,
    add_up,
    file_notes,
)
from pipeline.beam.inputs import InputPlan, plan_input
from pipeline.beam.instance_steps import (
    BUCKET_SIZES,
    AssignBuckets,
    MakeInstances,
    SummariseBuckets,
)
from pipeline.beam.manifest_steps import vocab_entry, write_manifest
from pipeline.beam.minhash_steps import BatchPositions
from pipeline.beam.shard_steps import (
    JoinParts,
    WriteShard,
    parts_per_shard,
    remove_leftovers,
)
from pipeline.beam.spool import use_spool
from pipeline.beam.vocab_steps import CountWords, learn_vocab
from pipeline.core.segment import segmenter_version
from pipeline.core.sources import (
    is_compressed,
    range_bytes,
)
from pipeline.core.vocab import parse_vocab
from pipeline.shards import shard_format

logger = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- files


def default_num_shards(total_input_bytes: int, dupe_factor: int) -> int:
    estimate = total_input_bytes * dupe_factor * OUTPUT_BYTES_PER_INPUT_BYTE
    return max(1, min(99999, round(estimate / TARGET_SHARD_BYTES)))


def check_output(config: BuildConfig) -> list[str]:
    """prepare_output's refusal, reading only (also a dry run's check of ``--output``).

    Returns:
        The shards and manifest of an earlier build there (to replace: --overwrite).

    Raises:
        FileExistsError: the directory already holds shards or a manifest, and no --overwrite.
    """
    out = config.output
    existing = [
        m.path
        for pattern in ("shard-*.arrow", shard_format.MANIFEST_NAME)
        for m in FileSystems.match([FileSystems.join(out, pattern)])[0].metadata_list
    ]
    if existing and not config.overwrite:
        raise FileExistsError(
            f"{out} already holds {len(existing)} shard/manifest file(s) from an earlier build; "
            "pass --overwrite to replace them or choose another --output"
        )
    return existing


def prepare_output(config: BuildConfig) -> bool:
    """Create the output directory; refuse to mix with an earlier build unless --overwrite.

    Returns:
        Whether this call created the directory (a build of 0 rows removes it again).

    Raises:
        FileExistsError: the directory already holds shards or a manifest.
    """
    out = config.output
    existing = check_output(config)
    remove_leftovers(out)  # an interrupted build's parts and temporaries are never output
    # The manifest goes first, so an interrupted clean-up never leaves a manifest
    # that lists deleted shards.
    existing.sort(key=lambda p: not p.endswith(shard_format.MANIFEST_NAME))
    if existing:
        FileSystems.delete(existing)
    if FileSystems.exists(out):
        return False
    FileSystems.mkdirs(out)
    return True


class EmptyBuildError(ValueError):
    """The build made 0 rows: nothing a trainer could read."""


def discard_build(out: str, created_output: bool) -> None:
    """Remove what a build wrote to ``out`` (an empty or failed one): the manifest first (the
    directory is an unfinished build from then on), then the shards, vocab, tokenizer, parts
    and temporaries, then ``out`` itself if the build created it (a local one, now empty;
    object stores have no directories). prepare_output left nothing else of those names."""
    patterns = [
        shard_format.MANIFEST_NAME,
        "shard-*.arrow",
        shard_format.VOCAB_NAME,
        shard_format.TOKENIZER_NAME,
    ]
    for pattern in patterns:  # one at a time, in order: the manifest first
        found = FileSystems.match([FileSystems.join(out, pattern)])[0].metadata_list
        if found:
            FileSystems.delete(sorted(m.path for m in found))
    remove_leftovers(out)
    if created_output and FileSystems.get_scheme(out) is None:
        with contextlib.suppress(OSError):  # not empty: someone else's files, kept
            os.rmdir(out)


def refuse_empty_build(manifest: dict, config: BuildConfig, created_output: bool) -> None:
    """Undo a build that made 0 rows and say why; a build with rows passes.

    A manifest of 0 rows is a valid directory that trains on nothing, so it is not kept:
    the manifest goes first (the directory is an unfinished build from then on), then
    the shards, vocab and tokenizer, then the output directory if this build created it
    (a local one, now empty; object stores have no directories).

    Raises:
        EmptyBuildError: ``"N documents -> 0 rows (skipped: ...)"``, naming the output.
    """
    if manifest["num_rows"]:
        return
    out = config.output
    discard_build(out, created_output)
    skipped = ", ".join(f"{kind} {n}" for kind, n in manifest["skipped"].items()) or "nothing"
    raise EmptyBuildError(
        f"{manifest['stats']['documents']} documents -> 0 rows (skipped: {skipped}): "
        f"nothing to train on, so nothing is kept in {out}; check --input"
    )


# ----------------------------------------------------------------------------- graph


def read_vocab_file(path: str) -> list[str]:
    try:
        with FileSystems.open(path) as f:
            text = f.read().decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"--vocab_file {path}: not UTF-8 ({e})") from e
    except OSError as e:
        raise FileNotFoundError(f"--vocab_file {path}: {e}") from e
    return parse_vocab(text, path)


class Plan(NamedTuple):
    """What the driver decides before the pipeline runs (fails fast on bad input): the
    input (:class:`~pipeline.beam.inputs.InputPlan`, as curate plans it) and the build's own."""

    input: InputPlan
    num_shards: int
    vocab: list[str] | None  # from --vocab_file, or None to learn one
    eval_ngrams: frozenset[int] = frozenset()  # --decontaminate's n-gram hashes

    files = property(lambda self: self.input.files)
    sizes = property(lambda self: self.input.sizes)
    ranges = property(lambda self: self.input.ranges)
    input_format = property(lambda self: self.input.input_format)
    format_origin = property(lambda self: self.input.format_origin)


def make_plan(config: BuildConfig) -> Plan:
    """Plan the input (:func:`~pipeline.beam.inputs.plan_input`), size the shards and read
    --vocab_file.

    Raises:
        FileNotFoundError: an input pattern matches nothing, or no --vocab_file.
        ValueError: the vocab file is malformed (names file and line), or the input is
            refused (:func:`~pipeline.beam.inputs.plan_input` says when).
        ImportError: --wwm_segmenter's package is not installed (names the extra).
    """
    segmenter_version(config.wwm_segmenter)  # fails here, not in every worker
    inputs = plan_input(config.input, config.read_options, config.input_split_mb)
    total = inputs.total_bytes
    num_shards = config.num_shards or default_num_shards(total, config.dupe_factor)
    vocab = read_vocab_file(config.vocab_file) if config.vocab_file else None
    logger.info(
        "%d %s input file(s), %.1f MB, read in %d range(s); %d shard(s)",
        len(inputs.files),
        inputs.input_format,
        total / 1e6,
        len(inputs.ranges),
        num_shards,
    )
    size = round(config.input_split_mb * 1e6) or range_bytes(total)
    files = zip(inputs.files, inputs.sizes, strict=True)
    whole = [(path, n) for path, n in files if is_compressed(path) and n > size]
    for path, n in whole[:3]:
        logger.warning(
            "%s is compressed (%.0f MB): it cannot seek, so one worker reads it "
            "whole; decompress it, or split it into files, to spread it over the "
            "workers",
            path,
            n / 1e6,
        )
    if len(whole) > 3:
        logger.warning("... and %d more compressed files over %.0f MB", len(whole) - 3, size / 1e6)
    eval_ngrams = frozenset()
    if config.curating:
        check_packages(config)  # the curate extra's, here rather than in every worker
        if config.decontaminate:
            eval_ngrams = eval_ngram_set(config.decontaminate, config.decontaminate_ngram)
    return Plan(inputs, num_shards, vocab, eval_ngrams)


class ReadCorpus(beam.PTransform):
    """The plan's file ranges -> (DocumentBatches, ((group, kind), count) of what was skipped
    or noted while reading). A file's documents are counted over its ranges (its ranges
    are read apart), for the skips and notes that concern whole files."""

    def __init__(self, config: BuildConfig, plan: Plan):
        super().__init__()
        self._config, self._plan = config, plan

    def expand(self, pbegin):
        # Curation reads records' texts whole (its rules need a document's own lines).
        split = not self._config.curating
        read_documents = ReadDocuments(
            self._config.read_options, self._plan.format_origin, split=split
        )
        read = (
            pbegin
            | "ListRanges" >> beam.Create(self._plan.ranges)  # reshuffled: spread to workers
            | "ReadDocuments"
            >> beam.ParDo(read_documents).with_outputs(COUNTS, FILE_DOCUMENTS, main="documents")
        )
        file_counts = (
            read[FILE_DOCUMENTS]
            | "SumPerFile" >> beam.CombinePerKey(add_up)
            | "FileNotes" >> beam.FlatMap(file_notes, self._plan.input_format)
        )
        return read.documents, (read[COUNTS], file_counts) | "ReadNotes" >> beam.Flatten()


class CurateDocuments(beam.PTransform):
    """Unsplit DocumentBatches -> (DocumentBatches of the documents curation keeps, split
    into sentences as ``build`` splits curate's output; ((group, kind), count) pairs: group
    ``removed`` per reason, ``curation`` the components' last-round changes and
    ``skipped`` what splitting left empty)."""

    def __init__(self, config: BuildConfig, plan: Plan):
        super().__init__()
        self._config, self._plan = config, plan

    def expand(self, batches):
        config, positions = self._config, None
        if config.dedup == "minhash" and config.minhash_keep == "first":
            positions = batches | "Positions" >> beam.ParDo(BatchPositions(self._plan.files))
        curated = (
            batches
            | "AsTexts" >> beam.FlatMap(documents_of)
            | "Steps" >> Curate(config, self._plan.eval_ngrams, positions=positions)
        )
        split = (
            curated.kept
            | "Ungroup" >> beam.FlatMap(lambda group: group[1])
            | "AsSentences" >> beam.FlatMap(as_sentences).with_outputs(COUNTS, main="documents")
        )
        documents = (
            split.documents
            | "Batch" >> beam.BatchElements(min_batch_size=64, max_batch_size=512)
            | "AsBatches" >> beam.FlatMap(batch_documents)
        )
        removed = curated.removed | "RemovedReasons" >> beam.Map(lambda r: (("removed", r[0]), 1))
        changed = curated.changed | "Unconverged" >> beam.Map(
            lambda n: (("curation", "components_changed_in_last_round"), n)
        )
        counts = (split[COUNTS], removed, changed) | "CurationCounts" >> beam.Flatten()
        return documents, counts


class LearnVocabulary(beam.PTransform):
    """DocumentBatches -> one vocab (a list of tokens): WordPiece learned on the word counts."""

    def __init__(self, config: BuildConfig):
        super().__init__()
        self._config = config

    def expand(self, documents):
        return (
            documents
            | "CountWords" >> CountWords(self._config.do_lower_case)
            | "LearnVocab" >> beam.Map(learn_vocab, self._config)
        )


class Rows(NamedTuple):
    """What :class:`MakeRows` gives: the rows and what the manifest says about them."""

    rows: beam.PCollection  # (write group, RowBlock bytes)
    counts: beam.PCollection  # ((group, kind), count): tokenizing's skips and notes, copies
    documents: beam.PCollection  # one int: the documents tokenized
    buckets: beam.PCollection  # one (count, min, max) of documents per bucket


class MakeRows(beam.PTransform):
    """DocumentBatches -> :class:`Rows`: tokenize, assign buckets by a seeded hash of the
    document id, then per bucket NSP pairs and masks (MakeInstances), rows keyed by write group."""

    def __init__(self, config: BuildConfig, num_shards: int, vocab: beam.pvalue.AsSingleton):
        super().__init__()
        self._config, self._num_shards, self._vocab = config, num_shards, vocab

    def expand(self, documents):
        config = self._config
        tokenize = Tokenize(
            config.do_lower_case, config.tokenizer_threads, segmenter=config.wwm_segmenter
        )
        tokenized = documents | "Tokenize" >> beam.ParDo(tokenize, vocab=self._vocab).with_outputs(
            COUNTS, main="batches"
        )
        num_docs = (
            tokenized.batches
            | "DocumentsPerBatch" >> beam.Map(lambda batch: len(batch.doc_ids))
            | "CountDocuments" >> beam.CombineGlobally(sum)
        )
        num_tokens = (
            tokenized.batches
            | "TokensPerBatch" >> beam.Map(lambda batch: len(batch.ids))
            | "CountTokens" >> beam.CombineGlobally(sum)
        )
        groups = tokenized.batches | "AssignBuckets" >> beam.ParDo(
            AssignBuckets(config),
            beam.pvalue.AsSingleton(num_docs),
            beam.pvalue.AsSingleton(num_tokens),
        )
        runner = documents.pipeline.options.view_as(StandardOptions).runner
        spool = config.output if use_spool(config.spool, runner) else None
        make = beam.ParDo(
            MakeInstances(config, self._num_shards, spool=spool),
            vocab=self._vocab,
            num_docs=beam.pvalue.AsSingleton(num_docs),
        )
        made = (
            groups
            | "GroupBuckets" >> beam.GroupByKey()
            | "MakeInstances" >> make.with_outputs(COUNTS, BUCKET_SIZES, main="rows")
        )
        bucket_sizes = made[BUCKET_SIZES] | "SummariseBuckets" >> beam.CombineGlobally(
            SummariseBuckets()
        )
        counts = (tokenized[COUNTS], made[COUNTS]) | "MakeRowsCounts" >> beam.Flatten()
        return Rows(made.rows, counts, num_docs, bucket_sizes)


class WriteShards(beam.PTransform):
    """(write group, RowBlock bytes) -> one list of every written shard's manifest entry and
    statistics: each write group (a shard, or a key range of one) sorted and written,
    then a shard's key-range parts joined into its file."""

    def __init__(self, config: BuildConfig, num_shards: int, vocab: beam.pvalue.AsSingleton):
        super().__init__()
        self._config, self._num_shards, self._vocab = config, num_shards, vocab

    def expand(self, rows):
        config, num_shards = self._config, self._num_shards
        written = (
            rows
            | "GroupShards" >> beam.GroupByKey()
            | "WriteGroups" >> beam.ParDo(WriteShard(config, num_shards), vocab=self._vocab)
        )
        if parts_per_shard(num_shards) > 1:
            written = (
                written
                | "GroupParts" >> beam.GroupByKey()
                | "JoinParts" >> beam.ParDo(JoinParts(config, num_shards), vocab=self._vocab)
            )
        return written | "CollectShards" >> beam.combiners.ToList()


def sum_counts(counts: Iterable[beam.PCollection]) -> beam.PCollection:
    """((group, kind), count) PCollections -> one total per (group, kind)."""
    return tuple(counts) | "MergeCounts" >> beam.Flatten() | "SumCounts" >> beam.CombinePerKey(sum)


def build_graph(p: beam.Pipeline, config: BuildConfig, plan: Plan) -> beam.PCollection:
    """Add the whole job to ``p``; returns the PCollection holding the manifest.

    ``config.input_format`` may be ``auto``: the plan's resolved format is what the job
    reads and what the manifest records.
    """
    config = dataclasses.replace(config, input_format=plan.input_format)
    documents, read_counts = p | "ReadCorpus" >> ReadCorpus(config, plan)
    if config.curating:
        documents, curation_counts = documents | "Curate" >> CurateDocuments(config, plan)
        read_counts = (read_counts, curation_counts) | "ReadAndCurationNotes" >> beam.Flatten()
    if plan.vocab is not None:
        vocab = p | "VocabFromFile" >> beam.Create([plan.vocab])
    else:
        vocab = documents | "LearnVocabulary" >> LearnVocabulary(config)
    vocab_side = beam.pvalue.AsSingleton(vocab)
    vocab_info = vocab | "WriteVocab" >> beam.Map(vocab_entry, config)
    made = documents | "MakeRows" >> MakeRows(config, plan.num_shards, vocab_side)
    shards = made.rows | "WriteShards" >> WriteShards(config, plan.num_shards, vocab_side)
    return shards | "WriteManifest" >> beam.Map(
        write_manifest,
        vocab=vocab_side,
        vocab_info=beam.pvalue.AsSingleton(vocab_info),
        counts=beam.pvalue.AsDict(sum_counts([read_counts, made.counts])),
        documents=beam.pvalue.AsSingleton(made.documents),
        buckets=beam.pvalue.AsSingleton(made.buckets),
        config=config,
        num_shards=plan.num_shards,
    )
