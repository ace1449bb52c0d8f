"""Command line: ``python -m pipeline build ...`` and ``python -m pipeline stats DIR``.

    python -m pipeline build --input 'corpus/*.txt' --output shards/ --dupe_factor 5
    python -m pipeline build --help          # every option and its default
    python -m pipeline stats shards/ [--plot]

Exit codes: 0 success, 1 the job failed, 2 bad arguments or input.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import os
import sys
import time
from collections.abc import Sequence

logger = logging.getLogger("pipeline")
DEFAULT_RUNNER = "apache_beam.runners.portability.fn_api_runner.FnApiRunner"

USAGE = """usage: python -m pipeline {build,stats,inspect,validate} [options]

  build     raw text -> vocab -> NSP pairs -> masked Arrow shards (Apache Beam)
  stats     summary statistics of a shard directory (optionally as PNG plots)
  inspect   decode rows back to WordPieces with the masks shown
  validate  check every shard and row against the manifest; exit 1 naming a bad file

Run `python -m pipeline build --help` for the options of one command."""


def _check_beam_args(beam_args: list[str]) -> None:
    """Refuse a misspelt option of ours instead of handing it to Beam, which would drop it."""
    from .config import build_parser

    ours = [a for action in build_parser()._actions for a in action.option_strings]
    for arg in beam_args:
        if not arg.startswith("--"):
            continue
        name = arg.split("=", 1)[0]
        close = difflib.get_close_matches(name, ours, n=1, cutoff=0.85)
        if close:
            raise ValueError(f"unknown option {name} (did you mean {close[0]}?)")


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


def run_build(argv: Sequence[str]) -> int:
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from .build import build_graph, make_plan, prepare_output
    from .config import parse_build_args
    from .dask_compat import install as install_dask_fix
    from .dask_compat import uses_dask
    from .format import read_manifest

    try:
        config, beam_args = parse_build_args(argv)
        _check_beam_args(beam_args)
        plan = make_plan(config)
        prepare_output(config)
    except (ValueError, FileNotFoundError, FileExistsError) as e:
        logger.error("%s", e)
        return 2
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
    options = PipelineOptions(beam_args)
    config = with_tokenizer_threads(config, options)
    start = time.perf_counter()
    logger.info("building shards in %s (Beam args: %s)", config.output, beam_args or "none")
    with beam.Pipeline(options=options) as p:
        build_graph(p, config, plan)
    manifest = read_manifest(config.output)
    elapsed = time.perf_counter() - start
    stats, skipped = manifest["stats"], manifest["skipped"]
    logger.info(
        "done in %.1f s: %d documents -> %d rows in %d shards; random-next %.1f%%, "
        "%.1f masks/row, %.1f%% of rows shorter than %d; skipped %s",
        elapsed, stats["documents"], manifest["num_rows"], len(manifest["shards"]),
        100 * stats["random_next_share"], stats["masks_per_row"], 100 * stats["short_row_share"],
        config.max_seq_length, skipped or "nothing",
    )  # fmt: skip
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "build":
        return run_build(rest)
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
