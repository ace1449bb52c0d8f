"""``RowBlock``: masked NSP rows in flat numpy arrays, the unit moved between Beam steps.

Rows travel from instance creation to the shard writers grouped by shard. A block
stores each ragged column as one flat array plus row offsets, so pickling a block
costs a handful of arrays however many rows it holds (a list of small arrays per
row costs microseconds each).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .format import Ragged


def _offsets(lengths: np.ndarray) -> np.ndarray:
    """Row lengths -> int64 offsets, e.g. ``[2, 3] -> [0, 2, 5]``."""
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def take_ragged(flat: np.ndarray, offsets: np.ndarray, order: np.ndarray):
    """Reorder the rows of a ragged array.

    Example: flat ``[1, 2, 3, 4, 5]``, offsets ``[0, 2, 5]``, order ``[1, 0]`` ->
    (``[3, 4, 5, 1, 2]``, ``[0, 3, 5]``).
    """
    lengths = np.diff(offsets)[order]
    new_offsets = _offsets(lengths)
    # For each output value, its index in ``flat``: row start + position in the row.
    index = np.repeat(offsets[:-1][order] - new_offsets[:-1], lengths) + np.arange(new_offsets[-1])
    return flat[index], new_offsets


@dataclass
class RowBlock:
    """R rows. ``keys`` uint64 [R] order rows within a shard; ragged columns are flat
    with int64 offsets [R + 1]: ``input_ids``/``segment_ids`` share ``row_offsets``,
    ``masked_lm_positions``/``masked_lm_ids`` share ``mlm_offsets``. Ids and positions
    use narrow integer types (uint16 where they fit): blocks cross the shuffle."""

    keys: np.ndarray
    input_ids: np.ndarray
    segment_ids: np.ndarray
    row_offsets: np.ndarray
    masked_lm_positions: np.ndarray
    masked_lm_ids: np.ndarray
    mlm_offsets: np.ndarray
    next_sentence_label: np.ndarray

    def __len__(self) -> int:
        return len(self.keys)

    @classmethod
    def concat(cls, blocks: Sequence[RowBlock]) -> RowBlock:
        """One block holding the rows of all ``blocks``, in order."""
        blocks = [b for b in blocks if len(b)] or [cls.empty()]

        def offsets(name: str) -> np.ndarray:
            parts, base = [np.zeros(1, dtype=np.int64)], 0
            for b in blocks:
                parts.append(getattr(b, name)[1:] + base)
                base += int(getattr(b, name)[-1])
            return np.concatenate(parts)

        flat = ("keys", "input_ids", "segment_ids", "masked_lm_positions", "masked_lm_ids",
                "next_sentence_label")  # fmt: skip
        values = {name: np.concatenate([getattr(b, name) for b in blocks]) for name in flat}
        return cls(row_offsets=offsets("row_offsets"), mlm_offsets=offsets("mlm_offsets"), **values)

    @classmethod
    def empty(cls) -> RowBlock:
        zero = np.zeros(1, dtype=np.int64)
        return cls(
            keys=np.zeros(0, np.uint64), input_ids=np.zeros(0, np.int32),
            segment_ids=np.zeros(0, np.int8), row_offsets=zero,
            masked_lm_positions=np.zeros(0, np.int32), masked_lm_ids=np.zeros(0, np.int32),
            mlm_offsets=zero, next_sentence_label=np.zeros(0, np.uint8),
        )  # fmt: skip

    def sorted_by_key(self) -> RowBlock:
        """Rows in increasing key order (keys are 64-bit hashes, so ties are not expected;
        a stable sort keeps the result deterministic even then)."""
        return self.take(np.argsort(self.keys, kind="stable"))

    def take(self, order: np.ndarray) -> RowBlock:
        """The rows at indices ``order`` (int [K]), in that order."""
        input_ids, row_offsets = take_ragged(self.input_ids, self.row_offsets, order)
        segment_ids, _ = take_ragged(self.segment_ids, self.row_offsets, order)
        positions, mlm_offsets = take_ragged(self.masked_lm_positions, self.mlm_offsets, order)
        ids, _ = take_ragged(self.masked_lm_ids, self.mlm_offsets, order)
        return RowBlock(self.keys[order], input_ids, segment_ids, row_offsets, positions, ids,
                        mlm_offsets, self.next_sentence_label[order])  # fmt: skip

    def columns(self) -> dict[str, Ragged | np.ndarray]:
        """The mapping :func:`pipeline.format.encode_shard` takes (no copies)."""
        return {
            "input_ids": Ragged(self.input_ids, self.row_offsets),
            "segment_ids": Ragged(self.segment_ids, self.row_offsets),
            "masked_lm_positions": Ragged(self.masked_lm_positions, self.mlm_offsets),
            "masked_lm_ids": Ragged(self.masked_lm_ids, self.mlm_offsets),
            "next_sentence_label": self.next_sentence_label,
        }
