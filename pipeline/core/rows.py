"""``RowBlock``: rows in flat numpy arrays, the unit moved between Beam steps.

Rows travel from instance creation to the shard writers grouped by shard. A block
stores each ragged column as one flat array plus row offsets, so pickling a block
costs a handful of arrays however many rows it holds (a list of small arrays per
row costs microseconds each).
"""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from pipeline.shards.shard_format import KIND_COLUMNS
from pipeline.shards.shard_writer import Ragged

# Rows per step of take_rows (about 300k values at BERT's lengths).
_TAKE_ROWS = 4096
_OFFSET_FIELDS = ("row_offsets", "mlm_offsets")
# Arrays with at least this many bytes cross Beam steps compressed.
_COMPRESS_MIN_BYTES = 1 << 16


def pack_array(array: np.ndarray) -> tuple:
    """``array`` as (dtype, count, bytes), zstd-compressed from ``_COMPRESS_MIN_BYTES`` on:
    how arrays cross Beam's shuffles (token ids compress well). :func:`unpack_array` undoes it."""
    data = array.tobytes()
    codec = "zstd" if len(data) >= _COMPRESS_MIN_BYTES else None
    if codec:
        data = pa.compress(data, codec=codec, asbytes=True)
    return array.dtype.str, len(array), codec, data


def unpack_array(packed: tuple) -> np.ndarray:
    """The array :func:`pack_array` packed (writable)."""
    dtype, count, codec, data = packed
    if codec is not None:
        data = pa.decompress(data, count * np.dtype(dtype).itemsize, codec=codec, asbytes=True)
    return np.frombuffer(data, dtype=dtype, count=count).copy()


def pack_text(parts: Sequence[str]) -> tuple:
    """Strings without line breaks (sentences, ids) as one UTF-8 text, zstd-compressed from
    ``_COMPRESS_MIN_BYTES`` on (English ~3x smaller than the strings pickled one by one).

    Raises:
        ValueError: a string holds a line break (the caller pickles them as they are).
    """
    text = "\n".join(parts)
    if text.count("\n") != max(len(parts) - 1, 0):
        raise ValueError("a string holds a line break")
    data = text.encode("utf-8", "surrogatepass")  # lone surrogates come from JSON escapes
    return pack_array(np.frombuffer(data, dtype=np.uint8)), len(parts)


def unpack_text(packed: tuple) -> list[str]:
    array, count = packed
    if not count:
        return []
    return unpack_array(array).tobytes().decode("utf-8", "surrogatepass").split("\n")


def offsets_of(lengths: np.ndarray) -> np.ndarray:
    """Row lengths -> int64 offsets, e.g. ``[2, 3] -> [0, 2, 5]``."""
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def take_ragged(flat: np.ndarray, offsets: np.ndarray, order: np.ndarray):
    """Reorder the rows of a ragged array.

    Example: flat ``[1, 2, 3, 4, 5]``, offsets ``[0, 2, 5]``, order ``[1, 0]`` ->
    (``[3, 4, 5, 1, 2]``, ``[0, 3, 5]``).
    """
    (values,), new_offsets = take_rows([flat], offsets, order)
    return values, new_offsets


def take_rows(
    columns: Sequence[np.ndarray], offsets: np.ndarray, order: np.ndarray
) -> tuple[list[np.ndarray], np.ndarray]:
    """:func:`take_ragged` for columns that share ``offsets``, a few thousand rows at a
    time: the gather index stays small enough for the CPU caches instead of being a
    fresh array as long as the data, which is much slower on large blocks."""
    lengths = np.diff(offsets)[order]
    new_offsets = offsets_of(lengths)
    outs = [np.empty(int(new_offsets[-1]), dtype=c.dtype) for c in columns]
    # Value p of output row r comes from offsets[order[r]] + (p - new_offsets[r]).
    shift = offsets[:-1][order] - new_offsets[:-1]
    for lo in range(0, len(order), _TAKE_ROWS):
        hi = min(lo + _TAKE_ROWS, len(order))
        start, stop = int(new_offsets[lo]), int(new_offsets[hi])
        index = np.repeat(shift[lo:hi], lengths[lo:hi])
        index += np.arange(start, stop)
        for out, column in zip(outs, columns, strict=True):
            np.take(column, index, out=out[start:stop])
    return outs, new_offsets


