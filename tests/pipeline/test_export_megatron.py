"""``python -m pipeline export --to megatron``, read back by megatron-core's ``IndexedDataset``.

megatron-core imports torch, so it is not in .venv (unpinned it also pulls torch 2.14):
scripts/test.sh runs this file in .venv-readers (scripts/readers.sh: the base install,
megatron-core 0.16.1 and torch 2.13.0 for CPU), where BERT_MEGATRON_TESTS=1 makes a missing package a failure;
elsewhere the tests that need it skip, naming the environment:

    .venv-readers/bin/python -m pytest tests/pipeline/test_export_megatron.py

The expected documents are the pipeline's tokenized documents, made here from the corpus
files with the pipeline's pure functions (pipeline/core/sources.py reads, the build's
tokenizer tokenizes), not with the export's Beam steps: every sentence with a token, in its
document's order; the documents sorted by content id within their part.
"""

import itertools
import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import pytest

from pipeline.beam.export_megatron import part_of
from pipeline.cli.main import main
from pipeline.core.sources import content_id, read_documents
from pipeline.core.vocab import build_tokenizer
from pipeline.shards import megatron_format
from tests.helpers import WORDS, make_corpus

FLAGS = ["--vocab_size", "200", "--max_seq_length", "48", "--num_shards", "3"]
MEGATRON_VENV = (
    "megatron-core ({}) is not in this environment: scripts/test.sh runs these tests in "
    ".venv-readers, which bash scripts/readers.sh makes (megatron-core==0.16.1, torch==2.13.0)"
)


def indexed_dataset():
    """megatron-core's IndexedDataset: skipped without it, failed with BERT_MEGATRON_TESTS=1."""
    try:
        from megatron.core.datasets.indexed_dataset import IndexedDataset
    except ImportError as err:
        if os.environ.get("BERT_MEGATRON_TESTS") == "1":
            pytest.fail(MEGATRON_VENV.format(err))
        pytest.skip(MEGATRON_VENV.format(err))
    return IndexedDataset


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    corpus = make_corpus(tmp_path_factory.mktemp("corpus"), n_docs=90)
    out = tmp_path_factory.mktemp("shards")
    args = ["build", "--input", corpus, "--output", str(out), *FLAGS, "--objective", "mlm"]
    assert main(args) == 0
    return out


def export(shards: Path, out: Path, *args: str) -> int:
    return main(["export", str(shards), "--output", str(out), "--to", "megatron", *args])


def expected_parts(shards: Path) -> list[list[list[list[int]]]]:
    """Each part's documents (lists of sentences' ids), from the corpus the manifest names."""
    manifest = json.loads((shards / "manifest.json").read_text())
    vocab = (shards / "vocab.txt").read_text(encoding="utf-8").split("\n")[:-1]
    tokenizer = build_tokenizer(vocab, manifest["params"]["do_lower_case"], specials_in_text=False)
    documents = []
    for path in sorted(Path(manifest["params"]["input"][0]).parent.glob("*.txt")):
        with open(path, "rb") as f:
            items = read_documents(f, input_format="txt", text_field="text", path=str(path))
            for sentences, reason in items:
                assert reason is None
                ids = [e.ids for e in tokenizer.encode_batch(sentences, add_special_tokens=False)]
                if any(ids):
                    documents.append((content_id(sentences), [s for s in ids if s]))
    assert len(documents) == manifest["stats"]["documents"]
    num_parts = len(manifest["shards"])
    documents.sort()  # by content id (copies: the same sentences)
    parts = [[] for _ in range(num_parts)]
    for part, (_, sentences) in zip(
        part_of([d for d, _ in documents], num_parts), documents, strict=True
    ):
        parts[part].append(sentences)
    return parts


def read_part(dataset) -> list[list[list[int]]]:
    """Megatron's view: document d is sequences document_indices[d] .. [d + 1]."""
    bounds = dataset.document_indices.tolist()
    return [
        [dataset[i].tolist() for i in range(start, stop)]
        for start, stop in itertools.pairwise(bounds)
    ]


def test_indexed_dataset_reads_every_document_and_sentence(built, tmp_path):
    IndexedDataset = indexed_dataset()
    assert export(built, tmp_path / "meg") == 0
    parts = expected_parts(built)
    assert sum(map(len, parts)) == 90 and all(parts)
    for index, documents in enumerate(parts):
        prefix = str(tmp_path / "meg" / megatron_format.part_prefix(index, len(parts)))
        dataset = IndexedDataset(prefix)
        assert dataset[0].dtype == np.uint16  # Megatron's optimal_dtype for 200 ids
        assert read_part(dataset) == documents
        assert len(dataset) == sum(map(len, documents))


