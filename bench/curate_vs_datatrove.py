"""``python -m pipeline curate`` against datatrove, side by side: keep/drop agreement of
MinHash dedup, and the wall time of curation end to end.

    python3 -m venv /tmp/venv-datatrove                 # datatrove in a venv of its own
    /tmp/venv-datatrove/bin/pip install 'datatrove[processing]==0.10.1' orjson spacy
    python bench/curate_vs_datatrove.py --datatrove_python /tmp/venv-datatrove/bin/python \\
        --mb 100 --repeats 3 --filters_agreement --keep /tmp/curate-vs-datatrove

The corpus is the main job's (``python -m pipeline corpus --files 10 --sources docstrings
reference --packages default``, as scripts/quickstart.sh writes it) with planted copies of
``--copies`` documents of at least 50 words, as ``bench/curate_dedup.py`` plants them: an
exact copy, a near copy (``--near_rate`` of its words replaced) and a far copy
(``--far_rate``). Both systems read the same ``--tasks`` jsonl files and run on
``--workers`` processes.

1. **Agreement** (not timed): MinHash dedup alone, 5-gram shingles, 14 bands x 8 rows,
   seed 1 on both. datatrove: ``MinhashDedupSignature``, ``MinhashDedupBuckets`` (14
   tasks), ``MinhashDedupCluster`` (1), ``MinhashDedupFilter`` under
   ``LocalPipelineExecutor``, as shipped (its English word tokenizer is spaCy's rule-based
   ``blank("en")``, which needs no model). Ours: ``curate --dedup minhash``, once per
   ``--minhash_keep`` rule (both by default). A document's
   decision is kept or dropped; exact copies are interchangeable (which one of identical
   texts stays changes no byte), so per text the kept copies are matched first. Each
   differing document gets a class, from the clusters of both (ours recomputed here from
   pipeline/core/dedup.py; datatrove's from ``save_cluster_id``) and a digest of each
   side's shingle set (datatrove's from its own ``get_shingles``):

   - ``other member kept``: the same cluster on both sides, one kept on both, not the same
     one (datatrove keeps its union-find root; we the smallest content id, or with
     ``--minhash_keep first`` the first in input order: the files are dealt round-robin,
     so that is datatrove's smallest (file, document) pair, its root unless a union by
     size made a later member the root);
   - ``too short for datatrove``: under 5 words, so datatrove has no shingle and never
     deduplicates it (we give it one shingle of all its words);
   - ``shingles differ``: the clusters differ and a member's shingle sets differ (text
     normalisation, word tokenizer);
   - ``unexplained``: anything else (a bug to find).

   It also prints the agreement up to which member of a cluster stays.

2. **Filter agreement** (``--filters_agreement``, not timed): each of the four rule sets
   alone (Gopher quality, Gopher repetition, C4, FineWeb, each on the original text) on
   each of the main job's documents: datatrove's filter objects' ``filter()`` with its
   English words (spaCy's, or ``--datatrove_tokenizer``), ours
   ``pipeline.core.filters.apply_filters``. Per set it prints the documents whose
   decisions agree, how many of those name the same rule, and the differing ones counted
   by (our rule, datatrove's rule), with example ids (``--keep`` keeps the inputs and
   ``filters-agreement.json``).

3. **Time** (``--mb`` of corpus: the planted corpus, then far copies (``--far_rate``) of
   the main job's documents, round after round, up to the size): MinHash dedup plus the
   Gopher quality and C4 rule sets. datatrove: reader -> ``GopherQualityFilter`` ->
   ``C4QualityFilter`` -> writer -> ``MinhashDedupSignature`` in one stage of ``--tasks``
   tasks, the buckets (14 tasks), the cluster (1), then reader -> ``MinhashDedupFilter``
   -> writer (``--tasks``), uncompressed jsonl between stages; ours: ``curate --filters
   gopher_quality,c4`` on the DirectRunner's multi-processing mode. Each process's wall
   clock, interpreter start included, ``--repeats`` rounds interleaved (the order swaps
   each round); each round prints ``uptime``'s load, ours / datatrove's time and the
   documents each kept. ``--datatrove_tokenizer split`` gives datatrove ``str.split`` for
   its words instead of spaCy: the cheapest tokenizer it can have, a lower bound on its time
   (its rules then keep other documents).

The same file runs datatrove's side under ``--datatrove_python`` (``--as_datatrove``),
so its top-level imports are the standard library's.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NGRAM, BANDS, ROWS, SEED = 5, 14, 8, 1
CLASSES = ("other member kept", "too short for datatrove", "shingles differ", "unexplained")


# ----------------------------------------------------------------------------- datatrove's side


def datatrove_job(spec: dict) -> None:
    """Run datatrove's pipeline as ``spec`` says (in datatrove's venv)."""
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup.minhash import (
        MinhashConfig,
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupFilter,
        MinhashDedupSignature,
    )
    from datatrove.pipeline.filters import C4QualityFilter, GopherQualityFilter
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter

    if spec["mode"] == "filters":
        datatrove_filters(spec)
        return
    work, tasks, workers = Path(spec["work"]), spec["tasks"], spec["workers"]
    config = MinhashConfig(n_grams=NGRAM, num_buckets=BANDS, hashes_per_bucket=ROWS, seed=SEED)
    agreement = spec["mode"] == "agreement"

    def run(pipeline, name, n):
        logs = str(work / "logs" / name)
        LocalPipelineExecutor(pipeline, tasks=n, workers=workers, logging_dir=logs).run()

    words = "en" if spec["tokenizer"] == "spacy" else split_tokenizer()
    first = [JsonlReader(spec["input"])]
    if not agreement:
        first += [GopherQualityFilter(language=words), C4QualityFilter(language=words)]
    first += [
        JsonlWriter(str(work / "filtered"), compression=None),
        MinhashDedupSignature(str(work / "signatures"), config=config, language=words),
    ]
    run(first, "signatures", tasks)
    buckets = MinhashDedupBuckets(str(work / "signatures"), str(work / "buckets"), config=config)
    run([buckets], "buckets", BANDS)
    cluster = MinhashDedupCluster(
        str(work / "buckets"), str(work / "remove"), config=config, save_cluster_id=agreement
    )
    run([cluster], "cluster", 1)
    dropped = JsonlWriter(str(work / "removed"), compression=None) if agreement else None
    last = [
        JsonlReader(str(work / "filtered")),
        MinhashDedupFilter(
            str(work / "remove"), exclusion_writer=dropped, load_cluster_ids=agreement
        ),
        JsonlWriter(str(work / "kept"), compression=None),
    ]
    run(last, "filter", tasks)
    if agreement:  # each document's shingle set, as a digest, for the difference classes
        signer = MinhashDedupSignature(output_folder=str(work / "unused"), config=config)
        with open(spec["input_list"]) as f, open(work / "shingles.jsonl", "w") as out:
            for line in f:
                record = json.loads(line)
                shingles = sorted(set(signer.get_shingles(record["text"]).ravel().tolist()))
                out.write(json.dumps({"id": record["id"], "shingles": digest(shingles)}) + "\n")


def datatrove_filters(spec: dict) -> None:
    """Each rule set's decision on each document of ``input_list``, alone (each set sees
    the original text), as ``{"id": ..., "<set>": reason or None}`` lines in
    ``<work>/filters.jsonl``."""
    from datatrove.data import Document
    from datatrove.pipeline.filters import (
        C4QualityFilter,
        FineWebQualityFilter,
        GopherQualityFilter,
        GopherRepetitionFilter,
    )

    words = "en" if spec["tokenizer"] == "spacy" else split_tokenizer()
    filters = {
        "gopher_quality": GopherQualityFilter(language=words),
        "gopher_repetition": GopherRepetitionFilter(language=words),
        "c4": C4QualityFilter(language=words),
        "fineweb": FineWebQualityFilter(language=words),
    }
    work = Path(spec["work"])
    work.mkdir(parents=True, exist_ok=True)
    with open(spec["input_list"]) as f, open(work / "filters.jsonl", "w") as out:
        for line in f:
            record = json.loads(line)
            row = {"id": record["id"]}
            for name, rule in filters.items():
                # C4 drops lines from doc.text in place: each set gets a Document of its own
                result = rule.filter(Document(text=record["text"], id=record["id"]))
                row[name] = None if result is True else result[1]
            out.write(json.dumps(row) + "\n")


def split_tokenizer():
    """datatrove's WhitespaceTokenizer with ``str.split`` for words (it runs spaCy's ``xx``):
    the cheapest words datatrove can be given, for a lower bound on its time."""
    from datatrove.utils.word_tokenizers import WhitespaceTokenizer

    class SplitTokenizer(WhitespaceTokenizer):
        def word_tokenize(self, text: str) -> list[str]:
            return text.split()

    return SplitTokenizer()


def digest(shingles: list[int]) -> str:
    """A set of shingle hashes (sorted ints) as a short hex digest, the same on both sides."""
    return hashlib.blake2b(",".join(map(str, shingles)).encode(), digest_size=8).hexdigest()


# ----------------------------------------------------------------------------- corpus


def main_corpus(work: Path) -> list[str]:
    """The main job's documents (written once under ``work``)."""
    sys.path.insert(0, str(ROOT / "bench"))
    from curate_dedup import documents

    corpus = work / "corpus"
    if not corpus.exists():
        cmd = [sys.executable, "-m", "pipeline", "corpus", "--output", str(corpus), "--files"]
        cmd += ["10", "--sources", "docstrings", "reference", "--packages", "default"]
        subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True)
    return documents(str(corpus / "*.txt"))