@dataclass
class RowBlock:
    """R rows. ``keys`` uint64 [R] order rows within a shard; ragged columns are flat
    with int64 offsets [R + 1]: ``input_ids`` uses ``row_offsets``,
    ``masked_lm_positions``/``masked_lm_ids`` share ``mlm_offsets``. Segment ids are
    not stored: ``b_starts`` [R] holds each row's position of B's first token (the
    segment ids are 0 before it, 1 from it on). Ids and positions use narrow integer
    types (uint16 where they fit): blocks cross the shuffle.

    MLM rows (packed sentences) use the same arrays: ``b_starts`` is the row's length
    (one segment), ``next_sentence_label`` 0 (not written), the masks empty unless
    static, and ``continues_word`` bool, flat like ``input_ids`` (empty for NSP rows)."""

    keys: np.ndarray
    input_ids: np.ndarray
    b_starts: np.ndarray
    row_offsets: np.ndarray
    masked_lm_positions: np.ndarray
    masked_lm_ids: np.ndarray
    mlm_offsets: np.ndarray
    next_sentence_label: np.ndarray
    continues_word: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, bool))

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def nbytes(self) -> int:
        """The bytes of its arrays (in memory, uncompressed)."""
        return sum(array.nbytes for array in self.__dict__.values())

    def __sizeof__(self) -> int:
        """The object and its arrays' bytes. ``sys.getsizeof`` counts a plain object's own
        56 bytes only, and Dask sizes a task's result with it: a 3.6 MB block counted as 56
        bytes, so the rows a Dask worker held between MakeInstances and WriteShards were
        "unmanaged" memory it could neither spill nor plan for, and its workers paused at
        their limit (docs/results.md, "Memory")."""
        return object.__sizeof__(self) + self.nbytes

    def __getstate__(self) -> dict:
        """Pickled (how Beam moves blocks between steps) compactly: offsets as uint16 row
        lengths, and every array of 64 KiB or more zstd-compressed.
        Shuffled bytes are what a local runner's data plane is slowest at, and a
        shuffle service bills them."""
        state = {}
        for name, array in self.__dict__.items():
            kind = "raw"
            if name in _OFFSET_FIELDS and (len(array) < 2 or np.diff(array).max() < 2**16):
                kind, array = "lengths", np.diff(array).astype(np.uint16)
            if array.nbytes >= _COMPRESS_MIN_BYTES:
                packed = pa.compress(array.tobytes(), codec="zstd", asbytes=True)
                state[name] = (kind, "zstd", array.dtype.str, len(array), packed)
            else:
                state[name] = (kind, None, array.dtype.str, len(array), array.tobytes())
        return state

    def __setstate__(self, state: dict) -> None:
        for name, (kind, codec, dtype, count, data) in state.items():
            if codec is not None:
                data = pa.decompress(
                    data, count * np.dtype(dtype).itemsize, codec=codec, asbytes=True
                )
            array = np.frombuffer(data, dtype=dtype, count=count).copy()
            setattr(self, name, offsets_of(array) if kind == "lengths" else array)

    def to_bytes(self) -> bytes:
        """The block pickled (compactly, see ``__getstate__``). Steps send blocks as bytes
        so that a runner grouping them moves opaque bytes instead of unpickling them."""
        return pickle.dumps(self, protocol=pickle.HIGHEST_PROTOCOL)

    @classmethod
    def from_bytes(cls, data: bytes) -> RowBlock:
        """The block :meth:`to_bytes` made (only ever our own bytes: it unpickles them)."""
        block = pickle.loads(data)
        if not isinstance(block, cls):
            raise TypeError(f"expected pickled {cls.__name__}, got {type(block).__name__}")
        return block

    @classmethod
    def concat(cls, blocks: Sequence[RowBlock]) -> RowBlock:
        """One block holding the rows of all ``blocks``, in order."""
        blocks = [b for b in blocks if len(b)] or [cls.empty()]
        if len(blocks) == 1:
            return blocks[0]

        def offsets(name: str) -> np.ndarray:
            parts, base = [np.zeros(1, dtype=np.int64)], 0
            for b in blocks:
                parts.append(getattr(b, name)[1:] + base)
                base += int(getattr(b, name)[-1])
            return np.concatenate(parts)

        flat = (
            "keys",
            "input_ids",
            "b_starts",
            "masked_lm_positions",
            "masked_lm_ids",
            "next_sentence_label",
        )
        values = {name: np.concatenate([getattr(b, name) for b in blocks]) for name in flat}
        values["continues_word"] = np.concatenate([b.continues_word for b in blocks])
        return cls(row_offsets=offsets("row_offsets"), mlm_offsets=offsets("mlm_offsets"), **values)

    @classmethod
    def empty(cls) -> RowBlock:
        zero = np.zeros(1, dtype=np.int64)
        return cls(
            keys=np.zeros(0, np.uint64),
            input_ids=np.zeros(0, np.int32),
            b_starts=np.zeros(0, np.uint16),
            row_offsets=zero,
            masked_lm_positions=np.zeros(0, np.int32),
            masked_lm_ids=np.zeros(0, np.int32),
            mlm_offsets=zero,
            next_sentence_label=np.zeros(0, np.uint8),
        )

    def sorted_by_key(self) -> RowBlock:
        """Rows in increasing key order (keys are 64-bit hashes, so ties are not expected;
        a stable sort keeps the result deterministic even then)."""
        return self.take(np.argsort(self.keys, kind="stable"))

    def take(self, order: np.ndarray) -> RowBlock:
        """The rows at indices ``order`` (int [K]), in that order."""
        packed = len(self.continues_word) == len(self.input_ids) > 0
        flat = [self.input_ids, self.continues_word] if packed else [self.input_ids]
        (input_ids, *words), row_offsets = take_rows(flat, self.row_offsets, order)
        masks, mlm_offsets = take_rows(
            [self.masked_lm_positions, self.masked_lm_ids], self.mlm_offsets, order
        )
        return RowBlock(
            self.keys[order],
            input_ids,
            self.b_starts[order],
            row_offsets,
            *masks,
            mlm_offsets,
            self.next_sentence_label[order],
            words[0] if packed else self.continues_word[:0],
        )

    def segment_ids(self) -> np.ndarray:
        """int8, flat like ``input_ids``: 0 through the first ``[SEP]``, 1 after it.

        Example: row offsets ``[0, 5, 9]``, b_starts ``[3, 2]`` -> ``[0 0 0 1 1 0 0 1 1]``.
        """
        # +1 where B starts, -1 where the next row starts; the running sum is the id.
        steps = np.zeros(len(self.input_ids) + 1, dtype=np.int8)
        steps[self.row_offsets[:-1] + self.b_starts] = 1
        steps[self.row_offsets[1:]] -= 1
        return np.cumsum(steps[:-1], dtype=np.int8)

    def columns(self, kind: str = "nsp") -> dict[str, Ragged | np.ndarray]:
        """The mapping :func:`pipeline.shards.shard_writer.encode_shard` takes, for the
        row kind's columns (``pipeline.shards.shard_format.KIND_COLUMNS``)."""
        columns = {
            "input_ids": Ragged(self.input_ids, self.row_offsets),
            "segment_ids": Ragged(self.segment_ids(), self.row_offsets),
            "continues_word": Ragged(self.continues_word, self.row_offsets),
            "masked_lm_positions": Ragged(self.masked_lm_positions, self.mlm_offsets),
            "masked_lm_ids": Ragged(self.masked_lm_ids, self.mlm_offsets),
            "next_sentence_label": self.next_sentence_label,
        }
        return {name: columns[name] for name in KIND_COLUMNS[kind]}
