"""Export speed (source Arrow MB/s) against plain reading of the same shards, in one run.

    python bench/export_speed.py                        # builds shards from Python's docs
    python bench/export_speed.py --data runs/quickstart/shards --rounds 7
    python bench/export_speed.py --keep /tmp/export-bench   # reuse the built shards next time
    python bench/export_speed.py --objective mlm            # MLM rows: mds and megatron
    .venv-readers/bin/python bench/export_speed.py          # with mds (scripts/test.sh makes it)

Shards: ``--data``, or ``python -m pipeline build`` on the standard library's docstrings and
reference (``pipeline.cli.corpus``, ``--mb`` of text) with the main job's settings
(scripts/quickstart.sh: vocab 8000, seq 128, P 20), so ids, lengths and masks are real
ones: deflate's speed depends on them, synthetic uniform ids would understate it.

Each round runs, in turn on the same page-cached shards (so machine noise hits all alike):

- ``read``, the peer: what a trainer's map-style dataset does, every row's columns into
  numpy through the reference reader (``pipeline.shards.shard_format.open_shard`` + ``iter_rows``:
  memory-mapped, each row's four lists and its label as int64 arrays);
- ``hdf5``, ``tfrecord`` and ``mds``: ``pipeline.beam.export.export_shard`` per shard,
  exactly the job's per-shard work (verify size and sha256 against the manifest, pad, encode,
  write the files atomically into a temp directory), without Beam's fixed start-up cost.
  The formats that take the shards' row kind (hdf5 and tfrecord: NSP rows only) and whose
  package is installed (mds: mosaicml-streaming, in .venv-readers); the others are named as
  skipped.

``megatron`` is a job of documents, not rows (pipeline/beam/export_megatron.py): it re-reads
and tokenizes the corpus. It is timed once per round as the whole job, Beam's start-up
included (``python -m pipeline export --to megatron`` in-process, DirectRunner), against its
own peer, ``tokenize``: the corpus read and tokenized with the same pure functions
(pipeline/core/sources.py, the build's tokenizer) and nothing written. Its MB/s are of
corpus text; with ``--data`` it needs the corpus the manifest names.

The median round gives MB/s; ``ratio`` is export over read MB/s (target >= 0.3), and
``cpu_ratio`` the same from process CPU time, which other jobs sharing the machine disturb
less. A breakdown pass then times each format's parts (padding, deflate, protobuf, framing)
to say where the time goes. One JSON line per format, then the breakdown (seconds).
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.beam import export as job  # noqa: E402
from pipeline.cli.corpus import write_corpus  # noqa: E402
from pipeline.cli.main import main as pipeline_main  # noqa: E402
from pipeline.core.sources import read_documents  # noqa: E402
from pipeline.core.vocab import build_tokenizer  # noqa: E402
from pipeline.shards import export_formats as formats  # noqa: E402
from pipeline.shards import shard_format  # noqa: E402


def build_shards(work: Path, mb: float, objective: str) -> Path:
    """Real shards at the main job's settings, built once into ``work/shards-OBJECTIVE``."""
    out = work / f"shards-{objective}"
    if (out / shard_format.MANIFEST_NAME).exists():
        return out
    write_corpus(work / "corpus", max_bytes=int(mb * 1e6), files=4, repeat=True)
    cmd = [
        sys.executable,
        "-m",
        "pipeline",
        "build",
        "--input",
        str(work / "corpus" / "*.txt"),
        "--output",
        str(out),
        "--vocab_size",
        "8000",
        *(["--dupe_factor", "5"] if objective == "nsp" else ["--objective", "mlm"]),
        "--max_seq_length",
        "128",
        "--num_shards",
        "4",
        "--direct_num_workers=2",
        "--direct_running_mode=multi_processing",
    ]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    return out


def read_all(data: Path, manifest: dict) -> int:
    """The peer: every row's columns as numpy through the reference reader; returns rows."""
    rows = 0
    for entry in manifest["shards"]:
        for _row in shard_format.iter_rows(shard_format.open_shard(data / entry["name"])):
            rows += 1
    return rows


def export_all(plan: job.ExportPlan, encoder) -> int:
    """The job's per-shard work for every shard; returns rows."""
    shards = plan.manifest["shards"]
    return sum(f["rows"] for e in shards for f in job.export_shard(e, plan, encoder))


def row_formats(manifest: dict) -> tuple[list[str], dict[str, str]]:
    """The row formats to time, and {format: why skipped} for the others."""
    kind, skipped, run = shard_format.manifest_kind(manifest), {}, []
    for fmt in (formats.HDF5, formats.TFRECORD, formats.MDS):
        if fmt in formats.NSP_FORMATS and kind != "nsp":
            skipped[fmt] = f"takes NSP rows, and these are {kind}"
        elif fmt == formats.MDS and importlib.util.find_spec("streaming") is None:
            skipped[fmt] = "needs mosaicml-streaming: run this in .venv-readers (scripts/test.sh)"
        else:
            run.append(fmt)
    return run, skipped


