import numpy as np

from pipeline.masking import MaskedInstance
from pipeline.nsp import NspInstance
from pipeline.rows import RowBlock, take_ragged


def test_take_ragged_known_answer():
    flat, offsets = np.array([1, 2, 3, 4, 5]), np.array([0, 2, 5])
    values, new = take_ragged(flat, offsets, np.array([1, 0]))
    assert values.tolist() == [3, 4, 5, 1, 2]
    assert new.tolist() == [0, 3, 5]


def block(keys, lengths, start=0):
    nsp, masked = [], []
    for k, n in enumerate(lengths):
        ids = np.arange(start + 10 * k, start + 10 * k + n, dtype=np.int32)
        seg = (np.arange(n) >= n // 2).astype(np.int8)
        nsp.append(NspInstance(ids, seg, bool(k % 2)))
        pos = np.array([1, n - 2], dtype=np.int32)
        masked.append(MaskedInstance(ids, pos, ids[pos]))
    return RowBlock.from_instances(keys, nsp, masked)


def test_concat_then_sort_keeps_rows_whole():
    a = block([30, 10], [5, 7])
    b = block([20], [6], start=100)
    merged = RowBlock.concat([a, RowBlock.empty(), b]).sorted_by_key()
    assert merged.keys.tolist() == [10, 20, 30]
    cols = merged.columns()
    assert [len(r) for r in cols["input_ids"]] == [7, 6, 5]
    assert cols["input_ids"][0].tolist() == list(range(10, 17))
    assert cols["input_ids"][1].tolist() == list(range(100, 106))
    assert cols["masked_lm_ids"][2].tolist() == [1, 3]
    assert cols["next_sentence_label"].tolist() == [1, 0, 0]
    assert cols["segment_ids"][0].tolist() == [0, 0, 0, 1, 1, 1, 1]


def test_empty_block_has_no_rows():
    cols = RowBlock.concat([]).columns()
    assert all(len(v) == 0 for v in cols.values())
