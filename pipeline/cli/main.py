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
import sys
from collections.abc import Sequence

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
    """``--verbose`` and ``--log_file`` (how a job talks, not what it writes); the rest."""
    from pipeline.options import CommandParser

    p = CommandParser(add_help=False, allow_abbrev=False)
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--log_file", default=None)
    return p.parse_known_args(list(argv))


def run_with_console(argv: Sequence[str], body) -> int:
    """``body(argv, log_file, verbose, handlers) -> exit code`` with our console installed
    (pipeline/console.py): Beam's logs and its workers' output go to a log file
    (``--log_file``, default beside the output) unless --verbose or BERT_VERBOSE=1."""
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


def _job(module: str, prepare: str):
    """``run_with_console``'s body for a Beam command: pipeline/beam/runner.py's run_job on
    ``module.prepare`` (imported only now: Beam logs on import, and with no handler yet
    Python's logging would add its own and print every line twice)."""

    def body(argv, log_file, verbose, handlers) -> int:
        import importlib

        from pipeline.beam.runner import run_job

        job = getattr(importlib.import_module(module), prepare)
        return run_job(job, argv, log_file, verbose, handlers)

    return body


JOBS = {
    "build": _job("pipeline.beam.build_job", "build_job"),
    "curate": _job("pipeline.beam.curate", "curate_job"),
    "export": _job("pipeline.beam.export", "export_job"),
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command in JOBS:  # a Beam job: its own console and log file (pipeline/console.py)
        return run_with_console(rest, JOBS[command])
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
