"""Text to documents, sentences and words: the pure functions under the pipeline.

Three jobs, all deterministic and download-free:

* ``basic_tokenize`` -- BERT's basic tokenization, done by the very
  ``tokenizers`` components the WordPiece tokenizer uses (``BertNormalizer`` +
  ``BertPreTokenizer``), so the words the vocab learner counts are exactly the
  words WordPiece later splits::

      basic_tokenize("Héllo, WORLD!", do_lower_case=True)  # ['hello', ',', 'world', '!']

* ``iter_txt_documents`` -- Google's txt convention: one sentence per line, a
  blank line between documents.
* ``split_sentences`` -- a rule-based sentence splitter for JSONL/Parquet
  records, where a record is one document of running text.

Counting the words of a corpus (what the Beam combiner does per bundle)::

    counts = collections.Counter()
    for sentence in sentences:
        counts.update(basic_tokenize(sentence, do_lower_case=True))

There is no batch variant of ``basic_tokenize``: normalizing and
pre-tokenizing many sentences joined into one string is no faster than one call
per sentence -- the cost is the work, not the call.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Iterator

from tokenizers import normalizers, pre_tokenizers

__all__ = ["basic_tokenize", "iter_txt_documents", "split_sentences"]


@functools.cache
def _normalizer(do_lower_case: bool) -> normalizers.Normalizer:
    """BERT's normalizer, built once per casing (``strip_accents=None`` follows
    ``lowercase``, as in Google's BERT: uncased strips accents, cased keeps them)."""
    return normalizers.BertNormalizer(
        clean_text=True,
        handle_chinese_chars=True,
        strip_accents=None,
        lowercase=do_lower_case,
    )


@functools.cache
def _pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    """BERT's pre-tokenizer (split on whitespace, isolate punctuation), built once."""
    return pre_tokenizers.BertPreTokenizer()


