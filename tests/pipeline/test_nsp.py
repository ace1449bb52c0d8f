"""Tests for pipeline/core/nsp.py: parity with Google's algorithm, invariants, statistics."""

from __future__ import annotations

import random

import numpy as np
import pytest

from pipeline.core.nsp import (
    BucketLayout,
    NspConfig,
    SpecialIds,
    assemble_rows,
    create_instances_from_document,
    plan_document,
    truncation_cuts,
)

CLS_ID, SEP_ID = 101, 102
SPECIAL_IDS = SpecialIds(cls_id=CLS_ID, sep_id=SEP_ID)


# --- Reference: google-research/bert create_pretraining_data.py, transcribed on
# string tokens with its structure kept and the masking call removed.


def google_truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng):
    while True:
        total_length = len(tokens_a) + len(tokens_b)
        if total_length <= max_num_tokens:
            break
        trunc_tokens = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        assert len(trunc_tokens) >= 1
        if rng.random() < 0.5:
            del trunc_tokens[0]
        else:
            trunc_tokens.pop()


def google_create_instances_from_document(
    all_documents, document_index, max_seq_length, short_seq_prob, rng
):
    document = all_documents[document_index]
    max_num_tokens = max_seq_length - 3
    target_seq_length = max_num_tokens
    if rng.random() < short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)
    instances = []
    current_chunk = []
    current_length = 0
    i = 0
    while i < len(document):
        segment = document[i]
        current_chunk.append(segment)
        current_length += len(segment)
        if i == len(document) - 1 or current_length >= target_seq_length:
            if current_chunk:
                a_end = 1
                if len(current_chunk) >= 2:
                    a_end = rng.randint(1, len(current_chunk) - 1)
                tokens_a = []
                for j in range(a_end):
                    tokens_a.extend(current_chunk[j])
                tokens_b = []
                is_random_next = False
                if len(current_chunk) == 1 or rng.random() < 0.5:
                    is_random_next = True
                    target_b_length = target_seq_length - len(tokens_a)
                    for _ in range(10):
                        random_document_index = rng.randint(0, len(all_documents) - 1)
                        if random_document_index != document_index:
                            break
                    random_document = all_documents[random_document_index]
                    random_start = rng.randint(0, len(random_document) - 1)
                    for j in range(random_start, len(random_document)):
                        tokens_b.extend(random_document[j])
                        if len(tokens_b) >= target_b_length:
                            break
                    num_unused_segments = len(current_chunk) - a_end
                    i -= num_unused_segments
                else:
                    is_random_next = False
                    for j in range(a_end, len(current_chunk)):
                        tokens_b.extend(current_chunk[j])
                google_truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
                assert len(tokens_a) >= 1
                assert len(tokens_b) >= 1
                tokens = ["[CLS]", *tokens_a, "[SEP]", *tokens_b, "[SEP]"]
                segment_ids = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
                instances.append((tokens, segment_ids, is_random_next))
            current_chunk = []
            current_length = 0
        i += 1
    return instances


# --- Synthetic corpora.


def make_corpus(seed: int, *, as_numpy: bool = False) -> list[list]:
    """Random documents of random ids; some one-sentence documents, some huge sentences."""
    gen = random.Random(seed)
    documents = []
    for _ in range(gen.choice([1, 1, 2, 3, 5, 8])):
        document = []
        for _ in range(gen.choice([1, 1, 2, 3, 6, 12])):
            # Sometimes a badly split "sentence" hundreds of tokens long.
            length = gen.randint(60, 400) if gen.random() < 0.1 else gen.randint(1, 40)
            document.append([gen.randint(1000, 29999) for _ in range(length)])
        documents.append(document)
    if as_numpy:
        return [[np.array(s, dtype=np.int32) for s in d] for d in documents]
    return documents


def as_strings(documents) -> list[list[list[str]]]:
    return [[[str(int(t)) for t in s] for s in d] for d in documents]


def to_strings(input_ids: np.ndarray) -> list[str]:
    names = {CLS_ID: "[CLS]", SEP_ID: "[SEP]"}
    return [names.get(t, str(t)) for t in input_ids.tolist()]


