"""Beam steps that write shards: sorted by key, atomically, in parallel parts.

Rows reach the writers grouped by ``shard * parts + part``. With at least
``memory.PARALLEL_WRITES`` shards each shard is one group; with fewer, each shard is
written in key ranges by parallel workers and joined (:class:`JoinParts`), so a
small build does not write on one worker. Part of ``python -m pipeline build``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from pipeline.beam import memory
from pipeline.beam.config import BuildConfig
from pipeline.beam.spool import SpoolRef, spooled_blocks
from pipeline.core.rows import RowBlock
from pipeline.shards import shard_format, shard_writer


class BeamFiles:
    """Beam's FileSystems as shard_writer's RemoteFiles: a build writes a URI wherever its
    runner can (gs://, s3://, hdfs://, azfs://, with the credentials of its options)."""

    def create(self, uri: str):
        return FileSystems.create(uri, compression_type=CompressionTypes.UNCOMPRESSED)

    def rename(self, source: str, target: str) -> None:
        FileSystems.rename([source], [target])

    def discard(self, uri: str) -> None:
        if FileSystems.exists(uri):
            FileSystems.delete([uri])


def write_atomic(path: str, data: bytes | Iterable[bytes]) -> tuple[int, str]:
    """Write ``data`` (bytes, or chunks of them) atomically with the project's one writer
    (shard_writer.atomic_write_bytes), a URI through Beam's FileSystems; returns the
    file's size and sha256 (hex)."""
    return shard_writer.atomic_write_bytes(path, data, remote=BeamFiles())


def parts_per_shard(num_shards: int) -> int:
    """Key ranges each shard is written in: 1 from ``memory.PARALLEL_WRITES`` shards on."""
    return max(1, -(-memory.PARALLEL_WRITES // num_shards))


def write_group(keys: np.ndarray, num_shards: int) -> np.ndarray:
    """Rows' write groups, ``shard * parts + part``: the shard is ``key % num_shards``
    and the part the key's range (the top bits), so parts in order are keys in order."""
    parts = parts_per_shard(num_shards)
    shard = keys % np.uint64(num_shards)
    part = ((keys >> np.uint64(32)) * np.uint64(parts)) >> np.uint64(32)
    return (shard * np.uint64(parts) + part).astype(np.int64)


def block_bytes(items: Iterable[bytes | SpoolRef]) -> list[bytes]:
    """A write group's blocks as RowBlock bytes (compressed): sent as bytes, or read back
    from spool files (:func:`spooled_blocks`)."""
    blocks, refs = [], []
    for item in items:
        (refs if isinstance(item, SpoolRef) else blocks).append(item)
    return blocks + list(spooled_blocks(refs))


def key_ranges(blocks: list[bytes], parts: int, part: int) -> Iterator[RowBlock]:
    """The rows of ``blocks`` (RowBlock bytes of write group part ``part`` of ``parts``)
    in key order, as consecutive key ranges: the part's span of the keys' top 32 bits cut
    into ``ceil(bytes / memory.RANGE_BYTES)`` ranges. Each range decodes every block once and
    keeps its own rows, so one range's rows are held at a time, with one block decoded."""
    count = max(1, -(-sum(map(len, blocks)) // memory.RANGE_BYTES))
    for index in range(part * count, (part + 1) * count):
        taken = []
        for data in blocks:
            block = RowBlock.from_bytes(data)
            fine = ((block.keys >> np.uint64(32)) * np.uint64(parts * count)) >> np.uint64(32)
            rows = np.flatnonzero(fine == np.uint64(index))
            if len(rows):
                taken.append(block if len(rows) == len(block) else block.take(rows))
            del block
        if taken:
            yield RowBlock.concat(taken).sorted_by_key()


def encoded_bodies(
    ranges: Iterable[RowBlock],
    schema,
    special: tuple[int, int],
    max_seq_length: int,
    stats: list[dict],
) -> Iterator[bytes]:
    """The record-batch messages of rows coming in key order, range after range: the bytes
    :func:`shard_writer.encode_shard_body` gives for all of them at once. Each range's
    full record batches are written but for the last ``memory.HELD_ROWS`` or more rows, carried
    into the next range (so the batches fall where they would, and each message has 64
    rows after it as it would: see ``encode_shard_body``); the last range writes the rest.
    Nothing at all gives the one empty batch an empty shard holds. Each written piece's
    statistics are appended to ``stats``; ``special`` is the ([MASK], [SEP]) ids."""
    batch = shard_format.DEFAULT_BATCH_SIZE
    kind = shard_format.schema_kind(schema)
    carry = RowBlock.empty()
    for rows in ranges:
        rows = RowBlock.concat([carry, rows])
        stop = max(0, len(rows) - memory.HELD_ROWS) // batch * batch
        if stop:
            stats.append(block_stats(rows.take(np.arange(stop)), *special, max_seq_length, kind))
            yield shard_writer.encode_shard_body(rows.columns(kind), schema, stop=stop)
            carry = rows.take(np.arange(stop, len(rows)))
        else:
            carry = rows
        del rows
    stats.append(block_stats(carry, *special, max_seq_length, kind))
    yield shard_writer.encode_shard_body(carry.columns(kind), schema)


class WriteShard(beam.DoFn):
    """(write group, RowBlock bytes or SpoolRefs) -> the shard's manifest entry and
    statistics after writing it, or (shard, part record) after writing one key range of it."""

    def __init__(self, config: BuildConfig, num_shards: int):
        self._config = config
        self._num_shards = num_shards
        self._parts = parts_per_shard(num_shards)

    def process(self, element, vocab: list[str]) -> Iterator:
        group, items = element
        blocks = block_bytes(items)
        del items
        shard, part = divmod(group, self._parts)
        whole = self._parts == 1
        name = shard_format.shard_name(shard, self._num_shards)
        path = (
            FileSystems.join(self._config.output, name)
            if whole
            else part_path(self._config.output, shard, part, self._num_shards)
        )
        ranges = key_ranges(blocks, self._parts, part)
        size, sha256, stats = write_sorted(path, ranges, vocab, self._config, whole=whole)
        if whole:
            yield {
                "entry": {"name": name, "rows": stats["rows"], "bytes": size, "sha256": sha256},
                "stats": stats,
            }
        else:
            yield shard, {"part": part, "path": path, "stats": stats}


def part_path(output: str, shard: int, part: int, num_shards: int) -> str:
    """A shard's part file: hidden, beside the shard, removed by the manifest step."""
    return FileSystems.join(
        output, f".{shard_format.shard_name(shard, num_shards)}.part-{part:03d}"
    )


def remove_leftovers(output: str) -> None:
    """Delete every part file (:func:`part_path`) and spool file (:class:`RowSpool`) in
    ``output``, and every temporary file of :func:`write_atomic` that a killed writer left
    (a worker lost mid-write; the runner's retry wrote the file again under another
    temporary name)."""
    patterns = [
        FileSystems.join(output, ".shard-*.part-*"),
        FileSystems.join(output, ".*.tmp"),
        FileSystems.join(output, ".rows-*.spool"),
    ]
    found = {m.path for result in FileSystems.match(patterns) for m in result.metadata_list}
    if found:
        FileSystems.delete(sorted(found))


class JoinParts(beam.DoFn):
    """(shard, part records) -> the shard's manifest entry and statistics, after
    joining its parts, in key order, into the shard file. The parts stay until the
    manifest step removes them, so a retried join finds them again."""

    def __init__(self, config: BuildConfig, num_shards: int):
        self._config = config
        self._num_shards = num_shards

    def process(self, element, vocab: list[str]) -> Iterator[dict]:
        shard, parts = element
        parts = sorted(parts, key=lambda p: p["part"])
        schema = shard_format.shard_schema(
            len(vocab), self._config.max_seq_length, self._config.kind
        )
        name = shard_format.shard_name(shard, self._num_shards)
        # One part in memory at a time: header, the parts' bodies in key order, end marker.
        chunks = shard_writer.shard_chunks(map(_read, (p["path"] for p in parts)), schema)
        size, sha256 = write_atomic(FileSystems.join(self._config.output, name), chunks)
        stats = merge_stats(part["stats"] for part in parts)
        yield {
            "entry": {"name": name, "rows": stats["rows"], "bytes": size, "sha256": sha256},
            "stats": stats,
        }


def _read(path: str) -> bytes:
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        return f.read()


def write_shard(
    shard: int, block: RowBlock, vocab: list[str], config: BuildConfig, num_shards: int
) -> dict:
    """Sort the rows by key, write the shard atomically, return its entry and statistics."""
    name = shard_format.shard_name(shard, num_shards)
    path = FileSystems.join(config.output, name)
    size, sha256, stats = write_sorted(path, [block.sorted_by_key()], vocab, config, whole=True)
    return {
        "entry": {"name": name, "rows": len(block), "bytes": size, "sha256": sha256},
        "stats": stats,
    }


def write_sorted(
    path: str, ranges: Iterable[RowBlock], vocab: list[str], config: BuildConfig, *, whole: bool
) -> tuple[int, str, dict]:
    """Write rows coming in key order, range after range (:func:`key_ranges`), atomically:
    a whole shard, or (``whole`` False) the body of one part. Returns size, sha256 and the
    rows' statistics."""
    schema = shard_format.shard_schema(len(vocab), config.max_seq_length, config.kind)
    stats: list[dict] = []
    special = (vocab.index("[MASK]"), vocab.index("[SEP]"))
    bodies = encoded_bodies(ranges, schema, special, config.max_seq_length, stats)
    chunks = shard_writer.shard_chunks(bodies, schema) if whole else bodies
    size, sha256 = write_atomic(path, chunks)
    return size, sha256, merge_stats(stats)


def block_stats(
    block: RowBlock, mask_id: int, sep_id: int, max_seq_length: int, kind: str = "nsp"
) -> dict[str, int | list[int]]:
    """Integer sums (so merging shards is exact and order-free) for the manifest. MLM rows
    also count their special tokens (``[CLS]``, ``[SEP]`` ends and separators): a masked
    position is never one, whatever random id it now holds."""
    lengths = np.diff(block.row_offsets)
    at_positions = block.row_offsets[:-1].repeat(np.diff(block.mlm_offsets))
    values = block.input_ids[at_positions + block.masked_lm_positions]
    if kind != "nsp":
        separators = int((block.input_ids == sep_id).sum()) - int((values == sep_id).sum())
        return {
            "rows": len(block),
            "tokens": int(lengths.sum()),
            "special_tokens": len(block) + separators,
            "full_length_rows": int((lengths == max_seq_length).sum()),
            "masked": len(block.masked_lm_ids),
            "masked_as_mask": int((values == mask_id).sum()),
            "masked_kept": int((values == block.masked_lm_ids).sum()),
            "length_histogram": np.bincount(lengths, minlength=max_seq_length + 1).tolist(),
        }
    return {
        "rows": len(block),
        "tokens": int(lengths.sum()),
        "full_length_rows": int((lengths == max_seq_length).sum()),
        "random_next": int(block.next_sentence_label.sum()),
        "masked": len(block.masked_lm_ids),
        "masked_as_mask": int((values == mask_id).sum()),
        "masked_kept": int((values == block.masked_lm_ids).sum()),
        "length_histogram": np.bincount(lengths, minlength=max_seq_length + 1).tolist(),
    }


def merge_stats(parts: Iterable[dict]) -> dict:
    total: dict = {}
    for part in parts:
        for key, value in part.items():
            if isinstance(value, list):
                old = total.get(key, [0] * len(value))
                total[key] = [a + b for a, b in zip(old, value, strict=True)]
            else:
                total[key] = total.get(key, 0) + value
    return total
