"""``python -m pipeline export SHARDS_DIR --to megatron``: the build's tokenized documents as
Megatron-LM indexed datasets (``part-00003-of-00008_text_sentence.bin``/``.idx``).

    python -m pipeline export shards/ --to megatron --output megatron/
    python -m pipeline export shards/ --to megatron --output megatron/ --input 'corpus/*.txt'

Megatron's BERT dataset makes its own sentence pairs and masks from documents of sentences
(pipeline/shards/megatron_format.py), so this export writes documents, not rows. The shards
cannot give them back: their rows are packed or paired, shuffled across shards, and masked.
So the job re-reads the corpus with the build's own steps (``ReadCorpus`` and ``Tokenize`` of
pipeline/beam/build.py and document_steps.py), configured from the shards' manifest: its
``params.input`` (or ``--input``), ``input_format``, ``text_field`` and ``do_lower_case``, and
its ``vocab.txt`` (checked against the manifest's sha256). Each sentence the build tokenized
(the empty ones dropped, as it drops them) is one sequence; documents keep their sentences'
order. The documents are the build's exactly: the job fails when their count differs from
the manifest's ``stats.documents`` (the input changed, or ``--input`` names other files).

Parts: a document goes to part ``int(content id[:8], 16) % parts`` (``parts`` = the shards'
count), and within a part documents are sorted by content id (copies of a document are the
same bytes), so the output is a function of the documents alone, like the shards. A part is
written by one worker, atomically, with every part in parallel; memory: one part's token ids
(2 bytes a token at vocabs under 65,500) and its documents' ids.
"""

from __future__ import annotations

import dataclasses
import hashlib

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from pipeline.beam.build import ReadCorpus, make_plan
from pipeline.beam.config import BuildConfig
from pipeline.beam.document_steps import COUNTS, Tokenize, TokenizedBatch
from pipeline.beam.shard_steps import write_atomic
from pipeline.core.vocab import parse_vocab
from pipeline.shards import megatron_format, shard_format


@dataclasses.dataclass(frozen=True)
class MegatronPlan:
    """What the driver settles before the job: the build's reading, its vocab, the parts."""

    build: BuildConfig  # the build's reading and tokenizing options
    read_plan: object  # build.Plan: the corpus's files in byte ranges
    vocab: list[str]
    num_parts: int
    documents: int | None  # the build's stats.documents, to check against


def make_megatron_plan(config, manifest: dict) -> MegatronPlan:
    """The build's corpus and tokenizer, from its manifest (``config``: an ExportConfig).

    Raises:
        FileNotFoundError: the corpus (params.input or --input) matches no file.
        ShardFormatError: vocab.txt differs from the manifest's sha256.
        ValueError: the manifest lacks the build's input, or the input's format is wrong.
    """
    params = manifest["params"]
    patterns = config.input or tuple(params.get("input") or ())
    if not patterns:
        raise ValueError(f"{config.source}'s manifest has no params.input: pass --input")
    vocab_path = shard_format.join_path(config.source, manifest["vocab"]["file"])
    data = shard_format.read_bytes(vocab_path)
    if hashlib.sha256(data).hexdigest() != manifest["vocab"]["sha256"]:
        raise shard_format.ShardFormatError(
            f"{vocab_path} has another sha256 than its {shard_format.MANIFEST_NAME} says"
        )
    vocab = parse_vocab(data.decode("utf-8"), vocab_path)
    build = BuildConfig(
        input=tuple(patterns),
        output=config.output,
        input_format=params.get("input_format", "auto"),
        text_field=params.get("text_field", "text"),
        do_lower_case=manifest["vocab"]["do_lower_case"],
        vocab_size=len(vocab),
        num_shards=len(manifest["shards"]),  # the parts (build.make_plan logs it as shards)
    )
    try:
        read_plan = make_plan(build)
    except FileNotFoundError as err:
        if config.input:
            raise
        raise FileNotFoundError(
            f"{err}: that is the build's params.input, as given to it (a relative path is "
            "relative to where the build ran); pass --input to name the corpus"
        ) from None
    return MegatronPlan(
        build,
        read_plan,
        vocab,
        len(manifest["shards"]),
        manifest.get("stats", {}).get("documents"),
    )


def part_of(doc_ids: list[str], num_parts: int) -> np.ndarray:
    """Each document's part, from its content id (hex): ``part_of(["0000000a..."], 4) -> [2]``."""
    return np.array([int(d[:8], 16) % num_parts for d in doc_ids], dtype=np.int64)


