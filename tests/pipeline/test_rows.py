import numpy as np
import pytest

from pipeline.core.rows import RowBlock, take_ragged


def test_take_ragged_known_answer():
    flat, offsets = np.array([1, 2, 3, 4, 5]), np.array([0, 2, 5])
    values, new = take_ragged(flat, offsets, np.array([1, 0]))
    assert values.tolist() == [3, 4, 5, 1, 2]
    assert new.tolist() == [0, 3, 5]


def block(keys, lengths, start=0):
    """Rows k of ids start+10k .. (n of them), positions [1, n-2] masked by their own ids."""
    ids = [
        np.arange(start + 10 * k, start + 10 * k + n, dtype=np.int32) for k, n in enumerate(lengths)
    ]
    positions = [np.array([1, n - 2], dtype=np.int32) for n in lengths]
    return RowBlock(
        keys=np.asarray(keys, dtype=np.uint64),
        input_ids=np.concatenate(ids),
        b_starts=np.array([n // 2 for n in lengths], dtype=np.uint16),
        row_offsets=np.concatenate([[0], np.cumsum(lengths)]),
        masked_lm_positions=np.concatenate(positions),
        masked_lm_ids=np.concatenate([i[p] for i, p in zip(ids, positions, strict=True)]),
        mlm_offsets=np.arange(0, 2 * len(lengths) + 1, 2),
        next_sentence_label=(np.arange(len(lengths)) % 2).astype(np.uint8),
    )


def test_concat_then_sort_keeps_rows_whole():
    a = block([30, 10], [5, 7])
    b = block([20], [6], start=100)
    merged = RowBlock.concat([a, RowBlock.empty(), b]).sorted_by_key()
    assert merged.keys.tolist() == [10, 20, 30]

    def row(name, offsets, r):
        return getattr(merged, name)[offsets[r] : offsets[r + 1]].tolist()

    assert np.diff(merged.row_offsets).tolist() == [7, 6, 5]
    assert row("input_ids", merged.row_offsets, 0) == list(range(10, 17))
    assert row("input_ids", merged.row_offsets, 1) == list(range(100, 106))
    assert row("masked_lm_ids", merged.mlm_offsets, 2) == [1, 3]
    segment_ids = merged.segment_ids()
    assert (
        segment_ids[: merged.row_offsets[2]].tolist() == [0, 0, 0, 1, 1, 1, 1] + [0] * 3 + [1] * 3
    )
    assert merged.next_sentence_label.tolist() == [1, 0, 0]


def test_empty_block_has_no_rows():
    empty = RowBlock.concat([])
    assert len(empty) == 0 and empty.row_offsets.tolist() == [0]


def test_segment_ids_known_answer():
    rows = RowBlock.empty()
    rows.input_ids = np.arange(9)
    rows.row_offsets = np.array([0, 5, 9])
    rows.b_starts = np.array([3, 2], dtype=np.uint16)
    assert rows.segment_ids().tolist() == [0, 0, 0, 1, 1, 0, 0, 1, 1]


def test_pickle_round_trip_is_exact_and_compact():
    import pickle

    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 129, 20_000)
    big = block(rng.integers(0, 2**63, 20_000), lengths.tolist())
    big.input_ids = (big.input_ids % 30_000).astype(np.uint16)  # as the pipeline ships them
    for original in (big, block([3, 1], [5, 7]), RowBlock.empty()):
        copy = pickle.loads(pickle.dumps(original))
        for name, array in vars(original).items():
            assert getattr(copy, name).dtype == array.dtype, name
            assert np.array_equal(getattr(copy, name), array), name
    raw = sum(array.nbytes for array in vars(big).values())
    assert len(pickle.dumps(big)) < 0.8 * raw  # compressed ids, uint16 lengths for offsets


def test_a_blocks_size_counts_its_arrays_for_dask():
    """Dask sizes a task's result with ``dask.sizeof``, which falls back to sys.getsizeof
    for an object: without ``__sizeof__`` a block of megabytes counted as 56 bytes, so the
    rows a worker held were memory it could not spill."""
    import sys

    sizeof = pytest.importorskip("dask.sizeof").sizeof
    rng = np.random.default_rng(0)
    big = block(rng.integers(0, 2**63, 5_000), rng.integers(5, 129, 5_000).tolist())
    assert big.nbytes > 1_000_000
    assert sys.getsizeof(big) >= big.nbytes
    assert big.nbytes <= sizeof(big) < big.nbytes + 1_000
    assert sizeof([(7, big), (8, big)]) >= 2 * big.nbytes  # as a Dask partition holds blocks
