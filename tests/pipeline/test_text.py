"""Known answers for pipeline/core/text.py, and parity of basic_tokenize with BERT's BasicTokenizer."""

import time

import pytest

from pipeline.core.text import basic_tokenize, iter_txt_documents, split_sentences

# ---------------------------------------------------------------- basic_tokenize


@pytest.mark.parametrize(
    ("text", "uncased", "cased"),
    [
        ("Héllo, WORLD!", ["hello", ",", "world", "!"], ["Héllo", ",", "WORLD", "!"]),
        ("Ångström façade naïve", ["angstrom", "facade", "naive"], ["Ångström", "façade", "naïve"]),
        ("我爱NLP。", ["我", "爱", "nlp", "。"], ["我", "爱", "NLP", "。"]),
        ("don't stop---now?!", ["don", "'", "t", "stop", "-", "-", "-", "now", "?", "!"], None),
        ("$5 #tag a+b=c", ["$", "5", "#", "tag", "a", "+", "b", "=", "c"], None),
        ("a\x00b \ufffdc", ["ab", "c"], None),  # NUL and U+FFFD dropped, not split on
        ("\x1b[31mred", ["[", "31mred"], None),  # ESC is a control character
        ("tab\there\nnew\r\nline\u3000x\u00a0y", ["tab", "here", "new", "line", "x", "y"], None),
        ("soft\u00adhyphen", ["softhyphen"], None),  # format character (Cf) dropped
        ("hi😀! 👍🏽x", ["hi😀", "!", "👍🏽x"], None),  # emoji are symbols, not punctuation
        ("ΟΔΟΣ", ["οδοσ"], ["ΟΔΟΣ"]),  # per-character lowercasing, as in tokenizers
        ("", [], []),
        (" \t\n ", [], []),
    ],
)
def test_basic_tokenize_known_answers(text, uncased, cased):
    assert basic_tokenize(text, do_lower_case=True) == uncased
    assert basic_tokenize(text, do_lower_case=False) == (uncased if cased is None else cased)


PARITY_TEXTS = [
    "Héllo, WORLD! Ångström façade naïve",
    "a\x00b\tc\ufffd d\x1b[0m",
    "我爱NLP。日本語とカタカナ 한국어 𠀀𪜀",
    "don't stop---now?! «quote» „de“ (x) [y] {z}",
    "hi😀! 👍🏽x \u2028 a\u2029b",
    "İstanbul ß ﬁ x\u0301y soft\u00adhyphen zero\u200bwidth",
    "$100 5% #tag @me a+b=c ~x^y `code` a_b",
]


@pytest.mark.parametrize("do_lower_case", [True, False])
def test_basic_tokenize_matches_bert_basic_tokenizer(do_lower_case):
    legacy = pytest.importorskip(
        "transformers.models.bert.tokenization_bert_legacy",
        reason="parity with Hugging Face's BERT tokenizer (transformers, in the test extra)",
    )
    reference = legacy.BasicTokenizer(do_lower_case=do_lower_case)
    for text in PARITY_TEXTS:
        assert basic_tokenize(text, do_lower_case) == reference.tokenize(text), text


def test_basic_tokenize_rejects_wrong_types():
    with pytest.raises(TypeError, match="text"):
        basic_tokenize(b"bytes", True)
    with pytest.raises(TypeError, match="do_lower_case"):
        basic_tokenize("x", "false")


# ---------------------------------------------------------------- iter_txt_documents


def test_iter_txt_documents_google_convention():
    lines = ["\n", "A.\n", "  B.  \n", "\n", " \t\n", "\n", "C.\n", "\x00\n", "D."]
    assert list(iter_txt_documents(lines)) == [["A.", "B."], ["C.", "\x00", "D."]]


def test_iter_txt_documents_edge_cases():
    assert list(iter_txt_documents([])) == []
    assert list(iter_txt_documents(["\n", "   ", "\t\n"])) == []
    assert list(iter_txt_documents(["one"])) == [["one"]]
    assert list(iter_txt_documents(["a\n", "\n", "b\n", "\n"])) == [["a"], ["b"]]


def test_iter_txt_documents_reads_a_file_lazily(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("First doc.\nSecond line.\n\nSecond doc.\n", encoding="utf-8")
    with open(path, encoding="utf-8") as f:
        documents = iter_txt_documents(f)
        assert next(documents) == ["First doc.", "Second line."]
        assert next(documents) == ["Second doc."]
        assert next(documents, None) is None
    with open(path, "rb") as f, pytest.raises(TypeError, match="open files as text"):
        list(iter_txt_documents(f))


# ---------------------------------------------------------------- split_sentences


@pytest.mark.parametrize(
    ("text", "sentences"),
    [
        ("Hi there. How are you?  Fine!", ["Hi there.", "How are you?", "Fine!"]),
        ("Dr. Smith met Mrs. Jones.", ["Dr. Smith met Mrs. Jones."]),
        ("He met J. Doe. She did not.", ["He met J. Doe.", "She did not."]),
        ("Use tools, e.g. Hammers. Or i.e. This.", ["Use tools, e.g. Hammers.", "Or i.e. This."]),
        ("He lives in the U.S. Army base.", ["He lives in the U.S. Army base."]),
        ("Apples, pears etc. Were sold. Fine.", ["Apples, pears etc. Were sold.", "Fine."]),
        ("See No. 5 today. I said no. We left.", ["See No. 5 today.", "I said no.", "We left."]),
        ("Cats vs. Dogs. Next.", ["Cats vs. Dogs.", "Next."]),
        ('He said "Stop." Then he left.', ['He said "Stop."', "Then he left."]),
        ("(It was late.) So we went home.", ["(It was late.)", "So we went home."]),
        ('Done. "Really?" she asked.', ["Done.", '"Really?" she asked.']),
        ("It costs 3.50 dollars. ok then.", ["It costs 3.50 dollars. ok then."]),
        ("Visit example.com today. 42 people did.", ["Visit example.com today.", "42 people did."]),
        ("Wait... What?! Yes.", ["Wait...", "What?!", "Yes."]),
        ("C'est fini. École demain.", ["C'est fini.", "École demain."]),
        (
            "Title\n\nFirst line. Second.\nItem one\n",
            ["Title", "First line.", "Second.", "Item one"],
        ),
        ("今天很好。我们走吧！你呢？", ["今天很好。", "我们走吧！", "你呢？"]),
        ("他说：「好。」然后走了。", ["他说：「好。」", "然后走了。"]),
        ("Mixed 文本。Then English. End", ["Mixed 文本。", "Then English.", "End"]),
        ("", []),
        ("  \n\n \t ", []),
    ],
)
def test_split_sentences_known_answers(text, sentences):
    assert split_sentences(text) == sentences


def test_split_sentences_is_fast_on_one_long_line():
    text = "This is a sentence, e.g. with Dr. Who in it. " * 20_000  # ~0.9 MB, no newline
    started = time.perf_counter()
    sentences = split_sentences(text)
    assert time.perf_counter() - started < 2.0
    assert sentences == ["This is a sentence, e.g. with Dr. Who in it."] * 20_000


def test_split_sentences_rejects_non_str():
    with pytest.raises(TypeError, match="text"):
        split_sentences(None)
