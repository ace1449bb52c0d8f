"""Documents from input files: txt (Google's convention), jsonl and parquet.

Pure generators over an open binary file, so they are testable without Beam; the
pipeline opens files through Beam's FileSystems (local, gs://, s3://, hdfs://,
``.gz``/``.bz2`` decompressed by extension).

The format comes from ``--input_format`` or, by default, from each file's name
(:func:`format_from_name`); either way the first bytes of each file must agree with it
(:func:`check_format`), so JSON Lines is never read as text, nor text as JSON Lines. A txt
or jsonl file must also be mostly UTF-8 (:func:`check_utf8`): a binary file, a compressed
one without its suffix or text in another encoding stops the build, named.

A big file is read in byte ranges (:func:`split_ranges`), each by its own worker: a range
owns the records that start in it (txt: the documents after the first blank line at or
past its start; jsonl: the lines; parquet: the row groups), so the ranges of a file read
each of its records exactly once. A compressed file cannot seek and is one range.

A document's id is its content (:func:`content_id`), never its file or place in it, so
the shards depend on the documents alone: not on the files' names, their number, their
order or their compression.

Every yielded item is ``(sentences, None)`` for a document or ``(None, reason)``
for a skipped record, so that the caller counts skips under their reason:

- ``invalid_utf8_line`` — a txt line that is not UTF-8 (the line is dropped);
- ``invalid_utf8_record`` / ``invalid_json`` / ``missing_text_field`` /
  ``non_string_text`` — a jsonl record (the record is dropped);
- ``empty_document`` — a document with no non-blank sentence.
"""

from __future__ import annotations

import codecs
import hashlib
import io
import json
import math
from collections.abc import Iterable, Iterator
from typing import BinaryIO, NamedTuple

from pipeline.core.text import iter_txt_documents, split_sentences

Item = tuple[list[str] | None, str | None]

# How many leading bytes of a file check_format reads (after decompression).
HEAD_BYTES = 64 * 1024
# A txt/jsonl file is refused when more than this share of the non-blank lines in its
# first HEAD_BYTES are not UTF-8. A text file with a few bad lines is read (each bad line
# counted and skipped); random bytes, split at their 0x0a bytes, are nearly all bad.
MAX_INVALID_UTF8_SHARE = 0.5
PARQUET_MAGIC = b"PAR1"
# Suffixes that Beam's FileSystems decompress on the fly (CompressionTypes.detect_...).
COMPRESSION_SUFFIXES = (".gz", ".bz2", ".deflate", ".zst", ".zstd", ".xz", ".lzma")
FORMAT_OF_SUFFIX = {
    ".txt": "txt",
    ".text": "txt",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".parquet": "parquet",
    ".pq": "parquet",
}


# A file is read in ranges of about this many bytes (between the bounds, aiming at
# TARGET_RANGES ranges for the whole input): enough ranges for every worker of a big job,
# few enough that opening a file per range (and, for parquet, reading its footer) is
# noise against reading the range.
MIN_RANGE_BYTES = 1 << 20
MAX_RANGE_BYTES = 64 << 20
TARGET_RANGES = 1024


class FileRange(NamedTuple):
    """Bytes ``[start, end)`` of an input file: a worker's share of it (``end`` None: to
    the end; a compressed file is always ``(0, None)``)."""

    path: str
    start: int = 0
    end: int | None = None

    @property
    def whole(self) -> bool:
        return self.start == 0 and self.end is None


def is_compressed(path: str) -> bool:
    """Whether Beam's FileSystems decompress ``path`` by its suffix (so it cannot seek)."""
    return path.lower().endswith(COMPRESSION_SUFFIXES)


def range_bytes(total_bytes: int) -> int:
    """The size of the ranges files are read in, for an input of ``total_bytes``.

    Examples: 15 MB -> 1 MiB (15 ranges); 20 GB -> 19.5 MiB (about 1,024 ranges).
    """
    return max(MIN_RANGE_BYTES, min(MAX_RANGE_BYTES, math.ceil(total_bytes / TARGET_RANGES)))


