"""``python -m pipeline curate``: raw documents -> curated documents, as one Beam job.

    python -m pipeline curate --input 'web/*.jsonl' --output curated/
    python -m pipeline curate --input 'web/*.jsonl' --output curated/ --dedup exact \\
        --filters gopher_quality,c4 --languages en --decontaminate 'eval/*.txt'
    python -m pipeline build --input 'curated/*.parquet' --output shards/ ...   # then build

The job reads the inputs ``build`` reads (txt, jsonl, parquet; byte ranges of big files;
gz), each document identified by its content (pipeline/core/sources.py ``content_id``).
Then the curation steps run, in the order that pipeline/beam/curation_steps.py's docstring
gives (they are shared with ``build``): language ID, quality rules, decontamination,
exact copies, MinHash near copies. Each removal counts under a named reason in
``report.json``.

Output: ``part-NNNNN-of-MMMMM.parquet`` files with ``id`` and ``text`` columns (text: a
jsonl or parquet record's text as it was, a txt document's lines one per line, so
``build`` splits it as it splits the source; id: a hash of that text), rows in id order,
each file written atomically; then ``report.json`` (documents and bytes in and out of each
step, a count per rule, documents and bytes in and out per input file: a kept document
counts to the first path, in sorted order, of its exact copies),
``removed_samples.jsonl`` (a few removed documents per reason, seeded) and, with
matplotlib, ``funnel.png``; ``manifest.json`` last: a directory without it is unfinished.

Exit codes: 0 success; 1 the job failed (what it wrote is removed); 2 bad arguments or
input found before the job.
"""

from __future__ import annotations

import functools
import json
import logging
import math
from collections.abc import Iterator, Sequence

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import StandardOptions
from apache_beam.pvalue import TaggedOutput

from pipeline.beam import memory, runner, sizing
from pipeline.beam.config import ReadOptions
from pipeline.beam.curate_config import CurateConfig, curate_parser, parse_curate_args
from pipeline.beam.curate_output import (
    OUTPUT_PATTERNS,
    CombineInBundle,
    add_pairs,
    file_of,
    funnel_lines,
    remove_outputs,
    sample_key,
    smallest,
    write_kept,
    write_outputs,
)
from pipeline.beam.curation_steps import (
    Curate,
    check_packages,
    document_totals,
    documents_of,
    eval_ngram_set,
    unconverged,
    utf8_bytes,
)
from pipeline.beam.document_steps import (
    COUNTS,
    FILE_DOCUMENTS,
    DocumentBatch,
    ReadDocuments,
    add_up,
)
from pipeline.beam.inputs import InputPlan, plan_input
from pipeline.beam.runner import Job
from pipeline.beam.spool import use_spool
from pipeline.core.idpacks import ORIGIN_COLUMNS, IdPacks, add_counts, file_counts

logger = logging.getLogger(__name__)

FILE_BYTES = 128 * 2**20  # output files aim at this many bytes of text (--num_files default)
# ReadTexts' tagged output: IdPacks of (id, input path rank, range start, index in the
# range, UTF-8 bytes): the first three a position (minhash_steps.BatchPositions')
ORIGINS = "origins"


# ----------------------------------------------------------------------------- documents


class ReadTexts(ReadDocuments):
    """FileRange -> (content id, text) per document (:func:`documents_of`), and tagged
    ``ORIGINS``: the bundle's (id, its file's rank in ``paths``, its range's first byte,
    its number in the range, its UTF-8 bytes) records packed per bucket of ids
    (:class:`IdPacks`), for the report's counts per input file and ``--minhash_keep
    first``. ReadDocuments' other tagged outputs pass through. ``paths``: the plan's,
    sorted."""

    def __init__(self, options: ReadOptions, format_origin: str, paths: Sequence[str]):
        super().__init__(options, format_origin, split=False)
        self._ranks = {path: rank for rank, path in enumerate(paths)}

    def start_bundle(self):
        self._origins = IdPacks(columns=ORIGIN_COLUMNS)

    def process(self, part) -> Iterator:
        rank, origins = self._ranks[part.path], self._origins
        for item in super().process(part):
            if not isinstance(item, DocumentBatch):
                yield item
                continue
            _, start, index = item.origin
            for i, (doc_id, text) in enumerate(documents_of(item)):
                yield doc_id, text
                origins.add(doc_id, rank, start, index + i, utf8_bytes(text))
            if len(origins) >= memory.PACK_RECORDS:
                for element in origins.packed():
                    yield TaggedOutput(ORIGINS, element)

    def finish_bundle(self):
        from apache_beam.transforms.window import GlobalWindow
        from apache_beam.utils.windowed_value import WindowedValue

        window = GlobalWindow()
        for element in self._origins.packed():
            yield TaggedOutput(ORIGINS, WindowedValue(element, window.max_timestamp(), [window]))


