"""Quality rules for curation: Gopher quality and repetition, C4 and FineWeb, with datatrove's
defaults. Pure functions; ``pipeline/beam/curate*.py`` maps :func:`apply_filters` over
documents and counts each returned rule name.

Each rule set follows its datatrove filter as released in datatrove 0.10.1
(``datatrove.pipeline.filters``: ``GopherQualityFilter``, ``GopherRepetitionFilter``,
``C4QualityFilter``, ``FineWebQualityFilter``): the same thresholds, the same order (the
first rule that fails names the removal), the same arithmetic, the same comparisons (``<``
or ``<=``), and its ``empty`` reasons. Where we differ, and why:

* **Words.** datatrove 0.10.1 runs a per-language tokenizer (spaCy's rule-based tokenizer
  for English, with jieba for Chinese, with SudachiPy for Japanese). We need neither spaCy
  nor a model: :func:`tokens` is a regex version of spaCy's English rules where a count
  depends on them, and the four rule sets run several times faster than datatrove's (one
  process each; docs/results.md, "Curation"). Punctuation and symbols are tokens of one
  character (``...`` and ``--`` one each); a run of letters and digits with inner
  punctuation is a word (``3.5``, ``self._data``), split where spaCy's infixes split it
  (``user-specified`` -> ``user - specified``, ``torch.nn.Module`` -> ``torch.nn . Module``)
  and its contractions (``don't`` -> ``do n't``); a URL, ``e.g.`` or ``x.`` is one token;
  a leading ``-``, ``--``, ``@`` or ``.`` stays on its word (``--input``, ``.metadata``).
  On the main job's 12,064 documents the decisions of each rule set alone agree with
  datatrove's (spaCy's words) on 98.98% (Gopher quality), 99.77% (repetition), 99.96% (C4)
  and 100% (FineWeb) of documents (``bench/curate_vs_datatrove.py --filters_agreement``);
  the rest are code and math pages at the 80% alphabetic-words line, where one of spaCy's
  finer rules (TeX markup kept whole, ``):`` one token) tips the ratio. Each CJK ideograph
  or kana is a word (the rule of ``pipeline.core.dedup.words``), so a Chinese document of 80
  characters has about 70 words, not 1 (``str.split``) and not 40 (jieba, which would fail
  Gopher's 50-word minimum on most paragraphs). C4 splits lines with ``str.split`` in
  datatrove; we use the same words there, so a Chinese line has more than 3 words.
* **Mean word length** (Gopher, 3 to 10) is measured on the words that are not CJK
  characters, and only when they are at least half of the words: a character of Chinese is
  one word of length 1, and the rule would drop every Chinese page.
* **Stop words** (Gopher, at least 2): datatrove's English list for ``language="en"``; a
  document whose words are mostly CJK characters uses a list of Chinese and Japanese
  function characters (的 了 是 ... の に は ...) whatever ``language`` says; another
  language has no list and the rule does not apply (datatrove applies the English list to
  every language unless it is given one).
* **C4's terminal punctuation** also accepts the CJK full stops and closing quotes
  ``。！？”」』``: datatrove's ``. ? ! " '`` would drop every Chinese line. ``”`` closes
  English quotations too, so an English line ending ``values.”`` is kept here, as
  ``values."`` is by both. (FineWeb's line ends are already Unicode's sentence terminals
  in datatrove, ``。`` among them.)
* **Sentences** (C4, at least 5): counted as spaCy's sentencizer ends them, on our tokens
  (:func:`_sentence_count`), so the full stops of CJK text end sentences too.
* **Top n-gram length** (Gopher repetition) counts no space next to a CJK character
  (datatrove joins every n-gram with spaces, so a Chinese 4-gram of 4 characters counts as
  7, and two repeats of a 4-character phrase in 80 characters fail).
* **Non-symbol words** (Gopher) are tokens not made only of Unicode punctuation and symbols
  (datatrove: of the characters of its ``PUNCTUATION`` string), so ``©`` or ``→`` alone is
  no word here.

C4 drops lines (``C4_LINE_RULES``) as datatrove's does, and we keep that: the text returned
by :func:`apply_filters` is the text after those removals (kept lines joined by ``\\n``), and
the rule sets after ``c4`` see it. :func:`c4_lines` counts the lines each line rule dropped.

Use (tests: ``python -m pytest tests/pipeline/test_filters.py``)::

    failed, text = apply_filters(text, ("gopher_quality", "c4"))
    if failed:                                      # e.g. "gopher_quality.word_count"
        ...  # count it under that name
"""