def corpus_files(manifest: dict) -> list[str]:
    return sorted(p for pattern in manifest["params"]["input"] for p in glob.glob(pattern))


def tokenize_all(manifest: dict, vocab: list[str]) -> int:
    """Megatron's peer: the corpus read and tokenized, nothing written; returns documents."""
    tokenizer = build_tokenizer(vocab, manifest["vocab"]["do_lower_case"], specials_in_text=False)
    documents = 0
    for path in corpus_files(manifest):
        with open(path, "rb") as f:
            items = read_documents(f, input_format="txt", text_field="text", path=path)
            for sentences, _ in items:
                ids = tokenizer.encode_batch_fast(sentences, add_special_tokens=False)
                documents += any(e.ids for e in ids)
    return documents


def megatron_job(data: Path, out: Path) -> int:
    """The whole --to megatron job, in-process; returns documents written."""
    argv = ["export", str(data), "--to", "megatron", "--output", str(out), "--overwrite"]
    assert pipeline_main(argv) == 0
    manifest = json.loads((out / shard_format.MANIFEST_NAME).read_text())
    return manifest["megatron"]["documents"]


def plan_for(data: Path, fmt: str, out: Path) -> tuple[job.ExportPlan, object]:
    config = job.ExportConfig(source=str(data), output=str(out), to=fmt, overwrite=True)
    plan = job.make_plan(config)
    job.prepare_output(config)
    encoder = None
    if fmt == formats.TFRECORD:
        encoder = formats.ExampleEncoder(
            plan.names, plan.max_seq_length, plan.max_predictions_per_seq
        )
    return plan, encoder