def planted_corpus(docs: list[str], args) -> list[str]:
    """``docs`` and, for ``args.copies`` of those of 50 words or more, an exact, a near and a
    far copy (bench/curate_dedup.py's planting)."""
    from curate_dedup import edited

    rng = random.Random(args.seed)
    vocabulary = sorted({w for d in docs[:500] for w in d.split()})
    long = [i for i, d in enumerate(docs) if len(d.split()) >= 50]
    copies = []
    for i in rng.sample(long, min(args.copies, len(long))):
        copies += [docs[i], edited(rng, docs[i], args.near_rate, vocabulary)]
        copies.append(edited(rng, docs[i], args.far_rate, vocabulary))
    return docs + copies


def grown(texts: list[str], docs: list[str], args) -> list[str]:
    """``texts``, then far copies of ``docs`` (round r: seed + r), up to ``args.mb`` MB."""
    from curate_dedup import edited

    vocabulary = sorted({w for d in docs[:500] for w in d.split()})
    out, size = list(texts), sum(len(t.encode()) for t in texts)
    for r in range(1, 10_000):
        rng = random.Random(args.seed + r)
        for doc in docs:
            if size >= args.mb * 1e6:
                return out
            copy = edited(rng, doc, args.far_rate, vocabulary) if doc.split() else doc
            out.append(copy)
            size += len(copy.encode())
    return out