def split_parts(batch: TokenizedBatch, num_parts: int):
    """A TokenizedBatch -> (part, its documents of that part) for each part it touches."""
    parts = part_of(batch.doc_ids, num_parts)
    for part in np.unique(parts).tolist():
        yield part, batch.take(np.flatnonzero(parts == part))


def part_files(part: int, batches: list[TokenizedBatch], plan: MegatronPlan) -> dict:
    """One part's documents, sorted by content id, as (.bin, .idx) bytes and its counts."""
    docs = TokenizedBatch.concat(batches)
    docs = docs.take(np.argsort(np.array(docs.doc_ids), kind="stable"))
    data, index = megatron_format.dataset_bytes(
        docs.ids, docs.lengths, docs.counts, len(plan.vocab)
    )
    return {
        "bin": data,
        "idx": index,
        "documents": len(docs.doc_ids),
        "sentences": len(docs.lengths),
        "tokens": len(docs.ids),
    }


def write_part(part: int, files: dict, plan: MegatronPlan, output: str) -> list[dict]:
    """Write one part's files atomically; returns their manifest entries."""
    prefix = megatron_format.part_prefix(part, plan.num_parts)
    entries = []
    for ext in ("bin", "idx"):
        name = f"{prefix}.{ext}"
        size, sha256 = write_atomic(FileSystems.join(output, name), files[ext])
        entry = {"name": name, "bytes": size, "sha256": sha256}
        if ext == "bin":
            entry |= {key: files[key] for key in ("documents", "sentences", "tokens")}
        entries.append(entry)
    return entries


class WritePart(beam.DoFn):
    """(part, TokenizedBatches) -> the part's two file entries (after writing them)."""

    def __init__(self, plan: MegatronPlan, output: str):
        self._plan, self._output = plan, output
        self._documents = Metrics.counter("export", "documents")

    def process(self, element):
        part, batches = element
        files = part_files(part, list(batches), self._plan)
        self._documents.inc(files["documents"])
        yield from write_part(part, files, self._plan, self._output)


def empty_parts(entries: list[dict], plan: MegatronPlan, output: str) -> list[dict]:
    """Write the parts no document fell into (empty datasets), so every part exists;
    returns their entries."""
    written = {e["name"] for e in entries}
    empty = {"bin": b"", "documents": 0, "sentences": 0, "tokens": 0}
    empty["idx"] = megatron_format.index_bytes(
        np.zeros(0, np.int64), np.zeros(0, np.int64), megatron_format.token_dtype(len(plan.vocab))
    )
    out = []
    for part in range(plan.num_parts):
        if f"{megatron_format.part_prefix(part, plan.num_parts)}.bin" not in written:
            out += write_part(part, empty, plan, output)
    return out


def check_documents(entries: list[dict], plan: MegatronPlan) -> None:
    """The corpus gave the build's documents, as many as its manifest counts.

    Raises:
        ValueError: another number (names both, and what to check).
    """
    documents = sum(e.get("documents", 0) for e in entries)
    if plan.documents is not None and documents != plan.documents:
        raise ValueError(
            f"the corpus {list(plan.build.input)} gave {documents} documents, the shards' build "
            f"{plan.documents} (manifest stats.documents): it changed since the build, or "
            "--input names other files"
        )


def fields(plan: MegatronPlan) -> dict:
    """The export manifest's ``fields``: the sequences' dtype and what a sequence is."""
    return {
        "sequence": "one sentence's WordPiece ids, no special tokens",
        "dtype": megatron_format.token_dtype(len(plan.vocab)).name,
        "document_indices": "where each document's sentences end",
    }


class ExportDocuments(beam.PTransform):
    """The build's corpus -> each Megatron part's file entries (after writing them):
    ReadCorpus -> Tokenize -> SplitParts -> GroupParts -> WriteParts."""

    def __init__(self, plan: MegatronPlan, output: str):
        super().__init__()
        self._plan, self._output = plan, output

    def expand(self, pbegin):
        plan = self._plan
        documents, _ = pbegin | "ReadCorpus" >> ReadCorpus(plan.build, plan.read_plan)
        tokenize = Tokenize(plan.build.do_lower_case, plan.build.tokenizer_threads)
        tokenized = documents | "Tokenize" >> beam.ParDo(tokenize, vocab=plan.vocab).with_outputs(
            COUNTS, main="batches"
        )
        return (
            tokenized.batches
            | "SplitParts" >> beam.FlatMap(split_parts, plan.num_parts)
            | "GroupParts" >> beam.GroupByKey()
            | "WriteParts" >> beam.ParDo(WritePart(plan, self._output))
        )
