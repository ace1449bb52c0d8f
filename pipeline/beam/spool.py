"""Spools: what a job would send through the runner's shuffle, written to hidden files in
its output directory instead, with only references (:class:`SpoolRef`) through the runner.

A runner that shuffles in memory holds everything it moves at once: the DirectRunner its
driver, Dask each task shuffle's splits until the last input is read. Spooled, the shuffle
carries a few bytes per bundle and group, and the receiver reads its blocks back
(:func:`spooled_blocks`, :func:`spooled_values`). The output is the same either way.

One flag, ``--spool auto|yes|no``, for ``build`` (rows to the shard writers) and ``curate``
(texts and MinHash band keys); ``auto`` resolves per runner (:func:`use_spool`). The files
(``.rows-*``, ``.texts-*``, ``.bands-*.spool``) are removed when the job ends, and with the
rest of a failed job's output.
"""

from __future__ import annotations

import pickle
import uuid
from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import NamedTuple

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from pipeline.beam import memory
from pipeline.beam.config import is_local_runner


def use_spool(requested: str, runner: str | None, *, dask: bool = False) -> bool:
    """Whether a job spools (``--spool``): ``yes``; or ``auto`` on the local runner, whose
    shuffles are the driver's memory, and, for ``dask`` jobs (curate), on Beam's DaskRunner,
    which holds a task shuffle's splits in its workers' memory."""
    on_dask = dask and (runner or "").rsplit(".", 1)[-1] == "DaskRunner"
    return requested == "yes" or (requested == "auto" and (is_local_runner(runner) or on_dask))


class SpoolRef(NamedTuple):
    """Where a bundle's rows of one write group lie in its spool file: (offset, length) of
    each pickled RowBlock."""

    path: str
    spans: tuple[tuple[int, int], ...]


class RowSpool:
    """Rows on their way to the shard writers, in a file instead of the runner's shuffle.

    A local runner (the DirectRunner) holds every shuffle in its driver's memory: all the
    rows of a build at once, many times the input. A spool writes each bundle's rows to one hidden
    file in --output (``.rows-<random>.spool``: a retried bundle writes a new one) and
    sends the runner a :class:`SpoolRef` per write group, a few bytes. The writers read
    their rows back (:func:`block_bytes`); the manifest step removes the files. The rows,
    so the shards, are the same either way.
    """

    def __init__(self, directory: str, kind: str = "rows"):
        self._directory, self._kind = directory, kind
        self._file = None
        self._path = ""
        self._offset = 0
        self._spans: dict[int, list[tuple[int, int]]] = defaultdict(list)

    def write(self, group: int, data: bytes) -> None:
        if self._file is None:
            name = f".{self._kind}-{uuid.uuid4().hex}.spool"
            self._path = FileSystems.join(self._directory, name)
            self._file = FileSystems.create(
                self._path, compression_type=CompressionTypes.UNCOMPRESSED
            )
        self._file.write(data)
        self._spans[group].append((self._offset, len(data)))
        self._offset += len(data)

    def close(self) -> list[tuple[int, SpoolRef]]:
        """Close the file; returns (write group, SpoolRef) for each group written."""
        if self._file is None:
            return []
        self._file.close()
        self._file = None
        return [
            (group, SpoolRef(self._path, tuple(spans)))
            for group, spans in sorted(self._spans.items())
        ]


def spooled_blocks(refs: Iterable[SpoolRef]) -> Iterator[bytes]:
    """The blocks ``refs`` name, read back one at a time: each file opened once, its spans
    read in file order.

    Raises:
        OSError: a file holds fewer bytes than a span names (cut short).
    """
    spans = defaultdict(list)
    for ref in refs:
        spans[ref.path].extend(ref.spans)
    for path in sorted(spans):
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            for offset, length in sorted(spans[path]):
                f.seek(offset)
                data = f.read(length)
                if len(data) != length:
                    raise OSError(f"{path}: spool file cut short at {offset + len(data)} bytes")
                yield data


def spooled_values(items: Iterable) -> Iterator:
    """A group's values as sent, and those of its SpoolRefs (:class:`SpoolTexts`,
    minhash_steps.BandKeys), read back from their spool files, each block a pickled list of
    values."""
    refs = []
    for item in items:
        if isinstance(item, SpoolRef):
            refs.append(item)
        else:
            yield item
    for block in spooled_blocks(refs):
        yield from pickle.loads(block)


class SpoolTexts(beam.DoFn):
    """(id, text) -> (group key, SpoolRef) for each group of the bundle's documents (by
    ``group_of`` of the id), whose texts went to the bundle's spool file in ``directory``
    (:class:`RowSpool`, ``.texts-<random>.spool``) instead of through the runner's
    shuffle, one element each.

    A runner that shuffles in memory holds every text it moves at once: Dask's task
    shuffle splits all of its input before any group is made, and keeps the splits until
    the last input is read. Spooled, the shuffle moves a reference per bundle and group,
    and curation_steps.KeepDistinct reads its group's texts back. A retried bundle writes a new file; the references of the attempt that
    counted are the ones grouped, and curate removes every spool file at the end.
    """

    def __init__(self, directory: str, group_of):
        super().__init__()
        self._directory, self._group_of = directory, group_of

    def start_bundle(self):
        self._spool = RowSpool(self._directory, kind="texts")
        self._held: dict = {}
        self._chars = 0

    # No return annotation: it emits from finish_bundle (see CountInBundle.process).
    def process(self, element):
        self._held.setdefault(self._group_of(element[0]), []).append(element)
        self._chars += len(element[1])
        if self._chars >= memory.SPOOL_HELD_CHARS:
            self._write()

    def _write(self) -> None:
        for group, docs in self._held.items():
            self._spool.write(group, pickle.dumps(docs, protocol=pickle.HIGHEST_PROTOCOL))
        self._held, self._chars = {}, 0

    def finish_bundle(self):
        from apache_beam.transforms.window import GlobalWindow
        from apache_beam.utils.windowed_value import WindowedValue

        self._write()
        window = GlobalWindow()
        for element in self._spool.close():
            yield WindowedValue(element, window.max_timestamp(), [window])