from __future__ import annotations

import functools
import itertools
import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Sequence

from pipeline.core.dedup import CJK_CHAR

__all__ = ["C4_LINE_RULES", "RULE_SETS", "apply_filters", "c4_lines", "tokens"]

RULE_SETS: dict[str, tuple[str, ...]] = {
    "gopher_quality": (
        "word_count",  # 50 <= non-symbol words <= 100,000
        "mean_word_length",  # 3 <= mean length of non-symbol words <= 10
        "hash_ratio",  # "#" per word <= 0.1
        "ellipsis_ratio",  # "..." and "…" per word <= 0.1
        "bullet_lines",  # lines starting with "•" or "-" <= 90%
        "ellipsis_lines",  # lines ending with "..." or "…" <= 30%
        "alpha_words",  # words with a letter >= 80%
        "stop_words",  # at least 2 distinct stop words
    ),
    "gopher_repetition": (
        "empty",  # no text
        "dup_para_frac",  # duplicate paragraphs <= 30%
        "dup_para_char_frac",  # their characters <= 20% of the text
        "dup_line_frac",  # duplicate lines <= 30%
        "dup_line_char_frac",  # their characters <= 20%
        "top_2_gram",  # the most frequent 2-gram's characters <= 20%
        "top_3_gram",  # <= 18%
        "top_4_gram",  # <= 16%
        *(f"dup_{n}_gram" for n in range(5, 11)),  # duplicate n-grams' chars <= 15% .. 10%
    ),
    "c4": (
        "lorem_ipsum",  # a kept line contains "lorem ipsum"
        "curly_bracket",  # a kept line contains "{"
        "min_sentences",  # fewer than 5 sentences in the kept lines
    ),
    "fineweb": (  # on the non-empty lines
        "empty",  # no non-empty line
        "line_punct_ratio",  # lines ending with a sentence terminal < 12%
        "short_line_ratio",  # lines of <= 30 characters > 67%
        "char_dup_ratio",  # characters in duplicate lines > 1% of the text's
        "list_ratio",  # newlines per word > 0.3
    ),
}
# C4's line rules: a line that breaks one is dropped, the document stays.
C4_LINE_RULES = ("too_long_word", "no_terminal_punct", "min_words_per_line", "javascript", "policy")


# Punctuation and symbols (Unicode P* and S*) of the BMP as code-point ranges, plus emoji.
def _ranges(codes: list[int]) -> str:
    """A regex character-class body for sorted code points, as ranges: [1, 2, 3, 7] -> 1-37."""
    spans: list[list[int]] = []
    for code in codes:
        if spans and spans[-1][1] == code - 1:
            spans[-1][1] = code
        else:
            spans.append([code, code])
    return "".join(f"{re.escape(chr(a))}-{re.escape(chr(b))}" for a, b in spans)


