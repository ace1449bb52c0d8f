"""Throughput of the whole pipeline job against the tokenizer floor, on any corpus.

    python bench/pipeline_speed.py                       # 8 MB of English prose, 1 and 2 workers
    python bench/pipeline_speed.py --mb 8 64 --workers 2 --profile
    python bench/pipeline_speed.py --input 'corpus/*.jsonl' --vocab_file vocab.txt
    python bench/pipeline_speed.py --chinese --mb 8 --workers 2 \
        --flags "--do_whole_word_mask true --wwm_segmenter jieba"   # vs. the same without it
    python bench/pipeline_speed.py --one-file --mb 64 --workers 2 --repeats 3

The corpus is ``--input`` (any format the build reads), or the Python standard
library's docstrings and language reference (``pipeline.cli.corpus``, English prose)
repeated to each ``--mb`` size in 8 files; ``--chinese``: the sentences of
tests/data/chinese/sample.jsonl shuffled into jsonl documents (seeded) to each size.
``--flags`` adds build options to every job (and to ``--profile``). Without ``--vocab_file`` a vocab is learned
once beforehand from the first corpus (not timed). Each job runs ``python -m pipeline
build`` on the DirectRunner (multi-processing, N workers) with ``--vocab_file`` and
prints input MB/s, wall clock included. The floor is the ``tokenizers`` library's
batch encoding (on every core) of the sentences the job tokenizes, with the same vocab,
measured in the same run. Targets on prose, 2 workers: >= 0.35 x the floor at 8 MB and
>= 0.5 x at 64 MB; and 2 workers >= 1.7 x faster than 1.

The tokenizer's threads per worker are automatic (``--tokenizer_threads 0``): the
cores divided by the workers, so the 1-worker job tokenizes on every core and the
2-worker job on one per worker. The 1-worker job also runs with one tokenizer thread
("1w-1t"), which isolates how the Beam job itself scales. ``fixed`` is a job on 10 kB
of prose (Beam's imports, runner and worker start-up, stopping): what every job pays
whatever its size.

``--one-file`` instead times, for each ``--mb``, the prose corpus in 16 files against the
same documents in one file, on the largest ``--workers``, alternating the two
``--repeats`` times: a file is read in byte ranges, so one file should be within 1.1x of
16 files' time. It prints each pair's ratio and whether the two builds wrote the same
shards (they should: a document's id is its content).

``--profile`` then runs the build's steps on the first corpus as plain function calls
in this process, on one core, without Beam (pipeline/beam/document_steps.py, instance_steps.py,
shard_steps.py: read, tokenize, bucket, NSP planning, masking, grouping rows by shard,
writing), and sets their seconds against the 1w-1t job's wall clock: the rest is
Beam's (fixed cost, moving and shuffling the elements between steps).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import filecmp
import glob
import json
import os
import random
import shlex
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from apache_beam.io.filesystems import FileSystems  # noqa: E402
from apache_beam.pvalue import TaggedOutput  # noqa: E402

import pipeline.beam.instance_steps  # noqa: E402
from pipeline.beam.build import make_plan, prepare_output  # noqa: E402
from pipeline.beam.config import parse_build_args  # noqa: E402
from pipeline.beam.document_steps import (  # noqa: E402
    DocumentBatch,
    ReadDocuments,
    Tokenize,
    TokenizedBatch,
)
from pipeline.beam.inputs import resolve_input_format  # noqa: E402
from pipeline.beam.instance_steps import MakeInstances, split_into_buckets  # noqa: E402
from pipeline.beam.shard_steps import JoinParts, WriteShard, parts_per_shard  # noqa: E402
from pipeline.cli.corpus import write_corpus  # noqa: E402
from pipeline.core.sources import read_documents  # noqa: E402
from pipeline.core.vocab import build_tokenizer, read_vocab  # noqa: E402


def build(inputs: str, out: Path, extra: list[str], dupe: int) -> float:
    cmd = [
        sys.executable,
        "-m",
        "pipeline",
        "build",
        "--input",
        inputs,
        "--output",
        str(out),
        "--dupe_factor",
        str(dupe),
        "--overwrite",
        *extra,
    ]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    elapsed = time.perf_counter() - start
    if done.returncode:
        sys.exit(f"pipeline failed:\n{done.stderr[-4000:]}")
    return elapsed


def job_sentences(files: list[str]) -> list[str]:
    """Every sentence the build tokenizes, read as the build reads the files."""
    input_format, _ = resolve_input_format("auto", files)
    sentences = []
    for path in files:
        with FileSystems.open(path) as f:
            for document, reason in read_documents(
                f, input_format=input_format, text_field="text", path=path
            ):
                if reason is None:
                    sentences.extend(document)
    return sentences


def tokenizer_floor(sentences: list[str], vocab: list[str], repeats: int = 3) -> float:
    """Seconds for the tokenizers library to batch-encode ``sentences`` on every core
    (best of ``repeats``)."""
    tokenizer = build_tokenizer(vocab, do_lower_case=True)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        tokenizer.encode_batch(sentences, add_special_tokens=False)
        best = min(best, time.perf_counter() - start)
    return best


def tiny_corpus(directory: Path) -> str:
    """About 10 kB of prose (txt), for ``fixed``: what a job costs whatever its input."""
    write_corpus(directory, max_bytes=10_000, sources=["docstrings"])
    return str(directory / "*.txt")


@contextlib.contextmanager
def timed(seconds: dict[str, float], step: str):
    start = time.perf_counter()
    yield
    seconds[step] = seconds.get(step, 0.0) + time.perf_counter() - start


def timing(seconds: dict[str, float], step: str, fn):
    """``fn`` that adds its own time to ``seconds[step]``."""

    def wrapper(*args, **kwargs):
        with timed(seconds, step):
            return fn(*args, **kwargs)

    return wrapper


def chinese_corpus(directory: Path, max_bytes: int, files: int = 8) -> None:
    """jsonl documents of 2-12 sentences drawn (seeded) from the shipped Chinese sample."""
    from pipeline.core.text import split_sentences

    sample = ROOT / "tests" / "data" / "chinese" / "sample.jsonl"
    lines = sample.read_text(encoding="utf-8").splitlines()
    sentences = [s for line in lines for s in split_sentences(json.loads(line)["text"])]
    rng, written = random.Random(0), 0
    directory.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        outs = [
            stack.enter_context(open(directory / f"part-{i}.jsonl", "w", encoding="utf-8"))
            for i in range(files)
        ]
        while written < max_bytes:
            text = "".join(rng.choices(sentences, k=rng.randint(2, 12)))
            line = json.dumps({"text": text}, ensure_ascii=False) + "\n"
            outs[rng.randrange(files)].write(line)
            written += len(line.encode("utf-8"))


def profile_steps(
    inputs: str, vocab_file: str, dupe: int, out: Path, flags: list[str]
) -> dict[str, float]:
    """The build's steps as plain calls on one core, without Beam: seconds per step."""
    config, _ = parse_build_args(
        [
            "--input",
            inputs,
            "--output",
            str(out),
            "--vocab_file",
            vocab_file,
            "--dupe_factor",
            str(dupe),
            "--overwrite",
            "--tokenizer_threads",
            "1",
            *flags,
        ]
    )
    plan = make_plan(config)
    config = dataclasses.replace(config, input_format=plan.input_format)
    prepare_output(config)
    vocab, s = plan.vocab, {}
    with timed(s, "read"):
        reader = ReadDocuments(config.read_options, plan.format_origin)
        batches = [
            b for part in plan.ranges for b in reader.process(part) if isinstance(b, DocumentBatch)
        ]
    tokenize = Tokenize(config.do_lower_case, threads=1, segmenter=config.wwm_segmenter)
    environ = dict(os.environ)
    tokenize.setup()  # sets TOKENIZERS_PARALLELISM for this process: restored below
    with timed(s, "tokenize"):
        tokenized = [
            t for b in batches for t in tokenize.process(b, vocab) if isinstance(t, TokenizedBatch)
        ]
    os.environ.clear()
    os.environ.update(environ)
    with timed(s, "buckets"):
        num_docs = sum(len(t.doc_ids) for t in tokenized)
        buckets = defaultdict(list)
        for t in tokenized:
            for bucket, part in split_into_buckets(t, num_docs, config):
                buckets[bucket].append(part)
    make = MakeInstances(config, plan.num_shards)
    make._masked_block = timing(s, "masking", make._masked_block)
    real_plan = pipeline.beam.instance_steps.plan_document
    pipeline.beam.instance_steps.plan_document = timing(s, "nsp plan", real_plan)
    try:
        with timed(s, "instances"):
            groups = defaultdict(list)
            for bucket in sorted(buckets):
                for made in make.process((bucket, buckets[bucket]), vocab, num_docs):
                    if not isinstance(made, TaggedOutput):  # not a count
                        groups[made[0]].append(made[1])
    finally:
        pipeline.beam.instance_steps.plan_document = real_plan
    # MakeInstances beyond planning and masking: seeds, the bucket's concat and sort,
    # the rows' shard keys and grouping, their bytes.
    s["seeds, keys, row bytes"] = s.pop("instances") - s.get("nsp plan", 0) - s.get("masking", 0)
    with timed(s, "write"):
        writer, parts = WriteShard(config, plan.num_shards), defaultdict(list)
        for group in sorted(groups):
            for result in writer.process((group, groups[group]), vocab):
                if parts_per_shard(plan.num_shards) > 1:
                    parts[result[0]].append(result[1])
        joiner = JoinParts(config, plan.num_shards)
        for shard in sorted(parts):
            list(joiner.process((shard, parts[shard]), vocab))
    return s