def write_inputs(texts: list[str], folder: Path, tasks: int, whole: bool = True) -> Path:
    """``texts`` dealt round-robin into ``tasks`` jsonl files, ``id`` the text's index; with
    ``whole``, also all of them in order, in ``<folder>.all.jsonl`` beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    for t in range(tasks):
        with open(folder / f"part-{t:03d}.jsonl", "w") as f:
            for i in range(t, len(texts), tasks):
                f.write(json.dumps({"id": str(i), "text": texts[i]}) + "\n")
    if not whole:
        return folder
    with open(folder.parent / f"{folder.name}.all.jsonl", "w") as f:
        for i, text in enumerate(texts):
            f.write(json.dumps({"id": str(i), "text": text}) + "\n")
    return folder


# ----------------------------------------------------------------------------- the two jobs


def run_ours(inputs: Path, out: Path, args, filters: str, keep: str = "smallest_id") -> float:
    cmd = [sys.executable, "-m", "pipeline", "curate", "--input", str(inputs / "*.jsonl")]
    cmd += ["--minhash_keep", keep]
    cmd += ["--output", str(out), "--overwrite", "true", "--num_files", str(args.tasks)]
    cmd += [f"--direct_num_workers={args.workers}", "--direct_running_mode=multi_processing"]
    if filters:
        cmd += ["--filters", filters]
    return timed(cmd, "curate")


def run_datatrove(inputs: Path, work: Path, args, mode: str) -> float:
    if work.exists():
        subprocess.run(["rm", "-rf", str(work)], check=True)
    work.mkdir(parents=True)
    spec = {"work": str(work), "input": str(inputs), "tasks": args.tasks, "mode": mode}
    spec["tokenizer"] = args.datatrove_tokenizer
    spec |= {"workers": args.workers, "input_list": str(inputs.parent / f"{inputs.name}.all.jsonl")}
    cmd = [args.datatrove_python, str(Path(__file__).resolve()), "--as_datatrove", json.dumps(spec)]
    return timed(cmd, "datatrove")


def timed(cmd: list[str], name: str) -> float:
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    seconds = time.perf_counter() - start
    if done.returncode:
        sys.exit(f"{name} failed:\n{done.stderr[-3000:]}")
    return seconds


def load() -> str:
    return os.popen("uptime").read().strip().split("load average:")[-1].strip()


# ----------------------------------------------------------------------------- agreement


def ours_kept(out: Path) -> Counter:
    import pyarrow.parquet as pq

    kept: Counter = Counter()
    for path in sorted(out.glob("*.parquet")):
        kept.update(pq.read_table(path).column("text").to_pylist())
    return kept


def datatrove_records(work: Path, folder: str) -> list[dict]:
    out = []
    for path in sorted((work / folder).glob("*.jsonl")):
        with open(path) as f:
            out += [json.loads(line) for line in f]
    return out


def our_clusters(texts: list[str]) -> dict[str, int]:
    """Each distinct text -> its cluster number (exact copies, then shared band keys)."""
    from pipeline.core.dedup import MinHasher, band_keys, shingle_hashes

    hasher = MinHasher(BANDS * ROWS, SEED)
    parent: dict[str, str] = {}

    def find(x):
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    first: dict[bytes, str] = {}
    for text in dict.fromkeys(texts):
        find(text)
        shingles = shingle_hashes(text, NGRAM)
        if not shingles.size:
            continue
        for key in band_keys(hasher.signature(shingles), BANDS, ROWS):
            if key in first:
                a, b = find(first[key]), find(text)
                if a != b:
                    parent[b] = a
            else:
                first[key] = text
    roots: dict[str, int] = {}
    return {text: roots.setdefault(find(text), len(roots)) for text in parent}


def agreement(texts: list[str], out: Path, work: Path) -> dict:
    """Per input document: kept or dropped by each; the differing ones, classified."""
    from pipeline.core.dedup import shingle_hashes

    ours = ours_kept(out)
    kept = datatrove_records(work, "kept")
    removed = datatrove_records(work, "removed")
    dt_kept = {r["id"] for r in kept}
    dt_cluster = {}
    for r in kept + removed:
        cluster = r["metadata"].get("minhash_cluster_id", -1)
        dt_cluster[r["id"]] = ("c", cluster) if cluster != -1 else ("single", r["id"])
    with open(work / "shingles.jsonl") as f:
        dt_shingles = {r["id"]: r["shingles"] for r in map(json.loads, f)}
    by_text: dict[str, list[str]] = defaultdict(list)
    for i, text in enumerate(texts):
        by_text[text].append(str(i))
    # our decision per id: per text, our kept copies go to datatrove's kept copies first
    ours_by_id = {}
    for text, ids in by_text.items():
        ranked = sorted(ids, key=lambda i: i not in dt_kept)
        for rank, i in enumerate(ranked):
            ours_by_id[i] = rank < ours[text]
    clusters = our_clusters(texts)
    members_ours: dict[int, set] = defaultdict(set)
    members_dt: dict[tuple, set] = defaultdict(set)
    for i, text in enumerate(texts):
        members_ours[clusters[text]].add(str(i))
        members_dt[dt_cluster[str(i)]].add(str(i))

    def same_shingles(i: str) -> bool:
        return digest(shingle_hashes(texts[int(i)], NGRAM).tolist()) == dt_shingles[i]

    classes: Counter = Counter()
    examples: dict[str, list[str]] = defaultdict(list)
    for i in map(str, range(len(texts))):
        if ours_by_id[i] == (i in dt_kept):
            continue
        mine, theirs = members_ours[clusters[texts[int(i)]]], members_dt[dt_cluster[i]]
        kept_mine = sum(ours_by_id[j] for j in mine)
        kept_theirs = sum(j in dt_kept for j in theirs)
        if len(texts[int(i)].split()) < NGRAM and dt_shingles[i] == digest([]):
            kind = CLASSES[1]
        elif mine == theirs and kept_mine == kept_theirs == 1:
            kind = CLASSES[0]
        elif not all(same_shingles(j) for j in mine | theirs):
            kind = CLASSES[2]
        else:
            kind = CLASSES[3]
        classes[kind] += 1
        examples[kind].append(i)
    same = len(texts) - sum(classes.values())
    return {
        "documents": len(texts),
        "agree": same,
        "ours_kept": sum(ours_by_id.values()),
        "datatrove_kept": len(dt_kept),
        "classes": dict(classes),
        "examples": {k: v[:5] for k, v in examples.items()},
    }


# datatrove's reason names -> ours (pipeline/core/filters.py's RULE_SETS)
DATATROVE_REASONS = {
    "gopher_short_doc": "word_count",
    "gopher_long_doc": "word_count",
    "gopher_below_avg_threshold": "mean_word_length",
    "gopher_above_avg_threshold": "mean_word_length",
    "gopher_too_many_hashes": "hash_ratio",
    "gopher_too_many_ellipsis": "ellipsis_ratio",
    "gopher_too_many_bullets": "bullet_lines",
    "gopher_too_many_end_ellipsis": "ellipsis_lines",
    "gopher_below_alpha_threshold": "alpha_words",
    "gopher_enough_stop_words": "stop_words",
    "too_few_sentences": "min_sentences",
    **{f"duplicated_{n}_n_grams": f"dup_{n}_gram" for n in range(5, 11)},
}


def filter_agreement(texts: list[str], work: Path) -> dict:
    """Per rule set: our decision and datatrove's on each document, alone; the differing
    ones counted by (our rule, datatrove's rule), with example ids."""
    from pipeline.core.filters import apply_filters

    with open(work / "filters.jsonl") as f:
        theirs = {r["id"]: r for r in map(json.loads, f)}
    result = {}
    start = time.perf_counter()
    for name in ("gopher_quality", "gopher_repetition", "c4", "fineweb"):
        pairs: Counter = Counter()
        examples: dict[tuple, list[str]] = defaultdict(list)
        dropped = {"ours": 0, "datatrove": 0}
        same_rule = 0
        for i, text in enumerate(texts):
            failed, _ = apply_filters(text, [name])
            mine = failed.split(".", 1)[1] if failed else None
            reason = theirs[str(i)][name]
            their = DATATROVE_REASONS.get(reason, reason) if reason else None
            dropped["ours"] += mine is not None
            dropped["datatrove"] += their is not None
            if (mine is None) == (their is None):
                same_rule += mine == their
                continue
            pairs[(mine or "kept", their or "kept")] += 1
            examples[(mine or "kept", their or "kept")].append(str(i))
        differ = sum(pairs.values())
        result[name] = {
            "documents": len(texts),
            "agree": len(texts) - differ,
            "same_rule": same_rule,
            "dropped": dropped,
            "pairs": [
                {"ours": a, "datatrove": b, "documents": n, "examples": examples[(a, b)][:5]}
                for (a, b), n in pairs.most_common()
            ],
        }
    print(f"our four rule sets, one process: {time.perf_counter() - start:.1f} s")
    return result


def print_filter_agreement(result: dict) -> None:
    for name, r in result.items():
        n = r["documents"]
        print(
            f"filters, {name} alone: decisions agree on {r['agree']:,}/{n:,} = "
            f"{r['agree'] / n:.4f} (the same rule on {r['same_rule']:,}); dropped: ours "
            f"{r['dropped']['ours']:,}, datatrove {r['dropped']['datatrove']:,}"
        )
        for pair in r["pairs"]:
            print(
                f"  ours {pair['ours']:18s} datatrove {pair['datatrove']:18s} "
                f"{pair['documents']:6,}  e.g. ids {pair['examples']}"
            )


# ----------------------------------------------------------------------------- main


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--as_datatrove", default=None, help=argparse.SUPPRESS)
    p.add_argument("--datatrove_python", default="/tmp/venv-datatrove/bin/python")
    p.add_argument(
        "--datatrove_tokenizer",
        default="spacy",
        choices=("spacy", "split"),
        help="datatrove's words: spacy (as shipped, English) or str.split (its cheapest)",
    )
    p.add_argument("--mb", type=float, default=100.0, help="corpus size of the timed runs")
    p.add_argument("--repeats", type=int, default=3, help="interleaved timed rounds (0: none)")
    p.add_argument("--tasks", type=int, default=8, help="input files = datatrove's tasks")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--copies", type=int, default=1000, help="documents given planted copies")
    p.add_argument("--near_rate", type=float, default=0.015)
    p.add_argument("--far_rate", type=float, default=0.2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--documents", type=int, default=None, help="only the first N (a smoke run)")
    p.add_argument("--skip_agreement", action="store_true")
    p.add_argument(
        "--minhash_keep",
        nargs="+",
        default=["smallest_id", "first"],
        choices=("smallest_id", "first"),
        help="our rules for which member of a cluster stays, each measured for agreement",
    )
    p.add_argument(
        "--filters_agreement",
        action="store_true",
        help="also each rule set's decisions against datatrove's on the main job's documents",
    )
    p.add_argument("--keep", default=None, help="keep the corpus and outputs here")
    args = p.parse_args(argv)
    if args.as_datatrove:
        datatrove_job(json.loads(args.as_datatrove))
        return 0
    sys.path.insert(0, str(ROOT))
    work = Path(args.keep or tempfile.mkdtemp(prefix="curate-vs-datatrove-"))
    work.mkdir(parents=True, exist_ok=True)
    docs = main_corpus(work)[: args.documents]
    texts = planted_corpus(docs, args)
    mb = sum(len(t.encode()) for t in texts) / 1e6
    print(f"main job's corpus: {len(docs):,} documents; planted: {len(texts):,} ({mb:.1f} MB)")
    if not args.skip_agreement:
        inputs = write_inputs(texts, work / "agreement-in", args.tasks)
        dt_s = run_datatrove(inputs, work / "agreement-datatrove", args, "agreement")
        for keep in args.minhash_keep:
            out = work / f"agreement-ours-{keep}"
            ours_s = run_ours(inputs, out, args, filters="", keep=keep)
            result = agreement(texts, out, work / "agreement-datatrove")
            share = result["agree"] / result["documents"]
            print(
                f"agreement, MinHash dedup alone, ours with --minhash_keep {keep}: "
                f"{result['agree']:,}/{result['documents']:,} = {share:.4f} (target >= 0.98); "
                f"kept: ours {result['ours_kept']:,}, datatrove {result['datatrove_kept']:,}; "
                f"ours {ours_s:.1f} s, datatrove {dt_s:.1f} s"
            )
            up_to = result["agree"] + result["classes"].get(CLASSES[0], 0)
            print(
                f"  up to which member of a cluster stays: {up_to:,}/{result['documents']:,} = "
                f"{up_to / result['documents']:.4f}"
            )
            for kind in CLASSES:
                n = result["classes"].get(kind, 0)
                print(f"  {kind:25s} {n:6,}  e.g. ids {result['examples'].get(kind, [])}")
    if args.filters_agreement:
        inputs = write_inputs(docs, work / "filters-in", args.tasks)
        spec = {"work": str(work / "filters-datatrove"), "mode": "filters"}
        spec |= {"tokenizer": args.datatrove_tokenizer, "input_list": f"{inputs}.all.jsonl"}
        cmd = [args.datatrove_python, str(Path(__file__).resolve()), "--as_datatrove"]
        seconds = timed([*cmd, json.dumps(spec)], "datatrove's filters")
        print(f"datatrove's four rule sets, one process: {seconds:.1f} s")
        result = filter_agreement(docs, work / "filters-datatrove")
        (work / "filters-agreement.json").write_text(json.dumps(result, indent=1))
        print_filter_agreement(result)
    if args.repeats:
        big = grown(texts, docs, args)
        inputs = write_inputs(big, work / "timing-in", args.tasks)
        size = sum(f.stat().st_size for f in inputs.glob("*.jsonl")) / 1e6
        print(f"timed: {len(big):,} documents, {size:.1f} MB of jsonl in {args.tasks} files")
        ratios = []
        for r in range(args.repeats):
            before = load()
            runs = {
                "ours": lambda: run_ours(inputs, work / "timing-ours", args, "gopher_quality,c4"),
                "datatrove": lambda: run_datatrove(inputs, work / "timing-datatrove", args, "time"),
            }
            order = ["ours", "datatrove"] if r % 2 == 0 else ["datatrove", "ours"]
            seconds = {name: runs[name]() for name in order}
            ratios.append(seconds["ours"] / seconds["datatrove"])
            kept_ours = sum(ours_kept(work / "timing-ours").values())
            kept_dt = len(datatrove_records(work / "timing-datatrove", "kept"))
            print(
                f"round {r + 1} ({' then '.join(order)}): ours {seconds['ours']:.1f} s, "
                f"datatrove {seconds['datatrove']:.1f} s, ours/datatrove {ratios[-1]:.2f}; "
                f"kept {kept_ours:,} / {kept_dt:,}; load {before} -> {load()}"
            )
        print(f"ours/datatrove: {min(ratios):.2f}-{max(ratios):.2f} (target <= 1.0)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
