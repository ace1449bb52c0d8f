"""MinHash near-duplicate detection (pipeline/core/dedup.py): known answers, datatrove's
formula, and LSH behaviour on seeded planted copies."""

import hashlib
import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline.core.dedup import (
    CJK_CHAR,
    MERSENNE_PRIME,
    MinHasher,
    band_keys,
    jaccard,
    ngram_set,
    normalize,
    shingle_hashes,
    words,
)

xxhash = pytest.importorskip("xxhash", reason="xxhash is in the curate extra")

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "chinese" / "sample.jsonl"
TEXT_A = "The quick brown fox jumps over the lazy dog. It was not amused, and said so twice."
TEXT_B = "自然语言处理是计算机科学和人工智能的一个重要方向。"


def sig_sha256(signature: np.ndarray) -> str:
    return hashlib.sha256(signature.astype("<u8").tobytes()).hexdigest()


def random_text(rng: random.Random, n_words: int) -> list[str]:
    """Words of 3-9 random lowercase letters: no two texts share a 5-gram by chance."""
    return [
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 9)))
        for _ in range(n_words)
    ]


def edit(rng: random.Random, text: list[str], rate: float) -> list[str]:
    """Replace round(rate * len) words at distinct random positions by new random words."""
    out = list(text)
    for i in rng.sample(range(len(out)), round(rate * len(out))):
        out[i] = "zz" + out[i][::-1]  # a word the text does not contain
    return out


def test_normalize_known_answers():
    assert normalize("Héllo,  WORLD!\n42 times") == "hello world 0 times"
    assert normalize("Python 3.11: 1,000 x2 ٣٤") == "python 0 0 x0 0"  # numbers as datatrove
    assert normalize("end.Start a/b don't") == "end start a b don t"
    assert normalize("自然语言，处理。") == "自然语言 处理"
    assert normalize("tab\there\x00nul ©2024 😀") == "tab here nul 0"
    assert normalize("?!...") == ""
    with pytest.raises(TypeError):
        normalize(b"bytes")


def test_words_split_cjk_characters():
    assert words("bert 模型 v0") == ["bert", "模", "型", "v0"]
    assert words("ひらがな カタカナ") == ["ひ", "ら", "が", "な", "カ", "タ", "カ", "ナ"]


def test_shingles_known_answers():
    assert shingle_hashes("a b c d e f").tolist() == sorted(
        [xxhash.xxh64_intdigest(b"a b c d e"), xxhash.xxh64_intdigest(b"b c d e f")]
    )
    # fewer than n words: one shingle of all of them
    assert shingle_hashes("A, b!").tolist() == [xxhash.xxh64_intdigest(b"a b")]
    assert shingle_hashes("?!").size == 0
    repeated = shingle_hashes("a b c d e " * 10)
    assert repeated.dtype == np.uint64 and repeated.size == 5  # unique
    assert np.all(np.diff(repeated.astype(np.float64)) > 0)  # sorted
    with pytest.raises(ValueError, match="n must be"):
        shingle_hashes("a b", n=0)


def test_chinese_sample_gets_character_shingles():
    docs = [json.loads(line)["text"] for line in SAMPLE.read_text(encoding="utf-8").splitlines()]
    sets = [shingle_hashes(doc) for doc in docs]
    for doc, shingles in zip(docs, sets, strict=True):
        # every ideograph a word (punctuation is none): one 5-gram per word but the last
        # four, less repeats
        n_words = len(words(normalize(doc)))
        assert n_words >= len(CJK_CHAR.findall(doc)) >= 50
        assert n_words - 4 - 2 <= shingles.size <= n_words - 4, doc
    assert max(jaccard(a, b) for i, a in enumerate(sets) for b in sets[i + 1 :]) < 0.1
    edited = docs[0].replace("重要", "主要", 1)  # one character changed
    assert jaccard(sets[0], shingle_hashes(edited)) > 0.85


def test_signatures_pinned():
    minhasher = MinHasher()
    sig_a = minhasher.signature(shingle_hashes(TEXT_A))
    sig_b = minhasher.signature(shingle_hashes(TEXT_B))
    assert sig_a.dtype == np.uint64 and sig_a.shape == (112,)
    assert sig_a[:4].tolist() == [
        85330943174081874,
        17117365841530785,
        39692144680456642,
        34440879854629237,
    ]
    assert sig_sha256(sig_a) == "827082370f0235589bca874eb065bb4a490b79be940309d1feddf3bfebdea7c2"
    assert sig_b[:2].tolist() == [80234470400148036, 135566557360655686]
    assert sig_sha256(sig_b) == "13fede75c0618a2a9b116871bd278273b099651f7f6a05734cb6b41e14cd3b80"


def test_signature_is_datatroves_formula():
    """datatrove's MinhashDedupSignature.get_signature, transcribed: same a, b, same values."""
    gen = np.random.RandomState(1)
    a = gen.randint(1, MERSENNE_PRIME, dtype=np.uint64, size=(1, 112))
    b = gen.randint(0, MERSENNE_PRIME, dtype=np.uint64, size=(1, 112))
    rng = np.random.default_rng(7)
    # 5000 rows: more than one chunk; values near 2**64 exercise the wrap-around
    for shingles in (shingle_hashes(TEXT_A), rng.integers(0, 2**64 - 1, 5000, dtype=np.uint64)):
        expected = np.min((shingles.reshape(-1, 1) * a + b) % MERSENNE_PRIME, axis=0)
        assert np.array_equal(MinHasher(112, seed=1).signature(shingles), expected)
    assert not np.array_equal(
        MinHasher(seed=1).signature(shingle_hashes(TEXT_A)),
        MinHasher(seed=2).signature(shingle_hashes(TEXT_A)),
    )