def corpora(args, work: Path) -> list[tuple[float, str]]:
    """(MB, glob) of each corpus to run."""
    if args.input:
        files = sorted(glob.glob(args.input))
        if not files:
            sys.exit(f"--input {args.input!r} matched no file")
        return [(sum(os.path.getsize(f) for f in files) / 1e6, args.input)]
    found = []
    for mb in args.mb:
        if args.chinese:
            directory = work / f"corpus-zh-{mb:g}mb"
            if not directory.exists():
                chinese_corpus(directory, int(mb * 1e6))
            found.append((mb, str(directory / "*.jsonl")))
            continue
        directory = work / f"corpus-{mb:g}mb"
        if not directory.exists():
            write_corpus(
                directory,
                max_bytes=int(mb * 1e6),
                files=8,
                repeat=True,
                sources=["docstrings", "reference"],
            )
        found.append((mb, str(directory / "*.txt")))
    return found


def sixteen_files(work: Path, mb: float) -> Path:
    """The prose corpus of ``mb`` MB in 16 files (written once)."""
    many = work / f"corpus-{mb:g}mb-16"
    if not many.exists():
        write_corpus(
            many,
            max_bytes=int(mb * 1e6),
            files=16,
            repeat=True,
            sources=["docstrings", "reference"],
        )
    return many


