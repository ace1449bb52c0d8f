import pytest

from pipeline.cli.corpus import comment_blocks, document_sentences, write_corpus
from pipeline.core.text import iter_txt_documents


def test_corpus_is_deterministic_and_in_googles_format(tmp_path):
    a = write_corpus(tmp_path / "a", max_bytes=200_000, files=2)
    b = write_corpus(tmp_path / "b", max_bytes=200_000, files=2)
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]
    lines = a[0].read_text(encoding="utf-8").splitlines()
    docs = list(iter_txt_documents(lines))
    assert len(docs) > 20 and all(len(d) >= 2 for d in docs)
    assert sum(p.stat().st_size for p in a) >= 200_000


def test_document_sentences_drops_doctests():
    doc = "Add two numbers. Returns their sum.\n\n>>> add(1, 2)\n3\n\nWorks on floats too."
    assert document_sentences(doc) == [
        "Add two numbers.", "Returns their sum.", "Works on floats too.",
    ]  # fmt: skip


def test_comment_blocks_keep_prose_and_drop_code():
    source = (
        "# Walk the tree once.\n# Then return.\nx = 1\n"
        "# y = f(x) + 2 if z else g(w)\n"
        "def f():\n    # Each node is visited\n    # before its children.\n    pass\n"
    )
    blocks = comment_blocks(source, min_words=4)
    assert blocks == [
        "Walk the tree once. Then return.",
        "Each node is visited before its children.",
    ]
    assert comment_blocks(source, min_words=8) == []  # both blocks are shorter


def test_corpus_sources_are_chosen_and_checked(tmp_path):
    only_reference = write_corpus(tmp_path / "r", files=1, sources=["reference"])
    text = only_reference[0].read_text(encoding="utf-8")
    everything = write_corpus(tmp_path / "all", max_bytes=len(text) * 2, files=1)
    assert everything[0].read_text(encoding="utf-8") != text
    with pytest.raises(ValueError, match="unknown corpus source"):
        write_corpus(tmp_path / "x", sources=["tweets"])
