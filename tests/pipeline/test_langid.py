"""Language identification (pipeline/core/langid.py): known languages, no-letter text, and
the error that names the extra when py3langid is missing."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from pipeline.core import langid

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "chinese" / "sample.jsonl"
ENGLISH = (
    "The committee met on Tuesday to discuss the budget for the coming year. Several "
    "members argued that the library needed new computers and longer opening hours."
)
GERMAN = (
    "Die Stadtverwaltung hat am Dienstag beschlossen, die Bibliothek länger zu öffnen. "
    "Viele Bürger hatten sich das seit Jahren gewünscht."
)

needs_py3langid = pytest.mark.skipif(
    importlib.util.find_spec("py3langid") is None,
    reason="py3langid is not installed: pip install 'bert-pipeline[curate]'",
)


@needs_py3langid
@pytest.mark.parametrize("text,language", [(ENGLISH, "en"), (GERMAN, "de")])
def test_detects_english_and_german(text, language):
    found, score = langid.detect(text)
    assert found == language
    assert 0.9 < score <= 1.0


@needs_py3langid
def test_detects_every_chinese_sample_document():
    docs = [json.loads(line)["text"] for line in SAMPLE.read_text(encoding="utf-8").splitlines()]
    results = [langid.detect(doc) for doc in docs]
    assert {language for language, _ in results} == {"zh"}
    # the lowest, 0.79, is the document with the Latin words BERT and Transformer
    assert min(score for _, score in results) > 0.75
    assert sorted(score for _, score in results)[1] > 0.9


@needs_py3langid
def test_text_without_letters_is_undetermined():
    assert langid.detect("1234 !! 😀") == ("und", 0.0)
    with pytest.raises(TypeError):
        langid.detect(b"bytes")


def test_missing_package_names_the_extra(monkeypatch):
    langid._identifier.cache_clear()
    monkeypatch.setitem(sys.modules, "py3langid", None)  # makes the import fail
    monkeypatch.setitem(sys.modules, "py3langid.langid", None)
    try:
        with pytest.raises(ImportError, match=r"pip install 'bert-pipeline\[curate\]'"):
            langid.detect(ENGLISH)
    finally:
        langid._identifier.cache_clear()