def one_file_runs(args, work: Path, given: list[str]) -> list[dict]:
    """``--one-file``: 16 files against the same documents in one, alternated."""
    workers = max(args.workers)
    runner = [f"--direct_num_workers={workers}", "--direct_running_mode=multi_processing"]
    results = []
    for mb in args.mb:
        many = sixteen_files(work, mb)
        one = work / f"corpus-{mb:g}mb-1"
        if not one.exists():
            one.mkdir()
            with open(one / "corpus.txt", "wb") as out:
                for path in sorted(many.glob("*.txt")):
                    out.write(path.read_bytes().rstrip(b"\n") + b"\n\n")
        ratios, times = [], {"16 files": [], "1 file": []}
        for _ in range(args.repeats):
            for name, inputs in (("16 files", many / "*.txt"), ("1 file", one / "*.txt")):
                out = work / f"shards-{mb:g}-{name.replace(' ', '')}"
                times[name].append(build(str(inputs), out, [*given, *runner], args.dupe_factor))
            ratios.append(times["1 file"][-1] / times["16 files"][-1])
            print(
                f"{mb:g} MB, {workers} workers: 16 files {times['16 files'][-1]:.1f} s, "
                f"1 file {times['1 file'][-1]:.1f} s: 1 file / 16 files = {ratios[-1]:.2f}",
                flush=True,
            )
        a, b = work / f"shards-{mb:g}-16files", work / f"shards-{mb:g}-1file"
        same = all(filecmp.cmp(x, b / x.name, shallow=False) for x in sorted(a.glob("shard-*")))
        print(
            f"{mb:g} MB: 1 file / 16 files = {min(ratios):.2f}-{max(ratios):.2f} "
            f"(target <= 1.1); same shards: {same}",
            flush=True,
        )
        results.append(
            {
                "corpus_mb": mb,
                "workers": workers,
                "ratios": [round(r, 3) for r in ratios],
                "seconds": {k: [round(t, 2) for t in v] for k, v in times.items()},
                "same_shards": same,
            }
        )
    return results


