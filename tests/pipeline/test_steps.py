"""The pipeline's Beam steps: DoFns called as plain functions, transforms on a TestPipeline."""

import hashlib
import logging
import os
import pickle
import subprocess
import sys

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.coders import typecoders
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.pvalue import TaggedOutput
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline
from apache_beam.testing.util import assert_that, equal_to

from pipeline.beam import memory
from pipeline.beam.config import BuildConfig
from pipeline.beam.document_steps import (
    COUNTS,
    FILE_DOCUMENTS,
    DocumentBatch,
    ReadDocuments,
    Tokenize,
    TokenizedBatch,
    add_up,
    file_notes,
)
from pipeline.beam.instance_steps import (
    BUCKET_SIZES,
    AssignBuckets,
    MakeInstances,
    num_groups,
    split_into_buckets,
    split_into_groups,
)
from pipeline.beam.shard_steps import (
    JoinParts,
    SpoolRef,
    WriteShard,
    block_bytes,
    block_stats,
    key_ranges,
    parts_per_shard,
    remove_leftovers,
    write_sorted,
)
from pipeline.beam.vocab_steps import CountWords
from pipeline.core.rows import RowBlock
from pipeline.core.sources import FileRange, content_id, split_ranges
from pipeline.core.text import basic_tokenize
from pipeline.core.vocab import SPECIAL_TOKENS
from pipeline.shards import shard_format, shard_writer, validate
from tests.helpers import REPO

# The FnApiRunner directly: Beam's DirectRunner would first try to download Prism.
RUNNER = ["--runner=apache_beam.runners.portability.fn_api_runner.FnApiRunner"]
WORDS = ["the", "river", "runs", "north", "city", "old", "a", "b", ".", "##s"]
VOCAB = [*SPECIAL_TOKENS, *WORDS]
CLS, SEP, MASK = VOCAB.index("[CLS]"), VOCAB.index("[SEP]"), VOCAB.index("[MASK]")


def beam_pipeline() -> BeamTestPipeline:
    return BeamTestPipeline(options=PipelineOptions(RUNNER))


@pytest.fixture
def corpus(tmp_path):
    (tmp_path / "a.txt").write_bytes(
        b"The river runs.\nThe city.\n\nOld north.\n\n\xff bad line\nA b.\n"
    )
    (tmp_path / "empty.txt").write_bytes(b"\n\n")
    return tmp_path


def config(tmp_path, **overrides):
    values = dict(
        input=(str(tmp_path / "*.txt"),),
        output=str(tmp_path / "out"),
        max_seq_length=16,
        dupe_factor=2,
        bucket_size=1,
    )
    return BuildConfig(**{**values, **overrides})


def outputs(items) -> tuple[list, dict[str, list]]:
    """A DoFn's outputs, called as a plain function: (main outputs, tag -> tagged values)."""
    main, tagged = [], {}
    for item in items:
        if isinstance(item, TaggedOutput):
            tagged.setdefault(item.tag, []).append(item.value)
        else:
            main.append(item)
    return main, tagged


def test_read_documents_as_a_plain_function(corpus):
    read = ReadDocuments(config(corpus).read_options)
    batches, tagged = outputs(read.process(FileRange(str(corpus / "a.txt"))))
    assert tagged[COUNTS] == [(("skipped", "invalid_utf8_line"), 1)]
    documents = [["The river runs.", "The city."], ["Old north."], ["A b."]]
    ids, origin = [content_id(d) for d in documents], (str(corpus / "a.txt"), 0, 0)
    assert batches == [DocumentBatch(ids, documents, origin)]
    assert tagged[FILE_DOCUMENTS] == [(str(corpus / "a.txt"), (3, 4))]  # documents, sentences
    empty = str(corpus / "empty.txt")
    assert outputs(read.process(FileRange(empty))) == ([], {FILE_DOCUMENTS: [(empty, (0, 0))]})
    assert add_up([(2, 9), (1, 4)]) == (3, 13)