@pytest.mark.parametrize("max_seq_length", [5, 9, 32, 128, 512])
@pytest.mark.parametrize("short_seq_prob", [0.0, 0.1, 1.0])
def test_matches_google_reference(max_seq_length, short_seq_prob):
    config = NspConfig(max_seq_length=max_seq_length, short_seq_prob=short_seq_prob)
    for seed in range(25):
        documents = make_corpus(seed, as_numpy=seed % 2 == 1)
        string_documents = as_strings(documents)
        ours_rng, google_rng = random.Random(seed), random.Random(seed)
        for _dupe in range(2):
            for index in range(len(documents)):
                ours = create_instances_from_document(
                    documents, index, config, ours_rng, SPECIAL_IDS
                )
                google = google_create_instances_from_document(
                    string_documents, index, max_seq_length, short_seq_prob, google_rng
                )
                assert len(ours) == len(google)
                for instance, (tokens, segment_ids, is_random_next) in zip(
                    ours, google, strict=True
                ):
                    assert to_strings(instance.input_ids) == tokens
                    assert instance.segment_ids.tolist() == segment_ids
                    assert instance.is_random_next == is_random_next
                # Same number and kind of draws: the generators stay in lockstep.
                assert ours_rng.getstate() == google_rng.getstate()


def test_truncation_cuts_match_google_loop_on_both_paths():
    gen = random.Random(0)
    for case in range(3000):
        max_num_tokens = gen.randint(2, 130)
        len_a, len_b = gen.randint(1, 300), gen.randint(1, 300)
        ours_rng, google_rng = random.Random(case), random.Random(case)
        a_front, a_back, b_front, b_back = truncation_cuts(len_a, len_b, max_num_tokens, ours_rng)
        tokens_a, tokens_b = list(range(len_a)), list(range(1000, 1000 + len_b))
        google_truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, google_rng)
        assert tokens_a == list(range(a_front, len_a - a_back))
        assert tokens_b == list(range(1000 + b_front, 1000 + len_b - b_back))
        assert ours_rng.getstate() == google_rng.getstate()


def test_truncation_cuts_known_answer():
    assert truncation_cuts(3, 4, 7, random.Random(0)) == (0, 0, 0, 0)
    # A is cut twice (5 > 3, then 4 > 3); B three times; then the sides alternate.
    a_front, a_back, b_front, b_back = truncation_cuts(10, 8, 10, random.Random(1))
    assert (a_front + a_back, b_front + b_back) == (5, 3)


def test_single_document_corpus_keeps_googles_quirk():
    # With one document all 10 draws hit it, so B comes from the same document
    # and is still labelled random-next (a one-segment chunk is always random).
    config = NspConfig(max_seq_length=10, short_seq_prob=0.0)
    rng = random.Random(0)
    instances = create_instances_from_document([[[1000, 1001]]], 0, config, rng, SPECIAL_IDS)
    assert [x.is_random_next for x in instances] == [True]
    assert instances[0].input_ids.tolist() == [CLS_ID, 1000, 1001, SEP_ID, 1000, 1001, SEP_ID]
    # Draws: short_seq_prob coin, 10 document draws, 1 start draw, nothing else.
    expected = random.Random(0)
    expected.random()
    for _ in range(11):
        expected.randint(0, 0)
    assert rng.getstate() == expected.getstate()


@pytest.mark.parametrize("max_seq_length", [5, 16, 128])
def test_structural_invariants(max_seq_length):
    config = NspConfig(max_seq_length=max_seq_length, short_seq_prob=0.1)
    rng = random.Random(7)
    for seed in range(40):
        documents = make_corpus(100 + seed)
        for index in range(len(documents)):
            for instance in create_instances_from_document(
                documents, index, config, rng, SPECIAL_IDS
            ):
                ids, segments = instance.input_ids, instance.segment_ids
                assert ids.dtype == np.int32 and segments.dtype == np.int8
                assert ids.ndim == 1 and ids.shape == segments.shape
                assert 5 <= len(ids) <= max_seq_length
                assert ids[0] == CLS_ID and ids[-1] == SEP_ID
                (seps,) = np.nonzero(ids == SEP_ID)
                assert len(seps) == 2 and 2 <= seps[0] <= len(ids) - 3
                assert not np.any(ids == CLS_ID) or np.count_nonzero(ids == CLS_ID) == 1
                assert segments.tolist() == [0] * (seps[0] + 1) + [1] * (len(ids) - seps[0] - 1)