def unmasked_mlm(flags: list[str]) -> bool:
    """Whether build ``flags`` make MLM rows without static masks (which refuse a dupe
    factor other than 1)."""

    def value(name: str) -> str | None:
        for i, flag in enumerate(flags):
            if flag == name and i + 1 < len(flags):
                return flags[i + 1]
            if flag.startswith(name + "="):
                return flag.split("=", 1)[1]
        return None

    return value("--objective") == "mlm" and value("--static_masks") != "true"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--mb", type=float, nargs="+", default=[8.0], help="prose corpus sizes in MB")
    p.add_argument("--input", default=None, help="a corpus (glob) instead of --mb of prose")
    p.add_argument("--vocab_file", default=None, help="default: learned from the first corpus")
    p.add_argument("--dupe_factor", type=int, default=5, help="dupe factor (default: 5)")
    p.add_argument(
        "--workers", type=int, nargs="+", default=[1, 2], help="worker counts (default: 1 2)"
    )
    p.add_argument("--vocab_size", type=int, default=30522, help="learned vocab size")
    p.add_argument("--profile", action="store_true", help="time each step without Beam")
    p.add_argument("--keep", default=None, help="keep corpora and outputs here (reused)")
    p.add_argument("--chinese", action="store_true", help="--mb of Chinese jsonl, not prose")
    p.add_argument("--one-file", action="store_true", help="16 files against the same in one")
    p.add_argument("--repeats", type=int, default=3, help="--one-file: alternated pairs")
    p.add_argument(
        "--flags",
        default="",
        help='build options for every job, e.g. "--do_whole_word_mask true --wwm_segmenter jieba"',
    )
    args = p.parse_args(argv)
    flags = shlex.split(args.flags)
    if unmasked_mlm(flags):  # a dupe factor shapes static masks only: these rows have none
        args.dupe_factor = 1

    work = Path(args.keep or tempfile.mkdtemp(prefix="pipeline-bench-"))
    if args.one_file:  # the vocab (if learned) from the first corpus
        runs = [(args.mb[0], str(sixteen_files(work, args.mb[0]) / "*.txt"))]
    else:
        runs = corpora(args, work)
    print(f"cpus: {os.cpu_count()}; load average at start: {os.getloadavg()}", flush=True)
    vocab_file = args.vocab_file
    if vocab_file is None:
        vocab_dir = work / "vocab-run"
        learn = ["--vocab_size", str(args.vocab_size), "--num_shards", "1"]
        learn_s = build(runs[0][1], vocab_dir, learn, 1)
        vocab_file = str(vocab_dir / "vocab.txt")
        print(f"vocab: learned in a dupe-1 job of {learn_s:.1f} s (not timed below)")
    vocab = read_vocab(vocab_file)
    given = ["--vocab_file", vocab_file, *flags]
    two = ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]
    if args.one_file:
        print(json.dumps(one_file_runs(args, work, given)))
        return 0
    fixed_s = build(
        tiny_corpus(work / "tiny"), work / "shards-tiny", [*given, *two], args.dupe_factor
    )
    print(f"fixed: a job of 10 kB, 2 workers: {fixed_s:.1f} s", flush=True)
    results = []
    for mb, inputs in runs:
        sentences = job_sentences(sorted(glob.glob(inputs)))
        floor = mb / tokenizer_floor(sentences, vocab)
        result = {
            "corpus_mb": round(mb, 3),
            "dupe_factor": args.dupe_factor,
            "flags": args.flags,
            "floor_mb_s": round(floor, 3),
            "fixed_s": round(fixed_s, 2),
        }
        print(f"{mb:.1f} MB: floor (tokenizers encode_batch) {floor:.2f} MB/s", flush=True)
        jobs = [(n, "auto") for n in args.workers]
        if 1 in args.workers:
            jobs.insert(1, (1, "1"))
        for n, threads in jobs:
            name = f"{n}w" if threads == "auto" else f"{n}w-{threads}t"
            runner = [f"--direct_num_workers={n}", "--direct_running_mode=multi_processing"]
            extra = [*given, *runner] + (
                ["--tokenizer_threads", threads] if threads != "auto" else []
            )
            seconds = build(inputs, work / f"shards-{mb:g}-{name}", extra, args.dupe_factor)
            result[f"job_{name}_s"] = round(seconds, 2)
            result[f"job_{name}_mb_s"] = round(mb / seconds, 3)
            result[f"job_{name}_vs_floor"] = round(mb / seconds / floor, 3)
            print(
                f"  job, {name}: {seconds:.1f} s, {mb / seconds:.2f} MB/s, "
                f"{mb / seconds / floor:.2f} x floor",
                flush=True,
            )
        if 1 in args.workers and 2 in args.workers:
            result["speedup_2w_over_1w"] = round(result["job_2w_mb_s"] / result["job_1w_mb_s"], 3)
        results.append(result)
    if args.profile:
        mb, inputs = runs[0]
        steps = profile_steps(inputs, vocab_file, args.dupe_factor, work / "profile-out", flags)
        print(f"profile, {mb:.1f} MB on one core without Beam (s, s/MB):")
        for step, seconds in steps.items():
            print(f"  {step:24s} {seconds:7.2f} {seconds / mb:7.3f}")
        ours = sum(steps.values())
        print(f"  {'sum of our steps':24s} {ours:7.2f} {ours / mb:7.3f}")
        if "job_1w-1t_s" in results[0]:
            rest = results[0]["job_1w-1t_s"] - ours
            print(
                f"  {'Beam (1w-1t job - sum)':24s} {rest:7.2f} {rest / mb:7.3f}  "
                f"of which fixed ~{fixed_s:.1f}"
            )
        results[0]["profile_s"] = {k: round(v, 2) for k, v in steps.items()}
        job = work / f"shards-{mb:g}-{args.workers[0]}w"
        shards = sorted((work / "profile-out").glob("shard-*.arrow"))
        same = bool(shards) and all(
            filecmp.cmp(shard, job / shard.name, shallow=False) for shard in shards
        )
        print(f"  the profile's shards are the job's bytes: {same}")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
