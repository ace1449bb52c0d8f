"""Command line: ``python -m pipeline {corpus,curate,build,stats,inspect,validate,export} ...``.

    python -m pipeline build --input 'corpus/*.txt' --output shards/ --dupe_factor 5
    python -m pipeline build --help          # every option and its default
    python -m pipeline stats shards/ [--plot]
    python -m pipeline export shards/ --to nvidia-hdf5 --output hdf5/   # pipeline/beam/export.py

``build`` prints its own progress lines; Beam's logs and its workers' output go to a log
file whose path it prints: ``OUTPUT.build.log`` beside a local output directory, or
``--log_file PATH``. ``--verbose`` or ``BERT_VERBOSE=1`` puts everything on the console.

``build`` and ``export`` take Beam's ``--dry_run``: the job is built and checked, not run
(pipeline/beam/runner.py), and --output is left as it was; the command says what it checked.

Exit codes: 0 success, 1 the job failed, 2 bad arguments or input.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Sequence

from pipeline.beam.runner import (
    beam_options,
    check_beam_options,
    job_log_file,
    run_pipeline,
    runner_of,
    split_dry_run,
    warn_dataflow_pitfalls,
    with_tokenizer_threads,
)

logger = logging.getLogger("pipeline")

USAGE = """usage: python -m pipeline {corpus,curate,build,stats,inspect,validate,export} [options]

  corpus    write an offline English corpus from the installed Python's own text
  curate    raw documents -> exact and near-duplicate removal, quality and language
            filters, decontamination -> Parquet documents (Apache Beam)
  build     raw text -> vocab -> NSP pairs -> masked Arrow shards (Apache Beam)
  stats     summary statistics of a shard directory (optionally as PNG plots)
  inspect   decode rows back to WordPieces (--words: words) with the masks shown
  validate  check every shard and row against the manifest; exit 1 naming a bad file
  export    shards -> NVIDIA's HDF5, Google's TFRecord, Mosaic's MDS or Megatron's indexed
            datasets, for other trainers (Apache Beam)

Run `python -m pipeline build --help` for the options of one command."""


def _console_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """``--verbose`` and ``--log_file`` (how the build talks, not what it writes); the rest."""
    from pipeline.options import CommandParser

    p = CommandParser(add_help=False, allow_abbrev=False)
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--log_file", default=None)
    return p.parse_known_args(list(argv))


def run_build(argv: Sequence[str]) -> int:
    """The build with a readable console: Beam's logs and its workers' output go to a log
    file (``--log_file``, default :func:`default_log_file`) unless --verbose or BERT_VERBOSE=1."""
    return run_with_console(argv, _build)


def run_with_console(argv: Sequence[str], body) -> int:
    """``body(argv, log_file, verbose, handlers) -> exit code`` with our console installed
    (pipeline/console.py): run_build's for any Beam command."""
    from pipeline import console

    own, argv = _console_args(argv)
    verbose = console.verbose_requested(own.verbose)
    stream = None if verbose else console.console_stream()
    handlers = console.install(("pipeline",), verbose=verbose, stream=stream)
    try:
        return body(argv, own.log_file, verbose, handlers)
    finally:
        console.uninstall(handlers)
        if stream is not None:
            stream.close()


def local_worker_processes(beam_args: list[str]) -> int:
    """The local runner's worker processes besides its driver: --direct_num_workers in
    multi_processing mode (0: one per core), none in memory (threads of the driver)."""
    from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions

    direct = PipelineOptions(beam_args).view_as(DirectOptions)
    if direct.direct_running_mode != "multi_processing":
        return 0
    return direct.direct_num_workers or os.cpu_count() or 1


