"""The data order: every epoch a permutation, ranks x workers disjoint, resumable by position."""

import numpy as np
import pytest

from trainer.order import StreamOrder, rank_positions

ROWS = np.array([7, 0, 5, 12, 3])  # uneven, one empty shard: 27 rows
FIRST = np.concatenate([[0], np.cumsum(ROWS)[:-1]])


def row_ids(order: StreamOrder, positions) -> np.ndarray:
    _, shard, row = order.locate(np.asarray(positions))
    assert (row >= 0).all() and (row < ROWS[shard]).all()
    return FIRST[shard] + row


def test_docstring_example_without_shuffle():
    order = StreamOrder(np.array([3, 2]), seed=0, window=4, shuffle=False)
    epoch, shard, row = order.locate(np.arange(7))
    assert epoch.tolist() == [0, 0, 0, 0, 0, 1, 1]
    assert list(zip(shard.tolist(), row.tolist(), strict=True)) == [
        (0, 0),
        (0, 1),
        (0, 2),
        (1, 0),
        (1, 1),
        (0, 0),
        (0, 1),
    ]
    assert rank_positions(0, 1, 2, 2, 0).tolist() == [4, 5]
    assert rank_positions(10, 1, 2, 2, 1).tolist() == [16, 17]


@pytest.mark.parametrize("window", [1, 4, 10, 1000])
def test_each_epoch_is_a_different_permutation(window):
    order = StreamOrder(ROWS, seed=3, window=window)
    epochs = [row_ids(order, np.arange(e * 27, (e + 1) * 27)) for e in range(3)]
    for ids in epochs:
        assert sorted(ids.tolist()) == list(range(27))
    if window > 1:
        assert epochs[0].tolist() != epochs[1].tolist()
    again = StreamOrder(ROWS, seed=3, window=window)
    assert row_ids(again, np.arange(81)).tolist() == np.concatenate(epochs).tolist()
    assert (
        row_ids(StreamOrder(ROWS, seed=4, window=window), np.arange(27)).tolist()
        != epochs[0].tolist()
    )


@pytest.mark.parametrize("world_size, micro, workers", [(2, 4, 2), (3, 2, 1), (1, 5, 3)])
def test_ranks_and_workers_split_an_epoch_without_loss_or_repeat(world_size, micro, workers):
    """27 rows never fill the global batches evenly: the remainder rolls into the next epoch."""
    order = StreamOrder(ROWS, seed=1, window=6)
    per_consumer: dict = {}
    steps = 27 // (world_size * micro) + 2  # past the end of epoch 0
    for rank in range(world_size):
        for k in range(steps):
            worker = k % workers  # what each DataLoader worker of this rank builds
            positions = rank_positions(0, k, micro, world_size, rank)
            per_consumer.setdefault((rank, worker), []).extend(positions.tolist())
    consumed = sorted(p for ps in per_consumer.values() for p in ps)
    assert consumed == list(range(steps * world_size * micro))  # disjoint and gap-free
    epoch0 = row_ids(order, np.array([p for p in consumed if p < 27]))
    assert sorted(epoch0.tolist()) == list(range(27))


def test_resuming_from_a_position_continues_the_same_stream():
    order = StreamOrder(ROWS, seed=9, window=5)
    full = [
        row_ids(order, rank_positions(0, k, 2, 2, r)).tolist() for k in range(10) for r in range(2)
    ]
    start = 3 * 2 * 2  # after 3 global micro-batches
    resumed = [
        row_ids(order, rank_positions(start, k, 2, 2, r)).tolist()
        for k in range(7)
        for r in range(2)
    ]
    assert resumed == full[6:]
    # On one rank with twice the micro batch the same rows come in the same order.
    one_rank = [row_ids(order, rank_positions(start, k, 4, 1, 0)).tolist() for k in range(7)]
    assert [r for b in one_rank for r in b] == [r for b in full[6:] for r in b]


def test_no_rows_is_an_error():
    with pytest.raises(ValueError, match="no rows"):
        StreamOrder(np.array([0, 0]), seed=0, window=4)
