"""MinHash signatures per second: ours (pipeline/core/dedup.py, numpy) against datasketch and
rensa, on the same documents and the same word 5-gram shingles, one process, one core.

    python -m pipeline corpus --output /tmp/corpus --sources docstrings reference
    python bench/curate_minhash.py --input /tmp/corpus/stdlib-docs-000.txt --repeats 5

(without ``--input`` it builds that corpus in a temporary folder first). Each
implementation is timed ``--repeats`` times, alternated; the median is printed with its
ratio to ours. Two measures:

* **end to end**: text -> signature. All three get the words from our ``normalize`` and
  ``words``; the n-grams are hashed by each implementation's own way (ours: xxhash64 per
  n-gram string; datasketch: SHA-1 per n-gram, its default; rensa: its own hash, in Rust).
* **signature only**: from the same uint64 shingle hashes (``shingle_hashes``) to the
  signature (datasketch with an identity ``hashfunc``; rensa's batch call
  ``digest_matrix_from_token_hash_sets`` on all documents at once, its fastest path).

All use 112 permutations (14 bands x 8 rows) and seed 1. Only ours computes datatrove's
permutation family; the others' signatures are different numbers of the same kind.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.core.dedup import MinHasher, normalize, shingle_hashes, words  # noqa: E402
from pipeline.core.text import iter_txt_documents  # noqa: E402

NUM_PERM, SEED, N = 112, 1, 5
SOURCES = ["--sources", "docstrings", "reference"]


def load_documents(path: str | None) -> list[str]:
    if path is None:
        out = Path(tempfile.mkdtemp(prefix="curate-minhash-"))
        subprocess.run(
            [sys.executable, "-m", "pipeline", "corpus", "--output", str(out), *SOURCES],
            check=True,
            cwd=ROOT,
        )
        path = str(next(out.glob("*.txt")))
    with open(path, encoding="utf-8") as f:
        documents = ["\n".join(sentences) for sentences in iter_txt_documents(f)]
    return [doc for doc in documents if shingle_hashes(doc).size]  # those with a signature


def ngram_strings(text: str) -> list[str]:
    """The word 5-grams as strings, as shingle_hashes forms them before hashing."""
    found = words(normalize(text))
    if len(found) < N:
        return [" ".join(found)]
    return [" ".join(found[i : i + N]) for i in range(len(found) - N + 1)]


def implementations(documents: list[str]) -> dict[str, Callable[[], object]]:
    """name -> a callable that computes every document's signature once."""
    import datasketch
    import rensa

    minhasher = MinHasher(NUM_PERM, SEED)
    hashes = [shingle_hashes(doc) for doc in documents]
    hash_lists = [h.tolist() for h in hashes]

    # datasketch draws its permutations per MinHash unless given them: reuse a template's
    # (its documented fast path), in its default 32-bit scheme and in the 64-bit one that
    # takes our 64-bit shingle hashes
    perm32 = datasketch.MinHash(num_perm=NUM_PERM, seed=SEED).permutations
    perm64 = datasketch.MinHash(num_perm=NUM_PERM, seed=SEED, scheme="affine64").permutations

    def datasketch_text():
        for doc in documents:
            m = datasketch.MinHash(NUM_PERM, SEED, permutations=perm32, scheme="affine32")
            m.update_batch([s.encode() for s in ngram_strings(doc)])
            m.digest()

    def datasketch_hashes():
        for h in hash_lists:
            m = datasketch.MinHash(
                NUM_PERM, SEED, hashfunc=int, permutations=perm64, scheme="affine64"
            )
            m.update_batch(h)
            m.digest()

    def rensa_text():
        for doc in documents:
            m = rensa.RMinHash(NUM_PERM, SEED)
            m.update(ngram_strings(doc))
            m.digest()

    return {
        "ours, end to end": lambda: [minhasher.signature(shingle_hashes(d)) for d in documents],
        "datasketch, end to end": datasketch_text,
        "rensa, end to end": rensa_text,
        "ours, signature only": lambda: [minhasher.signature(h) for h in hashes],
        "datasketch, signature only": datasketch_hashes,
        "rensa, signature only (batch)": lambda: rensa.RMinHash.digest_matrix_from_token_hash_sets(
            hash_lists, NUM_PERM, SEED
        ),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--input", default=None, help="a txt corpus; default: the stdlib corpus")
    p.add_argument("--repeats", type=int, default=3, help="alternated timed runs")
    args = p.parse_args(argv)
    documents = load_documents(args.input)
    shingles = np.array([shingle_hashes(doc).size for doc in documents])
    print(
        f"{len(documents)} documents, {sum(map(len, documents)) / 1e6:.2f} M characters, "
        f"5-gram shingles per document: median {int(np.median(shingles))}, "
        f"mean {shingles.mean():.0f}, max {shingles.max()}; {NUM_PERM} permutations"
    )
    runs = implementations(documents)
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            seconds[name].append(time.perf_counter() - start)
    rates = {name: len(documents) / statistics.median(times) for name, times in seconds.items()}
    for group in ("end to end", "signature only"):
        ours = rates[f"ours, {group}"]
        print(f"\n{group}:")
        for name, rate in rates.items():
            if group in name:
                spread = f"{min(seconds[name]):.3f}-{max(seconds[name]):.3f} s"
                print(
                    f"  {name:32s} {rate:10,.0f} signatures/s  {rate / ours:6.2f}x ours  ({spread})"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
