"""Quality rules (pipeline/core/filters.py): each rule on a document that breaks it and on one
that passes, C4's line removals, and the Chinese sample through every rule set."""

import json
from pathlib import Path

import pytest

from pipeline.core.filters import RULE_SETS, apply_filters, c4_lines, tokens

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "chinese" / "sample.jsonl"
GOOD_LINES = [
    "The committee met on Tuesday to discuss the budget for the coming year.",
    "Several members argued that the library needed new computers and longer hours.",
    "Others worried about the cost of repairing the roof before winter arrives.",
    "After a long debate, they agreed to split the money between both projects.",
    "The final vote was close, with seven members in favour and five against.",
    "A public meeting will be held next month so that residents can share their views.",
]
GOOD = "\n".join(GOOD_LINES)
# Ten distinct content words per line, none of Gopher's stop words.
FILLER = [
    f"{a} {b} {c} quietly watched distant rivers during golden evenings."
    for a, b, c in zip(
        ["Curious", "Patient", "Gentle", "Brave", "Clever", "Silent"],
        ["farmers", "sailors", "painters", "doctors", "pilots", "bakers"],
        ["often", "rarely", "sometimes", "usually", "never", "always"],
        strict=True,
    )
]


def failed(text, rule_set, language="en"):
    return apply_filters(text, [rule_set], language)[0]


# Tokens as datatrove 0.10.1's English words (spaCy 3.8's ``blank("en")``) are, each list
# printed by spaCy itself: punctuation one character at a time, URLs, abbreviations,
# infixes and contractions as its rules make them.
SPACY_TOKENS = {
    "Don't panic, e-mail 3.5 (now)!": [
        "Do",
        "n't",
        "panic",
        ",",
        "e",
        "-",
        "mail",
        "3.5",
        "(",
        "now",
        ")",
        "!",
    ],
    "foo()).": ["foo", "(", ")", ")", "."],
    "x (>= 3": ["x", "(", ">", "=", "3"],
    "wait... ok…": ["wait", "...", "ok", "…"],
    "a->b <= != ==": ["a->b", "<", "=", "!", "=", "=", "="],
    "user-specified box/whisker subplots=False": [
        "user",
        "-",
        "specified",
        "box",
        "/",
        "whisker",
        "subplots",
        "=",
        "False",
    ],
    "see https://github.com/python/mypy/issues/4146.": [
        "see",
        "https://github.com/python/mypy/issues/4146",
        ".",
    ],
    "e.g. x. U.S. x.y.z": ["e.g.", "x.", "U.S.", "x.y.z"],
    "torch.nn.Module and a .metadata file": [
        "torch.nn",
        ".",
        "Module",
        "and",
        "a",
        ".metadata",
        "file",
    ],
    "--input -1 @retry": ["--input", "-1", "@retry"],
    "they're it's can't": ["they", "'re", "it", "'s", "ca", "n't"],
    "**kwargs (a)": ["*", "*", "kwargs", "(", "a", ")"],
}


@pytest.mark.parametrize("text", list(SPACY_TOKENS))
def test_tokens_are_spacys(text):
    assert tokens(text) == SPACY_TOKENS[text]


def test_tokens_of_other_scripts():
    assert tokens("BERT模型。") == ["BERT", "模", "型", "。"]  # each CJK character a word
    assert tokens("हिन्दी भाषा") == ["हिन्दी", "भाषा"]  # combining marks stay in the word


def test_c4_counts_sentences_as_spacys_sentencizer():
    # a terminal token followed by a token that is not punctuation starts a sentence;
    # "e.g." and "3.5" are one token each, ")" stays with its sentence
    four = "One. two! (Three.) See e.g. this, 3.5 times."
    assert c4_lines(four)[0] == "min_sentences"
    assert c4_lines(four + " Four?")[0] is None
    assert c4_lines("这是第一句。这是第二句。第三句。第四句。第五句。")[0] is None


@pytest.mark.parametrize("rule_set", list(RULE_SETS))
def test_a_good_page_passes_every_rule_set(rule_set):
    assert apply_filters(GOOD, [rule_set]) == (None, GOOD)