def test_not_random_next_takes_b_from_the_same_document_in_order():
    # Each token encodes (document, sentence, position), so B's origin is visible.
    documents = [
        [[d * 10000 + s * 100 + k for k in range(7)] for s in range(9)] for d in range(1, 6)
    ]
    config = NspConfig(max_seq_length=40, short_seq_prob=0.0)
    rng = random.Random(11)
    seen = {True: 0, False: 0}
    for index in range(len(documents)):
        for instance in create_instances_from_document(documents, index, config, rng, SPECIAL_IDS):
            ids = instance.input_ids
            first_sep = int(np.nonzero(ids == SEP_ID)[0][0])
            tokens_a, tokens_b = ids[1:first_sep], ids[first_sep + 1 : -1]
            assert set(tokens_a // 10000) == {index + 1}
            seen[instance.is_random_next] += 1
            if not instance.is_random_next:
                assert set(tokens_b // 10000) == {index + 1}
                assert tokens_b[0] > tokens_a[-1]  # B follows A
            else:
                assert index + 1 not in set(tokens_b // 10000)
    assert seen[True] > 0 and seen[False] > 0


def _bucket_rows(documents, config, rng, passes=1):
    """All rows of a bucket the pipeline's way: one layout, plans, one assembly."""
    segments = [s for d in documents for s in d]
    layout = BucketLayout([len(s) for s in segments], [len(d) for d in documents])
    plans = []
    for _dupe in range(passes):
        for index in range(len(documents)):
            plan_document(layout, index, config, rng, plans)
    tokens = np.concatenate([np.asarray(s, dtype=np.int32) for s in segments])
    input_ids, segment_ids, offsets = assemble_rows(tokens, np.array(plans), SPECIAL_IDS)
    return np.array(plans), input_ids, segment_ids, offsets


def test_bucket_assembly_equals_per_document_instances():
    documents = make_corpus(7) + make_corpus(8) + make_corpus(9)
    config = NspConfig(max_seq_length=32, short_seq_prob=0.2)
    plans, input_ids, segment_ids, offsets = _bucket_rows(documents, config, random.Random(3), 2)
    rng = random.Random(3)
    expected = [
        instance
        for _dupe in range(2)
        for index in range(len(documents))
        for instance in create_instances_from_document(documents, index, config, rng, SPECIAL_IDS)
    ]
    assert len(expected) == len(plans) == len(offsets) - 1
    for r, instance in enumerate(expected):
        row = slice(offsets[r], offsets[r + 1])
        assert input_ids[row].tolist() == instance.input_ids.tolist()
        assert segment_ids[row].tolist() == instance.segment_ids.tolist()
        assert bool(plans[r, 4]) == instance.is_random_next


def test_statistics_on_a_larger_corpus():
    gen = random.Random(5)
    documents = [
        [[1000] * gen.randint(5, 45) for _ in range(gen.randint(2, 40))] for _ in range(400)
    ]
    config = NspConfig(max_seq_length=128, short_seq_prob=0.1)
    plans, _, _, offsets = _bucket_rows(documents, config, random.Random(123), passes=3)
    lengths = np.diff(offsets)
    share = plans[:, 4].mean()
    short_share = (lengths < 64).mean()
    # 50% coin flips plus the one-segment chunks that are always random.
    assert 0.52 < share < 0.60, share
    assert short_share >= 0.08, short_share
    assert lengths.max() <= 128 and lengths.min() >= 5
    # Without short targets far fewer rows are that short.
    long_config = NspConfig(max_seq_length=128, short_seq_prob=0.0)
    _, _, _, long_offsets = _bucket_rows(documents, long_config, random.Random(123))
    assert (np.diff(long_offsets) < 64).mean() < short_share - 0.04


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_seq_length": 4}, "max_seq_length"),
        ({"max_seq_length": 128.0}, "max_seq_length"),
        ({"max_seq_length": True}, "max_seq_length"),
        ({"short_seq_prob": -0.1}, "short_seq_prob"),
        ({"short_seq_prob": 1.5}, "short_seq_prob"),
        ({"short_seq_prob": float("nan")}, "short_seq_prob"),
    ],
)
def test_config_validation_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        NspConfig(**kwargs)


def test_special_ids_validation():
    with pytest.raises(ValueError, match="cls_id"):
        SpecialIds(cls_id=-1, sep_id=102)
    with pytest.raises(ValueError, match="must differ"):
        SpecialIds(cls_id=5, sep_id=5)


def test_bad_documents_raise_value_error():
    config = NspConfig()
    with pytest.raises(ValueError, match="document_index"):
        create_instances_from_document([[[1]]], 1, config, random.Random(0), SPECIAL_IDS)
    with pytest.raises(ValueError, match="non-empty"):
        create_instances_from_document([[]], 0, config, random.Random(0), SPECIAL_IDS)
    with pytest.raises(ValueError, match="non-empty"):
        create_instances_from_document([[[1], []]], 0, config, random.Random(0), SPECIAL_IDS)
