"""Tests for pipeline/core/masking.py: Google's masking rules, statistics, determinism."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.core.masking import (
    MaskingConfig,
    MaskingVocab,
    mask_flat,
    mask_instance,
    mask_instances,
    num_to_predict,
)

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
VOCAB_SIZE = 1000
# Ids 500..999 are "##" pieces.
TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [
    f"w{i}" if i < 500 else f"##p{i}" for i in range(5, VOCAB_SIZE)
]
VOCAB = MaskingVocab.from_tokens(TOKENS)


def make_rows(seed: int, count: int, *, max_len: int = 128, pieces: bool = False) -> list:
    """Rows laid out as [CLS] A [SEP] B [SEP]; with pieces, some words have ## pieces."""
    gen = np.random.default_rng(seed)
    rows = []
    for _ in range(count):
        length = int(gen.integers(5, max_len + 1))
        high = VOCAB_SIZE if pieces else 500
        row = gen.integers(5, high, size=length).astype(np.int32)
        first_sep = int(gen.integers(2, length - 2))
        row[[0, first_sep, length - 1]] = CLS, SEP, SEP
        rows.append(row)
    return rows


def full_row(seed: int = 0) -> np.ndarray:
    row = np.random.default_rng(seed).integers(5, 500, size=128).astype(np.int32)
    row[[0, 64, 127]] = CLS, SEP, SEP
    return row


def test_num_to_predict_matches_pythons_round():
    lengths = np.arange(0, 1025)
    for p in [0.15, 0.1, 0.2, 0.25, 0.5, 1 / 3, 0.125, 0.3, 0.05, 0.01, 0.7, 1.0]:
        for cap in [1, 20, 80, 10**6]:
            config = MaskingConfig(masked_lm_prob=p, max_predictions_per_seq=cap)
            expected = [min(cap, max(1, round(n * p))) for n in lengths.tolist()]
            assert num_to_predict(lengths, config).tolist() == expected
    # Half to even, not half up: round(2.5) == 2, round(3.5) == 4.
    half = MaskingConfig(masked_lm_prob=0.5, max_predictions_per_seq=100)
    assert num_to_predict(np.array([5, 7]), half).tolist() == [2, 4]
    assert int(num_to_predict(128, MaskingConfig())) == 19


def test_full_128_token_row_gets_19_masks():
    gen = np.random.default_rng(0)
    for seed in range(20):
        masked = mask_instance(full_row(seed), MaskingConfig(), VOCAB, gen)
        assert len(masked.masked_lm_positions) == 19


@pytest.mark.parametrize("whole_words", [False, True])
def test_rules_hold_on_many_rows(whole_words):
    config = MaskingConfig(do_whole_word_mask=whole_words)
    rows = make_rows(1, 600, pieces=whole_words)
    copies = [row.copy() for row in rows]
    results = mask_instances(rows, config, VOCAB, np.random.default_rng(2))
    assert len(results) == len(rows)
    for row, copy, result in zip(rows, copies, results, strict=True):
        assert np.array_equal(row, copy)  # input not modified
        positions, labels = result.masked_lm_positions, result.masked_lm_ids
        assert result.input_ids.dtype == positions.dtype == labels.dtype == np.int32
        assert np.all(np.diff(positions) > 0)  # sorted and unique
        assert not np.isin(row[positions], [CLS, SEP]).any()
        assert np.array_equal(labels, row[positions])
        unmasked = np.ones(len(row), dtype=bool)
        unmasked[positions] = False
        assert np.array_equal(result.input_ids[unmasked], row[unmasked])
        budget = min(20, max(1, round(len(row) * 0.15)))
        candidates = np.count_nonzero((row != CLS) & (row != SEP))
        if whole_words:
            assert len(positions) <= budget
        else:
            assert len(positions) == min(budget, candidates)


def words_of(row: np.ndarray) -> list[list[int]]:
    """Google's whole-word grouping, written plainly: ## joins the previous candidate's word."""
    words: list[list[int]] = []
    for i, token in enumerate(TOKENS[t] for t in row.tolist()):
        if token in ("[CLS]", "[SEP]"):
            continue
        if words and token.startswith("##"):
            words[-1].append(i)
        else:
            words.append([i])
    return words