def test_all_rule_sets_together_and_errors():
    assert apply_filters(GOOD, list(RULE_SETS)) == (None, GOOD)
    assert apply_filters("", list(RULE_SETS))[0] == "gopher_quality.word_count"
    with pytest.raises(ValueError, match="known: gopher_quality"):
        apply_filters(GOOD, ["gopher"])
    with pytest.raises(ValueError):
        apply_filters(GOOD, "c4")  # a string, not a sequence of names
    with pytest.raises(TypeError):
        apply_filters(b"bytes", ["c4"])


# --- Gopher quality ---------------------------------------------------------------------


def words(n):
    return " ".join(f"{w}" for w in (" ".join(GOOD_LINES * 20)).split()[:n])


GOPHER_QUALITY_BREAKERS = {
    "word_count": [words(49) + ".", " ".join(["word"] * 100_001)],
    "mean_word_length": [
        " ".join(["to", "be", "an", "ox", "of", "the"] * 10),
        " ".join(["internationalization", "telecommunications", "of"] * 20),
    ],
    "hash_ratio": [GOOD + "\n" + " ".join(f"#tag{i}" for i in range(20))],
    # every third word ends with "...": 1 in 4 tokens
    "ellipsis_ratio": [" ".join(w + "..." * (i % 3 == 0) for i, w in enumerate(GOOD.split(" ")))],
    "bullet_lines": ["\n".join("- " + line for line in GOOD_LINES)],
    "ellipsis_lines": [
        "\n".join([*(line[:-1] + "..." for line in GOOD_LINES[:2]), *GOOD_LINES[2:]])
    ],
    "alpha_words": [GOOD + "\n" + " ".join(str(1000 + i) for i in range(30))],
    # none, and one stop word three times (datatrove counts distinct ones)
    "stop_words": ["\n".join(FILLER), "\n".join(FILLER) + " The the the."],
}


@pytest.mark.parametrize(
    "rule,text",
    [(rule, text) for rule, texts in GOPHER_QUALITY_BREAKERS.items() for text in texts],
)
def test_gopher_quality_rule_breaks(rule, text):
    assert rule in RULE_SETS["gopher_quality"]
    assert failed(text, "gopher_quality") == f"gopher_quality.{rule}"


def test_gopher_quality_passes_at_the_thresholds():
    assert failed(words(50) + ".", "gopher_quality") is None  # 50 words: enough
    one_ellipsis_line = GOOD_LINES[0][:-1] + "...\n" + "\n".join(GOOD_LINES[1:])
    assert failed(one_ellipsis_line, "gopher_quality") is None  # 1 of 6 lines <= 30%
    assert (
        failed(GOOD + "\n" + " ".join(str(1000 + i) for i in range(10)), "gopher_quality") is None
    )
    # stop words: English's list for English; another language without a list: not applied
    assert failed("\n".join(FILLER) + " The end of the day.", "gopher_quality") is None
    assert failed("\n".join(FILLER), "gopher_quality", language="de") is None


# --- Gopher repetition ------------------------------------------------------------------


