"""``python -m pipeline build`` as a :class:`~pipeline.beam.runner.Job`: the plan and the
checks before it runs (:func:`build_job`), and the lines that end it (:func:`build_done`).
The graph is pipeline/beam/build.py's; pipeline/beam/runner.py's run_job runs it."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Sequence

from pipeline.beam import build, sizing
from pipeline.beam.config import BuildConfig, parse_build_args
from pipeline.beam.curation_steps import unconverged
from pipeline.beam.runner import (
    Job,
    check_beam_options,
    runner_of,
    split_dry_run,
    with_tokenizer_threads,
)

logger = logging.getLogger("pipeline")


def local_worker_processes(beam_args: list[str]) -> int:
    """The local runner's worker processes besides its driver: --direct_num_workers in
    multi_processing mode (0: one per core), none in memory (threads of the driver)."""
    from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions

    direct = PipelineOptions(beam_args).view_as(DirectOptions)
    if direct.direct_running_mode != "multi_processing":
        return 0
    return direct.direct_num_workers or os.cpu_count() or 1


def build_job(argv: Sequence[str]) -> Job:
    """Parse, plan, check the local runner's memory and prepare --output (a dry run only
    checks it: no directory made, no earlier build removed).

    Raises:
        ValueError, OSError, ImportError: bad arguments or input, an earlier build without
            --overwrite, too little memory (sizing.MemoryCheckError), a missing extra.
    """
    config, beam_args = parse_build_args(argv)
    dry_run, beam_args = split_dry_run(beam_args)
    beam_args = check_beam_options(beam_args)
    plan = build.make_plan(config)
    runner = runner_of(beam_args)
    # Dask partitions of ~8 MB of input, at most one per range (pipeline/beam/sizing.py).
    beam_args += sizing.dask_partitions(beam_args, runner, len(plan.ranges), sum(plan.sizes))
    if dry_run:
        build.check_output(config)
        created = False
    else:  # the local runner's memory, before anything is written
        files = list(zip(plan.files, plan.sizes, strict=True))
        sizing.check_local_memory(config, files, runner, local_worker_processes(beam_args))
        created = build.prepare_output(config)
    return Job(
        command="build",
        output=config.output,
        beam_args=beam_args,
        dry_run=dry_run,
        doing=f"building shards in {config.output}",
        graph=lambda p, options: build.build_graph(
            p, with_tokenizer_threads(config, options), plan
        ),
        finish=functools.partial(build_done, config, plan, created),
        discard=functools.partial(build.discard_build, config.output, created),
        paths={
            "--input": config.input,
            "--output": [config.output],
            "--vocab_file": [config.vocab_file or ""],
        },
        warnings=[capped_rate_warning(config)] if config.capped_rate else [],
    )


def capped_rate_warning(config: BuildConfig) -> str:
    p = config.max_predictions_per_seq
    return (
        f"--max_predictions_per_seq {p} lowers the masking rate: a row of "
        f"{config.max_seq_length} tokens gets {p} predictions at --masked_lm_prob "
        f"{config.masked_lm_prob:g}, not {int(config.uncapped_predictions()[-1])} "
        f"({100 * p / config.max_seq_length:.1f}% instead of "
        f"{100 * config.masked_lm_prob:.1f}%); the manifest's stats.rows_capped counts the "
        "rows it lowers. Leave it out to let the cap follow the rate"
    )


def build_done(
    config: BuildConfig, plan: build.Plan, created: bool, seconds: float, log_file: str | None
) -> int:
    """The build's last lines: its rows, what curation removed, and warnings about the
    input; 2 (and nothing kept) for a build of 0 rows."""
    from pipeline.shards.shard_format import read_manifest

    manifest = read_manifest(config.output)
    try:
        build.refuse_empty_build(manifest, config, created)
    except build.EmptyBuildError as e:
        logger.error("%s", e)
        return 2
    stats, skipped = manifest["stats"], manifest["skipped"]
    logger.info(
        "done in %.1f s: %d documents -> %d rows in %d shards; %s; skipped %s",
        seconds,
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
                "%s", unconverged(config.cc_rounds, curation["components_changed_in_last_round"])
            )
    input_warnings(stats.get("input", {}), config, len(plan.files), log_file or "the lines above")
    return 0


def input_warnings(counts: dict, config: BuildConfig, files: int, where: str) -> None:
    """Warnings about the input the build read (the manifest's ``stats.input``): sentences
    too long to keep, and txt files read as one document each; ``where`` names them."""
    from pipeline.beam.document_steps import LONG_SENTENCE_CHARS

    long = counts.get("long_sentences", 0)
    if long:
        logger.warning(
            "%d sentence(s) of %s characters or more (txt: lines) kept whole: a row holds "
            "at most %d tokens of one sentence, so most of such text is lost; split it into "
            "sentences, one per line (the files and documents are named in %s)",
            long,
            f"{LONG_SENTENCE_CHARS:,}",
            config.max_seq_length,
            where,
        )
    single = counts.get("single_document_files", 0)
    if single:
        logger.warning(
            "%d of %d txt input file(s) were each read as ONE document, since a txt document "
            "ends at a blank line and they have none (named, with their lines, in %s): NSP "
            "pairs their sentences as one running text. If they hold many documents, put a "
            'blank line between documents, or give them as jsonl, one {"text": ...} record '
            "per document (the build splits it into sentences)",
            single,
            files,
            where,
        )


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
