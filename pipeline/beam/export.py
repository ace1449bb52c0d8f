"""``python -m pipeline export``: a shard directory -> NVIDIA's HDF5, Google's TFRecord,
Mosaic's MDS or Megatron-LM's indexed dataset.

    python -m pipeline export shards/ --to nvidia-hdf5 --output hdf5/
    python -m pipeline export shards/ --to tfrecord --output tfrecord/ [--tfrecord_names v2]
    python -m pipeline export shards/ --to tfrecord --output tf/ --max_predictions_per_seq 80
    python -m pipeline export shards/ --to mds --output mds/ [--mds_token_column tokens]
    python -m pipeline export shards/ --to megatron --output megatron/ [--input 'corpus/*']
    python -m pipeline export shards/ ... --runner=DataflowRunner --project=...  # Beam options
    python -m pipeline export shards/ ... --runner=DataflowRunner ... --dry_run  # check only

A Beam job on the same runners as ``build``: one shard in, one file (or directory) out, in parallel
(``shard-00003-of-00010.arrow`` -> ``training-part-00003-of-00010.hdf5`` or
``shard-00003-of-00010.tfrecord``, or the MDS directory ``shard-00003-of-00010/``, with
an ``index.json`` over them all), each shard verified against its manifest (size, sha256,
rows) as it is read. Each file is written atomically; vocab.txt is copied (verified), and
``manifest.json`` last: the source manifest's sha256, format, field names, L and P, every
file's rows and sha256. Rows keep their order, ids and masks; pipeline/shards/export_formats.py
pads them each consumer's way (FORMAT.md, "Exports"); pipeline/shards/mds_format.py writes
them unpadded as streaming's MDSWriter does. ``--to megatron`` is another job, of documents
rather than rows: pipeline/beam/export_megatron.py.

Exit codes: 0 success; 1 the job failed (a corrupt shard is named), and what it wrote is
removed; 2 bad arguments or input found before the job (no manifest, P too small, an
output directory that holds an earlier export without --overwrite, a format's package
missing: h5py, or the mds extra's mosaicml-streaming).
With Beam's ``--dry_run`` the job is built and checked, not run, and --output is left as it
was (pipeline/beam/runner.py, ``run_pipeline``): 0 when the check passed.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import hashlib
import logging
import os
from collections.abc import Sequence

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from pipeline.beam import export_mds, export_megatron, runner
from pipeline.beam.export_config import ExportConfig, export_parser, parse_export_args
from pipeline.beam.runner import Job
from pipeline.beam.shard_steps import write_atomic
from pipeline.shards import export_formats as formats
from pipeline.shards import mds_format, shard_format
from pipeline.shards.shard_writer import created_by, encode_manifest

logger = logging.getLogger(__name__)
EXPORT_VERSION = 1  # of the export manifest's keys
# What an export writes; --overwrite deletes these (manifest first), a failed job too.
OUTPUT_PATTERNS = (
    shard_format.MANIFEST_NAME,
    shard_format.VOCAB_NAME,
    "training-part-*.hdf5",
    "shard-*.tfrecord",
    "index.json",  # MDS: the dataset's index, over the shards' directories
    "shard-?????-of-?????/index.json",
    "shard-?????-of-?????/shard.*.mds",
    "part-*_text_sentence.bin",  # Megatron
    "part-*_text_sentence.idx",
    "shard-?????-of-?????/.*.tmp",
    ".*.tmp",
)
MDS_DIRECTORIES = "shard-?????-of-?????"  # removed with their files (local outputs)


# ----------------------------------------------------------------------------- plan


@dataclasses.dataclass(frozen=True)
class ExportPlan:
    """What the driver settles before the job (fails fast, exit 2)."""

    config: ExportConfig
    manifest: dict  # the source's, validated
    manifest_sha256: str
    max_seq_length: int  # L: the shards' max_seq_length
    max_predictions_per_seq: int | None  # P (padded formats); None: mds and megatron
    names: dict  # field -> dataset, feature or column name (MDS: its encoding) in the files
    megatron: export_megatron.MegatronPlan | None = None  # --to megatron: the corpus


def make_plan(config: ExportConfig) -> ExportPlan:
    """Read the source manifest, settle L and P, check the format's dependencies.

    Raises:
        ShardFormatError: no or a bad source manifest (the build did not finish).
        ValueError: P smaller than the shards' max_predictions_per_seq; the manifest has no
            P and none was given; a padded NSP format asked of MLM rows.
        ImportError: h5py is missing (for nvidia-hdf5), or mosaicml-streaming (for mds).
        FileNotFoundError: --to megatron and the corpus matches no file.
    """
    source = config.source
    manifest = shard_format.read_manifest(source)
    raw = shard_format.read_bytes(shard_format.join_path(source, shard_format.MANIFEST_NAME))
    digest, seq = hashlib.sha256(raw).hexdigest(), manifest["schema"]["max_seq_length"]
    kind = shard_format.manifest_kind(manifest)
    if config.to == formats.MDS:
        schema = shard_format.shard_schema(manifest["schema"]["vocab_size"], seq, kind)
        names = mds_format.mds_columns(schema, config.mds_token_column or "input_ids")
        return ExportPlan(config, manifest, digest, seq, None, names)
    if config.to == formats.MEGATRON:
        megatron = export_megatron.make_megatron_plan(config, manifest)
        return ExportPlan(config, manifest, digest, seq, None, {}, megatron)
    if kind != "nsp":
        raise ValueError(
            f"--to {config.to} holds NSP rows with static masks (segment ids, masked positions, "
            f"next-sentence labels), and {source} holds {kind} rows: export those --to mds "
            "(the rows) or --to megatron (the documents)"
        )
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
    return ExportPlan(config, manifest, digest, seq, p, dict(names))


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
        names = ", ".join(sorted(_relative(p, out) for p in existing)[:3])
        raise FileExistsError(
            f"{out} already holds {len(existing)} file(s) of an earlier export ({names}, ...); "
            "pass --overwrite to replace them or choose another --output"
        )


def _relative(path: str, directory: str) -> str:
    """``path`` inside ``directory``, as the user names it: ``shard-00000-of-00002/index.json``."""
    if shard_format.is_remote(path):
        return path.removeprefix(directory.rstrip("/") + "/")
    return os.path.relpath(path, directory)


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
    if not shard_format.is_remote(output):  # object stores have no directories to leave
        for directory in glob.glob(os.path.join(glob.escape(output), MDS_DIRECTORIES)):
            if os.path.isdir(directory) and not os.listdir(directory):
                os.rmdir(directory)


# ----------------------------------------------------------------------------- the job


def export_shard(entry: dict, plan: ExportPlan, encoder=None) -> list[dict]:
    """Verify one source shard, write its export atomically; returns the files' entries.

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
    if config.to == formats.MDS:
        return export_mds.write_directory(table, name, entry["name"], plan)
    try:
        if config.to == formats.HDF5:
            data = formats.hdf5_bytes(table, seq, pred)
        else:
            data = formats.tfrecord_chunks(table, encoder, seq, pred)
        size, sha256 = write_atomic(FileSystems.join(config.output, name), data)
    except ValueError as err:  # a row that does not fit
        raise shard_format.ShardFormatError(f"{path}: {err}") from None
    return [
        {
            "name": name,
            "rows": table.num_rows,
            "bytes": size,
            "sha256": sha256,
            "source": entry["name"],
        }
    ]