_PUNCT_CODES = [c for c in range(0x10000) if unicodedata.category(chr(c))[0] in "PS"]
_PUNCT = _ranges(_PUNCT_CODES) + "\U0001f000-\U0001faff"
_CJK = CJK_CHAR.pattern[1:-1]
# A backslash is part of a word, as in spaCy's (TeX's "\\frac", a Windows path)
_WORD_CHAR = f"[^\\s{_ranges([c for c in _PUNCT_CODES if c != 0x5C])}\U0001f000-\U0001faff{_CJK}]"
_PUNCT_CHAR = f"[{_PUNCT}]"
# A token, as spaCy's English rules make them where a count depends on it: a URL, to the
# space (its closing punctuation apart); a letter and its dot, or several ("x.", "e.g.",
# "U.S.": spaCy's exceptions); one CJK character; a run of word characters, inner
# punctuation kept (split further by _INFIX and _CONTRACTION); a run of dots or of hyphens
# ("...", "--"); any other punctuation or symbol character alone.
_URL = r"(?:https?://|www\.)\S+?(?=[.,;:!?)\]'\"]*(?:\s|$))"
_ABBREVIATION = r"(?<![^\W_])(?:[^\W\d_]\.)+(?![^\W_])"
_TOKEN = re.compile(
    f"{_URL}|{_ABBREVIATION}|{CJK_CHAR.pattern}|(?:-{{1,2}}|[@.])?{_WORD_CHAR}+(?:{_PUNCT_CHAR}+{_WORD_CHAR}+)*"
    f"|\\.{{2,}}|-{{2,}}|{_PUNCT_CHAR}"
)
_SYMBOL_ONLY = re.compile(f"{_PUNCT_CHAR}+")
# Punctuation only (Unicode P*, not symbols): spaCy's is_punct, for the sentence ends.
_PUNCTUATION_ONLY = re.compile(
    f"[{_ranges([c for c in _PUNCT_CODES if unicodedata.category(chr(c))[0] == 'P'])}]+"
)
# Inside a word, as spaCy's English infixes: a hyphen, dash, tilde, ":", "<", ">", "=" or "/"
# between a letter or digit and a letter, a comma between letters, a dot between a lowercase
# and a capital letter ("torch.nn.Module" -> "torch.nn" "." "Module"); each its own token.
_INFIX = re.compile(
    r"((?<=[^\W_])[-\u2013\u2014~:<>=/](?=[^\W\d_])|(?<=[^\W\d_]),(?=[^\W\d_])|(?<=[a-z])\.(?=[A-Z]))"
)
# English contractions, as spaCy's: "don't" -> "do" "n't", "it's" -> "it" "'s".
_CONTRACTION = re.compile(r"(?i)^([^\W\d_]+?)(n['\u2019]t|['\u2019](?:s|re|ll|ve|d|m))$")

STOP_WORDS = {"en": frozenset(["the", "be", "to", "of", "and", "that", "have", "with"])}
# Function characters of Chinese and Japanese, each a word under the CJK rule.
CJK_STOP_WORDS = frozenset("的了是在和有不这也就都我他们一个上说要与及而或但のにはをたがでてとしも")
# Terminal punctuation: datatrove's (C4: . ? ! " ' ; FineWeb: the same), plus CJK's.
# C4's line ends: datatrove's (. ? ! " '), plus the CJK full stops and closing quotes.
C4_END = (".", "?", "!", '"', "'", "。", "！", "？", "”", "」", "』")
# FineWeb's line ends: Unicode's Sentence_Terminal characters (datatrove's
# TERMINAL_PUNCTUATION: ! . ? and the full stops of other scripts, 。 ！ ？ ｡ among them).
_SENTENCE_TERMINAL = re.compile(
    "["
    r"!.?\u0589\u061d-\u061f\u06d4\u0700-\u0702\u07f9\u0837\u0839\u083d-\u083e"
    r"\u0964-\u0965\u104a-\u104b\u1362\u1367-\u1368\u166e\u1735-\u1736\u17d4-\u17d6"
    r"\u17d9-\u17da\u1803\u1809\u1944-\u1945\u1aa8-\u1aab\u1b5a-\u1b5b\u1b5e-\u1b5f"
    r"\u1b7d-\u1b7e\u1c3b-\u1c3c\u1c7e-\u1c7f\u203c-\u203d\u2047-\u2049\u2e2e\u2e3c"
    r"\u2e53-\u2e54\u3002\ua4ff\ua60e-\ua60f\ua6f3\ua6f7\ua876-\ua877\ua8ce-\ua8cf\ua92f"
    r"\ua9c8-\ua9c9\uaa5d-\uaa5f\uaaf0-\uaaf1\uabeb\ufe52\ufe56-\ufe57\uff01\uff0e\uff1f"
    r"\uff61\U00010a56-\U00010a57\U00010f55-\U00010f59\U00010f86-\U00010f89"
    r"\U00011047-\U00011048\U000110be-\U000110c1\U00011141-\U00011143\U000111c5-\U000111c6"
    r"\U000111cd\U000111de-\U000111df\U00011238-\U00011239\U0001123b-\U0001123c\U000112a9"
    r"\U0001144b-\U0001144c\U000115c2-\U000115c3\U000115c9-\U000115d7\U00011641-\U00011642"
    r"\U0001173c-\U0001173e\U00011944\U00011946\U00011a42-\U00011a43\U00011a9b-\U00011a9c"
    r"\U00011c41-\U00011c42\U00011ef7-\U00011ef8\U00011f43-\U00011f44\U00016a6e-\U00016a6f"
    r"\U00016af5\U00016b37-\U00016b38\U00016b44\U00016e98\U0001bc9f\U0001da88"
    "]"
)

