"""The data order: one endless stream of rows, epoch after epoch, a pure function of the seed.

Epoch ``e`` is a permutation of all rows: the shards are put in the order
``numpy_rng(seed, "shard_order", e).permutation(num_shards)``, their rows concatenated,
and each window of ``window`` consecutive rows of that concatenation is shuffled with
``numpy_rng(seed, "window", e, w)``. (The pipeline already spread every document's rows
over shards and positions by a seeded hash; the window shuffle makes each epoch's order
differ too, while a window touches only one or two shards at a time.)

Epochs are laid end to end into a stream; stream position ``p`` is row
``p % num_rows`` of epoch ``p // num_rows``. The trainer consumes the stream in
consecutive global micro-batches of ``world_size x micro`` rows; rank ``r`` takes the
``r``-th slice of ``micro`` rows of each (see :func:`rank_positions`). Hence:

- within an epoch no row is dropped or repeated, whatever the number of ranks, DataLoader
  workers or shards: the remainder of an epoch that does not fill a global micro-batch is
  not dropped, the batch is filled up with the first rows of the next epoch;
- the whole data position is one integer, the stream position, saved with each checkpoint;
  a run resumed from it — on any number of ranks — continues the same stream.

Example (2 shards of 3 and 2 rows, no shuffle): stream = (0,0) (0,1) (0,2) (1,0) (1,1) |
(0,0) ...; with 2 ranks x micro 2 the first global micro-batch is rank 0: (0,0) (0,1),
rank 1: (0,2) (1,0); the second is rank 0: (1,1) (0,0) — the last row of epoch 0 and the
first of epoch 1.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from pipeline.core.rng import numpy_rng


def rank_positions(start: int, k: int, micro: int, world_size: int, rank: int) -> np.ndarray:
    """Stream positions of rank ``rank``'s ``k``-th micro-batch after stream position ``start``.

    ``rank_positions(10, 1, 2, 2, 1) -> [16, 17]`` (global micro-batch 1 = positions 14..17).

    Returns:
        int64 (micro,).
    """
    first = start + k * micro * world_size + rank * micro
    return np.arange(first, first + micro, dtype=np.int64)


class StreamOrder:
    """Maps stream positions to (epoch, shard, row).

    Args:
        rows_per_shard: int (num_shards,), rows of each shard in manifest order (0 for a
            shard that is skipped).
        seed: the run's seed.
        window: rows shuffled together (>= 1).
        shuffle: False gives the manifest order in every epoch (for evaluation).

    Raises:
        ValueError: no rows, or window < 1.
    """

    def __init__(self, rows_per_shard: np.ndarray, seed: int, window: int, shuffle: bool = True):
        self.rows_per_shard = np.asarray(rows_per_shard, dtype=np.int64)
        self.num_rows = int(self.rows_per_shard.sum())
        if self.num_rows <= 0:
            raise ValueError("the shards hold no rows")
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.seed, self.window, self.shuffle = seed, window, shuffle
        self._epochs: OrderedDict[int, np.ndarray] = OrderedDict()  # epoch -> shard order
        self._windows: OrderedDict[tuple[int, int], np.ndarray] = OrderedDict()

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(epoch, shard, row) of each stream position.

        Args:
            positions: int (n,), >= 0.

        Returns:
            Three int64 (n,) arrays.
        """
        positions = np.asarray(positions, dtype=np.int64)
        epochs, offsets = np.divmod(positions, self.num_rows)
        shards = np.empty_like(positions)
        rows = np.empty_like(positions)
        for epoch in np.unique(epochs).tolist():
            at = epochs == epoch
            shards[at], rows[at] = self._locate_in_epoch(int(epoch), offsets[at])
        return epochs, shards, rows

    def _locate_in_epoch(self, epoch: int, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        order = self._shard_order(epoch)  # (S,) shard indexes
        ends = np.cumsum(self.rows_per_shard[order])  # (S,)
        concatenated = offsets.copy()
        if self.shuffle:
            windows = offsets // self.window
            for w in np.unique(windows).tolist():
                at = windows == w
                base = w * self.window
                concatenated[at] = base + self._window_perm(epoch, w)[offsets[at] - base]
        slot = np.searchsorted(ends, concatenated, side="right")  # index into order
        rows = concatenated - (ends[slot] - self.rows_per_shard[order[slot]])
        return order[slot], rows

    def _shard_order(self, epoch: int) -> np.ndarray:
        if epoch not in self._epochs:
            n = len(self.rows_per_shard)
            order = np.arange(n, dtype=np.int64)
            if self.shuffle:
                order = numpy_rng(self.seed, "shard_order", epoch).permutation(n)
            self._epochs[epoch] = order
            _trim(self._epochs, 2)
        return self._epochs[epoch]

    def _window_perm(self, epoch: int, w: int) -> np.ndarray:
        key = (epoch, w)
        if key not in self._windows:
            size = min(self.window, self.num_rows - w * self.window)
            self._windows[key] = numpy_rng(self.seed, "window", epoch, w).permutation(size)
            _trim(self._windows, 4)
        self._windows.move_to_end(key)
        return self._windows[key]


def _trim(cache: OrderedDict, size: int) -> None:
    while len(cache) > size:
        cache.popitem(last=False)