# ----------------------------------------------------------------------------- the job


def make_curate_plan(config: CurateConfig) -> tuple[InputPlan, int]:
    """The input's byte ranges (as build plans them) and the number of output files."""
    plan = plan_input(config.input, config.read_options, config.input_split_mb)
    num_files = config.num_files or max(1, math.ceil(plan.total_bytes / FILE_BYTES))
    logger.info(
        "%d %s input file(s), %.1f MB, read in %d range(s); %d output file(s)",
        len(plan.files),
        plan.input_format,
        plan.total_bytes / 1e6,
        len(plan.ranges),
        num_files,
    )
    return plan, num_files


def curate_graph(
    p: beam.Pipeline,
    config: CurateConfig,
    plan: InputPlan,
    num_files: int,
    eval_ngrams: frozenset[int],
):
    """Read, curate, write each file of kept documents, then the report and manifest."""
    read, per_file, skipped = read_inputs(p, config, plan)
    group_of = functools.partial(file_of, num_files=num_files, seed=config.random_seed)
    runner = p.options.view_as(StandardOptions).runner
    curated = read.documents | "Curate" >> Curate(
        config,
        eval_ngrams,
        group_of,
        positions=read[ORIGINS],
        position_columns=ORIGIN_COLUMNS,
        spool=config.output if use_spool(config.spool, runner, dask=True) else None,
        finish_group=functools.partial(write_kept, config=config, num_files=num_files),
    )
    files = (
        curated.kept
        | "FileEntries" >> beam.Map(lambda written: written[0])
        | "CollectFiles" >> beam.combiners.ToList()
    )
    totals = report_totals(config, plan, read[ORIGINS], curated)
    return files | "WriteOutputs" >> beam.Map(
        write_outputs,
        **{name: beam.pvalue.AsDict(pcoll) for name, pcoll in totals.items()},
        input_files=beam.pvalue.AsDict(per_file),
        skipped=beam.pvalue.AsDict(skipped),
        converged=beam.pvalue.AsSingleton(curated.changed),
        config=config,
        num_files=num_files,
    )


def read_inputs(p: beam.Pipeline, config: CurateConfig, plan: InputPlan):
    """The plan's ranges read (:class:`ReadTexts`: documents, and tagged counts and
    origins), the documents and sentences per file, and the skipped records per reason."""
    reading = config.read_options._replace(input_format=plan.input_format)
    read = (
        p
        | "ListRanges" >> beam.Create(plan.ranges)
        | "ReadDocuments"
        >> beam.ParDo(ReadTexts(reading, plan.format_origin, plan.files)).with_outputs(
            COUNTS, FILE_DOCUMENTS, ORIGINS, main="documents"
        )
    )
    per_file = read[FILE_DOCUMENTS] | "SumPerFile" >> beam.CombinePerKey(add_up)
    skipped = (
        read[COUNTS]
        | "Skipped" >> beam.Filter(lambda kv: kv[0][0] == "skipped")
        | "SkipKinds" >> beam.Map(lambda kv: (kv[0][1], kv[1]))
        | "SumSkipped" >> beam.CombinePerKey(sum)
    )
    return read, per_file, skipped


def report_totals(config: CurateConfig, plan: InputPlan, origins, curated) -> dict:
    """report.json's keyed totals, each combined in bundles first (CombineInBundle): the
    documents and bytes after each step (``steps``) and per removal reason (``reasons``),
    the removed documents' seeded samples (``samples``), and the counts per input file
    (``file_totals``, the kept documents joined with every copy's origin by id)."""
    file_totals = (
        {
            "origin": origins,
            "kept": curated.kept | "KeptBytes" >> beam.FlatMap(lambda w: w[1]),
        }
        | "JoinOrigins" >> beam.CoGroupByKey()
        | "FileCounts" >> beam.FlatMap(file_counts, plan.files)
        | "SumFileCountsInBundle" >> beam.ParDo(CombineInBundle(lambda v: [add_counts(v)]))
        | "SumFileCounts" >> beam.CombinePerKey(add_counts)
    )
    steps = (
        curated.steps
        | "SumStepsInBundle" >> beam.ParDo(CombineInBundle(lambda pairs: [add_pairs(pairs)]))
        | "SumSteps" >> beam.CombinePerKey(add_pairs)
    )
    reasons = (
        curated.removed
        | "ReasonTotals" >> beam.Map(lambda removed: document_totals(removed[1], removed[0]))
        | "SumReasonsInBundle" >> beam.ParDo(CombineInBundle(lambda pairs: [add_pairs(pairs)]))
        | "SumReasons" >> beam.CombinePerKey(add_pairs)
    )
    n, key = config.samples_per_reason, sample_key(config.random_seed)
    samples = (
        curated.removed
        | "SamplesInBundle" >> beam.ParDo(CombineInBundle(smallest(n, key)))
        | "Samples" >> beam.combiners.Top.PerKey(n, key=key, reverse=True)
    )
    return {"steps": steps, "reasons": reasons, "samples": samples, "file_totals": file_totals}