def split_ranges(files: Iterable[tuple[str, int]], size: int) -> list[FileRange]:
    """(path, bytes) of each file -> the ranges workers read: ``size`` bytes each (the last
    of a file shorter), a compressed file whole. Every file gets a range that starts at 0
    (the one that checks its format).

    Example: ``[("a.txt", 5), ("b.txt.gz", 9)], size=2`` -> a.txt [0,2) [2,4) [4,5),
    b.txt.gz whole.
    """
    ranges = []
    for path, length in files:
        if is_compressed(path) or length <= size:
            ranges.append(FileRange(path))
            continue
        starts = range(0, length, size)
        ranges.extend(FileRange(path, start, start + size) for start in starts[:-1])
        ranges.append(FileRange(path, starts[-1], None))
    return ranges


def content_id(sentences: list[str]) -> str:
    """A document's id: a 128-bit hash of its sentences (hex), the same whatever file,
    position, compression or format it came from. Exact duplicates share it; the
    pipeline numbers them (:func:`number_duplicates`) where they meet, in one bucket.

    Sentences never hold a line break (txt: they are lines; jsonl and parquet:
    ``split_sentences`` breaks at every one), so joining them with one is unambiguous.
    """
    text = "\n".join(sentences).encode("utf-8", "surrogatepass")
    return hashlib.blake2b(text, digest_size=16).hexdigest()


def number_duplicates(sorted_ids: list[str]) -> list[str]:
    """Sorted content ids -> unique ids ``"<id>:<n>"``, n counting the copies of a document.

    Copies are the same bytes, so which copy gets which number changes nothing.

    Example: ``["a", "a", "b"] -> ["a:0", "a:1", "b:0"]``.
    """
    out, previous, n = [], None, 0
    for doc_id in sorted_ids:
        n = n + 1 if doc_id == previous else 0
        previous = doc_id
        out.append(f"{doc_id}:{n}")
    return out


def format_from_name(path: str) -> str | None:
    """The input format a file's name says (compression suffix ignored), or None.

    Examples: ``a/docs.jsonl.gz -> "jsonl"``, ``b.parquet -> "parquet"``, ``c.md -> None``.
    """
    name = path.rsplit("/", 1)[-1].lower()
    for suffix in COMPRESSION_SUFFIXES:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    dot = name.rfind(".")
    return FORMAT_OF_SUFFIX.get(name[dot:]) if dot > 0 else None


def _first_lines(head: bytes, limit: int = 8) -> list[bytes]:
    """Up to ``limit`` complete non-blank lines of ``head`` (a last line cut off by
    HEAD_BYTES is left out unless it is all there is)."""
    lines = head.split(b"\n")
    if len(lines) > 1 and len(head) >= HEAD_BYTES:
        lines = lines[:-1]
    return [line.strip() for line in lines if line.strip()][:limit]


def _is_json_object(line: bytes) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError
        return False


def sniff_format(head: bytes) -> str | None:
    """What a file's first bytes look like: ``"parquet"`` (Parquet's magic number),
    ``"jsonl"`` (the first line is a JSON object), ``"txt"``, or None for an empty file."""
    if head.startswith(PARQUET_MAGIC):
        return "parquet"
    lines = _first_lines(head, limit=1)
    if not lines:
        return None
    return "jsonl" if _is_json_object(lines[0]) else "txt"


def check_utf8(path: str, head: bytes) -> None:
    """Refuse a text file (txt, jsonl) that is mostly not UTF-8, judged by its head.

    More than :data:`MAX_INVALID_UTF8_SHARE` of the non-blank lines of ``head`` (a file's
    first HEAD_BYTES) invalid: a binary file, a compressed one whose name lacks its
    suffix, or text in another encoding (Latin-1, ...). Read line by line it would make
    junk rows. Only the head is read, so each worker can check the files it reads; a
    character cut by the end of a full head is not counted as invalid.

    Example: 100 kB of random bytes -> ValueError; ``b"Fine.\nBad \xff.\nFine.\n"`` -> None.

    Raises:
        ValueError: naming the file, how many lines were bad, and what to do.
    """
    lines = head.split(b"\n")
    checked = bad = 0
    for index, line in enumerate(lines):
        if not line.strip():
            continue
        cut = len(head) >= HEAD_BYTES and index == len(lines) - 1
        checked += 1
        try:
            codecs.getincrementaldecoder("utf-8")().decode(line, final=not cut)
        except UnicodeDecodeError:
            bad += 1
    if bad > MAX_INVALID_UTF8_SHARE * checked:
        raise ValueError(
            f"{path}: {bad} of the {checked} lines in its first {HEAD_BYTES // 1024} KiB are "
            "not UTF-8: a binary or compressed file, or text in another encoding? Convert it "
            "(e.g. iconv -f latin1 -t utf-8), name it for its compression (.gz, ...), or "
            "leave it out of --input"
        )


