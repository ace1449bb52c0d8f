"""Running our Beam jobs (build, curate and export): the options, the runner, the log file,
and :func:`run_job`, the skeleton every one of them runs in (each supplies its :class:`Job`).

:func:`beam_options` turns the Beam arguments of a command into PipelineOptions (the
FnApiRunner unless ``--runner`` says otherwise; Beam's SDK workers at WARNING) after
:func:`check_beam_options` refused what Beam would silently drop; :func:`run_pipeline` runs a
job and turns its failure into one error line (the traceback in the log file).

``--dry_run`` (:func:`split_dry_run`) builds the job without running it: the DataflowRunner
translates and validates it and stops before staging or submitting (Beam's TestOptions
``dry_run``); on runners without a dry run of their own the graph is built and encoded, and
nothing runs (:func:`run_pipeline`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence

from pipeline.shards import shard_format

logger = logging.getLogger("pipeline")
DEFAULT_RUNNER = "apache_beam.runners.portability.fn_api_runner.FnApiRunner"


def runner_of(beam_args: list[str]) -> str | None:
    """The ``--runner`` of Beam's arguments, or None (the DirectRunner)."""
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

    return PipelineOptions(beam_args).view_as(StandardOptions).runner


def check_beam_options(
    beam_args: list[str], parser: argparse.ArgumentParser | None = None
) -> list[str]:
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
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipeline.options import did_you_mean, respell

    _check_runner(beam_args)
    import pipeline.beam.dask_compat  # noqa: F401  (its --dask_shuffle_partitions is Beam's)

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
    # Older Beams' parsers take a prefix of a flag for the flag (argparse's abbreviations:
    # 2.55 reads --direct_num_worker=2 as --direct_num_workers=2): a flag must be Beam's own.
    declared = set(beam_names)
    for arg in beam_args:
        flag = arg.partition("=")[0]
        dest = flag[2:].replace("-", "_")
        if flag.startswith("--") and flag not in declared and dest not in unknown:
            unknown.append(dest)
    if unknown:
        parser = parser or _our_parser()
        ours = [a for action in parser._actions for a in action.option_strings]
        # Beam names an option by its dest (--vocab-sise -> vocab_sise): say it as given.
        given = {
            a.partition("=")[0][2:].replace("-", "_"): a.partition("=")[0]
            for a in beam_args
            if a.startswith("--")
        }
        names = [given.get(u, f"--{u}") for u in unknown]
        problems = [name + did_you_mean(name, [*beam_names, *ours]) for name in names]
        raise ValueError(
            f"unknown option{'s' if len(problems) > 1 else ''} {', '.join(problems)}: not one "
            f"of ours ({parser.prog} --help) nor of Apache Beam's pipeline options"
        )
    return beam_args


def _check_runner(beam_args: list[str]) -> None:
    """Refuse a ``--runner`` Beam does not know (with the closest name) or cannot load."""
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
    from apache_beam.runners.runner import create_runner

    runner = PipelineOptions(beam_args).view_as(StandardOptions).runner
    if not runner:
        return
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
    from pipeline.beam.config import build_parser

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

    from pipeline.beam.config import resolve_tokenizer_threads

    threads = resolve_tokenizer_threads(
        config.tokenizer_threads,
        options.view_as(StandardOptions).runner,
        options.view_as(DirectOptions).direct_num_workers,
        os.cpu_count() or 1,
    )
    return dataclasses.replace(config, tokenizer_threads=threads)


class UsageError(ValueError):
    """A mistake in the command's options that only the running job can find (a vocab
    size too small for the corpus's alphabet): exit 2, as options refused before the job
    starts are, with the message alone."""


def usage_message(err: BaseException) -> str | None:
    """The message of a :class:`UsageError` that stopped a job, else None. In-process
    runners and Dask raise it as it is; the multi-processing DirectRunner raises a
    RuntimeError whose last line is the worker's ``pipeline.beam.runner.UsageError: ...``.

    Beam's `` [while running 'Step']`` suffix goes: ``usage_message(RuntimeError("...\\n"
    "pipeline.beam.runner.UsageError: pass --x 5 [while running 'Learn']"))`` -> ``"pass --x 5"``.
    """
    name = f"{UsageError.__module__}.{UsageError.__qualname__}: "
    line = _last_line(err)
    if isinstance(err, UsageError):
        line = str(err)
    elif line.startswith(name):
        line = line[len(name) :]
    else:
        return None
    return re.sub(r" \[while running '[^']*'\]$", "", line)  # Beam's suffix: the step's label


