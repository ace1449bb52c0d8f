"""Command line: ``python -m pipeline build ...`` and ``python -m pipeline stats DIR``.

    python -m pipeline build --input 'corpus/*.txt' --output shards/ --dupe_factor 5
    python -m pipeline build --help          # every option and its default
    python -m pipeline stats shards/ [--plot]
    python -m pipeline export shards/ --to nvidia-hdf5 --output hdf5/   # pipeline/export.py

``build`` prints its own progress lines; Beam's logs and its workers' output go to a log
file whose path it prints: ``OUTPUT.build.log`` beside a local output directory, or
``--log_file PATH``. ``--verbose`` or ``BERT_VERBOSE=1`` puts everything on the console.

Exit codes: 0 success, 1 the job failed, 2 bad arguments or input.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import logging
import os
import sys
import tempfile
import time
from collections.abc import Sequence

logger = logging.getLogger("pipeline")
DEFAULT_RUNNER = "apache_beam.runners.portability.fn_api_runner.FnApiRunner"

USAGE = """usage: python -m pipeline {build,stats,inspect,validate,export} [options]

  build     raw text -> vocab -> NSP pairs -> masked Arrow shards (Apache Beam)
  stats     summary statistics of a shard directory (optionally as PNG plots)
  inspect   decode rows back to WordPieces (--words: words) with the masks shown
  validate  check every shard and row against the manifest; exit 1 naming a bad file
  export    shards -> NVIDIA's HDF5 or Google's TFRecord for other trainers (Apache Beam)

