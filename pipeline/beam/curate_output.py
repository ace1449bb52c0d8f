"""The files of ``python -m pipeline curate`` (pipeline/beam/curate.py): each group of kept
documents written as one Parquet file (:func:`write_kept`), then report.json,
removed_samples.jsonl, funnel.png and, last, manifest.json (:func:`write_outputs`); the
console's funnel lines; and the removal of a failed or replaced curate's files
(:func:`remove_outputs`). docs/curation.md, "Output", is the contract these files keep.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterable, Iterator, Sequence

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from pipeline.beam import memory
from pipeline.beam.curate_config import CurateConfig
from pipeline.beam.curation_steps import utf8_bytes
from pipeline.beam.inputs import CURATE_VERSION
from pipeline.beam.shard_steps import write_atomic
from pipeline.core.idpacks import IdPacks
from pipeline.core.rng import derive_seed
from pipeline.shards.shard_writer import created_by, encode_manifest

logger = logging.getLogger(__name__)

# The hidden spool files of spool.SpoolTexts and minhash_steps.BandKeys (--spool): removed once
# every file is written, or with the rest of a failed curate's output.
SPOOL_PATTERNS = (".texts-*.spool", ".bands-*.spool")
# Output files of a curate: --overwrite and a failed job remove these (manifest first).
OUTPUT_PATTERNS = (
    "manifest.json",
    "part-*-of-*.parquet",
    "report.json",
    "removed_samples.jsonl",
    "funnel.png",
    ".*.tmp",
    *SPOOL_PATTERNS,
)


def file_name(index: int, num_files: int) -> str:
    return f"part-{index:05d}-of-{num_files:05d}.parquet"


def kept_packs(group) -> Iterator[tuple[int, tuple[bytes, bytes]]]:
    """(file index, [(id, text) kept]) -> :class:`IdPacks` of (id, its UTF-8 bytes)."""
    packs = IdPacks(columns=1)
    for doc_id, text in group[1]:
        packs.add(doc_id, utf8_bytes(text))
    yield from packs.packed()


# ----------------------------------------------------------------------------- output


def file_of(doc_id: str, num_files: int, seed: int) -> int:
    return derive_seed("curated_file", seed, doc_id) % num_files


def write_file(element, config: CurateConfig, num_files: int) -> dict:
    """(file index, [(id, text)] in id order: a group of curation_steps.KeepDistinct) ->
    the file's entry, after writing it: columns ``id`` and ``text``, atomically (the
    Parquet bytes handed over without a copy)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    index, docs = element
    table = pa.table({"id": [d for d, _ in docs], "text": [t for _, t in docs]})
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd", write_statistics=False)
    del table
    name = file_name(index, num_files)
    size, sha256 = write_atomic(FileSystems.join(config.output, name), sink.getbuffer())
    return {"name": name, "rows": len(docs), "bytes": size, "sha256": sha256}


def write_kept(group, config: CurateConfig, num_files: int) -> Iterator[tuple[dict, list]]:
    """A file's kept documents (curation_steps.KeepDistinct's ``finish``) -> (its entry,
    after :func:`write_file` wrote it; :func:`kept_packs` of its documents)."""
    yield write_file(group, config, num_files), list(kept_packs(group))


def add_pairs(pairs: Iterable[tuple[int, int]]) -> tuple[int, int]:
    docs = nbytes = 0
    for a, b in pairs:
        docs, nbytes = docs + a, nbytes + b
    return docs, nbytes


def sample_key(seed: int):
    return lambda item: derive_seed("removed_sample", seed, item[0])


def smallest(n: int, key):
    """``values -> the n smallest by key``: :class:`CombineInBundle`'s fold for
    ``Top.PerKey(n, key=key, reverse=True)``, whose result over the folded values is the same."""
    return lambda values: sorted(values, key=key)[:n]


class CombineInBundle(beam.DoFn):
    """(key, value) -> the same keys with each bundle's values folded (``fold``: a list of
    values -> a shorter list whose combine gives the same result), emitted at the bundle's
    end: combiner lifting by hand, before the CombinePerKey that follows.

    Beam's portable runners lift combiners themselves; Beam's DaskRunner does not: it
    groups every value of a key in one task. Removed documents' samples keyed by reason
    put the texts of every document a rule removed into one worker (at 1 GB, 840 MB of
    ``gopher_quality.alpha_words`` on a 2 GiB worker); folded here, a key's group holds a
    few values per bundle.
    """

    def __init__(self, fold):
        super().__init__()
        self._fold = fold

    def start_bundle(self):
        self._values: dict = {}

    def process(self, element):
        key, value = element
        values = self._values.setdefault(key, [])
        values.append(value)
        if len(values) >= memory.FOLD_AT:
            self._values[key] = self._fold(values)

    def finish_bundle(self):
        from apache_beam.transforms.window import GlobalWindow
        from apache_beam.utils.windowed_value import WindowedValue

        window = GlobalWindow()
        for key, values in self._values.items():
            for value in self._fold(values):
                yield WindowedValue((key, value), window.max_timestamp(), [window])
        self._values = {}