def test_file_notes_count_files_without_documents_and_txt_files_of_one(caplog):
    assert file_notes(("empty.txt", (0, 0)), "txt") == [(("skipped", "file_without_documents"), 1)]
    with caplog.at_level(logging.WARNING, logger="pipeline.beam.document_steps"):
        notes = file_notes(("one.txt", (1, 236)), "txt")
    assert notes == [(("input", "single_document_files"), 1)]
    # The console can only count such files: the log names each, with its lines.
    assert "one.txt was read as one document of 236 lines" in caplog.text
    assert file_notes(("one.jsonl", (1, 5)), "jsonl") == []


def test_ranges_of_a_file_read_each_document_once(tmp_path):
    """However a txt file is cut into ranges, its ranges together read its documents once."""
    docs = [[f"Doc {d} line {i}." for i in range(1 + d % 4)] for d in range(60)]
    text = "\n\n".join("\n".join(d) for d in docs) + "\n"
    text = text.replace("Doc 7 line 0.\n", "Doc 7 line 0.\n \t\n\n")  # a run of blank lines
    path = tmp_path / "a.txt"
    path.write_text(text)
    read = ReadDocuments(config(tmp_path).read_options)

    def ids(part):
        return [i for x in read.process(part) if isinstance(x, DocumentBatch) for i in x.doc_ids]

    expected = ids(FileRange(str(path)))  # the file read whole
    assert len(expected) == 61 and content_id(["Doc 7 line 0."]) in expected
    for size in (1, 7, 50, 333, len(text)):
        ranges = split_ranges([(str(path), len(text))], size)
        assert len(ranges) == -(-len(text) // size)
        assert [i for r in ranges for i in ids(r)] == expected, size


def test_tokenize_as_a_plain_function():
    tokenize = Tokenize(do_lower_case=True, threads=1)
    tokenize.setup()
    batch = DocumentBatch(["d:0", "d:1", "d:2"], [["The river.", "\x00"], ["\u200b"], ["old city"]])
    (tokenized,), tagged = outputs(tokenize.process(batch, VOCAB))
    assert tokenized.doc_ids == ["d:0", "d:2"]  # d:1 tokenizes to nothing
    assert tokenized.counts.tolist() == [1, 1]  # the NUL-only sentence is dropped
    ids = [VOCAB.index(w) for w in ("the", "river", ".", "old", "city")]
    assert tokenized.ids.tolist() == ids and tokenized.lengths.tolist() == [3, 2]
    assert (("skipped", "empty_after_tokenization"), 1) in tagged[COUNTS]
    assert (("input", "one_sentence_documents"), 2) in tagged[COUNTS]


# Google's tokenization (google-research/bert tokenization.py) of text with special-token
# text in it, written out by hand: BasicTokenizer lowercases (when uncased), splits on
# whitespace and makes each punctuation character a word, so "[MASK]" is "[", "mask", "]";
# WordPiece then finds every word whole in this vocab. No special id comes out of text.
GOOGLE_VOCAB = [
    *SPECIAL_TOKENS,
    "[",
    "]",
    ".",
    "use",
    "mask",
    "here",
    "cls",
    "sep",
    "pad",
    "unk",
    "x",
    "Use",
    "MASK",
]
GOOGLE_PIECES = {
    ("Use [MASK] here. [CLS][SEP] [PAD]x [UNK]", True): [
        "use",
        "[",
        "mask",
        "]",
        "here",
        ".",
        "[",
        "cls",
        "]",
        "[",
        "sep",
        "]",
        "[",
        "pad",
        "]",
        "x",
        "[",
        "unk",
        "]",
    ],
    ("Use [MASK] here.", False): ["Use", "[", "MASK", "]", "here", "."],
}


@pytest.mark.parametrize("text, do_lower_case", list(GOOGLE_PIECES))
def test_tokenize_reads_special_token_text_as_text_as_googles_tokenizer_does(text, do_lower_case):
    tokenize = Tokenize(do_lower_case=do_lower_case, threads=1)
    tokenize.setup()
    (tokenized,), _ = outputs(tokenize.process(DocumentBatch(["d:0"], [[text]]), GOOGLE_VOCAB))
    expected = [GOOGLE_VOCAB.index(piece) for piece in GOOGLE_PIECES[text, do_lower_case]]
    assert tokenized.ids.tolist() == expected
    # The vocab learner counts the same words (so "mask" can be learned as a word).
    assert basic_tokenize(text, do_lower_case) == GOOGLE_PIECES[text, do_lower_case]


def tokenized_bucket(n_docs=12, seed=0):
    rng = np.random.default_rng(seed)
    counts = rng.integers(1, 5, n_docs)
    lengths = rng.integers(1, 9, int(counts.sum()))
    ids = rng.integers(len(SPECIAL_TOKENS), len(VOCAB), int(lengths.sum())).astype(np.uint16)
    return TokenizedBatch([f"f.txt:{i}" for i in range(n_docs)], ids, lengths, counts)


def made(make: MakeInstances, batches: list[TokenizedBatch]) -> list:
    """MakeInstances' (write group, rows) elements for one group of ``batches`` (one
    bucket at the default bucket size), its tagged outputs left out."""
    num_docs = sum(len(b.doc_ids) for b in batches)
    return outputs(make.process((0, batches), VOCAB, num_docs))[0]


def test_make_instances_rows_are_framed_and_masked(tmp_path):
    cfg = config(tmp_path, max_predictions_per_seq=3)
    make = MakeInstances(cfg, num_shards=2)
    batch = tokenized_bucket()
    halves = [batch.take(np.arange(0, 6)), batch.take(np.arange(6, 12))]
    out = made(make, halves[::-1])  # batch order must not matter
    assert out == made(make, halves)
    rows = RowBlock.concat([RowBlock.from_bytes(data) for _, data in out])
    assert len(rows) >= 12 * 2  # every document makes a row in each of the two passes
    starts, ends = rows.row_offsets[:-1], rows.row_offsets[1:]
    assert (rows.input_ids[starts] == CLS).all() and (rows.input_ids[ends - 1] == SEP).all()
    assert (np.diff(rows.row_offsets) <= 16).all()
    assert (np.diff(rows.mlm_offsets) >= 1).all() and (np.diff(rows.mlm_offsets) <= 3).all()
    groups = {group for group, _ in out}
    assert groups <= set(range(2 * parts_per_shard(2)))


def traced(*case: str) -> list[int]:
    """tests/pipeline/peaks.py's measurement of ``case``, in a fresh interpreter."""
    run = subprocess.run(
        [sys.executable, "-m", "tests.pipeline.peaks", *case],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    return [int(x) for x in run.stdout.split()]


def test_a_bucket_holds_one_pass_of_rows_not_every_dupe_pass(tmp_path, monkeypatch):
    """Rows are sent whenever those held reach PENDING_ROW_BYTES, so at dupe factor 8 a
    bucket holds about one pass's working memory, not eight (it held all of them at once)."""
    bucket = tokenized_bucket(n_docs=400, seed=3)
    peaks = {d: traced("held_rows", str(d))[0] for d in (1, 8)}
    assert peaks[8] < 2 * peaks[1], peaks
    # The rows are the same however they are sent.
    monkeypatch.setattr(memory, "PENDING_ROW_BYTES", 1)
    make = MakeInstances(config(tmp_path, dupe_factor=3), 2)
    small = RowBlock.concat([RowBlock.from_bytes(b) for _, b in made(make, [bucket])])
    monkeypatch.setattr(memory, "PENDING_ROW_BYTES", 1 << 40)
    whole = RowBlock.concat([RowBlock.from_bytes(b) for _, b in made(make, [bucket])])
    assert small.sorted_by_key().to_bytes() == whole.sorted_by_key().to_bytes()


def read_blocks(items) -> list[RowBlock]:
    """A write group's rows, as WriteShard reads them: bytes, or spool references."""
    return [RowBlock.from_bytes(data) for data in block_bytes(items)]


def test_a_spool_sends_references_and_the_writer_reads_the_same_rows(tmp_path):
    bucket = tokenized_bucket(n_docs=50, seed=4)
    cfg = config(tmp_path, dupe_factor=2)
    direct = made(MakeInstances(cfg, 2), [bucket])
    spooled = MakeInstances(cfg, 2, spool=str(tmp_path))
    spooled.start_bundle()
    assert made(spooled, [bucket]) == []  # nothing through the runner yet
    refs = [w.value for w in spooled.finish_bundle()]
    assert {g for g, _ in refs} == {g for g, _ in direct}
    assert all(isinstance(ref, SpoolRef) and len(ref.path) < 200 for _, ref in refs)
    (spool_file,) = tmp_path.glob(".rows-*.spool")
    for group, ref in refs:
        got = RowBlock.concat(read_blocks([ref])).to_bytes()
        assert got == RowBlock.concat(read_blocks([b for g, b in direct if g == group])).to_bytes()
    remove_leftovers(str(tmp_path))
    assert not spool_file.exists()


@pytest.mark.parametrize("ranges", [1, 3, 13, 29])
def test_a_write_group_is_written_range_by_range_with_the_same_bytes(tmp_path, monkeypatch, ranges):
    """Sorted and encoded one key range at a time (memory.RANGE_BYTES), a shard, or a part
    of one, has the bytes and statistics of all its rows encoded at once:
    the last rows of a range are carried into the next. 13 and 29 ranges broke the bytes when
    fewer than 64 rows were carried (pyarrow pads a sliced buffer to 64 bytes)."""
    cfg = config(tmp_path, dupe_factor=3)
    (tmp_path / "out").mkdir()
    blocks = [data for _, data in made(MakeInstances(cfg, 1), [tokenized_bucket(900, seed=7)])]
    rows = RowBlock.concat([RowBlock.from_bytes(b) for b in blocks]).sorted_by_key()
    assert len(rows) > 3 * shard_format.DEFAULT_BATCH_SIZE  # record batches to cross
    monkeypatch.setattr(memory, "RANGE_BYTES", -(-sum(map(len, blocks)) // ranges))
    assert len(list(key_ranges(blocks, 1, 0))) == ranges
    schema = shard_format.shard_schema(len(VOCAB), 16)
    mask_id = VOCAB.index("[MASK]")
    size, sha256, stats = write_sorted(
        str(tmp_path / "whole"), key_ranges(blocks, 1, 0), VOCAB, cfg, whole=True
    )
    whole = (tmp_path / "whole").read_bytes()
    assert whole == shard_writer.encode_shard(rows.columns(), schema)
    assert size == len(whole) and sha256 == hashlib.sha256(whole).hexdigest()
    assert stats == block_stats(rows, mask_id, VOCAB.index("[SEP]"), 16)
    # Part 1 of 2: the body of the rows whose keys' top bits fall in its half.
    half = rows.take(np.flatnonzero(rows.keys >= np.uint64(1 << 63)))
    write_sorted(str(tmp_path / "part"), key_ranges(blocks, 2, 1), VOCAB, cfg, whole=False)
    assert (tmp_path / "part").read_bytes() == shard_writer.encode_shard_body(
        half.columns(), schema
    )


def test_a_write_group_holds_one_range_at_a_time():
    """Writing a group of ~47,000 rows in 8 key ranges, tracemalloc's peak stays under
    1.5x the rows' bytes; sorted and encoded at once, a group held several times them
    (pyarrow's own buffers, not traced, come on top; memory.RANGE_BYTES says why)."""
    peak, row_bytes, rows = traced("write_group")
    assert rows > 40_000
    assert peak < 1.5 * row_bytes, (peak, row_bytes)


def test_steps_on_a_test_pipeline(corpus):
    cfg = config(corpus)
    with beam_pipeline() as p:
        files = p | beam.Create(
            [FileRange(str(corpus / "a.txt")), FileRange(str(corpus / "empty.txt"))]
        )
        read = files | beam.ParDo(ReadDocuments(cfg.read_options)).with_outputs(
            COUNTS, main="documents"
        )
        documents, counts = read.documents, read[COUNTS]
        doc_ids = documents | beam.FlatMap(lambda batch: batch.doc_ids)
        ids = [content_id(d) for d in (["The river runs.", "The city."], ["Old north."], ["A b."])]
        assert_that(doc_ids, equal_to(ids), label="ids")
        assert_that(counts, equal_to([(("skipped", "invalid_utf8_line"), 1)]), label="counts")
        words = documents | CountWords(do_lower_case=True)
        expected = {
            "the": 2,
            "river": 1,
            "runs": 1,
            ".": 4,
            "city": 1,
            "old": 1,
            "north": 1,
            "a": 1,
            "b": 1,
        }
        assert_that(words, equal_to([expected]), label="words")


def test_buckets_and_writers_on_a_test_pipeline(tmp_path):
    cfg = config(tmp_path, bucket_size=3)
    (tmp_path / "out").mkdir()
    num_shards = 2  # fewer than 16: each shard is written in parts, then joined
    batch = tokenized_bucket(n_docs=30)
    with beam_pipeline() as p:
        groups = p | beam.Create([batch]) | beam.FlatMap(split_into_groups, 30, len(batch.ids), cfg)
        sizes = groups | beam.Map(lambda kv: len(kv[1].doc_ids)) | beam.CombineGlobally(sum)
        assert_that(sizes, equal_to([30]), label="all documents bucketed")
        made = (
            groups
            | "GroupBuckets" >> beam.GroupByKey()
            | beam.ParDo(MakeInstances(cfg, num_shards), vocab=VOCAB, num_docs=30).with_outputs(
                BUCKET_SIZES, main="rows"
            )
        )
        assert_that(
            made[BUCKET_SIZES], equal_to(bucket_sizes_of(batch, 30, cfg)), label="bucket sizes"
        )
        entries = (
            made.rows
            | "GroupShards" >> beam.GroupByKey()
            | beam.ParDo(WriteShard(cfg, num_shards), vocab=VOCAB)
            | "GroupParts" >> beam.GroupByKey()
            | beam.ParDo(JoinParts(cfg, num_shards), vocab=VOCAB)
            | beam.Map(lambda written: written["entry"]["name"])
        )
        assert_that(entries, equal_to([shard_format.shard_name(i, num_shards) for i in range(2)]))
    total = 0
    for i in range(num_shards):
        table = shard_format.open_shard(str(tmp_path / "out" / shard_format.shard_name(i, 2)))
        validate.check_rows(
            *validate.table_columns(table), vocab_size=len(VOCAB), max_seq_length=16
        )
        total += table.num_rows
        assert table.num_rows > 0 and isinstance(table, pa.Table)
    assert total >= 30 * 2


def bucket_sizes_of(batch: TokenizedBatch, num_docs: int, cfg: BuildConfig) -> list[int]:
    return [len(part.doc_ids) for _, part in split_into_buckets(batch, num_docs, cfg)]


def test_buckets_cross_the_shuffle_in_groups_and_make_the_same_rows(tmp_path, monkeypatch):
    """Twenty buckets cross the shuffle as three groups, each bucket whole in one; made
    group by group, the rows are byte for byte those made bucket by bucket, and each
    bucket's size is reported once."""
    monkeypatch.setattr(memory, "MIN_GROUPS", 3)
    cfg = config(tmp_path, bucket_size=3, dupe_factor=2)
    batch = tokenized_bucket(n_docs=300, seed=6)
    buckets = dict(split_into_buckets(batch, 300, cfg))
    assert len(buckets) == 20 and num_groups(300, len(batch.ids), 2, cfg) == 3
    groups = dict(split_into_groups(batch, 300, len(batch.ids), cfg))
    assert sorted(groups) == [0, 1, 2]
    members = {g: {d for d in part.doc_ids} for g, part in groups.items()}
    for part in buckets.values():  # each bucket lies whole in one group
        assert sum(set(part.doc_ids) <= m for m in members.values()) == 1

    def rows(elements) -> bytes:
        blocks = [RowBlock.from_bytes(data) for _, data in elements]
        return RowBlock.concat(blocks).sorted_by_key().to_bytes()

    make = MakeInstances(cfg, 2)
    by_bucket = [x for b in sorted(buckets) for x in make.process((b, [buckets[b]]), VOCAB, 300)]
    by_group = [x for g in sorted(groups) for x in make.process((g, [groups[g]]), VOCAB, 300)]
    (group_rows, group_tagged), (bucket_rows, _) = outputs(by_group), outputs(by_bucket)
    assert rows(group_rows) == rows(bucket_rows)
    sizes = sorted(group_tagged[BUCKET_SIZES])
    assert sizes == sorted(len(part.doc_ids) for part in buckets.values())


def test_groups_grow_with_the_corpus_buckets_faster(tmp_path):
    """The shuffle's keys are groups of about GROUP_BYTES of token ids: at 1 GB of uint16
    ids, ~120 of them where there are ~400,000 buckets of 1,000 documents."""
    cfg = config(tmp_path, bucket_size=1000)
    docs, tokens = 500_000_000, 500_000_000  # 1 GB of uint16 ids in 0.5 billion documents
    assert num_groups(docs, tokens, 2, cfg) == 1_000_000_000 // memory.GROUP_BYTES + 1
    assert num_groups(1_000, 10**9, 2, cfg) == 1  # never more groups than buckets
    assert num_groups(10**6, 10**6, 2, cfg) == memory.MIN_GROUPS  # a small corpus


@pytest.mark.parametrize("joins", [False, True])
def test_batches_cross_a_shuffle_compactly_and_unchanged(joins):
    """Documents and tokenized batches pickle (Beam's coder for them) smaller than their
    parts one by one, and come back equal, lone surrogates and empty batches included."""
    coder = typecoders.registry.get_coder(object)
    words = " ".join(WORDS * 3)  # documents of ~100 kB in all: compressed (from 64 KiB)
    documents = [
        [f"Sentence {i} of document {d}: {words}." for i in range(1 + d % 5)] for d in range(300)
    ]
    documents[7] = ["A lone surrogate \ud800 from a JSON escape.", "Tab\tand NUL\x00 stay."]
    batch = DocumentBatch([content_id(d) for d in documents], documents, ("in/a.txt", 7, 512))
    for value in (batch, DocumentBatch([], [])):
        assert coder.decode(coder.encode(value)) == value
    assert len(coder.encode(batch)) < len(pickle.dumps((batch.doc_ids, batch.documents))) / 2
    broken = DocumentBatch(["x"], [["a\nb"]])  # never made by a reader: pickled as it is
    assert coder.decode(coder.encode(broken)) == broken
    tokenized = tokenized_bucket(n_docs=300, seed=5)
    if joins:
        tokenized = tokenized._replace(
            joins=np.random.default_rng(0).random(len(tokenized.ids)) < 0.5
        )
    back = coder.decode(coder.encode(tokenized))
    assert back.doc_ids == tokenized.doc_ids
    for name in ("ids", "lengths", "counts") + (("joins",) if joins else ()):
        got, want = getattr(back, name), getattr(tokenized, name)
        assert got.dtype == want.dtype and (got == want).all(), name


def test_a_bundles_batches_are_bucketed_together(tmp_path, monkeypatch):
    """Six batches of one bundle give one element per bucket group, not one per batch and
    group (about one per document on a large corpus), with the same documents in each
    group as batch by batch; past HELD_BYTES the held batches are split early."""
    cfg = config(tmp_path, bucket_size=3)
    batch = tokenized_bucket(n_docs=60)
    batches = [batch.take(np.arange(i, i + 10)) for i in range(0, 60, 10)]
    tokens = len(batch.ids)

    def grouped(elements):
        found: dict[int, list[str]] = {}
        for group, part in elements:
            found.setdefault(group, []).extend(part.doc_ids)
        return {group: sorted(ids) for group, ids in found.items()}

    one_by_one = [kv for b in batches for kv in split_into_groups(b, 60, tokens, cfg)]
    assign = AssignBuckets(cfg)
    assign.start_bundle()
    held = [kv for b in batches for kv in assign.process(b, 60, tokens)]
    together = [wv.value for wv in assign.finish_bundle()]
    assert held == []  # all held to the bundle's end
    assert len(together) == len({group for group, _ in together}) < len(one_by_one)
    assert grouped(together) == grouped(one_by_one)

    monkeypatch.setattr(memory, "HELD_BYTES", 1)  # split after every batch
    assign.start_bundle()
    early = [kv for b in batches for kv in assign.process(b, 60, tokens)]
    assert list(assign.finish_bundle()) == [] and grouped(early) == grouped(one_by_one)
