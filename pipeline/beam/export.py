"""``python -m pipeline export``: a shard directory -> NVIDIA's HDF5 or Google's TFRecord files.

    python -m pipeline export shards/ --to nvidia-hdf5 --output hdf5/
    python -m pipeline export shards/ --to tfrecord --output tfrecord/ [--tfrecord_names v2]
    python -m pipeline export shards/ --to tfrecord --output tf/ --max_predictions_per_seq 80
    python -m pipeline export shards/ ... --runner=DataflowRunner --project=...  # Beam options
    python -m pipeline export shards/ ... --runner=DataflowRunner ... --dry_run  # check only

A Beam job on the same runners as ``build``: one shard in, one file out, in parallel
(``shard-00003-of-00010.arrow`` -> ``training-part-00003-of-00010.hdf5`` or
``shard-00003-of-00010.tfrecord``), each shard verified against its manifest (size, sha256,
rows) as it is read. Each file is written atomically; vocab.txt is copied (verified), and
``manifest.json`` last: the source manifest's sha256, format, field names, L and P, every
file's rows and sha256. Rows keep their order, ids and masks; pipeline/shards/export_formats.py
pads them each consumer's way (FORMAT.md, "Exports").

Exit codes: 0 success; 1 the job failed (a corrupt shard is named), and what it wrote is
removed; 2 bad arguments or input found before the job (no manifest, P too small, an
output directory that holds an earlier export without --overwrite, h5py missing).
With Beam's ``--dry_run`` the job is built and checked, not run, and --output is left as it
was (pipeline/beam/runner.py, ``run_pipeline``): 0 when the check passed.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import logging
import os
import time
from collections.abc import Sequence

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from pipeline.beam.shard_steps import write_atomic
from pipeline.options import CommandParser, parse_bool
from pipeline.shards import export_formats as formats
from pipeline.shards import shard_format
from pipeline.shards.shard_writer import created_by, encode_manifest

logger = logging.getLogger(__name__)
EXPORT_VERSION = 1  # of the export manifest's keys
# What an export writes; --overwrite deletes these (manifest first), a failed job too.
OUTPUT_PATTERNS = (
    shard_format.MANIFEST_NAME,
    shard_format.VOCAB_NAME,
    "training-part-*.hdf5",
    "shard-*.tfrecord",
    ".*.tmp",
)


@dataclasses.dataclass(frozen=True)
class ExportConfig:
    """What ``python -m pipeline export`` was asked for."""

    source: str  # a shard directory (local or a URI), with its manifest.json
    output: str
    to: str  # one of export_formats.FORMATS
    tfrecord_names: str | None = None  # v1 (google-research/bert) or v2 (Model Garden)
    max_predictions_per_seq: int | None = None  # P; None: the shards' (manifest params)
    overwrite: bool = False

    def __post_init__(self):
        if self.to not in formats.FORMATS:
            raise ValueError(f"--to must be one of {formats.FORMATS}, got {self.to!r}")
        if self.tfrecord_names is not None and self.to != formats.TFRECORD:
            raise ValueError("--tfrecord_names applies to --to tfrecord only")
        if self.max_predictions_per_seq is not None and self.max_predictions_per_seq < 1:
            raise ValueError(
                f"--max_predictions_per_seq must be >= 1, got {self.max_predictions_per_seq}"
            )


def export_parser() -> argparse.ArgumentParser:
    p = CommandParser(
        prog="python -m pipeline export",
        description="Shards -> one NVIDIA HDF5 or Google TFRecord file per shard, for other "
        "BERT trainers. Unrecognised options (--runner, --direct_num_workers=N, ...) go to "
        "Apache Beam.",
        epilog="Console: our progress lines only; Beam's logs go to --log_file PATH (default: "
        "OUTPUT.export.log beside the output directory). --verbose or BERT_VERBOSE=1 shows "
        "everything.",
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
    return ExportConfig(**values), beam_args


# ----------------------------------------------------------------------------- plan


@dataclasses.dataclass(frozen=True)
class ExportPlan:
    """What the driver settles before the job (fails fast, exit 2)."""

    config: ExportConfig
    manifest: dict  # the source's, validated
    manifest_sha256: str
    max_seq_length: int  # L: the shards' max_seq_length
    max_predictions_per_seq: int  # P
    names: dict  # field -> dataset or feature name in the files


def make_plan(config: ExportConfig) -> ExportPlan:
    """Read the source manifest, settle L and P, check the format's dependencies.

    Raises:
        ShardFormatError: no or a bad source manifest (the build did not finish).
        ValueError: P smaller than the shards' max_predictions_per_seq; the manifest has no
            P and none was given.
        ImportError: h5py is missing (for nvidia-hdf5).
    """
    source = config.source
    manifest = shard_format.read_manifest(source)
    raw = shard_format.read_bytes(shard_format.join_path(source, shard_format.MANIFEST_NAME))
    shards_p = manifest["params"].get("max_predictions_per_seq")
    p = config.max_predictions_per_seq or shards_p
    if p is None:
        raise ValueError(
            f"{source}'s manifest has no params.max_predictions_per_seq: pass "
            "--max_predictions_per_seq (at least the most masked positions of any row)"
        )
    if shards_p is not None and p < shards_p:
        raise ValueError(
            f"--max_predictions_per_seq {p} is smaller than the shards' max_predictions_per_seq "
            f"{shards_p} (manifest params): rows with more masked positions would lose them; "
            f"pass at least {shards_p} (and give the trainer the same value)"
        )
    if config.to == formats.HDF5:
        formats.import_h5py()
        names = {name: name for name in formats.HDF5_DTYPES}
    else:
        names = formats.TFRECORD_NAMES[config.tfrecord_names or "v1"]
    return ExportPlan(
        config,
        manifest,
        hashlib.sha256(raw).hexdigest(),
        manifest["schema"]["max_seq_length"],
        p,
        dict(names),
    )


def _existing(output: str, patterns: Sequence[str]) -> list[str]:
    matches = FileSystems.match([FileSystems.join(output, pattern) for pattern in patterns])
    return [m.path for match in matches for m in match.metadata_list]


def prepare_output(config: ExportConfig) -> None:
    """Create the output directory; refuse one that holds shards or, unless --overwrite,
    an earlier export (then delete it, manifest first).

    Raises:
        ValueError: the output is the source directory or holds Arrow shards.
        FileExistsError: it holds an earlier export and --overwrite was not given.
    """
    check_output(config)
    remove_outputs(config.output)
    if not FileSystems.exists(config.output):
        FileSystems.mkdirs(config.output)


def check_output(config: ExportConfig) -> None:
    """prepare_output's refusals, reading only (a dry run's check of ``--output``).

    Raises:
        ValueError: the output is the source directory or holds Arrow shards.
        FileExistsError: it holds an earlier export and --overwrite was not given.
    """
    out = config.output
    if _same_place(out, config.source) or _existing(out, ["shard-*.arrow"]):
        raise ValueError(
            f"--output {out} holds Arrow shards: write the export to another directory"
        )
    existing = _existing(out, OUTPUT_PATTERNS[:-1])
    if existing and not config.overwrite:
        names = ", ".join(sorted(os.path.basename(p) for p in existing)[:3])
        raise FileExistsError(
            f"{out} already holds {len(existing)} file(s) of an earlier export ({names}, ...); "
            "pass --overwrite to replace them or choose another --output"
        )


def _same_place(a: str, b: str) -> bool:
    if shard_format.is_remote(a) or shard_format.is_remote(b):
        return a.rstrip("/") == b.rstrip("/")
    return os.path.realpath(a) == os.path.realpath(b)


def remove_outputs(output: str) -> None:
    """Delete what an export writes in ``output`` (its manifest first, so an interrupted
    clean-up never leaves a manifest listing deleted files), temp files included."""
    if not FileSystems.exists(output):
        return
    found = _existing(output, OUTPUT_PATTERNS)
    found.sort(key=lambda p: not p.endswith(shard_format.MANIFEST_NAME))
    if found:
        FileSystems.delete(found)


# ----------------------------------------------------------------------------- the job


def export_shard(entry: dict, plan: ExportPlan, encoder=None) -> dict:
    """Verify one source shard, write its export atomically; returns the file's entry.

    Args:
        entry: the shard's manifest entry (name, rows, bytes, sha256).
        encoder: an export_formats.ExampleEncoder, for TFRecord.

    Raises:
        ShardFormatError: the shard's size, sha256, rows or schema differ from the manifest,
            or a row has more than P masked positions (names the file and row).
    """
    config, seq, pred = plan.config, plan.max_seq_length, plan.max_predictions_per_seq
    path = shard_format.join_path(config.source, entry["name"])
    table = shard_format.verify_shard(path, entry)
    schema = plan.manifest["schema"]
    if shard_format.schema_params(table.schema, where=path) != (schema["vocab_size"], seq):
        raise shard_format.ShardFormatError(f"{path} has another schema than its manifest says")
    index, num_shards = shard_format.parse_shard_name(entry["name"])
    name = formats.export_name(index, num_shards, config.to)
    try:
        if config.to == formats.HDF5:
            data = formats.hdf5_bytes(table, seq, pred)
        else:
            data = formats.tfrecord_chunks(table, encoder, seq, pred)
        size, sha256 = write_atomic(FileSystems.join(config.output, name), data)
    except ValueError as err:  # a row that does not fit
        raise shard_format.ShardFormatError(f"{path}: {err}") from None
    return {
        "name": name,
        "rows": table.num_rows,
        "bytes": size,
        "sha256": sha256,
        "source": entry["name"],
    }


class ExportShard(beam.DoFn):
    """A source shard's manifest entry -> its exported file's entry (after writing it)."""

    def __init__(self, plan: ExportPlan):
        self._plan = plan
        self._encoder = None
        self._rows = Metrics.counter("export", "rows")
        self._files = Metrics.counter("export", "files")

    def setup(self):
        plan = self._plan
        if plan.config.to == formats.TFRECORD:  # message classes built once per worker
            self._encoder = formats.ExampleEncoder(
                plan.names, plan.max_seq_length, plan.max_predictions_per_seq
            )

    def process(self, entry):
        written = export_shard(entry, self._plan, self._encoder)
        self._rows.inc(written["rows"])
        self._files.inc()
        yield written


def fields(plan: ExportPlan) -> dict:
    """The manifest's ``fields``: each dataset's (HDF5) or feature's (TFRecord) dtype and shape."""
    seq, pred = plan.max_seq_length, plan.max_predictions_per_seq
    width = dict.fromkeys(("input_ids", "input_mask", "segment_ids"), seq)
    width |= dict.fromkeys(("masked_lm_positions", "masked_lm_ids", "masked_lm_weights"), pred)
    width["next_sentence_labels"] = 1
    if plan.config.to == formats.HDF5:
        return {
            name: {"dtype": dtype, "shape": ["rows", width[name]] if width[name] > 1 else ["rows"]}
            for name, dtype in formats.HDF5_DTYPES.items()
        }
    return {
        feature: {
            "dtype": "float32" if field == "masked_lm_weights" else "int64",
            "shape": [width[field]],
        }
        for field, feature in plan.names.items()
    }