def test_whole_words_are_masked_whole_and_greedily():
    config = MaskingConfig(do_whole_word_mask=True, max_predictions_per_seq=20)
    rows = make_rows(3, 800, pieces=True)
    results = mask_instances(rows, config, VOCAB, np.random.default_rng(4))
    short_of_budget = 0
    for row, result in zip(rows, results, strict=True):
        chosen = set(result.masked_lm_positions.tolist())
        budget = min(20, max(1, round(len(row) * 0.15)))
        assert len(chosen) <= budget
        unchosen_sizes = []
        for word in words_of(row):
            taken = [i in chosen for i in word]
            assert all(taken) or not any(taken), (row, word, chosen)
            if not any(taken):
                unchosen_sizes.append(len(word))
        # Google's walk only leaves budget unused when every unchosen word
        # would overshoot it.
        if unchosen_sizes:
            assert budget - len(chosen) < min(unchosen_sizes)
        short_of_budget += len(chosen) < budget
    assert short_of_budget > 0  # the skip rule was exercised


def test_whole_word_quirks_across_sep_and_rows():
    config = MaskingConfig(masked_lm_prob=1.0, max_predictions_per_seq=3, do_whole_word_mask=True)
    # ## after [CLS] starts a word; ## after the middle [SEP] joins A's last word.
    row = np.array([CLS, 600, 10, 600, SEP, 601, 11, SEP], dtype=np.int32)
    # Words: {1} {2, 3, 5} {6}; budget 3: either {2, 3, 5}, or some of {1} {6}.
    seen = set()
    gen = np.random.default_rng(0)
    for _ in range(200):
        rows = [row, np.array([CLS, 602, SEP, 603, SEP], dtype=np.int32)]
        first, second = mask_instances(rows, config, VOCAB, gen)
        seen.add(tuple(first.masked_lm_positions.tolist()))
        # The ## after row 2's [CLS] starts a word (not joined to row 1's last
        # word) and the ## after its middle [SEP] joins it: one word {1, 3}.
        assert second.masked_lm_positions.tolist() == [1, 3]
    assert seen == {(2, 3, 5), (1, 6)}


def test_80_10_10_proportions_and_random_ids():
    rows = [full_row(seed) for seed in range(5000)]
    results = mask_instances(rows, MaskingConfig(), VOCAB, np.random.default_rng(5))
    labels = np.concatenate([r.masked_lm_ids for r in results])
    written = np.concatenate([r.input_ids[r.masked_lm_positions] for r in results])
    n = len(labels)
    assert n == 5000 * 19
    masked = np.mean(written == MASK)
    kept = np.mean(written == labels)
    other = written[(written != MASK) & (written != labels)]
    # Standard errors: ~0.0013 for 0.8, ~0.001 for 0.1; allow ~4.5 of them.
    assert abs(masked - 0.8) < 0.006, masked
    assert abs(kept - 0.1) < 0.0045, kept
    assert abs(len(other) / n - 0.1) < 0.0045, len(other) / n
    # Random ids come from the whole vocabulary, specials included, uniformly.
    counts = np.bincount(other, minlength=VOCAB_SIZE)
    assert counts[:5].sum() > 0
    assert abs(other.mean() - (VOCAB_SIZE - 1) / 2) < 0.02 * VOCAB_SIZE
    quarters = counts.reshape(4, -1).sum(axis=1) / len(other)
    assert np.all(np.abs(quarters - 0.25) < 0.02), quarters


def test_positions_are_uniform_over_candidates():
    row = full_row(0)
    trials = 4000
    results = mask_instances([row] * trials, MaskingConfig(), VOCAB, np.random.default_rng(6))
    hits = np.bincount(np.concatenate([r.masked_lm_positions for r in results]), minlength=128)
    assert hits[[0, 64, 127]].sum() == 0
    expected = trials * 19 / 125  # ~608 per candidate, sd ~23
    candidate_hits = np.delete(hits, [0, 64, 127])
    assert np.all(np.abs(candidate_hits - expected) < 5 * np.sqrt(expected)), candidate_hits
    # Rows differ from each other: the shuffle is per row.
    assert len({tuple(r.masked_lm_positions.tolist()) for r in results[:50]}) == 50


def test_cap_is_respected():
    for whole_words in (False, True):
        config = MaskingConfig(
            masked_lm_prob=0.5, max_predictions_per_seq=7, do_whole_word_mask=whole_words
        )
        rows = make_rows(7, 300, pieces=True)
        for result in mask_instances(rows, config, VOCAB, np.random.default_rng(8)):
            assert len(result.masked_lm_positions) <= 7