_CITATION = re.compile(r"\[\d*]|\[edit]|\[citation needed]")
_POLICY = (
    "terms of use",
    "privacy policy",
    "cookie policy",
    "uses cookies",
    "use of cookies",
    "use cookies",
)


def tokens(text: str) -> list[str]:
    """The words and punctuation tokens the word-counting rules see.

    Worked example::

        tokens("Don't panic, e-mail 3.5 (now)!")  -> ['Do', "n't", 'panic', ',', 'e', '-',
                                                      'mail', '3.5', '(', 'now', ')', '!']
        tokens("BERT模型。")                        -> ['BERT', '模', '型', '。']
    """
    return list(_tokens(text))


@functools.lru_cache(maxsize=2)
def _tokens(text: str) -> tuple[str, ...]:
    """:func:`tokens`, kept for the last texts: the rule sets of one :func:`apply_filters`
    call tokenize the document once (a str caches its hash, so a hit costs nothing)."""
    return _split(text)


def _split(text: str) -> tuple[str, ...]:
    """:func:`tokens` without the cache (C4's lines, which would push the document out)."""
    out: list[str] = []
    for token in _TOKEN.findall(text):
        if token.isalnum() or len(token) < 3 or token.endswith(".") or "://" in token:
            out.append(token)  # no inner punctuation: the usual case, without the regexes
            continue
        for piece in _INFIX.split(token):
            contraction = _CONTRACTION.match(piece)
            if contraction:
                out += contraction.groups()
            elif piece:
                out.append(piece)
    return tuple(out)


def _duplicates(items: list[str]) -> tuple[int, int]:
    """(repeated items, their characters): every occurrence after an item's first."""
    seen: set[str] = set()
    count = chars = 0
    for item in items:
        if item in seen:
            count += 1
            chars += len(item)
        else:
            seen.add(item)
    return count, chars


def _gopher_quality(text: str, language: str) -> str | None:
    words = _tokens(text)
    n_words = len(words) or 1
    non_symbol = [w for w in words if not _SYMBOL_ONLY.fullmatch(w)]
    if not 50 <= len(non_symbol) <= 100_000:
        return "word_count"
    spaced = [w for w in non_symbol if not CJK_CHAR.fullmatch(w)]
    if 2 * len(spaced) >= len(non_symbol) and not 3 <= sum(map(len, spaced)) / len(spaced) <= 10:
        return "mean_word_length"
    if text.count("#") / n_words > 0.1:
        return "hash_ratio"
    if (text.count("...") + text.count("…")) / n_words > 0.1:
        return "ellipsis_ratio"
    lines = text.splitlines() or [""]
    if sum(line.lstrip().startswith(("•", "-")) for line in lines) / len(lines) > 0.9:
        return "bullet_lines"
    if sum(line.rstrip().endswith(("...", "…")) for line in lines) / len(lines) > 0.3:
        return "ellipsis_lines"
    if sum(any(c.isalpha() for c in w) for w in words) / n_words < 0.8:
        return "alpha_words"
    stop_words = CJK_STOP_WORDS if 2 * len(spaced) < len(non_symbol) else STOP_WORDS.get(language)
    if stop_words is not None and len(stop_words.intersection(words)) < 2:
        return "stop_words"
    return None