def write_manifest(files: list[dict], plan: ExportPlan) -> dict:
    """Copy vocab.txt (checked against the source manifest), then write manifest.json, last."""
    config, source = plan.config, plan.manifest
    vocab = source["vocab"]
    data = shard_format.read_bytes(shard_format.join_path(config.source, vocab["file"]))
    if hashlib.sha256(data).hexdigest() != vocab["sha256"]:
        raise shard_format.ShardFormatError(
            f"{shard_format.join_path(config.source, vocab['file'])} has another sha256 than "
            f"its {shard_format.MANIFEST_NAME} says"
        )
    write_atomic(FileSystems.join(config.output, shard_format.VOCAB_NAME), data)
    files = sorted(files, key=lambda f: f["name"])
    manifest = {
        "created_by": created_by(),
        "export_version": EXPORT_VERSION,
        "format": config.to,
        "fields": fields(plan),
        "max_seq_length": plan.max_seq_length,
        "max_predictions_per_seq": plan.max_predictions_per_seq,
        "num_rows": sum(f["rows"] for f in files),
        "files": files,
        "source": {
            "manifest_sha256": plan.manifest_sha256,
            "num_rows": source["num_rows"],
            "format_version": source["format_version"],
            # Which algorithm made the rows (absent from manifests older than the key).
            "algorithm_version": source.get("algorithm_version"),
            "created_by": source["created_by"],
            "params": source["params"],
        },
        # Copied from the source: the trainers need it (--vocab_file, do_lower_case).
        "vocab": {
            "file": shard_format.VOCAB_NAME,
            "copied_from_source": True,
            **{k: vocab[k] for k in ("sha256", "size", "do_lower_case", "special_ids")},
        },
    }
    if config.to == formats.HDF5:
        manifest["hdf5"] = {k: v for k, v in formats.HDF5_OPTIONS.items()}
    else:
        manifest["tfrecord_names"] = config.tfrecord_names or "v1"
    write_atomic(
        FileSystems.join(config.output, shard_format.MANIFEST_NAME), encode_manifest(manifest)
    )
    return manifest


