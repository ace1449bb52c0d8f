"""MLM-only rows on a real corpus: packing efficiency, and the MLM build's speed against
the NSP build of the same corpus.

    python bench/mlm_rows.py --input 'runs/quickstart/corpus/*-00[0-8].txt' --repeats 3
    python bench/mlm_rows.py --mb 8          # the stdlib's prose, repeated to 8 MB

Packing efficiency is real tokens (specials included) / (rows * max_seq_length): the
share of a padded batch's slots that hold a token. It is printed for both packings at
each ``--lengths`` (the manifest's ``stats.packing_efficiency``; the target for
``full_sentences`` is >= 0.95 at 128 and at 512). Speed: the MLM build (no pairing, no
masking, one pass) against the NSP build with ``--dupe_factor 1`` (one pass of pairing
and masking) and with Google's 10, the same vocab and workers, alternated ``--repeats``
times; each job is ``python -m pipeline build`` on the DirectRunner, wall clock included.
Without ``--vocab_file`` a vocab is learned once beforehand (not timed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.pipeline_speed import build, corpora  # noqa: E402


def efficiency(out: Path) -> tuple[float, int]:
    manifest = json.loads((out / "manifest.json").read_text())
    return manifest["stats"]["packing_efficiency"], manifest["num_rows"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--input", default=None, help="a corpus (glob); default: --mb of prose")
    p.add_argument("--mb", type=float, nargs="+", default=[8.0], help="prose corpus size, MB")
    p.add_argument("--chinese", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--vocab_file", default=None, help="default: learned once (8000 tokens)")
    p.add_argument("--lengths", type=int, nargs="+", default=[128, 512])
    p.add_argument("--workers", type=int, default=2, help="DirectRunner worker processes")
    p.add_argument("--repeats", type=int, default=3, help="alternated speed runs (0: none)")
    p.add_argument("--keep", default=None, help="keep corpora and outputs here")
    args = p.parse_args(argv)
    work = Path(args.keep or tempfile.mkdtemp(prefix="mlm-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    args.mb = args.mb[:1]
    mb, inputs = corpora(args, work)[0]
    runner = [f"--direct_num_workers={args.workers}", "--direct_running_mode=multi_processing"]
    vocab = args.vocab_file
    if vocab is None:
        build(inputs, work / "vocab", ["--vocab_size", "8000", "--num_shards", "1"], 1)
        vocab = str(work / "vocab" / "vocab.txt")
    common = ["--vocab_file", vocab, *runner]
    print(f"corpus {inputs}: {mb:.1f} MB, {args.workers} workers")
    print("packing efficiency (tokens / (rows x max_seq_length)), rows:")
    for length in args.lengths:
        cells = []
        for packing in ("full_sentences", "doc_sentences"):
            out = work / f"mlm-{packing}-{length}"
            options = ["--objective", "mlm", "--mlm_packing", packing]
            build(inputs, out, [*common, *options, "--max_seq_length", str(length)], 1)
            share, rows = efficiency(out)
            cells.append(f"{packing} {share:.3f} ({rows:,} rows)")
        print(f"  max_seq_length {length}: " + ", ".join(cells))
    if not args.repeats:
        return 0
    jobs = {
        "mlm": ([*common, "--objective", "mlm"], 1),
        "nsp, dupe 1": (common, 1),
        "nsp, dupe 10": (common, 10),
    }
    seconds: dict[str, list[float]] = {name: [] for name in jobs}
    for _ in range(args.repeats):
        for name, (options, dupe) in jobs.items():
            seconds[name].append(build(inputs, work / "speed", options, dupe))
    print("build wall clock, s (each run; median):")
    for name, values in seconds.items():
        median = statistics.median(values)
        print(f"  {name:>13}: {' '.join(f'{v:.1f}' for v in values)}; {median:.1f}")
    mlm = statistics.median(seconds["mlm"])
    for name in ("nsp, dupe 1", "nsp, dupe 10"):
        ratios = [n / m for n, m in zip(seconds[name], seconds["mlm"], strict=True)]
        print(
            f"  {name} / mlm: {min(ratios):.2f}-{max(ratios):.2f}x (medians "
            f"{statistics.median(seconds[name]) / mlm:.2f}x)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