def unique_words(count, tag):
    """``count`` distinct 6-letter words (letters only, so no n-gram repeats by chance)."""
    letters = "bcdfghjklmnpqrstvwxz"
    return [
        tag + letters[i // 400 % 20] + letters[i // 20 % 20] + letters[i % 20] + "o"
        for i in range(count)
    ]


def repeated_segment(m, x, copies):
    """One line: a segment of ``m`` distinct 10-letter words ``copies`` times, between
    distinct 6-letter filler words, sized so that one word's letters in all repeats (copies
    after the first) are ``x`` of the text. Datatrove's duplicate k-gram count then finds
    floor(m / k) * k words per repeat: ``floor(m / k) * k * x`` of the characters."""
    segment = unique_words(m, "segmnt")  # 10 letters each
    length = 10 * (copies - 1) / x
    filler_words = round((length - copies * 11 * m) / 7 / copies)  # "f0bcdo "
    chunks = [" ".join(unique_words(filler_words, f"f{i}")[:filler_words]) for i in range(copies)]
    return " ".join(f"{chunk} {' '.join(segment)}" for chunk in chunks) + "."


PARAGRAPHS = [" ".join(unique_words(12, t)) + "." for t in "abcdefgh"]
LONG = " ".join(unique_words(80, "l")) + "."
REPETITION_BREAKERS = {
    "empty": "",
    "dup_para_frac": "\n\n".join([PARAGRAPHS[0], PARAGRAPHS[1], PARAGRAPHS[0], PARAGRAPHS[0]]),
    "dup_para_char_frac": "\n\n".join([LONG, *PARAGRAPHS[:6], LONG]),
    "dup_line_frac": "\n".join([PARAGRAPHS[0], PARAGRAPHS[1], PARAGRAPHS[0], PARAGRAPHS[0]]),
    "dup_line_char_frac": "\n".join([LONG, *PARAGRAPHS[:6], LONG]),
    # "alpha bravo" (11 characters) 20 times in 20 x 13: far over 20%
    "top_2_gram": " ".join(f"alpha bravo {w}" for w in unique_words(20, "x")),
    # the 2-gram's 11 x 20 / L <= 0.2 while the 3-gram's 17 x 20 / L > 0.18 (L / 20 = 75)
    "top_3_gram": " ".join(
        f"alpha bravo delta {' '.join(unique_words(8, 'x' + str(i)))}" for i in range(20)
    ),
    # 3-gram 17 / (L / 20) <= 0.18, 4-gram 22 / (L / 20) > 0.16 (L / 20 = 23 + 14 x 7)
    "top_4_gram": " ".join(
        f"alpha bravo delta echo {' '.join(unique_words(13, 'y' + str(i)))}" for i in range(20)
    ),
    # 20 words twice: 5-grams 20 x 0.01 > 0.15 (top 4-gram 43 x 2 x 0.01 / 10 = 0.086)
    "dup_5_gram": repeated_segment(20, 0.01, 2),
    # m words, 6 copies: m-grams m x over their threshold, shorter k-grams under theirs
    "dup_6_gram": repeated_segment(6, 0.0267, 6),  # 6-grams 0.16 > 0.14; 5-grams 0.13
    "dup_7_gram": repeated_segment(7, 0.021, 6),  # 0.147 > 0.13; 6: 0.126, 5: 0.105
    "dup_8_gram": repeated_segment(8, 0.0168, 6),  # 0.134 > 0.12; 7: 0.118
    "dup_9_gram": repeated_segment(9, 0.0136, 6),  # 0.122 > 0.11; 8: 0.109
    "dup_10_gram": repeated_segment(10, 0.0111, 6),  # 0.111 > 0.10; 9: 0.0999
}


@pytest.mark.parametrize("rule", RULE_SETS["gopher_repetition"])
def test_gopher_repetition_rule_breaks(rule):
    assert failed(REPETITION_BREAKERS[rule], "gopher_repetition") == f"gopher_repetition.{rule}"


def test_gopher_repetition_passes_below_the_thresholds():
    assert failed("\n\n".join(PARAGRAPHS), "gopher_repetition") is None
    # one duplicate of eight paragraphs: 1/9 <= 30%, its characters well under 20%
    assert failed("\n\n".join([*PARAGRAPHS, PARAGRAPHS[0]]), "gopher_repetition") is None
    assert failed(repeated_segment(20, 0.0045, 2), "gopher_repetition") is None  # <= 0.09
    assert failed(repeated_segment(10, 0.009, 6), "gopher_repetition") is None  # 0.09


# --- C4 ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "rule,line",
    [
        ("lorem_ipsum", "Lorem ipsum dolor sit amet, consectetur adipiscing elit."),
        ("curly_bracket", "Write the mapping as {key: value} in the file."),
    ],
)
def test_c4_document_rules_break(rule, line):
    assert failed(GOOD + "\n" + line, "c4") == f"c4.{rule}"
    # the line is dropped before the check when it breaks a line rule first
    assert failed(GOOD + "\n" + line.rstrip("."), "c4") is None


def test_c4_min_sentences():
    assert failed("\n".join(GOOD_LINES[:4]), "c4") == "c4.min_sentences"
    assert failed("\n".join(GOOD_LINES[:5]), "c4") is None
    assert failed(" ".join(GOOD_LINES[:5]), "c4") is None  # five sentences on one line


