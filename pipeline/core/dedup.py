"""Near-duplicate detection: MinHash signatures and LSH band keys, plus n-grams for
decontamination. Pure functions; ``pipeline/beam/curate*.py`` maps them over documents.

The scheme is datatrove's MinHash (``datatrove.pipeline.dedup.minhash``, as released in
0.10.1), so that our keep/drop decisions can be compared with its: the same text
simplification, word 5-gram shingles hashed with xxhash64, the same seeded permutation
family ``(a * h + b) mod (2**61 - 1)`` drawn from ``np.random.RandomState(seed)``, and 14 bands
of 8 rows. Given the same shingles, our signatures are datatrove's, bit for bit. Two
documents whose 5-gram Jaccard similarity is ``s`` share at least one band with probability
``1 - (1 - s**8)**14``: 0.92 at s = 0.8, 0.32 at s = 0.6, 0.0012 at s = 0.3.

Where we differ from datatrove, and why:

* The characters folded to a space are every Unicode punctuation (P*) and symbol (S*)
  character and the controls, not only those of datatrove's ``PUNCTUATION`` string (which
  has ``’`` but not ``‘``, and no ``°`` or box-drawing characters).
* Words are what is between spaces, except that each CJK ideograph and kana is a word of its
  own (datatrove 0.10.1 runs a per-language word tokenizer: spaCy's rule-based tokenizer
  for English, with jieba for Chinese, with SudachiPy for Japanese). Characters need no
  model and no optional package, so every worker finds the same shingles; a 5-gram of
  characters is a sensible shingle for Chinese and Japanese (a word is one to three
  characters).
* A document of fewer than ``n`` words gets one shingle of all its words (datatrove gives it
  none and never deduplicates it): short exact and near-exact copies are still found.
* An n-gram is hashed as the UTF-8 bytes of its words joined by spaces. datatrove passes the
  ``str`` to xxhash, which xxhash 3 encoded as UTF-8 (the same hash) and xxhash 4 refuses.
* ``MinHasher.signature`` processes shingles in chunks, so its memory stays bounded for any
  document (datatrove builds the whole ``shingles x permutations`` matrix at once). The
  values are the same.

Use (tests: ``python -m pytest tests/pipeline/test_dedup.py``; speed against datasketch and
rensa: ``python bench/curate_minhash.py``)::

    minhasher = MinHasher()                     # once per worker
    signature = minhasher.signature(shingle_hashes(text))
    for key in band_keys(signature):            # GroupByKey on these: candidate pairs
        ...
"""

from __future__ import annotations

import hashlib
import re
import unicodedata

import numpy as np

from pipeline.core.segment import IDEOGRAPH_RANGES

__all__ = [
    "MinHasher",
    "band_keys",
    "jaccard",
    "ngram_set",
    "normalize",
    "shingle_hashes",
    "words",
]

# The package extra that installs xxhash: pip install 'bert-pipeline[curate]'.
EXTRA = "curate"
MERSENNE_PRIME = np.uint64((1 << 61) - 1)
# Rows of the (shingles x permutations) matrix computed at once: 2048 x 112 x 8 B = 1.8 MB
# per temporary, so a document of a million shingles needs no more memory than one of 2048.
_CHUNK = 2048

# CJK ideographs (BERT's _is_chinese_char ranges, pipeline/core/segment.py), hiragana,
# katakana (and its phonetic extensions, halfwidth forms): scripts written without spaces,
# whose characters are words here.
_CJK_RANGES = (
    *IDEOGRAPH_RANGES,
    (0x3040, 0x309F),
    (0x30A0, 0x30FF),
    (0x31F0, 0x31FF),
    (0xFF66, 0xFF9F),
)
CJK_CHAR = re.compile("[" + "".join(f"{chr(a)}-{chr(b)}" for a, b in _CJK_RANGES) + "]")
# A number, with one decimal part after any of these separators (datatrove's pattern): it
# becomes one "0" ("3.11", "1,000" -> "0"); \d is any script's decimal digit.
_NUMBERS = re.compile(r"\d+(?:[.,،٫⎖⎗⎘]\d+)?")