def test_the_export_is_a_function_of_the_documents(built, tmp_path):
    """Byte-identical run to run, and from the same documents in other files (--input)."""
    assert export(built, tmp_path / "a") == 0
    moved = tmp_path / "elsewhere"
    corpus = Path(json.loads((built / "manifest.json").read_text())["params"]["input"][0]).parent
    text = "".join(p.read_text() for p in sorted(corpus.glob("*.txt")))
    moved.mkdir()
    docs = text.split("\n\n")
    (moved / "one.txt").write_text("\n\n".join(reversed(docs[:-1])) + "\n\n")
    assert export(built, tmp_path / "b", "--input", str(moved / "one.txt")) == 0
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert len(names) == 2 * 3 + 2  # 3 parts, vocab.txt, manifest.json
    for name in names:
        if name != "manifest.json":  # it records the input, which differs
            assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


@pytest.mark.slow
def test_workers_in_parallel_write_the_same_bytes(built, tmp_path):
    assert export(built, tmp_path / "one") == 0
    workers = ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]
    assert export(built, tmp_path / "two", *workers) == 0
    for path in sorted((tmp_path / "one").iterdir()):
        assert path.read_bytes() == (tmp_path / "two" / path.name).read_bytes(), path.name


def test_a_changed_corpus_fails_and_leaves_nothing(built, tmp_path, capfd):
    corpus = Path(json.loads((built / "manifest.json").read_text())["params"]["input"][0]).parent
    fewer = tmp_path / "fewer"
    shutil.copytree(corpus, fewer)
    sorted(fewer.glob("*.txt"))[0].unlink()
    assert export(built, tmp_path / "meg", "--input", str(fewer / "*.txt")) == 1
    assert "documents, the shards' build 90" in capfd.readouterr().err
    assert not list((tmp_path / "meg").iterdir())
    assert export(built, tmp_path / "x", "--input", str(tmp_path / "none*.txt")) == 2
    assert "matched no file" in capfd.readouterr().err


def test_a_jsonl_build_is_re_read_with_its_format_and_text_field(tmp_path):
    """The manifest's input_format and text_field reach the re-read: read as txt, or with
    the default field "text", the corpus would give other documents, and the job fail."""
    rng = random.Random(3)
    lines = []
    for _ in range(30):
        sentences = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))) + "."]
        sentences *= rng.randint(1, 5)
        lines.append(json.dumps({"body": " ".join(sentences).capitalize(), "text": "x"}))
    (tmp_path / "docs.jsonl").write_text("\n".join(lines) + "\n")
    shards = tmp_path / "shards"
    flags = ["--input", str(tmp_path / "docs.jsonl"), "--text_field", "body", "--objective", "mlm"]
    assert main(["build", *flags, "--output", str(shards), *FLAGS]) == 0
    assert export(shards, tmp_path / "meg") == 0
    manifest = json.loads((tmp_path / "meg" / "manifest.json").read_text())
    assert manifest["megatron"]["documents"] == 30
    tokens = sum(f.get("tokens", 0) for f in manifest["files"])
    assert tokens > 30 * 5  # the bodies, not the one-word "text" field


def test_index_bytes_known_answer():
    """One document of two sentences of 2 and 3 uint16 tokens, as Megatron's _IndexWriter
    writes it: magic, version 1, dtype code 8, S 2, D + 1 = 2, lengths, pointers, ends."""
    data = megatron_format.index_bytes(np.array([2, 3]), np.array([2]), np.dtype(np.uint16))
    assert data == (
        b"MMIDIDX\x00\x00"
        + (1).to_bytes(8, "little")
        + bytes([8])
        + (2).to_bytes(8, "little")
        + (2).to_bytes(8, "little")
        + np.array([2, 3], "<i4").tobytes()
        + np.array([0, 4], "<i8").tobytes()
        + np.array([0, 2], "<i8").tobytes()
    )
    index = megatron_format.read_index(data)
    assert index["document_indices"].tolist() == [0, 2]
    assert megatron_format.token_dtype(65499) == np.uint16
    assert megatron_format.token_dtype(65500) == np.int32
    with pytest.raises(ValueError, match="do not split"):
        megatron_format.index_bytes(np.array([2, 3]), np.array([1]), np.dtype(np.uint16))