def test_c4_drops_lines_and_returns_the_text_after():
    noisy = [
        "Please enable JavaScript to view this page.",
        "This site uses cookies to improve your experience.",
        "Home | About | Contact",
        "Read more.",
        "See " + "x" * 1001 + " here.",
        "Ends with an ellipsis and nothing more...",
    ]
    text = "\n".join([noisy[0], *GOOD_LINES[:3], *noisy[1:], *GOOD_LINES[3:]])
    assert apply_filters(text, ["c4"]) == (None, GOOD)
    failed_rule, kept, dropped = c4_lines(text)
    assert (failed_rule, kept) == (None, GOOD)
    assert dropped == {
        "too_long_word": 1,
        "no_terminal_punct": 2,
        "min_words_per_line": 1,
        "javascript": 1,
        "policy": 1,
    }
    # citations are removed from kept lines
    assert c4_lines(GOOD.replace("year.", "year.[1]"))[1] == GOOD
    # later rule sets see the text after C4's removals: the short menu line is gone
    assert apply_filters(text, ["c4", "fineweb"]) == (None, GOOD)


# --- FineWeb ----------------------------------------------------------------------------

FINEWEB_BREAKERS = {
    "empty": "\n  \n",
    "line_punct_ratio": "\n".join(line.rstrip(".") for line in GOOD_LINES),
    "short_line_ratio": "\n".join(
        [*GOOD_LINES[:3], *(f"Item {w} is here." for w in unique_words(8, "q"))]
    ),
    "char_dup_ratio": GOOD + "\n" + GOOD_LINES[2],
    "list_ratio": "\n".join(f"Extraordinarily {w}incomprehensible." for w in unique_words(20, "z")),
}


@pytest.mark.parametrize("rule", RULE_SETS["fineweb"])
def test_fineweb_rule_breaks(rule):
    assert failed(FINEWEB_BREAKERS[rule], "fineweb") == f"fineweb.{rule}"


def test_fineweb_passes_near_the_thresholds():
    one_in_six = "\n".join([*(line.rstrip(".") for line in GOOD_LINES[:5]), GOOD_LINES[5]])
    assert failed(one_in_six, "fineweb") is None  # 1/6 = 0.17 > 12% end with punctuation
    assert failed("\n".join([*GOOD_LINES, "Item one is here."]), "fineweb") is None


# --- Text that is not split by spaces -----------------------------------------------------


def chinese_sample():
    return [json.loads(line)["text"] for line in SAMPLE.read_text(encoding="utf-8").splitlines()]


@pytest.mark.parametrize("language", ["zh", "en"])
def test_chinese_sample_passes_the_word_counting_rule_sets(language):
    for doc in chinese_sample():
        assert len([t for t in tokens(doc) if t not in "，。"]) >= 50  # characters are words
        for rule_set in ("gopher_quality", "gopher_repetition", "fineweb"):
            assert apply_filters(doc, [rule_set], language) == (None, doc), (rule_set, doc)


def test_chinese_sample_through_c4():
    docs = chinese_sample()
    for doc in docs:
        # every line kept (terminal 。, more than 3 words); each document is one line of
        # four sentences, and C4 wants five, as it would of an English page of four
        failed_rule, kept, dropped = c4_lines(doc)
        assert (kept, set(dropped.values())) == (doc, {0})
        assert failed_rule == "min_sentences"
    for first, second in zip(docs[::2], docs[1::2], strict=True):
        page = first + "\n" + second  # eight sentences
        assert apply_filters(page, list(RULE_SETS), "zh") == (None, page)


JAPANESE = (
    "東京は日本の首都であり、世界でも有数の大都市です。毎日たくさんの人が電車で通勤しています。"
    "春になると公園の桜が咲き、多くの家族が花見を楽しみます。夜の街は明るく、食事や買い物をする人で"
    "にぎわっています。"
)


def test_japanese_passes_the_word_counting_rule_sets():
    assert len(tokens(JAPANESE)) > 90  # kanji and kana are words
    for rule_set in ("gopher_quality", "gopher_repetition", "fineweb"):
        for language in ("ja", "en"):
            assert apply_filters(JAPANESE, [rule_set], language) == (None, JAPANESE), rule_set
    # four sentences on one line: C4 keeps the line and wants a fifth sentence
    assert c4_lines(JAPANESE)[:2] == ("min_sentences", JAPANESE)