def _last_line(err: BaseException) -> str:
    """A Beam error's message ends with the worker's exception; its traceback goes first."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[-1] if lines else type(err).__name__


def job_log_file(
    log_file: str | None,
    verbose: bool,
    output: str,
    command: str,
    handlers: list[logging.Handler],
    *,
    dry_run: bool = False,
) -> str | None:
    """The log file of a Beam command that passed its checks (a refused run keeps the last
    one's log): ``--log_file``, else :func:`default_log_file` emptied, unless verbose;
    adds its handler to ``handlers``. A dry run's default log is a temporary file: it
    writes nothing beside the output, and the last real run's log stays."""
    from pipeline.console import add_log_file

    if log_file is None and not verbose:
        log_file = default_log_file(output, command, temporary=dry_run)
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

    from pipeline.beam.dask_compat import install as install_dask_fix
    from pipeline.beam.dask_compat import uses_dask

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


def split_dry_run(beam_args: list[str]) -> tuple[bool, list[str]]:
    """Take Beam's ``--dry_run`` out of ``beam_args``: (whether asked, the other arguments).

    ``--dry_run``, ``--dry_run=true`` and ``--dry-run false`` all work (parse_bool), so it
    reads like our flags. Beam declares it (TestOptions) as taking a value it never
    converts: ``--dry_run`` alone stops Beam's parser with a usage dump, and
    ``--dry_run=False`` is the string "False", which the DataflowRunner takes for true.
    :func:`run_pipeline` sets Beam's option itself.

    Raises:
        SystemExit: a value that is not true/false (exit 2, one line naming it).
    """
    from pipeline.options import CommandParser, parse_bool

    parser = CommandParser(prog="--dry_run", add_help=False, allow_abbrev=False)
    parser.add_argument("--dry_run", type=parse_bool, nargs="?", const=True, default=False)
    args, rest = parser.parse_known_args(beam_args)
    return args.dry_run, rest


def warn_dataflow_pitfalls(options, paths: dict[str, Sequence[str]]) -> None:
    """On Dataflow, say what would fail only once workers start: paths of this machine
    among ``paths`` (flag -> paths), and no way for workers to get this package.

    Beam validates its own options only; --input and --output are ours. A worker runs on
    its own VM, so a path on this machine is not there (a Dask or Spark cluster may share
    a file system; Dataflow never does), and it imports ``pipeline`` only if
    ``--setup_file`` (or an image or package) brings it. Warned, not refused: a dry run on
    local files is how the job is checked without a bucket.
    """
    from apache_beam.options.pipeline_options import SetupOptions, StandardOptions, WorkerOptions

    runner = options.view_as(StandardOptions).runner or ""
    if "dataflow" not in runner.rsplit(".", 1)[-1].lower():
        return
    for flag, values in paths.items():
        for path in values:
            if path and not shard_format.is_remote(path):
                logger.warning(
                    "%s %s is a path on this machine: Dataflow's workers cannot "
                    "reach it; use gs://",
                    flag,
                    path,
                )
    setup = options.view_as(SetupOptions)
    if not (
        setup.setup_file
        or setup.extra_packages
        or options.view_as(WorkerOptions).sdk_container_image
    ):
        logger.warning(
            "no --setup_file: Dataflow's workers would not have this package; "
            "pass --setup_file=setup.py (deploy/beam/dataflow.sh does)"
        )


def run_pipeline(
    options, add_steps, log_file: str | None, verbose: bool, what: str, *, dry_run: bool = False
) -> int:
    """Run ``add_steps(pipeline)`` on ``options``: 0, or 1 after one error line (the
    worker's exception) with the traceback in the log file; 2 for a :class:`UsageError`,
    its message alone. Unless verbose, descriptor 2
    (Beam's workers included) goes to the log file meanwhile. ``dry_run``: build the job
    without running it (:func:`_dry_run`), then one line saying what was checked."""

    from pipeline.console import stderr_to

    try:
        quiet = contextlib.nullcontext() if verbose else stderr_to(log_file)
        with quiet:
            if dry_run:
                checked = _dry_run(options, add_steps, what)
            else:
                with _pipeline(options) as p, p:
                    add_steps(p)
    except Exception as e:  # the runner's failure, whatever its type: exit 1, not a traceback
        usage = usage_message(e)
        if usage is not None:  # the user's to fix: what to pass instead, no traceback
            logger.debug("%s stopped", what, exc_info=True)
            logger.error("%s", usage)
            return 2
        where = f"; traceback and Beam's log: {log_file}" if log_file else ""
        logger.error(
            "%s%s failed: %s%s",
            "the dry run of the " if dry_run else "",
            what,
            _last_line(e),
            where,
            exc_info=True,
        )
        return 1
    if dry_run:
        logger.info("dry run: %s", checked)
    return 0


@contextlib.contextmanager
def _pipeline(options):
    """``beam.Pipeline(options=options)``, its local temporary directory removed on the way
    out. Beam makes one (``beam-pipeline-temp*``) when the pipeline is made and removes it
    only at the end of ``run()``: a dry run, or a graph whose construction failed, left it
    in the temporary directory for good."""
    import apache_beam as beam

    p = beam.Pipeline(options=options)
    try:
        yield p
    finally:
        shutil.rmtree(p.local_tempdir, ignore_errors=True)


def _dry_run(options, add_steps, what: str) -> str:
    """Build the job on ``options`` without running it; returns what was checked.

    The DataflowRunner honours Beam's ``dry_run``: it validates the options (a project id,
    a region, a gs:// temp_location; in ``beam.Pipeline``), builds the worker environment
    (``--setup_file``'s source distribution included), translates the graph into
    Dataflow's job request, and returns before staging a file or calling the service. The
    other runners ignore the option (the FnApiRunner would run the whole job), so on them
    the graph is built and encoded as Beam's runner API protos (every step pickled, every
    coder chosen), which is what such a runner receives, and nothing runs.
    """
    from apache_beam.options.pipeline_options import TestOptions
    from apache_beam.runners.dataflow.dataflow_runner import DataflowRunner

    # Before the Pipeline: its option checks skip the bucket look-ups (network) on a dry run.
    options.view_as(TestOptions).dry_run = True
    with _pipeline(options) as p:
        add_steps(p)
        runner = type(p.runner).__name__
        if isinstance(p.runner, DataflowRunner):
            p.run().wait_until_finish()
            return (
                f"the {what} job was translated and validated for {runner}; nothing was "
                "staged or submitted and nothing was written"
            )
        p.to_runner_api()
    return (
        f"{runner} has no dry run of its own: the {what} graph was built and encoded "
        "(every step pickled); nothing ran and nothing was written"
    )


def default_log_file(output: str, command: str = "build", *, temporary: bool = False) -> str:
    """Beside a local output directory, ``runs/shards/ -> runs/shards.build.log`` (not in
    it: the directory holds only what the manifest lists); for a remote one, or if
    ``temporary``, a temporary file."""
    if temporary or shard_format.is_remote(output):
        fd, path = tempfile.mkstemp(prefix=f"pipeline-{command}-", suffix=".log")
        os.close(fd)
        return path
    path = os.path.abspath(output.rstrip("/") or output) + f".{command}.log"
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return path


# ----------------------------------------------------------------------------- the job


@dataclasses.dataclass
class Job:
    """A Beam command's job as its ``prepare`` planned it (build, curate, export); what
    :func:`run_job` runs, the same way for each."""

    command: str  # "build": the log file's suffix and the messages' name for the job
    output: str
    beam_args: list[str]
    dry_run: bool
    doing: str  # the start line: "building shards in runs/shards"
    graph: Callable  # (pipeline, options) -> None: adds the job's steps
    finish: Callable[[float, str | None], int]  # (seconds, log file) -> exit code: the summary
    discard: Callable[[], None]  # removes what a failed job wrote
    paths: dict[str, Sequence[str]] = dataclasses.field(default_factory=dict)  # for Dataflow
    warnings: list[str] = dataclasses.field(default_factory=list)  # logged before it runs


def run_job(
    prepare: Callable[[Sequence[str]], Job],
    argv: Sequence[str],
    log_file: str | None,
    verbose: bool,
    handlers: list[logging.Handler],
) -> int:
    """Every Beam command's skeleton, under pipeline/cli/main.py's console: ``prepare(argv)``
    parses, plans and prepares the output (its ValueError, OSError or ImportError: exit 2,
    one line), then the log file, the start line, the run (:func:`run_pipeline`; a dry run
    stops after it), and on failure ``discard`` (nothing half-written stays), on success
    ``finish``, whose exit code is the command's."""
    try:
        job = prepare(argv)
    except (ValueError, OSError, ImportError) as e:  # ImportError: its message names the extra
        logger.error("%s", e)
        return 2
    log_file = job_log_file(
        log_file, verbose, job.output, job.command, handlers, dry_run=job.dry_run
    )
    options, given = beam_options(job.beam_args)
    from apache_beam.options.pipeline_options import StandardOptions

    runner = (options.view_as(StandardOptions).runner or "DirectRunner").rsplit(".", 1)[-1]
    checking = "dry run: checking, not running: " if job.dry_run else ""
    logger.info("%s%s on %s (Beam args: %s)", checking, job.doing, runner, given)
    warn_dataflow_pitfalls(options, job.paths)
    if log_file and not verbose:
        logger.info("Beam's log: %s (--verbose or BERT_VERBOSE=1 shows it here)", log_file)
    for warning in job.warnings:
        logger.warning("%s", warning)
    start = time.perf_counter()
    failed = run_pipeline(
        options,
        lambda p: job.graph(p, options),
        log_file,
        verbose,
        job.command,
        dry_run=job.dry_run,
    )
    if job.dry_run:  # nothing ran: nothing of the job's to remove or report
        return failed
    if failed:
        job.discard()
        logger.info(
            "removed the %s's files from %s: nothing half-written is left", job.command, job.output
        )
        return failed
    return job.finish(time.perf_counter() - start, log_file)