class ExportShard(beam.DoFn):
    """A source shard's manifest entry -> its exported files' entries (after writing them)."""

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
        self._rows.inc(entry["rows"])
        self._files.inc(len(written))
        yield from written


def fields(plan: ExportPlan) -> dict:
    """The manifest's ``fields``: each dataset's (HDF5) or feature's (TFRecord) dtype and
    shape, each MDS column's encoding, or what Megatron's sequences hold."""
    if plan.config.to == formats.MDS:
        return {name: {"encoding": encoding} for name, encoding in plan.names.items()}
    if plan.config.to == formats.MEGATRON:
        return export_megatron.fields(plan.megatron)
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


def format_files(files: list[dict], plan: ExportPlan) -> tuple[list[dict], dict]:
    """Write what completes a format's files before the manifest (the MDS dataset's
    index.json, Megatron's empty parts); returns every file's entry and the manifest's
    format-specific keys.

    Raises:
        ValueError: --to megatron, and the corpus gave another number of documents than the
            shards' build.
    """
    config = plan.config
    if config.to == formats.HDF5:
        return files, {"hdf5": dict(formats.HDF5_OPTIONS)}
    if config.to == formats.TFRECORD:
        return files, {"tfrecord_names": config.tfrecord_names or "v1"}
    if config.to == formats.MEGATRON:
        files = files + export_megatron.empty_parts(files, plan.megatron, config.output)
        export_megatron.check_documents(files, plan.megatron)
        parts = plan.megatron.num_parts
        return files, {
            "megatron": {"num_parts": parts, "documents": sum(f.get("documents", 0) for f in files)}
        }
    files = [*files, export_mds.write_index(files, config.output)]
    return files, {"mds": {"token_column": config.mds_token_column or "input_ids"}}


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
    files, format_keys = format_files(files, plan)
    files = sorted(files, key=lambda f: f["name"])
    rows = None if config.to == formats.MEGATRON else sum(f["rows"] for f in files)
    manifest = {
        "created_by": created_by(),
        "export_version": EXPORT_VERSION,
        "format": config.to,
        "fields": fields(plan),
        "max_seq_length": plan.max_seq_length,
        "max_predictions_per_seq": plan.max_predictions_per_seq,
        "num_rows": rows,  # null for megatron: documents, not rows (megatron.documents)
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
        **format_keys,
    }
    write_atomic(
        FileSystems.join(config.output, shard_format.MANIFEST_NAME), encode_manifest(manifest)
    )
    return manifest


