"""Language identification for curation (``--languages en,zh`` with a score threshold).

One call, :func:`detect`, over py3langid: langid.py's naive Bayes model on byte n-grams
(140 labels in py3langid 0.4), shipped inside the wheel (``py3langid/data/model.npz.xz``, no
download at run time), numpy only. It is in the ``curate`` extra:
``pip install 'bert-pipeline[curate]'``.

Why py3langid and not lingua (``lingua-language-detector``): lingua is many times slower in
either accuracy mode, preloads its models for seconds, holds over a GB and installs far more
bytes, and both label the English, Chinese and German samples right (docs/results.md,
"Language identification"). At corpus scale speed decides.
(datatrove uses fastText's lid.176 model, which is downloaded at run time.)

Use (tests: ``python -m pytest tests/pipeline/test_langid.py``)::

    language, score = detect(text)          # ('en', 0.9999); the model loads once per process
    keep = language in {"en", "zh"} and score >= 0.65
"""

from __future__ import annotations

import functools
import re

__all__ = ["EXTRA", "detect"]

# The package extra that installs py3langid.
EXTRA = "curate"
# Text without a letter in any script (digits, punctuation, emoji) has no language.
_LETTER = re.compile(r"[^\W\d_]")


@functools.cache
def _identifier():
    """py3langid's identifier with probabilities normalised to [0, 1], built once.

    Raises:
        ImportError: py3langid is missing (names the extra).
    """
    try:
        from py3langid.langid import MODEL_FILE, LanguageIdentifier
    except ImportError as e:
        raise ImportError(
            f"language identification needs the py3langid package: pip install "
            f"'bert-pipeline[{EXTRA}]' (or pip install py3langid)"
        ) from e
    return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


def detect(text: str) -> tuple[str, float]:
    """The text's language and the model's probability for it.

    The whole text is classified (langid.py's features are byte n-gram counts, so the cost
    is linear in its length). Scores come from floating-point sums in numpy, so the last
    bits may differ between CPUs; a threshold compares them, nothing hashes them.

    Worked examples::

        detect("The committee met on Tuesday to discuss the budget.")  -> ('en', 0.99...)
        detect("自然语言处理是计算机科学的一个重要方向。")                 -> ('zh', 0.98...)
        detect("1234 !!")                                               -> ('und', 0.0)

    Args:
        text: one document (``str``).

    Returns:
        ``(language, score)``: py3langid's label, an ISO 639-1 code (``"en"``, ``"zh"``)
        or, for a language without one, ISO 639-3 (``"ary"``), and its probability in
        [0, 1]; ``("und", 0.0)`` (BCP 47's "undetermined") for text without letters.

    Raises:
        TypeError: ``text`` is not a ``str``.
        ImportError: py3langid is missing (names the extra).
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    identifier = _identifier()
    if not _LETTER.search(text):
        return "und", 0.0
    language, score = identifier.classify(text)
    return str(language), float(score)