def test_signature_same_in_another_process():
    code = (
        "from pipeline.core.dedup import MinHasher, shingle_hashes;"
        f"print(MinHasher().signature(shingle_hashes({TEXT_A!r})).tolist())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "123", "PATH": ""},
        cwd=Path(__file__).resolve().parents[2],
    ).stdout
    assert json.loads(out) == MinHasher().signature(shingle_hashes(TEXT_A)).tolist()


def test_signature_errors():
    with pytest.raises(ValueError, match="non-empty"):
        MinHasher().signature(np.zeros(0, dtype=np.uint64))
    with pytest.raises(TypeError, match="uint64"):
        MinHasher().signature(np.array([1, 2]))
    with pytest.raises(ValueError, match="num_perm"):
        MinHasher(num_perm=0)


def test_identical_texts_same_signature_and_keys():
    minhasher = MinHasher()
    one = minhasher.signature(shingle_hashes(TEXT_A))
    # case, punctuation and whitespace are normalised away
    two = minhasher.signature(shingle_hashes("  " + TEXT_A.upper().replace(" ", " ,\n ")))
    assert np.array_equal(one, two)
    assert band_keys(one) == band_keys(two)


def test_band_keys_shape_and_band_index():
    signature = MinHasher().signature(shingle_hashes(TEXT_A))
    keys = band_keys(signature)
    assert len(keys) == 14 and all(len(key) == 18 for key in keys)
    assert keys[3][:2] == b"\x00\x03"
    assert (
        keys[3][2:]
        == hashlib.blake2b(signature[24:32].astype("<u8").tobytes(), digest_size=16).digest()
    )
    # the same values in band 0 and band 1 give different keys
    same = np.tile(signature[:8], 14)
    assert len(set(band_keys(same))) == 14
    with pytest.raises(ValueError, match="bands"):
        band_keys(signature, bands=10, rows=8)


def test_near_copies_share_a_band_unrelated_do_not():
    rng = random.Random(33)
    minhasher = MinHasher()
    near_shared, far_shared, unrelated_shared, trials = 0, 0, 0, 40
    for _ in range(trials):
        text = random_text(rng, 300)
        original = shingle_hashes(" ".join(text))
        near = shingle_hashes(" ".join(edit(rng, text, 0.01)))
        two_percent = shingle_hashes(" ".join(edit(rng, text, 0.02)))
        other = shingle_hashes(" ".join(random_text(rng, 300)))
        # 3 words replaced kill <= 15 of 296 shingles: J >= 281 / 311 = 0.90
        assert jaccard(original, near) >= 0.85
        # 6 words: J >= 266 / 326 = 0.82; LSH keeps such a pair with p = 1 - (1 - J**8)**14
        assert jaccard(original, two_percent) >= 0.8
        keys = set(band_keys(minhasher.signature(original)))
        near_shared += bool(keys & set(band_keys(minhasher.signature(near))))
        far_shared += bool(keys & set(band_keys(minhasher.signature(two_percent))))
        unrelated_shared += bool(keys & set(band_keys(minhasher.signature(other))))
    # expected rates: 0.9996 at J = 0.90 and 0.96 at J = 0.82 (binomial, 40 trials: a count
    # below these bounds has probability about 1e-4 and 1e-3); unrelated texts (J = 0): 0.
    # Seed 33 gives 40, 39 and 0.
    assert near_shared >= trials - 1
    assert far_shared >= 0.85 * trials
    assert unrelated_shared == 0


def test_jaccard_known_answers():
    assert jaccard(np.array([1, 2, 3]), np.array([2, 3, 4])) == 0.5
    assert jaccard(np.array([1, 1, 2]), np.array([2, 1])) == 1.0
    assert jaccard(np.array([], dtype=np.uint64), np.array([], dtype=np.uint64)) == 1.0
    assert jaccard(np.array([1]), np.array([2])) == 0.0


def test_ngram_set_for_decontamination():
    assert ngram_set("a b c", n=2) == {
        xxhash.xxh64_intdigest(b"a b"),
        xxhash.xxh64_intdigest(b"b c"),
    }
    eval_text = " ".join(f"w{i}" for i in range(20))
    train = "Some preface. " + " ".join(f"W{i}" for i in range(5, 18)) + " trailing words."
    assert ngram_set(train) & ngram_set(eval_text)  # shares the 13-gram w5 .. w17
    assert not ngram_set(" ".join(f"w{i}" for i in range(5, 17))) & ngram_set(eval_text)  # 12 only
    # CJK: characters are words, so a 13-character run is a 13-gram
    assert len(ngram_set("自然语言处理是计算机科学和人工智能")) == 17 - 13 + 1


def test_missing_xxhash_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "xxhash", None)  # makes the import fail
    with pytest.raises(ImportError, match=r"pip install 'bert-pipeline\[curate\]'"):
        shingle_hashes(TEXT_A)
