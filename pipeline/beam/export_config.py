"""``python -m pipeline export``'s options: one ExportConfig from the command line.

    python -m pipeline export SHARDS_DIR --to {nvidia-hdf5,tfrecord,mds,megatron} --output DIR

The job is pipeline/beam/export.py; what each option does to the files: FORMAT.md, "Exports",
and docs/exports.md.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence

from pipeline.beam.config import job_parser
from pipeline.options import parse_bool
from pipeline.shards import export_formats as formats
from pipeline.shards import mds_format


@dataclasses.dataclass(frozen=True)
class ExportConfig:
    """What ``python -m pipeline export`` was asked for."""

    source: str  # a shard directory (local or a URI), with its manifest.json
    output: str
    to: str  # one of export_formats.FORMATS
    tfrecord_names: str | None = None  # v1 (google-research/bert) or v2 (Model Garden)
    max_predictions_per_seq: int | None = None  # P; None: the shards' (manifest params)
    mds_token_column: str | None = None  # input_ids (ModernBERT) or tokens (mosaicml)
    input: tuple[str, ...] | None = None  # megatron: the corpus; None: the manifest's
    overwrite: bool = False

    def __post_init__(self):
        if self.to not in formats.FORMATS:
            raise ValueError(f"--to must be one of {formats.FORMATS}, got {self.to!r}")
        if self.tfrecord_names is not None and self.to != formats.TFRECORD:
            raise ValueError("--tfrecord_names applies to --to tfrecord only")
        if self.mds_token_column is not None and self.to != formats.MDS:
            raise ValueError("--mds_token_column applies to --to mds only")
        if self.input is not None and self.to != formats.MEGATRON:
            raise ValueError("--input applies to --to megatron only (it re-reads the corpus)")
        if self.max_predictions_per_seq is not None and self.to not in formats.NSP_FORMATS:
            raise ValueError(
                f"--max_predictions_per_seq pads rows for {formats.NSP_FORMATS}; --to {self.to} "
                "writes no padding"
            )
        if self.max_predictions_per_seq is not None and self.max_predictions_per_seq < 1:
            raise ValueError(
                f"--max_predictions_per_seq must be >= 1, got {self.max_predictions_per_seq}"
            )


def export_parser() -> argparse.ArgumentParser:
    p = job_parser(
        "export",
        "Shards -> one NVIDIA HDF5 or Google TFRecord file or MDS directory per shard, or "
        "Megatron-LM indexed datasets of the corpus's documents, for other BERT trainers.",
        allow_abbrev=False,
    )
    p.add_argument("source", metavar="SHARDS_DIR", help="a finished build (has manifest.json)")
    p.add_argument("--to", required=True, choices=formats.FORMATS, help="the file format")
    p.add_argument("--output", required=True, help="output directory (local or a URI)")
    p.add_argument(
        "--tfrecord_names",
        choices=sorted(formats.TFRECORD_NAMES),
        help="feature names: v1 google-research/bert and Model Garden's default (input_ids, "
        "segment_ids), v2 Model Garden's use_v2_feature_names (input_word_ids, input_type_ids); "
        "default v1",
    )
    p.add_argument(
        "--max_predictions_per_seq",
        type=int,
        help="P, masked positions per row after padding: the trainer's flag of that name "
        "(default: the shards' own; smaller is refused, larger pads)",
    )
    p.add_argument(
        "--mds_token_column",
        choices=mds_format.TOKEN_COLUMNS,
        help="--to mds: the name of the token column: input_ids (ModernBERT's text_data.py) "
        "or tokens (mosaicml/examples' and llm-foundry's); default input_ids",
    )
    p.add_argument(
        "--input",
        nargs="+",
        metavar="PATTERN",
        help="--to megatron: the corpus files or globs to re-read (default: the build's, "
        "the manifest's params.input, as given to it)",
    )
    p.add_argument(
        "--overwrite",
        type=parse_bool,
        nargs="?",
        const=True,
        default=False,
        metavar="true|false",
        help="replace an earlier export in --output (as "
        "build's --overwrite: no value is true; default: false)",
    )
    p.add_argument("--verbose", action="store_true", help="everything on the console")
    p.add_argument("--log_file", help="Beam's log (default: OUTPUT.export.log)")
    return p


def parse_export_args(argv: Sequence[str]) -> tuple[ExportConfig, list[str]]:
    """Our ExportConfig and the Beam arguments.

    Raises:
        ValueError: an invalid combination (see ExportConfig).
    """
    args, beam_args = export_parser().parse_known_args(list(argv))
    values = {k: v for k, v in vars(args).items() if k not in ("verbose", "log_file")}
    if values["input"] is not None:
        values["input"] = tuple(values["input"])
    return ExportConfig(**values), beam_args