def _grams(words: Sequence[str], n: int, separator: str) -> list[str]:
    """The word n-grams, each joined by ``separator``: ``(["a", "b", "c"], 2, " ")`` ->
    ``["a b", "b c"]``."""
    # the shifted lists are shorter by design: zip stops at the last full n-gram
    return list(map(separator.join, zip(*(words[i:] for i in range(n)), strict=False)))


def _top_gram_chars(words: Sequence[str], n: int) -> int:
    """Characters of the most frequent word n-gram, joined by spaces, times its count; no
    space is counted next to a CJK character (datatrove counts one at every word boundary,
    so a 4-character Chinese 4-gram would count as 7)."""
    grams = _grams(words, n, " ")
    if not grams:
        return 0
    gram, count = Counter(grams).most_common(1)[0]
    first = grams.index(gram)
    cjk = [CJK_CHAR.fullmatch(word) is not None for word in words[first : first + n]]
    unwritten = sum(a or b for a, b in itertools.pairwise(cjk))
    return (len(gram) - unwritten) * count


def _repeated_gram_chars(words: Sequence[str], n: int) -> int:
    """Characters of n-grams (joined without spaces) seen before, skipping past each repeat:
    datatrove's ``find_all_duplicate``."""
    grams = _grams(words, n, "")
    if len(set(grams)) == len(grams):
        return 0  # the usual case, found without the loop
    seen: set[str] = set()
    chars = i = 0
    while i < len(grams):
        if grams[i] in seen:
            chars += len(grams[i])
            i += n
        else:
            seen.add(grams[i])
            i += 1
    return chars


def _gopher_repetition(text: str, language: str) -> str | None:
    if not text:
        return "empty"
    length = len(text)
    paragraphs = re.split(r"\n{2,}", text.strip())
    count, chars = _duplicates(paragraphs)
    if count / len(paragraphs) > 0.3:
        return "dup_para_frac"
    if chars / length > 0.2:
        return "dup_para_char_frac"
    lines = re.split(r"\n+", text)
    count, chars = _duplicates(lines)
    if count / len(lines) > 0.3:
        return "dup_line_frac"
    if chars / length > 0.2:
        return "dup_line_char_frac"
    words = _tokens(text)
    for n, fraction in ((2, 0.2), (3, 0.18), (4, 0.16)):
        if _top_gram_chars(words, n) / length > fraction:
            return f"top_{n}_gram"
    for n, fraction in zip(range(5, 11), (0.15, 0.14, 0.13, 0.12, 0.11, 0.10), strict=True):
        if _repeated_gram_chars(words, n) / length > fraction:
            return f"dup_{n}_gram"
    return None


def _sentence_count(line: str) -> int:
    """Sentences in ``line`` as spaCy's sentencizer ends them (datatrove's English
    sentences): after a sentence terminal token (one character of Unicode's
    Sentence_Terminal, ``。`` among them), the next token that is not punctuation starts a
    sentence, so closing quotes and brackets stay with theirs. ``"One. two! (Three.)"`` has
    3; ``"e.g. this"`` 1 (``e.g.`` is one token)."""
    words = _split(line)
    count, ended = int(bool(words)), False
    for word in words:
        terminal = len(word) == 1 and _SENTENCE_TERMINAL.match(word) is not None
        if ended and not terminal and not _PUNCTUATION_ONLY.fullmatch(word):
            count, ended = count + 1, False
        elif terminal:
            ended = True
    return count