def test_deterministic_given_generator_seed():
    rows = make_rows(9, 50, pieces=True)
    for whole_words in (False, True):
        config = MaskingConfig(do_whole_word_mask=whole_words)
        runs = [mask_instances(rows, config, VOCAB, np.random.default_rng(s)) for s in (1, 1, 2)]
        same = [
            np.array_equal(a.input_ids, b.input_ids)
            and np.array_equal(a.masked_lm_positions, b.masked_lm_positions)
            for a, b in zip(runs[0], runs[1], strict=True)
        ]
        assert all(same)
        differ = [
            np.array_equal(a.masked_lm_positions, b.masked_lm_positions)
            for a, b in zip(runs[0], runs[2], strict=True)
        ]
        assert not all(differ)


def test_rows_without_candidates_and_empty_batches():
    row = np.array([CLS, SEP, SEP], dtype=np.int32)
    result = mask_instance(row, MaskingConfig(), VOCAB, np.random.default_rng(0))
    assert result.masked_lm_positions.tolist() == [] and result.input_ids.tolist() == [2, 3, 3]
    assert mask_instances([], MaskingConfig(), VOCAB, np.random.default_rng(0)) == []


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"masked_lm_prob": 0.0}, "masked_lm_prob"),
        ({"masked_lm_prob": 1.5}, "masked_lm_prob"),
        ({"masked_lm_prob": float("nan")}, "masked_lm_prob"),
        ({"max_predictions_per_seq": 0}, "max_predictions_per_seq"),
        ({"max_predictions_per_seq": 20.0}, "max_predictions_per_seq"),
        ({"do_whole_word_mask": 1}, "do_whole_word_mask"),
    ],
)
def test_config_validation_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        MaskingConfig(**kwargs)


def test_vocab_validation_and_bad_rows():
    with pytest.raises(ValueError, match="mask_id"):
        MaskingVocab(cls_id=2, sep_id=3, mask_id=1000, vocab_size=1000)
    with pytest.raises(ValueError, match="distinct"):
        MaskingVocab(cls_id=2, sep_id=2, mask_id=4, vocab_size=1000)
    with pytest.raises(ValueError, match="is_continuation"):
        MaskingVocab(cls_id=2, sep_id=3, mask_id=4, vocab_size=10, is_continuation=np.zeros(9))
    with pytest.raises(ValueError, match=r"\[MASK\]"):
        MaskingVocab.from_tokens(["[CLS]", "[SEP]", "a"])
    plain = MaskingVocab(cls_id=2, sep_id=3, mask_id=4, vocab_size=1000)
    gen = np.random.default_rng(0)
    with pytest.raises(ValueError, match="is_continuation"):
        mask_instances([full_row()], MaskingConfig(do_whole_word_mask=True), plain, gen)
    with pytest.raises(ValueError, match="ids must be in"):
        mask_instances([np.array([2, 1000, 3])], MaskingConfig(), plain, gen)
    with pytest.raises(ValueError, match="1-D"):
        mask_instances([np.zeros((2, 3), dtype=np.int32)], MaskingConfig(), plain, gen)
    assert VOCAB.is_continuation is not None and not VOCAB.is_continuation.flags.writeable


def flat_of(rows):
    offsets = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
    return np.concatenate(rows), offsets


@pytest.mark.parametrize("whole_words", [False, True])
def test_mask_flat_rules_and_statistics(whole_words):
    rows = make_rows(3, 3000, pieces=whole_words) + [full_row(s) for s in range(2000)]
    flat, offsets = flat_of(rows)
    keys = np.random.default_rng(0).integers(0, 2**63, size=len(rows), dtype=np.uint64)
    config = MaskingConfig(do_whole_word_mask=whole_words)
    masked, selected = mask_flat(flat, offsets, keys, config, VOCAB)
    assert np.all(np.diff(selected) > 0)
    assert not np.isin(flat[selected], [CLS, SEP]).any()
    per_row = np.diff(np.searchsorted(selected, offsets))
    budget = num_to_predict(np.diff(offsets), config)
    assert np.all(per_row <= budget)
    if not whole_words:
        assert np.array_equal(per_row[3000:], np.full(2000, 19))  # full 128-token rows
        assert np.array_equal(per_row, budget)
    untouched = np.ones(len(flat), dtype=bool)
    untouched[selected] = False
    assert np.array_equal(masked[untouched], flat[untouched])
    written, labels = masked[selected], flat[selected]
    assert abs(np.mean(written == MASK) - 0.8) < 0.01
    assert abs(np.mean(written == labels) - 0.1) < 0.008
    assert abs(np.mean((written != MASK) & (written != labels)) - 0.1) < 0.008


