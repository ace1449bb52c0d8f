"""``python -m pipeline curate``'s options (:class:`CurateConfig`) and parser: the curation
steps' own (:class:`~pipeline.beam.config.CurationOptions`, shared with ``build``), and
what reads the input and writes the output."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.beam.config import (
    DEDUP,
    DEDUP_HELP,
    INPUT_FORMATS,
    SPOOL,
    CurationOptions,
    ReadOptions,
    job_parser,
)
from pipeline.options import CommandParser, option, parse_options


@dataclass(frozen=True)
class CurateConfig(CurationOptions):
    """Everything that decides the curated output (all of it goes into the manifest);
    the curation steps' options are :class:`CurationOptions`, shared with ``build``."""

    input: tuple[str, ...] = option(help="files or globs, as build reads them", metavar="PATTERN")
    output: str = option(help="output directory (local or a URI)")
    input_format: str = option(
        "auto",
        "txt, jsonl or parquet; auto: from the extension or first bytes, as build",
        choices=INPUT_FORMATS,
    )
    text_field: str = option("text", "field (jsonl) or column (parquet) holding the text")
    dedup: str = option(  # curate's default; the help and choices are CurationOptions'
        "minhash", DEDUP_HELP, choices=DEDUP, kw_only=True
    )
    num_files: int | None = option(None, "output Parquet files (default: ~128 MB of text each)")
    random_seed: int = option(12345, "seed of the removed documents' sample")
    samples_per_reason: int = option(5, "removed documents sampled per reason")
    input_split_mb: float = option(0.0, "read input files in ranges of this many MB, as build")
    overwrite: bool = option(False, "replace an earlier curate in --output")
    # Memory only: the files are the same either way; not in the manifest.
    spool: str = option(
        "auto",
        "yes: the texts and the MinHash band keys go through files in --output (hidden, "
        "removed at the end) and only references to them through the runner; no: through "
        "the runner's shuffle; auto: yes on the DirectRunner and the DaskRunner, which hold "
        "their shuffles in memory, no on runners that shuffle through their own disks or "
        "service",
        choices=SPOOL,
    )

    def __post_init__(self) -> None:
        if not self.input:
            raise ValueError("--input: give at least one path or glob")
        self.check_curation()
        checks = {
            "num_files": (
                self.num_files is None or 1 <= self.num_files <= 99999,
                "must be in 1..99999 (file names have 5 digits)",
            ),
            "samples_per_reason": (self.samples_per_reason >= 0, "must be 0 or more"),
            "spool": (self.spool in SPOOL, f"one of {SPOOL}"),
        }
        for name, (ok, allowed) in checks.items():
            if not ok:
                raise ValueError(f"--{name}: invalid value {getattr(self, name)!r}: {allowed}")

    def params(self) -> dict:
        values = dataclasses.asdict(self)
        for key in ("output", "overwrite", "input_split_mb", "spool"):
            values.pop(key)
        values["input"] = list(self.input)
        values["decontaminate"] = list(self.decontaminate)
        return values

    @property
    def read_options(self) -> ReadOptions:
        return ReadOptions(self.input_format, self.text_field)


def curate_parser() -> CommandParser:
    description = (
        "Raw documents -> exact and near-duplicate removal, language and quality filters, "
        "decontamination -> Parquet files of curated documents."
    )
    return job_parser("curate", description, CurateConfig)


def parse_curate_args(argv: Sequence[str]) -> tuple[CurateConfig, list[str]]:
    return parse_options(curate_parser(), CurateConfig, argv, sep="_", known=True)
