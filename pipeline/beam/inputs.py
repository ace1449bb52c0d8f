"""What ``build`` and ``curate`` read, planned once for both: the options that read
documents (:class:`ReadOptions`, what :class:`~pipeline.beam.document_steps.ReadDocuments`
takes) and the input plan (:func:`plan_input`: the files matched, their format, and the
byte ranges the workers read).

A curate's output read back (``build --input 'curated/part-*.parquet'``) is checked here:
where curate left its files, its directory's manifest must exist (without one: an
unfinished curate) and be of a ``curate_version`` this code reads (:func:`check_curated`).
"""

from __future__ import annotations

import json
import logging
import posixpath
import re
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from apache_beam.io.filesystems import FileSystems

from pipeline.beam.config import ReadOptions
from pipeline.core.sources import (
    HEAD_BYTES,
    FileRange,
    check_format,
    format_from_name,
    range_bytes,
    sniff_format,
    split_ranges,
)

logger = logging.getLogger(__name__)

# Of curate's output (docs/curation.md, "Output"): its manifest's ``curate_version``, which
# tests/pipeline/test_golden_curate.py pins with the bytes; readers refuse a newer one.
CURATE_VERSION = 1
CURATED_KIND = "curated_documents"
CURATED_FILE = re.compile(r"part-\d{5}-of-\d{5}\.parquet$")


class InputPlan(NamedTuple):
    """The input as planned before a job runs (fails fast on bad input)."""

    files: list[str]  # sorted
    sizes: list[int]  # each file's bytes
    ranges: list[FileRange]  # the files in the byte ranges workers read
    input_format: str  # txt, jsonl or parquet: --input_format, or inferred
    format_origin: str  # where input_format came from, for error messages

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes)


def match_inputs(patterns: Iterable[str]) -> list[tuple[str, int]]:
    """Expand globs through Beam's FileSystems; returns sorted (path, size_in_bytes).

    Raises:
        FileNotFoundError: a pattern matches no file (names the pattern).
    """
    found: dict[str, int] = {}
    for pattern in patterns:
        result = FileSystems.match([pattern])[0]
        if not result.metadata_list:
            raise FileNotFoundError(f"--input {pattern!r} matched no file")
        for meta in result.metadata_list:
            found[meta.path] = meta.size_in_bytes
    return sorted(found.items())


def read_head(path: str) -> bytes:
    """The first bytes of a file (decompressed), enough to tell its format."""
    with FileSystems.open(path) as f:
        return f.read(HEAD_BYTES)


def resolve_input_format(requested: str, files: list[str]) -> tuple[str, str]:
    """The input format and where it came from: ``--input_format`` unless
    ``auto``; then the files' extensions, which must agree; then the first file's bytes.

    The first file's bytes are checked against the result here, so a mismatch stops the
    job before it starts (every file is checked again as it is read).

    Raises:
        ValueError: extensions of two formats, or a first file that contradicts the format.
    """
    if requested != "auto":
        fmt, origin = requested, f"--input_format {requested}"
    else:
        named: dict[str, str] = {}
        for path in files:
            named.setdefault(format_from_name(path) or "", path)
        named.pop("", None)
        if len(named) > 1:
            examples = ", ".join(f"{path} ({fmt})" for fmt, path in sorted(named.items()))
            raise ValueError(
                f"--input mixes formats: {examples}; read each format in its own job or "
                "pass --input_format to read them all one way"
            )
        if named:
            fmt = next(iter(named))
            origin = f"inferred from the extension of {named[fmt]}; --input_format overrides"
        else:
            fmt = sniff_format(read_head(files[0])) or "txt"
            origin = f"inferred from the first bytes of {files[0]}; --input_format overrides"
    check_format(files[0], read_head(files[0]), fmt, origin)
    return fmt, origin


def check_curated(paths: Sequence[str]) -> None:
    """Refuse curate output that is unfinished or of a newer ``curate_version``: every
    ``part-NNNNN-of-NNNNN.parquet`` among ``paths`` is checked against its directory's
    manifest, when the directory holds what only curate writes there (:func:`_curate_left`).
    A curate killed before it wrote report.json or a spool file (``--spool no``) leaves
    Parquet files that cannot be told from another maker's: those are read.

    Raises:
        ValueError: no manifest (an unfinished curate), a newer version, or a file the
            manifest does not list; each names the file.
    """
    directories = {posixpath.dirname(p) for p in paths if CURATED_FILE.search(p)}
    for directory in sorted(directories):
        if not _curate_left(directory):
            continue  # Parquet files of another maker
        manifest_path = FileSystems.join(directory, "manifest.json")
        if not FileSystems.exists(manifest_path):
            raise ValueError(
                f"{directory}: curate's output without its manifest.json, which curate "
                "writes last: an unfinished or failed curate; run it again"
            )
        with FileSystems.open(manifest_path) as f:
            manifest = json.loads(f.read())
        if manifest.get("kind") != CURATED_KIND:
            continue
        version = manifest.get("curate_version")
        if not isinstance(version, int) or version > CURATE_VERSION:
            raise ValueError(
                f"{manifest_path}: curate_version {version!r}; this code reads curate output "
                f"up to version {CURATE_VERSION}: update it, or curate again with it"
            )
        listed = {entry["name"] for entry in manifest.get("files", [])}
        for path in paths:
            ours = posixpath.dirname(path) == directory and CURATED_FILE.search(path)
            if ours and posixpath.basename(path) not in listed:
                raise ValueError(
                    f"{path}: not among the files {manifest_path} lists (left from an "
                    "earlier curate?)"
                )


def _curate_left(directory: str) -> bool:
    """Whether ``directory`` holds curate's manifest or report.json, or the hidden spool
    files of a curate that is running or was killed (pipeline/beam/spool.py)."""
    join = FileSystems.join
    if any(FileSystems.exists(join(directory, name)) for name in ("manifest.json", "report.json")):
        return True
    patterns = [join(directory, ".texts-*.spool"), join(directory, ".bands-*.spool")]
    return any(result.metadata_list for result in FileSystems.match(patterns))


def plan_input(
    patterns: Iterable[str], options: ReadOptions, input_split_mb: float = 0.0
) -> InputPlan:
    """Match ``patterns``, resolve the format and split the files into ranges of
    ``input_split_mb`` MB (0: sized to the input, :func:`~pipeline.core.sources.range_bytes`).

    Raises:
        FileNotFoundError: a pattern matches nothing.
        ValueError: the format is ambiguous or contradicted by a file, or curate output
            that is unfinished or too new (:func:`check_curated`).
    """
    files = match_inputs(patterns)
    paths = [path for path, _ in files]
    check_curated(paths)
    input_format, origin = resolve_input_format(options.input_format, paths)
    total = sum(size for _, size in files)
    ranges = split_ranges(files, round(input_split_mb * 1e6) or range_bytes(total))
    return InputPlan(paths, [n for _, n in files], ranges, input_format, origin)