class _FoldTable(dict):
    """``str.translate`` table: combining marks (Mn) are deleted; punctuation (P*), symbols
    (S*) and controls other than whitespace become a space; everything else stays. Filled
    lazily, per character seen, so no table of all 1.1M code points is built."""

    def __missing__(self, code: int) -> int | None:
        char = chr(code)
        category = unicodedata.category(char)
        if category == "Mn":
            value = None  # translate deletes it
        elif category[0] in "PS" or (category == "Cc" and not char.isspace()):
            value = 0x20
        else:
            value = code
        self[code] = value
        return value


_FOLD = _FoldTable()


def normalize(text: str) -> str:
    """The text as MinHash sees it: datatrove's ``simplify_text``, punctuation to spaces.

    Steps, in datatrove 0.10.1's order: lowercase; each number to ``0`` (digits of any script,
    with one decimal part: ``3.11``, ``1,000``); punctuation, symbols and control characters
    to spaces; decompose (NFD) and drop combining marks (``é`` -> ``e``); whitespace runs to
    one space; strip. Deterministic (``str.lower`` and ``unicodedata`` of this Python).

    Worked examples::

        normalize("Héllo,  WORLD!\\n42 times")  -> 'hello world 0 times'
        normalize("Python 3.11: 1,000 x2")     -> 'python 0 0 x0'
        normalize("end.Start a/b don't")       -> 'end start a b don t'
        normalize("自然语言，处理。")             -> '自然语言 处理'

    Args:
        text: a ``str`` of any length.

    Returns:
        The normalised ``str`` (empty when ``text`` has no letters or digits).

    Raises:
        TypeError: ``text`` is not a ``str``.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    text = _NUMBERS.sub("0", text.lower())
    return " ".join(unicodedata.normalize("NFD", text).translate(_FOLD).split())


def words(normalized: str) -> list[str]:
    """The words of a normalised text: split on spaces, each CJK character a word.

    Example: ``words("bert 模型 v0")`` -> ``['bert', '模', '型', 'v0']``.
    """
    return CJK_CHAR.sub(r" \g<0> ", normalized).split()


def _xxh64():
    """xxhash's 64-bit digest of a str (UTF-8), datatrove's default shingle hash."""
    try:
        import xxhash
    except ImportError as e:
        raise ImportError(
            f"MinHash dedup needs the xxhash package: pip install 'bert-pipeline[{EXTRA}]'"
        ) from e
    return xxhash.xxh64_intdigest


def _gram_hashes(text: str, n: int) -> list[int]:
    """xxhash64 of each word n-gram (joined by one space) of the normalised text; one of all
    the words when there are fewer than ``n``; none for a text without words."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    found = words(normalize(text))
    digest = _xxh64()
    if len(found) < n:
        return [digest(" ".join(found).encode())] if found else []
    # the shifted lists are shorter by design: zip stops at the last full n-gram
    grams = map(" ".join, zip(*(found[i:] for i in range(n)), strict=False))
    return list(map(digest, map(str.encode, grams)))


def shingle_hashes(text: str, n: int = 5) -> np.ndarray:
    """The document's shingles: hashes of its word n-grams, unique and sorted.

    Words are those of :func:`words` on :func:`normalize`\\ d text; an n-gram is hashed as
    its words joined by one space (xxhash64 of the UTF-8 bytes, seed 0: datatrove's
    ``get_shingles``). Fewer than ``n`` words: one shingle of all of them.

    Worked examples::

        shingle_hashes("a b c d e f")   -> 2 hashes: "a b c d e", "b c d e f"
        shingle_hashes("A, b!")         -> 1 hash: xxh64("a b")
        shingle_hashes("自然语言处理")    -> 2 hashes: "自 然 语 言 处", "然 语 言 处 理"
        shingle_hashes("?!")            -> empty

    Args:
        text: one document (``str``).
        n: words per shingle (datatrove's ``n_grams``, default 5).

    Returns:
        uint64 ``[S]``, sorted, no repeats; S = 0 when the text has no words.

    Raises:
        TypeError: ``text`` is not a ``str``.
        ValueError: ``n`` is not a positive int.
        ImportError: xxhash is missing (names the extra).
    """
    return np.unique(np.array(_gram_hashes(text, n), dtype=np.uint64))