def basic_tokenize(text: str, do_lower_case: bool) -> list[str]:
    """Splits text into BERT's basic-tokenizer words (what WordPiece sees).

    Steps (those of ``BertNormalizer`` then ``BertPreTokenizer``): drop NUL,
    U+FFFD and control characters; map whitespace (tabs, newlines, Unicode
    spaces) to spaces; put spaces around CJK ideographs; when
    ``do_lower_case``, lowercase and strip accents (NFD, drop combining marks);
    split on whitespace; make every punctuation character a word of its own.
    Emoji and other symbols are neither, so they stay inside their word.
    Lowercasing is per character, as in ``tokenizers`` (a final Greek capital
    sigma becomes ``σ``; Python's ``str.lower`` in the slow ``BasicTokenizer``
    gives ``ς``): we match what ``BertTokenizerFast`` sees.

    Worked examples::

        basic_tokenize("Héllo, WORLD!", True)    -> ['hello', ',', 'world', '!']
        basic_tokenize("Héllo, WORLD!", False)   -> ['Héllo', ',', 'WORLD', '!']
        basic_tokenize("a\\x00b\\tc\\ufffd", True) -> ['ab', 'c']
        basic_tokenize("我爱NLP", True)           -> ['我', '爱', 'nlp']
        basic_tokenize("don't", True)            -> ['don', "'", 't']
        basic_tokenize("hi😀!", True)             -> ['hi😀', '!']

    Args:
        text: a ``str`` of any length (a sentence, usually).
        do_lower_case: ``True`` for an uncased model (lowercase + strip
            accents), ``False`` for a cased one.

    Returns:
        The words, a ``list[str]`` (empty when ``text`` has none); no word is
        empty or contains whitespace.

    Raises:
        TypeError: ``text`` is not a ``str`` or ``do_lower_case`` not a ``bool``.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if not isinstance(do_lower_case, bool):
        raise TypeError(f"do_lower_case must be a bool, got {do_lower_case!r}")
    normalized = _normalizer(do_lower_case).normalize_str(text)
    return [word for word, _ in _pre_tokenizer().pre_tokenize_str(normalized)]


def iter_txt_documents(lines: Iterable[str]) -> Iterator[list[str]]:
    """Groups lines into documents by Google's txt convention.

    One sentence per line; a blank (whitespace-only) line ends a document.
    Lines are stripped (``str.strip``, as ``create_pretraining_data.py`` does);
    runs of blank lines and a missing final blank line are fine; empty
    documents are not yielded. Lines that tokenize to nothing (``"\\x00"``) are
    kept here and dropped after tokenization, as Google's script does.

    Worked example::

        ["A.\\n", "B.\\n", "\\n", "  \\n", "C.\\n"] -> ["A.", "B."], ["C."]

    Args:
        lines: the file's lines (``str``, trailing newlines allowed), lazily.

    Yields:
        Each document as a non-empty ``list[str]`` of stripped sentences.

    Raises:
        TypeError: a line is not a ``str`` (e.g. a file opened in binary mode).
    """
    document: list[str] = []
    for line in lines:
        if not isinstance(line, str):
            raise TypeError(f"lines must be str, got {type(line).__name__}; open files as text")
        sentence = line.strip()
        if sentence:
            document.append(sentence)
        elif document:
            yield document
            document = []
    if document:
        yield document


# Sentence splitting. A candidate end is ".", "!" or "?" (any run of them),
# then closing quotes/brackets, then whitespace, then the next sentence's first
# character. CJK full stops end a sentence with or without whitespace.
_LATIN_END = re.compile(r"[.!?]+[\"'”’»)\]}]*(?=\s+(\S))")
_CJK_END = re.compile(r"[。！？]+[」』”’）》】〕]*")
_OPENERS = frozenset("\"'“‘«([{¿¡")
# Words before a "." (lowercased) that do not end a sentence: always, and
# only when a number follows ("No. 5", "Fig. 3", "Jan. 2020" -- but "say no. We").
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof sr jr st mt rev hon gov sen rep gen col capt lt sgt "
    "vs etc cf al approx dept est inc ltd co corp bros".split()
)
_NUMBER_ABBREVIATIONS = frozenset(
    "no nos vol vols pp ch sec fig figs eq eqs art "
    "jan feb mar apr jun jul aug sep sept oct nov dec".split()
)
# Initialisms with inner dots ("U.S", "e.g", "i.e", "a.m", "Ph.D").
_INITIALISM = re.compile(r"(?:[^\W\d_]{1,2}\.)+[^\W\d_]{1,2}")
_LEADING_OPENERS = "\"'“‘«([{"
_CLOSERS = "\"'”’»)]}"


def _is_abbreviation(line: str, dot: int, next_char: str) -> bool:
    """Whether the "." at ``line[dot]`` closes an abbreviation, not a sentence.

    The word before the dot (leading quotes/brackets removed) is an
    abbreviation when it is in ``_ABBREVIATIONS`` (any case), in
    ``_NUMBER_ABBREVIATIONS`` and ``next_char`` is a digit, an initialism with
    inner dots, or a single letter ("J. Smith"). Examples: ``"Dr."``,
    ``"e.g."``, ``"U.S."``, ``"J."`` -> True; ``"dog."``, ``"2020."`` -> False.
    """
    # Abbreviations are short: look back a bounded window, so a 1 MB line with
    # many sentences stays linear.
    before = line[max(0, dot - 32) : dot].split()
    word = before[-1].lstrip(_LEADING_OPENERS) if before else ""
    if len(word) == 1:
        return word.isalpha()
    lowered = word.lower()
    if lowered in _ABBREVIATIONS or (lowered in _NUMBER_ABBREVIATIONS and next_char.isdigit()):
        return True
    return _INITIALISM.fullmatch(word) is not None


def _starts_sentence(char: str) -> bool:
    """Whether ``char`` may begin a sentence: uppercase, digit, opening quote/bracket."""
    return char.isupper() or char.istitle() or char.isdigit() or char in _OPENERS


def _sentence_ends(line: str) -> list[int]:
    """Offsets just past each sentence end in a single line, in order."""
    ends = [m.end() for m in _CJK_END.finditer(line)]
    for m in _LATIN_END.finditer(line):
        next_char = m.group(1)
        if not _starts_sentence(next_char):
            continue
        single_dot = m.group(0).rstrip(_CLOSERS) == "."
        if single_dot and _is_abbreviation(line, m.start(), next_char):
            continue
        ends.append(m.end())
    return sorted(set(ends))


def split_sentences(text: str) -> list[str]:
    """Splits one document of running text into sentences, by rule.

    Rules, in order:

    1. Every line break ends a sentence (``str.splitlines``: paragraphs,
       headings and list items in web text are lines without final
       punctuation). Hard-wrapped text should be unwrapped before.
    2. Within a line, a sentence ends after a run of ``.!?`` plus any closing
       quotes/brackets (``" ' ” ’ » ) ] }``) when whitespace follows and then
       an uppercase letter, a digit, or an opening quote/bracket.
    3. ...except when the run is a single ``.`` closing an abbreviation: a
       title or common one (Mr. Mrs. Dr. Prof. St. vs. etc. cf. al. Inc. ...),
       one that precedes a number (No. Fig. Vol. pp. Jan. ... -- "No. 5" but
       not "say no. We"), an initialism (e.g. i.e. U.S. a.m. Ph.D.) or a
       single letter ("J. Smith"). So "in the U.S. The" is not split: the
       usual trade-off of a rule-based splitter.
    4. CJK full stops ``。！？`` (plus closing ``」』”’）》】〕``) end a sentence
       with or without whitespace after them.

    Sentences are stripped; empty ones are dropped. Pure and deterministic.

    Worked examples::

        "Hi there. How are you?  Fine!"  -> ['Hi there.', 'How are you?', 'Fine!']
        "Dr. Smith met J. Doe, i.e. him." -> ['Dr. Smith met J. Doe, i.e. him.']
        'He said "Stop." Then he left.'  -> ['He said "Stop."', 'Then he left.']
        "It costs 3.50 dollars. ok then." -> ['It costs 3.50 dollars. ok then.']
        "Title\\n\\nFirst line. Second."   -> ['Title', 'First line.', 'Second.']
        "今天很好。我们走吧！"             -> ['今天很好。', '我们走吧！']

    Args:
        text: one document (``str``), e.g. a JSONL record's text field.

    Returns:
        The sentences, a ``list[str]`` in document order (empty for blank text).

    Raises:
        TypeError: ``text`` is not a ``str``.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    sentences = []
    for line in text.splitlines():
        start = 0
        for end in [*_sentence_ends(line), len(line)]:
            sentence = line[start:end].strip()
            if sentence:
                sentences.append(sentence)
            start = end
    return sentences
