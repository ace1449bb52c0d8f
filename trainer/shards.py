"""Random access to the rows of a shard directory, memory-mapped, through pipeline.shards.shard_format.

A :class:`ShardSet` knows every shard's row count from ``manifest.json`` and opens shards
lazily (a small LRU per process: local shards are memory maps, so "open" costs little and
the rows stay on disk; a gs:// or s3:// shard is read into memory in one request, so at most
``max_open`` of them are held). Rows are returned as numpy views into the mapped buffers.

Every row kind of the format is read (``manifest.json``'s ``schema.kind``, FORMAT.md):
a row holds its kind's list columns (``continues_word`` unpacked from Arrow's bits to a
bool array, the one copy); rows without ``next_sentence_label`` (the MLM kinds) get the
label ``NSP_IGNORE``, so no NSP loss counts them. A kind this reader does not know is
refused (``ShardFormatError``).

Start-up check (:meth:`ShardSet.check`): each shard's size must equal the manifest's
``bytes`` (catches truncation, cheap on object storage too); local shards are also opened
(end-of-stream marker, schema) and their row counts compared; ``verify=True`` adds the
sha256 of every file. A failing shard raises ShardFormatError naming the file, or with
``skip_corrupt`` is dropped (its rows get count 0) and counted. A shard that fails later,
mid-run, always raises: skipping it then would change the data order of every rank.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.shards import shard_format

logger = logging.getLogger(__name__)

NSP_IGNORE = -100  # the label of a row without an NSP target (torch cross_entropy's ignore)
_BITS = "continues_word"  # the one list of bools: Arrow packs it 8 to a byte


@dataclass
class _Chunk:
    """One record batch: per list column (offsets int32 (n + 1,), values (total,)), labels
    (n,) or None (the MLM kinds); ``bits``: continues_word's (offsets, packed uint8, bit
    offset of value 0)."""

    lists: dict[str, tuple[np.ndarray, np.ndarray]]
    labels: np.ndarray | None
    bits: tuple[np.ndarray, np.ndarray, int] | None = None

    def row_bits(self, local: int) -> np.ndarray:
        """continues_word of row ``local``: bool (n,), unpacked from the mapped bytes."""
        offsets, packed, first = self.bits
        start, end = first + int(offsets[local]), first + int(offsets[local + 1])
        window = np.unpackbits(packed[start // 8 : (end + 7) // 8], bitorder="little")
        return window[start % 8 : start % 8 + end - start].astype(bool)


class _OpenShard:
    """A shard's record batches as zero-copy numpy views."""

    def __init__(self, path: str, kind: str = "nsp"):
        table = shard_format.open_shard(path)
        names = [n for n in shard_format.kind_columns(kind) if n != "next_sentence_label"]
        self.chunks: list[_Chunk] = []
        starts = [0]
        for batch in table.to_batches():
            lists, bits = {}, None
            for name in names:
                column = batch.column(name)
                if name == _BITS:
                    values = column.values
                    packed = np.frombuffer(values.buffers()[1], dtype=np.uint8)
                    bits = (column.offsets.to_numpy(), packed, values.offset)
                else:
                    lists[name] = (column.offsets.to_numpy(), column.values.to_numpy())
            labels = None
            if kind == "nsp":
                labels = batch.column("next_sentence_label").to_numpy()
            self.chunks.append(_Chunk(lists, labels, bits))
            starts.append(starts[-1] + batch.num_rows)
        self.starts = np.asarray(starts, dtype=np.int64)  # (chunks + 1,)
        self.num_rows = int(self.starts[-1])

    def rows(self, index: np.ndarray) -> list[tuple[dict[str, np.ndarray], int]]:
        """Rows ``index`` (int (n,), in [0, num_rows)) as ({column: 1-D view}, label)."""
        chunk_of = np.searchsorted(self.starts, index, side="right") - 1
        out = []
        for c, local in zip(
            chunk_of.tolist(), (index - self.starts[chunk_of]).tolist(), strict=True
        ):
            chunk = self.chunks[c]
            row = {}
            for name, (offsets, values) in chunk.lists.items():
                row[name] = values[offsets[local] : offsets[local + 1]]
            if chunk.bits is not None:
                row[_BITS] = chunk.row_bits(local)
            label = NSP_IGNORE if chunk.labels is None else int(chunk.labels[local])
            out.append((row, label))
        return out