def export_graph(p: beam.Pipeline, plan: ExportPlan) -> beam.PCollection:
    """Add the export to ``p``; returns the PCollection holding the manifest."""
    return (
        p
        | "ListShards" >> beam.Create(plan.manifest["shards"])  # reshuffled: spread to workers
        | "ExportShards" >> beam.ParDo(ExportShard(plan))
        | "CollectFiles" >> beam.combiners.ToList()
        | "WriteManifest" >> beam.Map(write_manifest, plan)
    )


def run_export(
    argv: Sequence[str], log_file: str | None, verbose: bool, handlers: list[logging.Handler]
) -> int:
    """The command's body under pipeline/cli/main.py's console (run_with_console)."""
    from pipeline.beam import runner

    try:
        config, beam_args = parse_export_args(argv)
        dry_run, beam_args = runner.split_dry_run(beam_args)
        beam_args = runner.check_beam_options(beam_args, export_parser())
        plan = make_plan(config)
        # A dry run checks --output and leaves it as it found it (no directory, no deletes).
        (check_output if dry_run else prepare_output)(config)
    except (ValueError, OSError, ImportError) as e:  # ShardFormatError is a ValueError
        logger.error("%s", e)
        return 2
    log_file = runner.job_log_file(
        log_file, verbose, config.output, "export", handlers, dry_run=dry_run
    )
    options, given = runner.beam_options(beam_args)
    source = plan.manifest
    logger.info(
        "%s %d shards (%d rows) of %s to %s as %s, L %d, P %d (Beam args: %s)",
        "dry run: checking, not running, the export of" if dry_run else "exporting",
        len(source["shards"]),
        source["num_rows"],
        config.source,
        config.output,
        config.to,
        plan.max_seq_length,
        plan.max_predictions_per_seq,
        given,
    )
    runner.warn_dataflow_pitfalls(options, {"source": [config.source], "--output": [config.output]})
    if log_file and not verbose:
        logger.info("Beam's log: %s (--verbose or BERT_VERBOSE=1 shows it here)", log_file)
    start = time.perf_counter()
    failed = runner.run_pipeline(
        options, lambda p: export_graph(p, plan), log_file, verbose, "export", dry_run=dry_run
    )
    if dry_run:  # nothing ran: nothing of the job's to remove or report
        return failed
    if failed:
        remove_outputs(config.output)
        logger.info(
            "removed the export's files from %s: nothing half-written is left", config.output
        )
        return failed
    in_bytes = sum(entry["bytes"] for entry in source["shards"])
    logger.info(
        "done in %.1f s: %d rows, %d shards (%.1f MB) -> %d %s files in %s; train with "
        "max_seq_length %d, max_predictions_per_seq %d, vocab %s, do_lower_case %s",
        time.perf_counter() - start,
        source["num_rows"],
        len(source["shards"]),
        in_bytes / 1e6,
        len(source["shards"]),
        config.to,
        config.output,
        plan.max_seq_length,
        plan.max_predictions_per_seq,
        shard_format.join_path(config.output, shard_format.VOCAB_NAME),
        source["vocab"]["do_lower_case"],
    )
    return 0