def write_outputs(
    files: list[dict],
    steps: dict,
    reasons: dict,
    samples: dict,
    input_files: dict,
    file_totals: dict,
    skipped: dict,
    converged: int,
    config: CurateConfig,
    num_files: int,
) -> dict:
    """Remove the spool files (every file is written, so they are read); write the empty
    files no document landed in, report.json, the samples, the funnel plot, and
    manifest.json last; returns the manifest."""
    remove_outputs(config.output, patterns=SPOOL_PATTERNS)
    written = {entry["name"] for entry in files}
    for index in range(num_files):
        if file_name(index, num_files) not in written:
            files = [*files, write_file((index, []), config, num_files)]
    files = sorted(files, key=lambda entry: entry["name"])
    report = make_report(steps, reasons, input_files, file_totals, skipped, converged)
    join = FileSystems.join
    write_atomic(join(config.output, "report.json"), encode_manifest(report))
    lines = [
        json.dumps({"reason": reason, "id": doc_id, "text": text[:2000]}, ensure_ascii=False)
        for reason in sorted(samples)
        for doc_id, text in samples[reason]
    ]
    write_atomic(join(config.output, "removed_samples.jsonl"), ("\n".join(lines) + "\n").encode())
    plot = funnel_png(report["funnel"], report["removed"])
    if plot is not None:
        write_atomic(join(config.output, "funnel.png"), plot)
    manifest = {
        "curate_version": CURATE_VERSION,
        "created_by": created_by(),
        "kind": "curated_documents",
        "columns": {"id": "string", "text": "string"},
        "num_documents": sum(entry["rows"] for entry in files),
        "files": files,
        "params": config.params(),
        "report": "report.json",
        "removed": {reason: n for reason, (n, _) in sorted(reasons.items())},
    }
    write_atomic(join(config.output, "manifest.json"), encode_manifest(manifest))
    return manifest


def make_report(
    steps: dict, reasons: dict, input_files: dict, file_totals: dict, skipped: dict, converged: int
) -> dict:
    """report.json (docs/curation.md, "Output"): the funnel in step order, the documents
    and bytes each reason removed, the counts per input file, the skipped records."""
    order = ["read", "filters", "exact_dedup", "near_dedup"]
    return {
        "funnel": [
            {"step": step, "documents": steps[step][0], "bytes": steps[step][1]}
            for step in order
            if step in steps
        ],
        "removed": {
            reason: {"documents": n, "bytes": b} for reason, (n, b) in sorted(reasons.items())
        },
        "input_files": {
            path: dict(zip(FILE_KEYS, file_totals.get(path, (0, 0, 0, 0)), strict=True))
            for path in sorted(input_files)
        },
        "skipped": dict(sorted(skipped.items())),
        "components_changed_in_last_round": converged,
    }


FILE_KEYS = ("documents_in", "bytes_in", "documents_out", "bytes_out")


def funnel_lines(report: dict, kept: int) -> list[str]:
    """The console's funnel: what each rule removed, as counts and shares of what was read.

    Example: 6,625 read, gopher_quality 6,000 and exact_dup 220 removed, 405 kept ->
    ``["  removed by gopher_quality:   6000 (90.6%)", "  removed by exact_dup:    220 (3.3%)",
    "  kept:    405 (6.1%)"]``.
    """
    read = max(report["funnel"][0]["documents"], 1) if report["funnel"] else 1
    lines = [
        f"  removed by {reason}: {r['documents']:6d} ({100 * r['documents'] / read:.1f}%)"
        for reason, r in sorted(report["removed"].items(), key=lambda item: -item[1]["documents"])
    ]
    return [*lines, f"  kept: {kept:6d} ({100 * kept / read:.1f}%)"]


def funnel_png(funnel: list[dict], removed: dict) -> bytes | None:
    """Documents kept after each step, and removed by each rule, as a PNG with the numbers on
    the bars (None without matplotlib)."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    read = max(funnel[0]["documents"], 1) if funnel else 1
    bars = left.bar([row["step"] for row in funnel], [row["documents"] for row in funnel])
    left.bar_label(bars, labels=[f"{row['documents']:,}" for row in funnel], fontsize=8)
    left.set_title("documents kept after each step")
    rules = sorted(removed, key=lambda reason: -removed[reason]["documents"])
    counts = [removed[reason]["documents"] for reason in rules]
    bars = right.bar(rules, counts, color="C3")
    right.bar_label(bars, labels=[f"{n:,} ({100 * n / read:.1f}%)" for n in counts], fontsize=8)
    right.set_title("documents removed by each rule (share of those read)")
    for ax in (left, right):
        ax.tick_params(axis="x", rotation=20)
        ax.margins(y=0.15)  # room for the labels
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    return buffer.getvalue()


def remove_outputs(output: str, patterns: Sequence[str] = OUTPUT_PATTERNS) -> None:
    """Delete what a curate writes in ``output`` (manifest first), or the files of
    ``patterns`` there."""
    for pattern in patterns:
        found = [
            m.path
            for r in FileSystems.match([FileSystems.join(output, pattern)])
            for m in r.metadata_list
        ]
        if found:
            FileSystems.delete(found)