Run `python -m pipeline build --help` for the options of one command."""


def check_beam_options(beam_args: list[str], parser: argparse.ArgumentParser | None = None
                       ) -> list[str]:  # fmt: skip
    """Refuse what Beam would drop; return ``beam_args`` spelt as Beam declares them.

    Beam discards an option it cannot parse (``--runer=...``) with one log line and runs on,
    locally, and drops ``--direct-num-workers=2`` without a word: each flag is respelt as
    Beam declares it (``--direct_num_workers=2``; its hyphenated ``--job-server-timeout``
    kept). Beam's own parsers decide what is known, the chosen runner's included (its
    module is imported first, so its options class counts). ``parser`` is the command's own
    (default: build's), whose options are suggested too.

    Raises:
        ValueError: an unknown runner or option, with Beam's closest name.
    """
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
    from apache_beam.runners.runner import create_runner

    from .options import did_you_mean, respell

    runner = PipelineOptions(beam_args).view_as(StandardOptions).runner
    if runner:
        try:
            create_runner(runner)
        except ValueError as err:  # Beam lists the valid names in its message
            valid = str(err).split("Valid values are ", 1)[-1].replace(" or ", ", ").split(", ")
            close = difflib.get_close_matches(runner, valid, n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]}?)" if close else f": {err}"
            raise ValueError(f"--runner={runner} is not a Beam runner{hint}") from None
        except ImportError as err:
            raise ValueError(
                f"--runner={runner}: cannot load it ({err}); install what it needs, e.g. "
                "pip install 'apache-beam[dask]' for the DaskRunner"
            ) from None
    beam_names = _beam_flags()
    beam_args = respell(beam_args, beam_names)
    options = PipelineOptions(beam_args)
    beam_logger = logging.getLogger("apache_beam.options.pipeline_options")
    level = beam_logger.level
    beam_logger.setLevel(logging.ERROR)  # its "Discarding unparseable args" is said below
    try:
        known = options.get_all_options()
    finally:
        beam_logger.setLevel(level)
    unknown = sorted(set(options.get_all_options(retain_unknown_options=True)) - set(known))
    if unknown:
        parser = parser or _our_parser()
        ours = [a for action in parser._actions for a in action.option_strings]
        # Beam names an option by its dest (--vocab-sise -> vocab_sise): say it as given.
        given = {a.partition("=")[0][2:].replace("-", "_"): a.partition("=")[0]
                 for a in beam_args if a.startswith("--")}  # fmt: skip
        names = [given.get(u, f"--{u}") for u in unknown]
        problems = [name + did_you_mean(name, [*beam_names, *ours]) for name in names]
        raise ValueError(
            f"unknown option{'s' if len(problems) > 1 else ''} {', '.join(problems)}: not one "
            f"of ours ({parser.prog} --help) nor of Apache Beam's pipeline options"
        )
    return beam_args


def _beam_flags() -> list[str]:
    """Every flag of Beam's options classes imported so far, as Beam spells it
    (``--direct_num_workers``, ``--job-server-timeout``): the parser Beam builds to read them."""
    from apache_beam.options.pipeline_options import PipelineOptions

    names: list[str] = []

    def collect(parser: argparse.ArgumentParser) -> None:
        names.extend(name for action in parser._actions for name in action.option_strings)

    PipelineOptions([]).get_all_options(add_extra_args_fn=collect)
    return names


def _our_parser() -> argparse.ArgumentParser:
    from .config import build_parser

    parser = build_parser()
    for flag in ("--verbose", "--log_file"):  # _console_args's
        parser.add_argument(flag)
    return parser


def _quiet_beam_logs() -> None:
    """Beam and Dask log every bundle at INFO; BEAM_LOG_LEVEL=INFO brings them back."""
    level = os.environ.get("BEAM_LOG_LEVEL", "WARNING")
    for name in list(logging.root.manager.loggerDict):
        if name.startswith(("apache_beam", "distributed")):
            logging.getLogger(name).setLevel(level)


def with_tokenizer_threads(config, options):
    """``config`` with ``tokenizer_threads`` resolved for the runner in ``options``."""
    from apache_beam.options.pipeline_options import DirectOptions, StandardOptions

    from .config import resolve_tokenizer_threads

    threads = resolve_tokenizer_threads(
        config.tokenizer_threads,
        options.view_as(StandardOptions).runner,
        options.view_as(DirectOptions).direct_num_workers,
        os.cpu_count() or 1,
    )
    return dataclasses.replace(config, tokenizer_threads=threads)


def _console_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """``--verbose`` and ``--log_file`` (how the build talks, not what it writes); the rest."""
    from .options import CommandParser

    p = CommandParser(add_help=False, allow_abbrev=False)
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--log_file", default=None)
    return p.parse_known_args(list(argv))


def _last_line(err: BaseException) -> str:
    """A Beam error's message ends with the worker's exception; its traceback goes first."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[-1] if lines else type(err).__name__


def job_log_file(log_file: str | None, verbose: bool, output: str, command: str,
                 handlers: list[logging.Handler]) -> str | None:  # fmt: skip
    """The log file of a Beam command that passed its checks (a refused run keeps the last
    one's log): ``--log_file``, else :func:`default_log_file` emptied, unless verbose;
    adds its handler to ``handlers``."""
    from .console import add_log_file

    if log_file is None and not verbose:
        log_file = default_log_file(output, command)
        open(log_file, "w").close()  # this run's log only (appended to below)
    if log_file is not None:
        handlers.append(add_log_file(log_file))
    return log_file


def beam_options(beam_args: list[str]):
    """Our commands' PipelineOptions: Beam's SDK workers log at WARNING
    and, without ``--runner``, the FnApiRunner (:data:`DEFAULT_RUNNER`) runs the job.

    Returns:
        (PipelineOptions, the Beam arguments as the user gave them, for the log).
    """
    from apache_beam.options.pipeline_options import PipelineOptions

    from .dask_compat import install as install_dask_fix
    from .dask_compat import uses_dask

    given = " ".join(beam_args) or "none"
    if not any(a.startswith("--default_sdk_harness_log_level") for a in beam_args):
        # Beam's workers log every bundle at INFO; keep the console for our progress.
        beam_args = [*beam_args, "--default_sdk_harness_log_level=WARNING"]
    if not any(a == "--runner" or a.startswith("--runner=") for a in beam_args):
        # Beam's DirectRunner would first try to download its Prism runner; go
        # straight to the engine it uses for batch jobs (in-process or
        # --direct_running_mode=multi_processing with --direct_num_workers).
        beam_args = [*beam_args, f"--runner={DEFAULT_RUNNER}"]
    if uses_dask(beam_args):
        install_dask_fix()
    _quiet_beam_logs()
    return PipelineOptions(beam_args), given


def run_pipeline(options, add_steps, log_file: str | None, verbose: bool, what: str) -> int:
    """Run ``add_steps(pipeline)`` on ``options``: 0, or 1 after one error line (the
    worker's exception) with the traceback in the log file. Unless verbose, descriptor 2
    (Beam's workers included) goes to the log file meanwhile."""
    import apache_beam as beam

    from .console import stderr_to

    try:
        quiet = contextlib.nullcontext() if verbose else stderr_to(log_file)
        with quiet, beam.Pipeline(options=options) as p:
            add_steps(p)
    except Exception as e:  # the runner's failure, whatever its type: exit 1, not a traceback
        where = f"; traceback and Beam's log: {log_file}" if log_file else ""
        logger.error("%s failed: %s%s", what, _last_line(e), where, exc_info=True)
        return 1
    return 0


def run_build(argv: Sequence[str]) -> int:
    """The build with a readable console: Beam's logs and its workers' output go to a log
    file (``--log_file``, default :func:`default_log_file`) unless --verbose or BERT_VERBOSE=1."""
    return run_with_console(argv, _build)


def run_with_console(argv: Sequence[str], body) -> int:
    """``body(argv, log_file, verbose, handlers) -> exit code`` with our console installed
    (pipeline/console.py): run_build's for any Beam command."""
    from . import console

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


def default_log_file(output: str, command: str = "build") -> str:
    """Beside a local output directory, ``runs/shards/ -> runs/shards.build.log`` (not in
    it: the directory holds only what the manifest lists); for a remote one, a temporary file."""
    if "://" in output:
        fd, path = tempfile.mkstemp(prefix=f"pipeline-{command}-", suffix=".log")
        os.close(fd)
        return path
    path = os.path.abspath(output.rstrip("/") or output) + f".{command}.log"
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return path


def _build(argv: Sequence[str], log_file: str | None, verbose: bool,
           handlers: list[logging.Handler]) -> int:  # fmt: skip
    """Plan, run and summarise the build. The log file takes every record; unless verbose,
    descriptor 2 (Beam's workers included) goes there too while the pipeline runs."""
    from apache_beam.options.pipeline_options import StandardOptions

    from . import build
    from .config import parse_build_args
    from .documents import LONG_SENTENCE_CHARS
    from .shard_format import read_manifest

    try:
        config, beam_args = parse_build_args(argv)
        beam_args = check_beam_options(beam_args)
        plan = build.make_plan(config)
        created = build.prepare_output(config)
    except (ValueError, OSError) as e:  # FileNotFoundError and FileExistsError included
        logger.error("%s", e)
        return 2
    log_file = job_log_file(log_file, verbose, config.output, "build", handlers)
    options, given = beam_options(beam_args)
    config = with_tokenizer_threads(config, options)
    start = time.perf_counter()
    runner = options.view_as(StandardOptions).runner or "DirectRunner"
    logger.info("building shards in %s on %s (Beam args: %s)", config.output,
                runner.rsplit(".", 1)[-1], given)  # fmt: skip
    if not verbose:
        logger.info("Beam's log: %s (--verbose or BERT_VERBOSE=1 shows it here)", log_file)
    failed = run_pipeline(options, lambda p: build.build_graph(p, config, plan), log_file,
                          verbose, "build")  # fmt: skip
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
        "done in %.1f s: %d documents -> %d rows in %d shards; random-next %.1f%%, "
        "%.1f masks/row, %.1f%% of rows shorter than %d; skipped %s",
        elapsed, stats["documents"], manifest["num_rows"], len(manifest["shards"]),
        100 * stats["random_next_share"], stats["masks_per_row"], 100 * stats["short_row_share"],
        config.max_seq_length, skipped or "nothing",
    )  # fmt: skip
    long = stats.get("input", {}).get("long_sentences", 0)
    if long:
        logger.warning(
            "%d sentence(s) of %s characters or more (txt: lines) kept whole: a row holds "
            "at most %d tokens of one sentence, so most of such text is lost; split it into "
            "sentences, one per line (the files and documents are named in %s)",
            long, f"{LONG_SENTENCE_CHARS:,}", config.max_seq_length,
            log_file or "the lines above",
        )  # fmt: skip
    single = stats.get("input", {}).get("single_document_files", 0)
    if single:
        logger.warning(
            "%d of %d txt input file(s) hold a single document (no blank line in them); "
            "if a file holds many documents, put a blank line between them (the txt "
            "convention NSP relies on) or use jsonl, one document per record",
            single, len(plan.files),
        )  # fmt: skip
    return 0


def _run_export(*args) -> int:
    """pipeline/export.py, imported only now: Beam logs on import, and with no handler yet
    Python's logging would add its own and print every line twice."""
    from .export import run_export

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
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if command == "stats":
        from .stats import main as stats_main

        return stats_main(rest)
    if command in ("inspect", "validate"):
        from . import inspect_cli

        return (inspect_cli.inspect_main if command == "inspect" else inspect_cli.validate_main)(
            rest
        )
    print(f"unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
