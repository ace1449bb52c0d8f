from pipeline.corpus import document_sentences, write_corpus
from pipeline.text import iter_txt_documents


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