def curate_job(argv: Sequence[str]) -> Job:
    """Parse, plan and prepare --output (a dry run leaves it as it is), for run_job.

    Raises:
        ValueError, OSError, ImportError: bad arguments or input, an earlier curate without
            --overwrite, the curate extra missing (named).
    """
    config, beam_args = parse_curate_args(argv)
    dry_run, beam_args = runner.split_dry_run(beam_args)
    beam_args = runner.check_beam_options(beam_args, curate_parser())
    plan, num_files = make_curate_plan(config)
    # Dask partitions of ~8 MB of input, as build's (pipeline/beam/sizing.py): Beam's
    # default, 128 ranges a partition, put 2.6 GB in one task at 1 GB on 2 GiB workers.
    # Shuffles in partitions of ~64 MB: each carries ids or each kept text once.
    beam_args += sizing.dask_partitions(
        beam_args,
        runner.runner_of(beam_args),
        len(plan.ranges),
        plan.total_bytes,
        shuffle_bytes=memory.CURATE_SHUFFLE_BYTES,
    )
    eval_ngrams = frozenset()
    if config.decontaminate:
        eval_ngrams = eval_ngram_set(config.decontaminate, config.decontaminate_ngram)
    check_packages(config)  # the curate extra's, here: exit 2, naming it
    if not dry_run:
        _prepare(config)
    return runner.Job(
        command="curate",
        output=config.output,
        beam_args=beam_args,
        dry_run=dry_run,
        doing=f"curating {list(config.input)} into {config.output}",
        graph=lambda p, _: curate_graph(p, config, plan, num_files, eval_ngrams),
        finish=functools.partial(curate_done, config),
        discard=functools.partial(remove_outputs, config.output),
        paths={"--input": config.input, "--output": [config.output]},
    )


def curate_done(config: CurateConfig, seconds: float, log_file: str | None) -> int:
    """The curate's last lines: the funnel, and warnings; 2 (nothing kept) if it read no
    document."""
    with FileSystems.open(FileSystems.join(config.output, "manifest.json")) as f:
        manifest = json.loads(f.read())
    with FileSystems.open(FileSystems.join(config.output, "report.json")) as f:
        report = json.loads(f.read())
    read = report["funnel"][0]["documents"] if report["funnel"] else 0
    if not read:  # as build refuses a build of 0 rows: nothing to keep
        remove_outputs(config.output)
        logger.error(
            "0 documents read from %s (skipped: %s): nothing to curate, so nothing is kept in "
            "%s; check --input",
            list(config.input),
            report["skipped"] or "nothing",
            config.output,
        )
        return 2
    kept = manifest["num_documents"]
    logger.info(
        "done in %.1f s: %d documents -> %d kept in %d file(s)",
        seconds,
        read,
        kept,
        len(manifest["files"]),
    )
    for line in funnel_lines(report, kept):
        logger.info("%s", line)
    for reason, removed in report["removed"].items():
        if removed["documents"] * 2 > read:
            logger.warning(
                "!! %s removed %d of %d documents (%.0f%%): more than half the corpus. Check "
                "its threshold against removed_samples.jsonl in %s before training on the rest",
                reason,
                removed["documents"],
                read,
                100 * removed["documents"] / read,
                config.output,
            )
    if report["components_changed_in_last_round"]:
        logger.warning(
            "%s", unconverged(config.cc_rounds, report["components_changed_in_last_round"])
        )
    return 0


def _prepare(config: CurateConfig) -> None:
    """Refuse an earlier curate in --output unless --overwrite; then remove it."""
    found = [
        m.path
        for r in FileSystems.match([FileSystems.join(config.output, p) for p in OUTPUT_PATTERNS])
        for m in r.metadata_list
    ]
    if found and not config.overwrite:
        raise FileExistsError(
            f"{config.output} holds an earlier curate ({len(found)} file(s)); pass "
            "--overwrite true to replace it"
        )
    remove_outputs(config.output)
    if not FileSystems.exists(config.output):
        FileSystems.mkdirs(config.output)