def row_shape(stats: dict, kind: str, max_len: int) -> str:
    """The build line's account of its rows, its shares stated so that they agree.

    NSP rows: ``"random-next 62.2%, 11.1 masks/row, 79.7% of rows shorter than 128"``.
    Packed MLM rows fill almost every slot, yet most end a few tokens short of the length
    (a sentence that does not fit starts the next row), so the shortfall is given in tokens:
    ``"mlm rows, 98.2% of token slots filled (68.9% of rows end short of 128, by 3.3 tokens
    on average); no static masks: the trainer masks them"``.
    """
    short = stats["short_row_share"]
    if "random_next_share" in stats:
        return (
            f"random-next {100 * stats['random_next_share']:.1f}%, "
            f"{stats['masks_per_row']:.1f} masks/row, {100 * short:.1f}% of rows shorter than "
            f"{max_len}"
        )
    filled = stats["packing_efficiency"]
    by = (1 - filled) * max_len / short if short else 0.0
    masks = (
        f"{stats['masks_per_row']:.1f} masks/row"
        if stats["masks_per_row"]
        else "no static masks: the trainer masks them"
    )
    return (
        f"{kind} rows, {100 * filled:.1f}% of token slots filled ({100 * short:.1f}% of rows "
        f"end short of {max_len}, by {by:.1f} tokens on average); {masks}"
    )