def export_graph(p: beam.Pipeline, plan: ExportPlan) -> beam.PCollection:
    """Add the export to ``p``; returns the PCollection holding the manifest."""
    if plan.config.to == formats.MEGATRON:
        files = p | "ExportDocuments" >> export_megatron.ExportDocuments(
            plan.megatron, plan.config.output
        )
    else:
        files = (
            p
            | "ListShards" >> beam.Create(plan.manifest["shards"])  # reshuffled: to workers
            | "ExportShards" >> beam.ParDo(ExportShard(plan))
        )
    return (
        files
        | "CollectFiles" >> beam.combiners.ToList()
        | "WriteManifest" >> beam.Map(write_manifest, plan)
    )


def export_job(argv: Sequence[str]) -> Job:
    """Parse, plan and prepare --output (a dry run checks it and leaves it as it found it:
    no directory, no deletes), for run_job.

    Raises:
        ValueError, OSError, ImportError: bad arguments, a bad source (ShardFormatError is a
            ValueError), an earlier export without --overwrite.
    """
    config, beam_args = parse_export_args(argv)
    dry_run, beam_args = runner.split_dry_run(beam_args)
    beam_args = runner.check_beam_options(beam_args, export_parser())
    plan = make_plan(config)
    (check_output if dry_run else prepare_output)(config)
    source = plan.manifest
    what = (
        f"the documents of the corpus {list(plan.megatron.build.input)} of {config.source}"
        if plan.megatron
        else f"{len(source['shards'])} shards ({source['num_rows']} rows) of {config.source}"
    )
    lengths = f", L {plan.max_seq_length}, P {plan.max_predictions_per_seq}"
    return runner.Job(
        command="export",
        output=config.output,
        beam_args=beam_args,
        dry_run=dry_run,
        doing=f"exporting {what} to {config.output} as {config.to}"
        + (lengths if plan.max_predictions_per_seq else ""),
        graph=lambda p, _: export_graph(p, plan),
        finish=functools.partial(export_done, plan),
        discard=functools.partial(remove_outputs, config.output),
        paths={"source": [config.source], "--output": [config.output]},
    )


def export_done(plan: ExportPlan, seconds: float, log_file: str | None) -> int:
    """The export's last line: what it wrote, and what to give the trainer."""
    logger.info("done in %.1f s: %s", seconds, summary(plan))
    return 0


def summary(plan: ExportPlan) -> str:
    """The last line of an export: what was written, and what the trainer must be given."""
    config, source = plan.config, plan.manifest
    vocab = shard_format.join_path(config.output, shard_format.VOCAB_NAME)
    casing = source["vocab"]["do_lower_case"]
    if config.to == formats.MEGATRON:
        prefixes = shard_format.join_path(config.output, "part-*_text_sentence")
        return (
            f"{plan.megatron.num_parts} Megatron datasets {prefixes}.bin/.idx; train with "
            f"--data-path and each prefix, --vocab-file {vocab}, --tokenizer-type "
            f"{'BertWordPieceLowerCase' if casing else 'BertWordPieceCase'}"
        )
    in_bytes = sum(entry["bytes"] for entry in source["shards"])
    done = (
        f"{source['num_rows']} rows, {len(source['shards'])} shards ({in_bytes / 1e6:.1f} MB) -> "
    )
    if config.to == formats.MDS:
        return done + (
            f"{len(source['shards'])} MDS directories and index.json in {config.output}; read "
            f"with StreamingDataset(local={config.output!r}), token column "
            f"{config.mds_token_column or 'input_ids'}, vocab {vocab}, do_lower_case {casing}"
        )
    return done + (
        f"{len(source['shards'])} {config.to} files in {config.output}; train with "
        f"max_seq_length {plan.max_seq_length}, max_predictions_per_seq "
        f"{plan.max_predictions_per_seq}, vocab {vocab}, do_lower_case {casing}"
    )