def test_mask_flat_depends_only_on_each_rows_key():
    rows = make_rows(4, 50)
    keys = np.arange(1000, 1050, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    flat, offsets = flat_of(rows)
    together, sel = mask_flat(flat, offsets, keys, MaskingConfig(), VOCAB)
    for r in (0, 17, 49):
        one, one_sel = mask_flat(
            rows[r], np.array([0, len(rows[r])]), keys[r : r + 1], MaskingConfig(), VOCAB
        )
        assert np.array_equal(one, together[offsets[r] : offsets[r + 1]])
        in_row = sel[(sel >= offsets[r]) & (sel < offsets[r + 1])] - offsets[r]
        assert np.array_equal(one_sel, in_row)
    other, _ = mask_flat(flat, offsets, keys + np.uint64(1), MaskingConfig(), VOCAB)
    assert not np.array_equal(other, together)
    with pytest.raises(ValueError, match="one key per row"):
        mask_flat(flat, offsets, keys[:3], MaskingConfig(), VOCAB)


# ----------------------------------------------------------------------------- mask_split, word_joins


def test_googles_split_keeps_its_thresholds_exactly():
    # 0.8 + 0.1 is 0.9000000000000001 in float64: keep_below is 1 - random, which is 0.9.
    assert MaskingConfig().thresholds == (0.8, 0.9)
    assert MaskingConfig(mask_split=(0.5, 0.2, 0.3)).thresholds == (0.5, 0.7)


@pytest.mark.parametrize("split", [(0.5, 0.2, 0.3), (1.0, 0.0, 0.0), (0.0, 1.0, 0.0)])
def test_mask_split_sets_the_shares(split):
    config = MaskingConfig(masked_lm_prob=0.3, max_predictions_per_seq=40, mask_split=split)
    results = mask_instances(make_rows(11, 400), config, VOCAB, np.random.default_rng(12))
    chosen = np.concatenate([r.input_ids[r.masked_lm_positions] for r in results])
    originals = np.concatenate([r.masked_lm_ids for r in results])
    masked = chosen == MASK
    kept = ~masked & (chosen == originals)
    shares = masked.mean(), kept.mean(), 1 - masked.mean() - kept.mean()
    # About 9,000 predictions: sd of a share <= 0.005; a random id equals the original 0.1%.
    assert np.allclose(shares, split, atol=0.02), (shares, split)


def test_word_joins_group_a_rows_tokens_as_words():
    rows = make_rows(13, 200)  # no "##" pieces: every group comes from the joins
    gen = np.random.default_rng(14)
    joins = []
    for r in rows:  # as a continues_word column: False at and right after [CLS] / [SEP]
        special = (r == CLS) | (r == SEP)
        joins.append((gen.random(len(r)) < 0.5) & ~special & ~np.roll(special, 1))
    config = MaskingConfig(masked_lm_prob=0.3, max_predictions_per_seq=40, do_whole_word_mask=True)
    results = mask_instances(rows, config, VOCAB, np.random.default_rng(15), word_joins=joins)
    for r, row, j in zip(results, rows, joins, strict=True):
        chosen = np.zeros(len(row), dtype=bool)
        chosen[r.masked_lm_positions] = True
        words = np.cumsum(~j)  # word number of each token (a join continues the one before)
        for word in np.unique(words[chosen]):
            assert chosen[words == word].all()  # a word is masked whole or not at all
    plain = mask_instances(rows, config, VOCAB, np.random.default_rng(15))
    assert any(
        not np.array_equal(a.masked_lm_positions, b.masked_lm_positions)
        for a, b in zip(results, plain, strict=True)
    )


def test_bad_split_or_word_joins_are_refused():
    with pytest.raises(ValueError, match="mask_split"):
        MaskingConfig(mask_split=(0.8, 0.1, 0.2))
    with pytest.raises(ValueError, match="mask_split"):
        MaskingConfig(mask_split=(1.2, -0.1, -0.1))
    row = full_row()
    joins = [np.zeros(len(row), dtype=bool)]
    with pytest.raises(ValueError, match="word_joins needs do_whole_word_mask"):
        mask_instances([row], MaskingConfig(), VOCAB, np.random.default_rng(0), word_joins=joins)
    whole = MaskingConfig(do_whole_word_mask=True)
    with pytest.raises(ValueError, match="one flag per id"):
        mask_instances([row], whole, VOCAB, np.random.default_rng(0), word_joins=[joins[0][:5]])