def check_format(path: str, head: bytes, input_format: str, origin: str) -> None:
    """Refuse a file whose first bytes contradict ``input_format``, or a txt/jsonl file
    that is mostly not UTF-8 (:func:`check_utf8`).

    ``origin`` says where the format came from, for the message (``"--input_format txt"``
    or ``"the name *.txt"``).

    Raises:
        ValueError: names the file, what it looks like and what to pass instead.
    """
    seen = sniff_format(head)
    if "parquet" not in (seen, input_format):
        check_utf8(path, head)
    if seen is None or seen == input_format:
        return
    if input_format == "jsonl" and seen == "txt":
        lines = _first_lines(head)
        if any(line.startswith(b"{") for line in lines):
            return  # JSON Lines with a broken record up front: counted as skips when read
        what = "its first lines are not JSON objects"
        if lines and lines[0].startswith(b"["):
            what = "it looks like one JSON array, not JSON Lines (one object per line)"
    else:
        what = {
            "parquet": "it is a Parquet file",
            "jsonl": "its first line is a JSON object (JSON Lines)",
            "txt": "it is not a Parquet file",
        }[seen]
    hint = f"--input_format {seen}" + (" (and --text_field NAME)" if seen != "txt" else "")
    raise ValueError(
        f"{path}: read as {input_format} ({origin}), but {what}; pass {hint}, "
        "or rename the file so its extension says its format"
    )


def _lines(f: BinaryIO) -> Iterator[bytes]:
    """The lines of ``f`` through ``readline``: Beam's decompressing file (``.gz``, ``.bz2``,
    ...) has it but cannot be iterated."""
    return iter(f.readline, b"")


def _first_line_at(f: BinaryIO, start: int) -> int:
    """Move ``f`` to the first line that starts at or after byte ``start``; returns where."""
    if start == 0:
        return 0
    f.seek(start - 1)
    return start - 1 + len(f.readline())  # the rest of the line holding byte start - 1


def _blank(raw: bytes) -> bool:
    """A txt line that ends a document (what iter_txt_documents calls blank: whitespace by
    ``str.strip``; a line that is not UTF-8 is not blank)."""
    try:
        return not raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        return False


def _txt_range(f: BinaryIO, start: int, end: int | None) -> Iterator[bytes]:
    """The lines of the documents a txt range owns.

    Ranges cut at blank lines: a range from ``start > 0`` begins at the first blank line
    that starts at or past ``start``, and every range stops before the first blank line that
    starts at or past its ``end``. The previous range stops exactly where this one begins,
    so each document is read by one range (the one holding the blank line before it; the
    file's first document by the range at 0). A range holding no blank line owns nothing.
    """
    pos = _first_line_at(f, start)
    lines = _lines(f)
    if start > 0:
        for raw in lines:
            if end is not None and pos >= end:
                return
            pos += len(raw)
            if _blank(raw):
                break
        else:
            return
    for raw in lines:
        if end is not None and pos >= end and _blank(raw):
            return
        pos += len(raw)
        yield raw


def _line_range(f: BinaryIO, start: int, end: int | None) -> Iterator[bytes]:
    """The lines that start in ``[start, end)``: a jsonl range's records."""
    pos = _first_line_at(f, start)
    for raw in _lines(f):
        if end is not None and pos >= end:
            return
        pos += len(raw)
        yield raw


def _txt_lines(lines: Iterable[bytes], skipped: list[str]) -> Iterator[str]:
    for raw in lines:
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError:
            skipped.append("invalid_utf8_line")
            # An undecodable line must not end the document the way a blank one would.
            yield "\x00"


