"""Documents from input files: txt (Google's convention), jsonl and parquet.

Pure generators over an open binary file, so they are testable without Beam; the
pipeline opens files through Beam's FileSystems (local, gs://, s3://, hdfs://,
``.gz``/``.bz2`` decompressed by extension).

The format comes from ``--input_format`` or, by default, from each file's name
(:func:`format_from_name`); either way the first bytes of each file must agree with it
(:func:`check_format`), so JSON Lines is never read as text, nor text as JSON Lines. A txt
or jsonl file must also be mostly UTF-8 (:func:`check_utf8`): a binary file, a compressed
one without its suffix or text in another encoding stops the build, named.

Every yielded item is ``(sentences, None)`` for a document or ``(None, reason)``
for a skipped record, so that the caller counts skips under their reason:

- ``invalid_utf8_line`` — a txt line that is not UTF-8 (the line is dropped);
- ``invalid_utf8_record`` / ``invalid_json`` / ``missing_text_field`` /
  ``non_string_text`` — a jsonl record (the record is dropped);
- ``empty_document`` — a document with no non-blank sentence.
"""

from __future__ import annotations

import codecs
import io
import json
from collections.abc import Iterator
from typing import BinaryIO

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
    ".txt": "txt", ".text": "txt",
    ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl",
    ".parquet": "parquet", ".pq": "parquet",
}  # fmt: skip


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


def _txt_lines(f: BinaryIO, skipped: list[str]) -> Iterator[str]:
    for raw in _lines(f):
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError:
            skipped.append("invalid_utf8_line")
            # An undecodable line must not end the document the way a blank one would.
            yield "\x00"


def read_txt(f: BinaryIO) -> Iterator[Item]:
    """One sentence per line, a blank line between documents.

    Example: ``b"A b.\\nC d.\\n\\nE f.\\n"`` -> ``(["A b.", "C d."], None), (["E f."], None)``.
    """
    skipped: list[str] = []
    for sentences in iter_txt_documents(_txt_lines(f, skipped)):
        yield from ((None, reason) for reason in skipped)
        skipped.clear()
        # The placeholder of an undecodable line holds only NUL, which BERT's
        # normalisation drops; remove it here so it is not a "sentence".
        sentences = [s for s in sentences if s.strip("\x00")]
        yield (sentences, None) if sentences else (None, "empty_document")
    yield from ((None, reason) for reason in skipped)


def _document(text: str) -> Item:
    sentences = split_sentences(text)
    return (sentences, None) if sentences else (None, "empty_document")


def read_jsonl(f: BinaryIO, text_field: str) -> Iterator[Item]:
    """One JSON object per line; ``text_field`` holds a document, split into sentences."""
    for raw in _lines(f):
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
        yield _document(text)


def read_parquet(f: BinaryIO, text_field: str, path: str) -> Iterator[Item]:
    """One document per row of the string column ``text_field``.

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
    for batch in parquet.iter_batches(columns=[text_field], batch_size=1024):
        for text in batch.column(0).to_pylist():
            yield (None, "missing_text_field") if text is None else _document(text)


def read_documents(f: BinaryIO, *, input_format: str, text_field: str, path: str) -> Iterator[Item]:
    """Dispatch on ``input_format`` (txt, jsonl, parquet)."""
    if input_format == "txt":
        return read_txt(f)
    if input_format == "jsonl":
        return read_jsonl(f, text_field)
    if input_format == "parquet":
        return read_parquet(f, text_field, path)
    raise ValueError(f"unknown input_format {input_format!r}")