def ngram_set(text: str, n: int = 13) -> set[int]:
    """The hashes of the text's word n-grams, for decontamination (GPT-3's 13-grams).

    Same words and hash as :func:`shingle_hashes` (so the same CJK rule); a text of fewer
    than ``n`` words gives one n-gram of all its words. A training document is contaminated
    when its set meets the union of the evaluation texts' sets.

    Example: ``ngram_set("a b c", n=2)`` -> ``{xxh64("a b"), xxh64("b c")}``.

    Args:
        text: one document (``str``).
        n: words per n-gram (default 13).

    Returns:
        ``set[int]`` of 64-bit hashes (empty when the text has no words).

    Raises:
        TypeError, ValueError, ImportError: as :func:`shingle_hashes`.
    """
    return set(_gram_hashes(text, n))


class MinHasher:
    """A seeded family of ``num_perm`` hash functions ``h -> (a*h + b) mod (2**61 - 1)``.

    ``a`` and ``b`` are drawn as datatrove draws them: ``np.random.RandomState(seed)``, first
    ``a`` (``randint(1, p)``, all ``num_perm``), then ``b`` (``randint(0, p)``). NumPy keeps the
    legacy ``RandomState`` stream fixed across versions and platforms, and no Python
    ``hash()`` is involved, so every process gets the same family. ``a*h + b`` wraps modulo
    2**64 before the reduction, as datatrove's uint64 numpy code does; we keep that so the
    signatures are datatrove's, bit for bit.

    Why numpy and not a library (``bench/curate_minhash.py`` measures it): rensa computes
    signatures from the same shingle hashes several times faster, and datasketch is slower
    than us, but neither implements this family, so neither reproduces datatrove's
    signatures (the issue's comparison target), and rensa's output is tied to its
    ``ALGORITHM_VERSION`` (2 in 0.5, changed before). Shingling costs as much as the
    signature, so the end-to-end gap is smaller than the signature-only one.

    Example::

        MinHasher(num_perm=4, seed=1).signature(np.array([1, 2], np.uint64))
        # uint64 [4]: per function, the smaller of the two permuted values

    Args:
        num_perm: number of hash functions (signature length); 112 = 14 bands x 8 rows.
        seed: the family's seed (datatrove's ``MinhashConfig.seed`` default, 1).

    Raises:
        ValueError: ``num_perm`` < 1 or ``seed`` not an int in [0, 2**32).
    """

    def __init__(self, num_perm: int = 112, seed: int = 1) -> None:
        if not isinstance(num_perm, int) or num_perm < 1:
            raise ValueError(f"num_perm must be a positive int, got {num_perm!r}")
        if not isinstance(seed, int) or not 0 <= seed < 2**32:
            raise ValueError(f"seed must be an int in [0, 2**32), got {seed!r}")
        self.num_perm = num_perm
        self.seed = seed
        gen = np.random.RandomState(seed)
        self.a = gen.randint(1, MERSENNE_PRIME, dtype=np.uint64, size=(1, num_perm))  # (1, P)
        self.b = gen.randint(0, MERSENNE_PRIME, dtype=np.uint64, size=(1, num_perm))  # (1, P)

    def signature(self, hashes: np.ndarray) -> np.ndarray:
        """The MinHash signature of a set of shingle hashes.

        Args:
            hashes: uint64 ``[S]``, S >= 1 (repeats allowed; they do not change the result).

        Returns:
            uint64 ``[num_perm]``, each value in [0, 2**61 - 1).

        Raises:
            ValueError: ``hashes`` is empty (a document without words has no signature:
                the caller counts it and leaves it to exact dedup) or not 1-D.
            TypeError: ``hashes`` is not uint64.
        """
        hashes = np.asarray(hashes)
        if hashes.dtype != np.uint64:
            raise TypeError(f"hashes must be uint64, got {hashes.dtype}")
        if hashes.ndim != 1 or hashes.size == 0:
            raise ValueError(f"hashes must be a non-empty 1-D array, got shape {hashes.shape}")
        out = np.full(self.num_perm, np.iinfo(np.uint64).max, dtype=np.uint64)
        for start in range(0, hashes.size, _CHUNK):
            np.minimum(out, self._permuted_min(hashes[start : start + _CHUNK]), out=out)
        return out

    def _permuted_min(self, hashes: np.ndarray) -> np.ndarray:
        """min over rows of ``(a*h + b mod 2**64) mod p`` for a chunk: uint64 [C] -> [P].

        ``x mod p`` for p = 2**61 - 1 is ``(x & p) + (x >> 61)``, then minus p if that is >= p
        (2**61 = 1 mod p): exact, and twice as fast as numpy's ``%`` on uint64.
        """
        x = hashes[:, None] * self.a  # (C, P), wraps mod 2**64 as datatrove's does
        x += self.b
        y = x & MERSENNE_PRIME
        x >>= np.uint64(61)
        y += x  # (C, P) in [0, p + 7]
        if y.max() >= MERSENNE_PRIME:  # rare: a value in [p, p + 7] must be reduced first
            y[y >= MERSENNE_PRIME] -= MERSENNE_PRIME
        return y.min(axis=0)


