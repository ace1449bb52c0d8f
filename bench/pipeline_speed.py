"""Throughput of the whole pipeline job against the tokenizer floor, on real English.

    python bench/pipeline_speed.py                 # 8 MB, dupe factor 5, 1 and 2 workers
    python bench/pipeline_speed.py --mb 32 --workers 1 2

The corpus is the Python standard library's docstrings and language reference
(``pipeline.corpus``), repeated to ``--mb``, in 8 files. A vocab is learned
once beforehand (not timed). Each job runs ``python -m pipeline build`` on the
DirectRunner (multi-processing, N workers) with ``--vocab_file`` and prints
input MB/s, wall clock included. The floor is the ``tokenizers`` library's batch
encoding of the same lines with the same vocab on the same cores, measured in
the same run. Targets: the 2-worker job at >= 0.25 x the floor, and 2 workers
>= 1.7 x faster than 1.

The tokenizer's threads per worker are automatic (``--tokenizer_threads 0``):
the cores divided by the workers, so the 1-worker job tokenizes on every core
and the 2-worker job on one per worker. The 1-worker job also runs with one
tokenizer thread ("1w-1t"), which isolates how the Beam job itself scales.
Beam's fixed cost (imports, starting the worker processes: about 2 s here)
weighs on both ratios at a few MB; ``--mb`` shows how they move with size.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.corpus import write_corpus  # noqa: E402
from pipeline.vocab import build_tokenizer, read_vocab  # noqa: E402


def build(inputs: str, out: Path, extra: list[str], dupe: int) -> float:
    cmd = [sys.executable, "-m", "pipeline", "build", "--input", inputs, "--output", str(out),
           "--dupe_factor", str(dupe), "--overwrite", *extra]  # fmt: skip
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    elapsed = time.perf_counter() - start
    if done.returncode:
        sys.exit(f"pipeline failed:\n{done.stderr[-4000:]}")
    return elapsed


def tokenizer_floor(files: list[Path], vocab: list[str], repeats: int = 3) -> float:
    """Seconds for the tokenizers library to batch-encode every line (best of ``repeats``)."""
    tokenizer = build_tokenizer(vocab, do_lower_case=True)
    lines = [line for f in files for line in f.read_text(encoding="utf-8").splitlines() if line]
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        tokenizer.encode_batch(lines, add_special_tokens=False)
        best = min(best, time.perf_counter() - start)
    return best


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--mb", type=float, default=8.0, help="corpus size in MB (default: 8)")
    p.add_argument("--dupe_factor", type=int, default=5, help="dupe factor (default: 5)")
    p.add_argument(
        "--workers", type=int, nargs="+", default=[1, 2], help="worker counts (default: 1 2)"
    )
    p.add_argument(
        "--vocab_size", type=int, default=30522, help="learned vocab size (default: 30522)"
    )
    p.add_argument("--keep", default=None, help="keep the outputs in this directory")
    args = p.parse_args(argv)

    work = Path(args.keep or tempfile.mkdtemp(prefix="pipeline-bench-"))
    files = write_corpus(work / "corpus", max_bytes=int(args.mb * 1e6), files=8, repeat=True)
    inputs = str(work / "corpus" / "*.txt")
    mb = sum(f.stat().st_size for f in files) / 1e6
    print(f"corpus: {mb:.2f} MB in {len(files)} files; cpus: {os.cpu_count()}", flush=True)

    vocab_dir = work / "vocab-run"
    learn_s = build(
        inputs, vocab_dir, ["--vocab_size", str(args.vocab_size), "--num_shards", "1"], 1
    )
    vocab = read_vocab(vocab_dir / "vocab.txt")
    print(
        f"vocab: {len(vocab)} tokens learned in a dupe-1 job of {learn_s:.1f} s (not timed below)"
    )

    floor_s = tokenizer_floor(files, vocab)
    floor = mb / floor_s
    print(f"floor: tokenizers encode_batch {floor:.2f} MB/s", flush=True)
    results = {"corpus_mb": round(mb, 3), "dupe_factor": args.dupe_factor,
               "floor_mb_s": round(floor, 3)}  # fmt: skip
    runs = [(n, "auto") for n in args.workers]
    if 1 in args.workers:
        runs.insert(1, (1, "1"))
    for n, threads in runs:
        name = f"{n}w" if threads == "auto" else f"{n}w-{threads}t"
        out = work / f"shards-{name}"
        runner = [f"--direct_num_workers={n}", "--direct_running_mode=multi_processing"]
        extra = ["--vocab_file", str(vocab_dir / "vocab.txt"), *runner]
        if threads != "auto":
            extra += ["--tokenizer_threads", threads]
        seconds = build(inputs, out, extra, args.dupe_factor)
        results[f"job_{name}_mb_s"] = round(mb / seconds, 3)
        results[f"job_{name}_vs_floor"] = round(mb / seconds / floor, 3)
        print(f"job, {name}: {seconds:.1f} s, {mb / seconds:.2f} MB/s, "
              f"{mb / seconds / floor:.2f} x floor", flush=True)  # fmt: skip
    if 1 in args.workers and 2 in args.workers:
        results["speedup_2w_over_1w"] = round(results["job_2w_mb_s"] / results["job_1w_mb_s"], 3)
        results["speedup_2w_over_1w_1t"] = round(
            results["job_2w_mb_s"] / results["job_1w-1t_mb_s"], 3
        )
    print(json.dumps(results))
    last = work / f"shards-{args.workers[-1]}w"
    subprocess.run([sys.executable, "-m", "pipeline", "stats", str(last)], cwd=ROOT, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