def read_txt(f: BinaryIO, start: int = 0, end: int | None = None) -> Iterator[Item]:
    """One sentence per line, a blank line between documents; the documents of the range
    ``[start, end)`` (:func:`_txt_range`).

    Example: ``b"A b.\\nC d.\\n\\nE f.\\n"`` -> ``(["A b.", "C d."], None), (["E f."], None)``.
    """
    skipped: list[str] = []
    lines = _lines(f) if start == 0 and end is None else _txt_range(f, start, end)
    for sentences in iter_txt_documents(_txt_lines(lines, skipped)):
        yield from ((None, reason) for reason in skipped)
        skipped.clear()
        # The placeholder of an undecodable line holds only NUL, which BERT's
        # normalisation drops; remove it here so it is not a "sentence".
        sentences = [s for s in sentences if s.strip("\x00")]
        yield (sentences, None) if sentences else (None, "empty_document")
    yield from ((None, reason) for reason in skipped)


def document_sentences(text: str, split: bool = True) -> Item:
    """A record's text as sentences; unsplit (``split`` False: curation, whose line rules
    need the document's own lines), the whole text as one item."""
    if not split:
        return ([text], None) if text.strip() else (None, "empty_document")
    sentences = split_sentences(text)
    return (sentences, None) if sentences else (None, "empty_document")


def read_jsonl(
    f: BinaryIO, text_field: str, start: int = 0, end: int | None = None, split: bool = True
) -> Iterator[Item]:
    """One JSON object per line; ``text_field`` holds a document, split into sentences
    (unless not ``split``: :func:`_document`). The records whose lines start in
    ``[start, end)``."""
    for raw in _lines(f) if start == 0 and end is None else _line_range(f, start, end):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            yield None, "invalid_utf8_record"
            continue
        except json.JSONDecodeError:
            yield None, "invalid_json"
            continue
        if not isinstance(record, dict) or text_field not in record:
            yield None, "missing_text_field"
            continue
        text = record[text_field]
        if not isinstance(text, str):
            yield None, "non_string_text"
            continue
        yield document_sentences(text, split)


def row_group_start(metadata, index: int) -> int:
    """Where row group ``index`` starts in its file: its first column chunk's first page."""
    group = metadata.row_group(index)
    starts = []
    for c in range(group.num_columns):
        column = group.column(c)
        first = column.data_page_offset
        if column.has_dictionary_page and column.dictionary_page_offset:
            first = min(first, column.dictionary_page_offset)
        starts.append(first)
    return min(starts)


def read_parquet(
    f: BinaryIO,
    text_field: str,
    path: str,
    start: int = 0,
    end: int | None = None,
    split: bool = True,
) -> Iterator[Item]:
    """One document per row of the string column ``text_field``; the row groups that start
    in ``[start, end)``.

    Raises:
        ValueError: the file has no such column, or it is not a string column
            (a configuration error, so it stops the run and names the file).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = f.read() if not f.seekable() else None
    parquet = pq.ParquetFile(io.BytesIO(data) if data is not None else f)
    schema = parquet.schema_arrow
    if text_field not in schema.names:
        raise ValueError(
            f"{path}: no column {text_field!r} (columns: {schema.names}); see --text_field"
        )
    column_type = schema.field(text_field).type
    if not (pa.types.is_string(column_type) or pa.types.is_large_string(column_type)):
        raise ValueError(f"{path}: column {text_field!r} is {column_type}, not a string column")
    groups = None
    if not (start == 0 and end is None):
        metadata = parquet.metadata
        firsts = [row_group_start(metadata, i) for i in range(metadata.num_row_groups)]
        groups = [
            i for i, first in enumerate(firsts) if first >= start and (end is None or first < end)
        ]
        if not groups:
            return
    for batch in parquet.iter_batches(columns=[text_field], batch_size=1024, row_groups=groups):
        for text in batch.column(0).to_pylist():
            yield (None, "missing_text_field") if text is None else document_sentences(text, split)


def read_documents(
    f: BinaryIO,
    *,
    path: str,
    start: int = 0,
    end: int | None = None,
    input_format: str,
    text_field: str,
    split: bool = True,
) -> Iterator[Item]:
    """Dispatch on ``input_format`` (txt, jsonl, parquet); the records of ``[start, end)``.
    ``split`` False keeps a jsonl or parquet record's text whole (txt documents are lines
    already)."""
    if input_format == "txt":
        return read_txt(f, start, end)
    if input_format == "jsonl":
        return read_jsonl(f, text_field, start, end, split)
    if input_format == "parquet":
        return read_parquet(f, text_field, path, start, end, split)
    raise ValueError(f"unknown input_format {input_format!r}")