class ShardSet:
    """The shards of one directory; rows addressed by (shard index, row index).

    Args:
        directory: holds manifest.json; a local path or a URI pyarrow.fs understands.
        manifest: from pipeline.shards.shard_format.read_manifest(directory), if already read.
        max_open: shards kept open per process (least recently used ones are closed).

    Raises:
        ShardFormatError: from read_manifest (no manifest, other version, inconsistent), or
            a row kind this reader does not know.
        OSError: the manifest cannot be read.
    """

    def __init__(self, directory: str, manifest: Mapping | None = None, *, max_open: int = 8):
        self.directory = os.fspath(directory)
        self.manifest = dict(manifest or shard_format.read_manifest(self.directory))
        self.kind = shard_format.manifest_kind(self.manifest)  # nsp, mlm or mlm_masked
        try:
            shard_format.kind_columns(self.kind)
        except shard_format.ShardFormatError as err:
            raise shard_format.ShardFormatError(f"{self.directory}: {err}") from None
        entries = self.manifest["shards"]
        self.names = [entry["name"] for entry in entries]
        self.rows_per_shard = np.array([entry["rows"] for entry in entries], dtype=np.int64)
        self.skipped: list[str] = []
        self._max_open = max_open
        self._open: OrderedDict[int, _OpenShard] = OrderedDict()

    @property
    def num_rows(self) -> int:
        """Rows of the shards in use (skipped shards count 0)."""
        return int(self.rows_per_shard.sum())

    @property
    def trains_nsp(self) -> bool:
        """Whether the rows have next-sentence labels (the NSP kind)."""
        return self.kind == "nsp"

    @property
    def params(self) -> Mapping:
        """The pipeline parameters of manifest.json (max_predictions_per_seq, ...)."""
        return self.manifest["params"]

    def path(self, shard: int) -> str:
        return self.path_of(self.names[shard])

    def read_text(self, name: str) -> str:
        """A UTF-8 file of the directory (e.g. vocab.txt), local or remote."""
        return shard_format.read_bytes(self.path_of(name)).decode("utf-8")

    def path_of(self, name: str) -> str:
        return shard_format.join_path(self.directory, name)

    def check(self, *, verify: bool = False, skip_corrupt: bool = False) -> list[str]:
        """The start-up check described in the module docstring; returns skipped file names.

        Raises:
            ShardFormatError: a shard fails and ``skip_corrupt`` is False (names the file).
            ValueError: every shard was skipped.
        """
        for index, entry in enumerate(self.manifest["shards"]):
            path = self.path(index)
            try:
                self._check_one(path, entry, verify)
            except (shard_format.ShardFormatError, OSError) as err:
                if not skip_corrupt:
                    if isinstance(err, shard_format.ShardFormatError):
                        raise
                    raise shard_format.ShardFormatError(f"{path}: {err}") from err
                logger.warning("skipping shard %s (%d rows): %s", path, entry["rows"], err)
                self.rows_per_shard[index] = 0
                self.skipped.append(entry["name"])
        if self.num_rows == 0:
            raise ValueError(f"{self.directory}: no rows left to train on")
        return list(self.skipped)

    @staticmethod
    def _check_one(path: str, entry: Mapping, verify: bool) -> None:
        size = shard_format.file_size(path)
        if size != entry["bytes"]:
            raise shard_format.ShardFormatError(
                f"{path} has {size} bytes, manifest.json says {entry['bytes']} (truncated?)"
            )
        if verify:
            shard_format.verify_shard(path, entry)
        elif not shard_format.is_remote(path):
            rows = shard_format.open_shard(path).num_rows
            if rows != entry["rows"]:
                raise shard_format.ShardFormatError(
                    f"{path} has {rows} rows, manifest.json says {entry['rows']}"
                )

    def _shard(self, index: int) -> _OpenShard:
        shard = self._open.get(index)
        if shard is None:
            shard = _OpenShard(self.path(index), self.kind)
            if shard.num_rows != self.rows_per_shard[index]:
                raise shard_format.ShardFormatError(
                    f"{self.path(index)} has {shard.num_rows} rows, manifest.json says "
                    f"{int(self.rows_per_shard[index])}"
                )
            self._open[index] = shard
            while len(self._open) > self._max_open:
                self._open.popitem(last=False)
        self._open.move_to_end(index)
        return shard

    def rows(
        self, shards: Sequence[int] | np.ndarray, rows: Sequence[int] | np.ndarray
    ) -> list[tuple[dict[str, np.ndarray], int]]:
        """Rows ``(shards[i], rows[i])`` in order, each ({column: 1-D unsigned view}, label);
        the label is NSP_IGNORE for the MLM kinds.

        Args:
            shards: int (n,), shard indexes.
            rows: int (n,), row indexes within those shards.

        Raises:
            ShardFormatError: a shard cannot be read (names the file).
        """
        shards, rows = np.asarray(shards), np.asarray(rows)
        out: list = [None] * len(shards)
        for shard in np.unique(shards).tolist():
            where = np.flatnonzero(shards == shard)
            for i, row in zip(where.tolist(), self._shard(shard).rows(rows[where]), strict=True):
                out[i] = row
        return out