def _build(
    argv: Sequence[str], log_file: str | None, verbose: bool, handlers: list[logging.Handler]
) -> int:
    """Plan, run and summarise the build. The log file takes every record; unless verbose,
    descriptor 2 (Beam's workers included) goes there too while the pipeline runs."""
    from apache_beam.options.pipeline_options import StandardOptions

    from pipeline.beam import build, sizing
    from pipeline.beam.config import parse_build_args
    from pipeline.beam.document_steps import LONG_SENTENCE_CHARS
    from pipeline.shards.shard_format import read_manifest

    try:
        config, beam_args = parse_build_args(argv)
        dry_run, beam_args = split_dry_run(beam_args)
        beam_args = check_beam_options(beam_args)
        plan = build.make_plan(config)
        runner = runner_of(beam_args)
        # Dask partitions of ~8 MB of input, at most one per range (pipeline/beam/sizing.py).
        beam_args += sizing.dask_partitions(beam_args, runner, len(plan.ranges), sum(plan.sizes))
        if not dry_run:  # the local runner's memory, before anything is written
            workers = local_worker_processes(beam_args)
            files = list(zip(plan.files, plan.sizes, strict=True))
            sizing.check_local_memory(config, files, runner, workers)
        # A dry run leaves --output as it found it: no directory made, no earlier build
        # removed; it refuses one without --overwrite as the build would.
        if dry_run:
            build.check_output(config)
        created = False if dry_run else build.prepare_output(config)
    except (ValueError, OSError, ImportError) as e:  # FileNotFoundError, FileExistsError
        logger.error("%s", e)  # ImportError: an optional package (its message names the extra)
        return 2  # (ValueError includes sizing.MemoryCheckError)
    log_file = job_log_file(log_file, verbose, config.output, "build", handlers, dry_run=dry_run)
    options, given = beam_options(beam_args)
    config = with_tokenizer_threads(config, options)
    start = time.perf_counter()
    runner = options.view_as(StandardOptions).runner or "DirectRunner"
    logger.info(
        "%s shards in %s on %s (Beam args: %s)",
        "dry run: checking, not running, the build of" if dry_run else "building",
        config.output,
        runner.rsplit(".", 1)[-1],
        given,
    )
    warn_dataflow_pitfalls(
        options,
        {
            "--input": config.input,
            "--output": [config.output],
            "--vocab_file": [config.vocab_file or ""],
        },
    )
    if not verbose:
        logger.info("Beam's log: %s (--verbose or BERT_VERBOSE=1 shows it here)", log_file)
    if config.capped_rate:
        logger.warning(
            "--max_predictions_per_seq %d lowers the masking rate: a row of %d tokens gets "
            "%d predictions at --masked_lm_prob %g, not %d (%.1f%% instead of %.1f%%); the "
            "manifest's stats.rows_capped counts the rows it lowers. Leave it out to let "
            "the cap follow the rate",
            config.max_predictions_per_seq,
            config.max_seq_length,
            config.max_predictions_per_seq,
            config.masked_lm_prob,
            int(config.uncapped_predictions()[-1]),
            100 * config.max_predictions_per_seq / config.max_seq_length,
            100 * config.masked_lm_prob,
        )
    failed = run_pipeline(
        options,
        lambda p: build.build_graph(p, config, plan),
        log_file,
        verbose,
        "build",
        dry_run=dry_run,
    )
    if dry_run:  # nothing ran: no manifest to read, nothing of the job's to remove
        return failed
    if failed:  # nothing half-written stays: what the job wrote goes, the error stays shown
        build.discard_build(config.output, created)
        return failed
    manifest = read_manifest(config.output)
    try:
        build.refuse_empty_build(manifest, config, created)
    except build.EmptyBuildError as e:
        logger.error("%s", e)
        return 2
    elapsed = time.perf_counter() - start
    stats, skipped = manifest["stats"], manifest["skipped"]
    logger.info(
        "done in %.1f s: %d documents -> %d rows in %d shards; %s; skipped %s",
        elapsed,
        stats["documents"],
        manifest["num_rows"],
        len(manifest["shards"]),
        row_shape(stats, config.kind, config.max_seq_length),
        skipped or "nothing",
    )
    curation = stats.get("curation")
    if curation:
        removed = curation["removed"]
        logger.info(
            "curation removed %d documents before tokenizing: %s",
            sum(removed.values()),
            ", ".join(f"{reason} {n}" for reason, n in removed.items()) or "none",
        )
        if curation["components_changed_in_last_round"]:
            logger.warning(
                "near-duplicate clusters had not converged after --cc_rounds %d (%d "
                "documents changed cluster in the last round): some near copies may "
                "remain; raise it",
                config.cc_rounds,
                curation["components_changed_in_last_round"],
            )
    long = stats.get("input", {}).get("long_sentences", 0)
    if long:
        logger.warning(
            "%d sentence(s) of %s characters or more (txt: lines) kept whole: a row holds "
            "at most %d tokens of one sentence, so most of such text is lost; split it into "
            "sentences, one per line (the files and documents are named in %s)",
            long,
            f"{LONG_SENTENCE_CHARS:,}",
            config.max_seq_length,
            log_file or "the lines above",
        )
    single = stats.get("input", {}).get("single_document_files", 0)
    if single:
        logger.warning(
            "%d of %d txt input file(s) were each read as ONE document, since a txt document "
            "ends at a blank line and they have none (named, with their lines, in %s): NSP "
            "pairs their sentences as one running text. If they hold many documents, put a "
            'blank line between documents, or give them as jsonl, one {"text": ...} record '
            "per document (the build splits it into sentences)",
            single,
            len(plan.files),
            log_file or "the lines above",
        )
    return 0


def _run_curate(*args) -> int:
    """pipeline/beam/curate.py, imported only now (as export, below)."""
    from pipeline.beam.curate import run_curate

    return run_curate(*args)


def _run_export(*args) -> int:
    """pipeline/beam/export.py, imported only now: Beam logs on import, and with no handler yet
    Python's logging would add its own and print every line twice."""
    from pipeline.beam.export import run_export

    return run_export(*args)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "build":
        return run_build(rest)  # sets up its own logging (pipeline/console.py)
    if command == "export":
        return run_with_console(rest, _run_export)
    if command == "curate":
        return run_with_console(rest, _run_curate)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if command == "stats":
        from pipeline.cli.stats import main as stats_main

        return stats_main(rest)
    if command == "corpus":
        from pipeline.cli.corpus import main as corpus_main

        return corpus_main(rest)
    if command in ("inspect", "validate"):
        from pipeline.cli import inspect_cli

        return (inspect_cli.inspect_main if command == "inspect" else inspect_cli.validate_main)(
            rest
        )
    print(f"unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