def breakdown(data: Path, manifest: dict, plans: dict) -> dict:
    """Seconds of each format's parts over all shards (one pass each, after the rounds)."""
    if formats.TFRECORD not in plans:  # MLM rows: nothing padded to break down
        return {}
    tables = [shard_format.open_shard(data / e["name"]) for e in manifest["shards"]]
    seq, pred = (
        next(iter(plans.values()))[0].max_seq_length,
        manifest["params"]["max_predictions_per_seq"],
    )

    def timed(fn) -> float:
        start = time.perf_counter()
        fn()
        return round(time.perf_counter() - start, 3)

    def pad():
        for t in tables:
            for i, batch in enumerate(t.to_batches()):
                formats.padded_batch(batch, seq, pred, i)

    def hdf5(options):
        saved = formats.HDF5_OPTIONS
        formats.HDF5_OPTIONS = options
        try:
            for t in tables:
                formats.hdf5_bytes(t, seq, pred)
        finally:
            formats.HDF5_OPTIONS = saved

    encoder = plans[formats.TFRECORD][1]

    def examples():
        for t in tables:
            for i, batch in enumerate(t.to_batches()):
                for _ in encoder.encode(formats.padded_batch(batch, seq, pred, i)):
                    pass

    classes = formats.example_classes()

    def fresh_messages():  # the plain way, for comparison: a new Example per row
        example, features, feature = classes["Example"], classes["Features"], classes["Feature"]
        ints, floats = classes["Int64List"], classes["FloatList"]
        for t in tables:
            for i, batch in enumerate(t.to_batches()):
                padded = formats.padded_batch(batch, seq, pred, i)
                lists = {k: v.tolist() for k, v in padded.items()}
                for r, count in enumerate(lists["num_predictions"]):
                    values = {
                        k: feature(int64_list=ints(value=lists[k][r]))
                        for k in (
                            "input_ids",
                            "input_mask",
                            "segment_ids",
                            "masked_lm_positions",
                            "masked_lm_ids",
                        )
                    }
                    values["next_sentence_labels"] = feature(
                        int64_list=ints(value=[lists["next_sentence_labels"][r]])
                    )
                    values["masked_lm_weights"] = feature(
                        float_list=floats(value=[1.0] * count + [0.0] * (pred - count))
                    )
                    example(features=features(feature=values)).SerializeToString()

    def tfrecord():
        for t in tables:
            for _ in formats.tfrecord_chunks(t, encoder, seq, pred):
                pass

    verify = timed(
        lambda: [shard_format.verify_shard(data / e["name"], e) for e in manifest["shards"]]
    )
    level4 = {"compression": "gzip", "compression_opts": 4}  # NVIDIA's own files
    return {
        "verify_s": verify,
        "pad_s": timed(pad),
        "hdf5_uncompressed_s": timed(lambda: hdf5({})),
        "hdf5_gzip1_shuffle_s": timed(lambda: hdf5(formats.HDF5_OPTIONS)),
        "hdf5_gzip4_s": timed(lambda: hdf5(level4)),
        "tfrecord_pad_and_protobuf_s": timed(examples),
        "tfrecord_fresh_message_per_row_s": timed(fresh_messages),
        "tfrecord_with_framing_s": timed(tfrecord),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--data", type=Path, help="a shard directory (default: build one)")
    p.add_argument("--mb", type=float, default=2.0, help="corpus MB to build from (default: 2)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default: 5)")
    p.add_argument("--keep", type=Path, help="build into / reuse this directory")
    p.add_argument(
        "--objective", choices=("nsp", "mlm"), default="nsp", help="the rows built (default nsp)"
    )
    args = p.parse_args(argv)

    work = args.keep or Path(tempfile.mkdtemp(prefix="export-bench-"))
    data = args.data or build_shards(work, args.mb, args.objective)
    manifest = shard_format.read_manifest(data)
    source_mb = sum(e["bytes"] for e in manifest["shards"]) / 1e6
    corpus_mb = sum(os.path.getsize(p) for p in corpus_files(manifest)) / 1e6
    print(
        f"shards: {data}, {manifest['num_rows']} rows, {source_mb:.1f} MB of Arrow "
        f"({shard_format.manifest_kind(manifest)} rows), corpus {corpus_mb:.1f} MB; "
        f"cpus: {os.cpu_count()}, load: {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    fmts, skipped = row_formats(manifest)
    for fmt, why in skipped.items():
        print(json.dumps({"format": fmt, "skipped": why}), flush=True)
    out = Path(tempfile.mkdtemp(prefix="export-bench-out-"))
    try:
        plans = {fmt: plan_for(data, fmt, out / fmt) for fmt in fmts}
        runs = {"read": lambda: read_all(data, manifest)}
        for fmt, (plan, encoder) in plans.items():
            runs[fmt] = lambda plan=plan, encoder=encoder: export_all(plan, encoder)
        documents = manifest["stats"]["documents"]
        vocab = (data / shard_format.VOCAB_NAME).read_text(encoding="utf-8").split("\n")[:-1]
        corpus_runs = {
            "tokenize": lambda: tokenize_all(manifest, vocab),
            formats.MEGATRON: lambda: megatron_job(data, out / formats.MEGATRON),
        }
        wall: dict[str, list[float]] = {name: [] for name in [*runs, *corpus_runs]}
        cpu: dict[str, list[float]] = {name: [] for name in wall}
        for fn in runs.values():  # warm-up: page cache, imports, message classes
            assert fn() == manifest["num_rows"]
        for fn in corpus_runs.values():
            assert fn() == documents
        runs |= corpus_runs
        for _ in range(args.rounds):
            for name, fn in runs.items():
                start, start_cpu = time.perf_counter(), time.process_time()
                fn()
                wall[name].append(time.perf_counter() - start)
                cpu[name].append(time.process_time() - start_cpu)
        wall_s = {name: statistics.median(t) for name, t in wall.items()}
        cpu_s = {name: statistics.median(t) for name, t in cpu.items()}
        rows = manifest["num_rows"]
        print(
            json.dumps(
                {
                    "format": formats.MEGATRON,
                    "export_corpus_mb_s": round(corpus_mb / wall_s[formats.MEGATRON], 2),
                    "tokenize_corpus_mb_s": round(corpus_mb / wall_s["tokenize"], 2),
                    "ratio": round(wall_s["tokenize"] / wall_s[formats.MEGATRON], 3),
                    "cpu_ratio": round(cpu_s["tokenize"] / cpu_s[formats.MEGATRON], 3),
                    "documents": documents,
                    "rounds": args.rounds,
                    "corpus_mb": round(corpus_mb, 2),
                }
            ),
            flush=True,
        )
        for fmt in fmts:
            print(
                json.dumps(
                    {
                        "format": fmt,
                        "export_mb_s": round(source_mb / wall_s[fmt], 2),
                        "read_mb_s": round(source_mb / wall_s["read"], 2),
                        "ratio": round(wall_s["read"] / wall_s[fmt], 3),
                        # process CPU time: what other jobs on the machine disturb least
                        "cpu_ratio": round(cpu_s["read"] / cpu_s[fmt], 3),
                        "us_per_row": round(1e6 * wall_s[fmt] / rows, 2),
                        "read_us_per_row": round(1e6 * wall_s["read"] / rows, 2),
                        "rounds": args.rounds,
                        "rows": rows,
                        "source_mb": round(source_mb, 2),
                    }
                ),
                flush=True,
            )
        print(json.dumps({"breakdown": breakdown(data, manifest, plans)}), flush=True)
    finally:
        shutil.rmtree(out, ignore_errors=True)
        if args.keep is None and args.data is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