def c4_lines(text: str) -> tuple[str | None, str, dict[str, int]]:
    """C4's line pass: (the document rule it breaks or None, the kept text, lines dropped per
    rule of :data:`C4_LINE_RULES`).

    Per line (``str.splitlines``, stripped), in datatrove's order: a word over 1000
    characters drops it; citations (``[1]``, ``[edit]``, ``[citation needed]``) are removed;
    no terminal punctuation (or ending with ``...``) drops it; fewer than 3 words drops it;
    ``lorem ipsum`` fails the document; ``javascript`` drops the line; ``{`` fails the
    document; a cookie/terms-of-use phrase drops the line. Then fewer than 5 sentences in
    the kept lines fails the document.

    Example::

        c4_lines("Enable javascript to see this.\\nA fine line of text.\\nMenu")
        -> ('min_sentences', 'A fine line of text.',
            {'javascript': 1, 'no_terminal_punct': 1, ...others 0})
    """
    dropped = dict.fromkeys(C4_LINE_RULES, 0)
    kept: list[str] = []
    sentences = 0
    for raw in text.splitlines():
        line = raw.strip()
        words = _TOKEN.findall(line) if CJK_CHAR.search(line) else line.split()
        if any(len(word) > 1000 for word in words):
            dropped["too_long_word"] += 1
            continue
        line = _CITATION.sub("", line)
        if not line.endswith(C4_END) or line.endswith("..."):
            dropped["no_terminal_punct"] += 1
            continue
        if len(words) < 3:
            dropped["min_words_per_line"] += 1
            continue
        lowered = line.lower()
        if "lorem ipsum" in lowered:
            return "lorem_ipsum", text, dropped
        if "javascript" in lowered:
            dropped["javascript"] += 1
            continue
        if "{" in line:
            return "curly_bracket", text, dropped
        if any(phrase in lowered for phrase in _POLICY):
            dropped["policy"] += 1
            continue
        sentences += _sentence_count(line)
        kept.append(line)
    kept_text = "\n".join(kept).strip()
    return ("min_sentences" if sentences < 5 else None), kept_text, dropped


def _fineweb(text: str, language: str) -> str | None:
    lines = [line for line in text.split("\n") if line.strip()]
    if not lines:
        return "empty"
    ends = sum(_SENTENCE_TERMINAL.fullmatch(line[-1]) is not None for line in lines)
    if ends / len(lines) < 0.12:
        return "line_punct_ratio"
    if sum(len(line) <= 30 for line in lines) / len(lines) > 0.67:
        return "short_line_ratio"
    if _duplicates(lines)[1] / len(text.replace("\n", "")) > 0.01:
        return "char_dup_ratio"
    if text.count("\n") / len(_tokens(text)) > 0.3:
        return "list_ratio"
    return None


_DOCUMENT_RULES: dict[str, Callable[[str, str], str | None]] = {
    "gopher_quality": _gopher_quality,
    "gopher_repetition": _gopher_repetition,
    "fineweb": _fineweb,
}


def apply_filters(
    text: str, rule_sets: Sequence[str], language: str = "en"
) -> tuple[str | None, str]:
    """Runs the rule sets in order on one document; the first rule it breaks removes it.

    Worked examples::

        apply_filters("Too short.", ["gopher_quality"])  -> ('gopher_quality.word_count', 'Too short.')
        apply_filters(good_page, ["c4", "fineweb"])       -> (None, good_page minus C4's dropped lines)

    Args:
        text: one document (``str``).
        rule_sets: names from :data:`RULE_SETS`, applied in this order; ``c4`` hands the
            text after its line removals to the sets after it.
        language: an ISO 639-1 code; it picks Gopher's stop words (see the module doc).

    Returns:
        ``(failed, text)``: ``failed`` is ``"<rule set>.<rule>"`` (a name of
        :data:`RULE_SETS`) or None when the document is kept; ``text`` is the document after
        C4's line removals (unchanged without ``c4``).

    Raises:
        TypeError: ``text`` is not a ``str``.
        ValueError: an unknown rule set (the message lists the known ones).
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    unknown = [name for name in rule_sets if name not in RULE_SETS]
    if unknown or isinstance(rule_sets, str):
        raise ValueError(
            f"unknown rule sets {unknown or rule_sets!r}; known: {', '.join(RULE_SETS)}"
        )
    for name in rule_sets:
        if name == "c4":
            failed, text, _ = c4_lines(text)
        else:
            failed = _DOCUMENT_RULES[name](text, language)
        if failed:
            return f"{name}.{failed}", text
    return None, text