def band_keys(signature: np.ndarray, bands: int = 14, rows: int = 8) -> list[bytes]:
    """LSH band keys: documents sharing any key are candidate near-duplicates.

    Key ``i`` is the band index as 2 big-endian bytes followed by the 16-byte BLAKE2b digest
    of band ``i``'s ``rows`` values (little-endian uint64): equal bands at different indexes
    never collide, and 18 bytes go through the shuffle instead of 2 + 8 x rows. Two distinct
    bands share a digest with probability 2**-128.

    Example: ``band_keys(sig)[3][:2] == b"\\x00\\x03"`` and
    ``band_keys(sig)[3][2:] == blake2b(sig[24:32].astype("<u8").tobytes(), digest_size=16)``.

    Args:
        signature: uint64 ``[bands * rows]`` from :meth:`MinHasher.signature`.
        bands: number of bands (datatrove's ``num_buckets``, 14).
        rows: values per band (datatrove's ``hashes_per_bucket``, 8).

    Returns:
        ``list[bytes]`` of ``bands`` keys of 18 bytes, in band order.

    Raises:
        ValueError: the signature's length is not ``bands * rows``, or bands > 65536.
    """
    signature = np.asarray(signature)
    if not 0 < bands <= 1 << 16 or rows < 1 or signature.shape != (bands * rows,):
        raise ValueError(
            f"signature must have bands * rows = {bands} * {rows} values, got shape "
            f"{signature.shape} (bands in [1, 65536], rows >= 1)"
        )
    data = signature.astype("<u8").tobytes()
    width = 8 * rows
    return [
        band.to_bytes(2, "big")
        + hashlib.blake2b(data[band * width : (band + 1) * width], digest_size=16).digest()
        for band in range(bands)
    ]


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Jaccard similarity |a & b| / |a | b| of two shingle-hash sets (for tests and benches).

    Example: ``jaccard(np.array([1, 2, 3]), np.array([2, 3, 4]))`` -> 0.5.

    Args:
        a, b: 1-D arrays of hashes (any integer dtype; repeats are ignored).

    Returns:
        A ``float`` in [0, 1]; 1.0 when both are empty (two equal, empty sets).
    """
    a, b = np.unique(a), np.unique(b)
    union = np.union1d(a, b).size
    if union == 0:
        return 1.0
    return np.intersect1d(a, b, assume_unique=True).size / union
