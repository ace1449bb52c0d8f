"""Near-duplicate removal's recall and false merges on a real corpus with planted copies,
and the curate job's wall time.

    python bench/curate_dedup.py                         # the stdlib corpus, 2 workers
    python bench/curate_dedup.py --input 'corpus/*.txt' --copies 300 --filters gopher_quality,c4

The corpus (``--input``, txt; default the stdlib's docstrings and reference written by
``python -m pipeline corpus``) gets, for ``--copies`` documents of at least 50 words each:
an exact copy, a near copy (``--near_rate`` of its words replaced, 1-2%) and a far copy
(``--far_rate``, 20%). The job is ``python -m pipeline curate`` on the DirectRunner
(``--workers`` processes, wall clock included). Ground truth is brute force: each planted
pair's Jaccard similarity of its 5-gram shingles (pipeline/core/dedup.py). It prints

- exact copies: planted texts found more than once in the output (target: none);
- recall: planted near pairs with Jaccard >= 0.85 not both kept (target >= 0.95);
- false merges: planted far copies with Jaccard <= 0.5 to their original that were removed
  (target <= 1%): a far copy is in no other planted pair (its original may go, as the near
  copy's duplicate, or stay), so its removal is a merge with a dissimilar document.
"""

from __future__ import annotations

import argparse
import glob
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pyarrow.parquet as pq  # noqa: E402

from pipeline.cli.corpus import write_corpus  # noqa: E402
from pipeline.core.dedup import jaccard, shingle_hashes  # noqa: E402
from pipeline.core.sources import read_txt  # noqa: E402


def documents(pattern: str) -> list[str]:
    out = []
    for path in sorted(glob.glob(pattern)):
        with open(path, "rb") as f:
            out += ["\n".join(sentences) for sentences, _ in read_txt(f) if sentences]
    return out


def edited(rng: random.Random, text: str, rate: float, vocabulary: list[str]) -> str:
    """``text`` with ``rate`` of its words (at least one) replaced by corpus words; line
    breaks kept."""
    lines = [line.split() for line in text.split("\n")]
    where = [(i, j) for i, line in enumerate(lines) for j in range(len(line))]
    for i, j in rng.sample(where, max(1, round(rate * len(where)))):
        lines[i][j] = rng.choice(vocabulary)
    return "\n".join(" ".join(line) for line in lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--input", default=None, help="txt corpus (glob); default: the stdlib's")
    p.add_argument("--copies", type=int, default=300, help="documents given planted copies")
    p.add_argument("--near_rate", type=float, default=0.015)
    p.add_argument("--far_rate", type=float, default=0.2)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--filters", default="", help="also run these rule sets (--filters)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--keep", default=None, help="keep the corpus and output here")
    args = p.parse_args(argv)
    work = Path(args.keep or tempfile.mkdtemp(prefix="curate-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    pattern = args.input
    if pattern is None:
        if not (work / "corpus").exists():
            write_corpus(work / "corpus", files=4, sources=["docstrings", "reference"])
        pattern = str(work / "corpus" / "*.txt")
    docs = documents(pattern)
    rng = random.Random(args.seed)
    vocabulary = sorted({w for d in docs[:500] for w in d.split()})
    long = [i for i, d in enumerate(docs) if len(d.split()) >= 50]
    chosen = rng.sample(long, min(args.copies, len(long)))
    planted = {"exact": [], "near": [], "far": []}
    for i in chosen:
        planted["exact"].append((docs[i], docs[i]))
        planted["near"].append((docs[i], edited(rng, docs[i], args.near_rate, vocabulary)))
        planted["far"].append((docs[i], edited(rng, docs[i], args.far_rate, vocabulary)))
    texts = docs + [copy for pairs in planted.values() for _, copy in pairs]
    corpus = work / "planted.jsonl"
    with open(corpus, "w") as f:
        for text in texts:
            f.write(json.dumps({"text": text}) + "\n")
    out = work / "curated"
    cmd = [sys.executable, "-m", "pipeline", "curate", "--input", str(corpus)]
    cmd += ["--output", str(out), "--overwrite", "true", "--num_files", "2"]
    cmd += [f"--direct_num_workers={args.workers}", "--direct_running_mode=multi_processing"]
    if args.filters:
        cmd += ["--filters", args.filters]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    seconds = time.perf_counter() - start
    if done.returncode:
        sys.exit(f"curate failed:\n{done.stderr[-3000:]}")
    rows: list[str] = []
    for path in sorted(out.glob("*.parquet")):
        rows += pq.read_table(path).column("text").to_pylist()
    kept = set(rows)
    report = json.loads((out / "report.json").read_text())
    mb = corpus.stat().st_size / 1e6
    print(
        f"{len(texts):,} documents ({mb:.1f} MB), {len(chosen)} with planted copies; "
        f"curate in {seconds:.1f} s on {args.workers} workers"
    )
    print(f"removed: {json.dumps({k: v['documents'] for k, v in report['removed'].items()})}")
    similar = dissimilar = found = merged = 0
    for original, copy in planted["near"]:
        if jaccard(shingle_hashes(original), shingle_hashes(copy)) >= 0.85:
            similar += 1
            found += not (original in kept and copy in kept)
    for original, copy in planted["far"]:
        if jaccard(shingle_hashes(original), shingle_hashes(copy)) <= 0.5:
            dissimilar += 1
            merged += copy not in kept
    twice = sum(rows.count(original) > 1 for original, _ in planted["exact"])
    print(f"exact copies: {twice} of {len(chosen)} planted texts more than once (target: 0)")
    if similar:
        print(
            f"recall, Jaccard >= 0.85: {found}/{similar} = {found / similar:.3f} (target >= 0.95)"
        )
    if dissimilar:
        print(
            f"false merges, Jaccard <= 0.5: {merged}/{dissimilar} = {merged / dissimilar:.3f} "
            "(target <= 0.01)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
