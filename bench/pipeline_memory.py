"""Peak memory of every process of a pipeline build, as the corpus grows, per runner.

    python bench/pipeline_memory.py --mb 50 200                 # DirectRunner and Dask
    python bench/pipeline_memory.py --mb 50 --runners dask --memory_limit 4GiB
    python bench/pipeline_memory.py --input 'corpus/*.txt' --vocab_file vocab.txt
    python bench/pipeline_memory.py --command curate --mb 200 1000 --runners dask \
        --memory_limit 2GiB                                      # curation (issue 33)

Each build is ``python -m pipeline build --vocab_file ... --dupe_factor 5`` on

- ``direct``: the DirectRunner's engine with ``--direct_num_workers=2
  --direct_running_mode=multi_processing``: the driver (the FnApiRunner, which holds
  every PCollection between stages) and its two SDK worker processes;
- ``dask``: a fresh Dask cluster started with the ``dask`` CLI (``tests/dask_cluster.py``:
  a scheduler and two ``dask worker --nworkers 1 --nthreads 1`` processes) and the
  build submitted to it (partitions of ~8 MB of input, at most one per range: the build's default; or
  ``--dask_npartitions files``: one per input file): the client, the scheduler, each
  worker (and its nanny).

psutil samples the resident set size (RSS) of every process of the build's tree and of
the cluster every ``--interval`` seconds; the table gives each process's peak, when it
peaked, and the peak of their sum (on Dask, also each worker's peak of spilled bytes on
disk, ``spill i``). Without ``--input`` the corpus is English prose
from Python's own documentation (``pipeline.cli.corpus``, all four sources: docstrings, the
language reference, test docstrings, prose comments), repeated to ``--mb`` MB in
``--files`` files, and without ``--vocab_file`` a vocab is learned once from 8 MB of
it (not measured); ``--learn_vocab``: each build learns its own (30,522 tokens), which
makes every runner hold the read documents until the vocab is learned. ``--timeline DIR``
writes every sample as CSV, one file per build.

``--command curate`` measures ``python -m pipeline curate --dedup minhash --filters
gopher_quality,c4`` instead (more flags after ``--``). Its generated corpus must not be
repeats, which exact dedup would drop before MinHash sees them: it is
``bench/curate_vs_datatrove.py``'s timed corpus (the main job's documents with planted
exact, near and far copies, then far copies (20% of words replaced) of the main job's
documents, round after round) up to ``--mb``, as jsonl in ``--files`` files; every
document but the planted copies is distinct, so each one is shingled, signed and banded.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import glob
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.cli.corpus import write_corpus  # noqa: E402
from tests.dask_cluster import DASK_RUNNER, DaskCluster, worker_env  # noqa: E402

DIRECT = ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]


def roles(build: psutil.Process, cluster: DaskCluster | None) -> dict[int, str]:
    """pid -> role: the build process and its SDK workers, the Dask scheduler, each
    nanny and the worker process under it; the rest (:func:`_is_helper`) as helpers."""
    found = {build.pid: "driver" if cluster is None else "client"}
    trees = [(build, "sdk worker" if cluster is None else "client child")]
    if cluster is not None:
        found[cluster.scheduler.pid] = "scheduler"
        for i, nanny in enumerate(cluster.workers):
            found[nanny.pid] = f"nanny {i}"
            trees.append((psutil.Process(nanny.pid), f"worker {i}"))
    for parent, role in trees:
        try:
            children = sorted(parent.children(recursive=True), key=lambda c: c.pid)
        except psutil.NoSuchProcess:
            continue
        helpers = [c for c in children if _is_helper(c)]
        found.update({c.pid: "helpers" for c in helpers})
        workers = [c for c in children if c not in helpers]
        numbered = role == "sdk worker"  # two of them, under one parent
        found.update({c.pid: f"{role} {k}" if numbered else role for k, c in enumerate(workers)})
    return found


def _is_helper(process: psutil.Process) -> bool:
    """The ``sh -c`` the FnApiRunner starts each worker through, multiprocessing's
    resource tracker: a few MB each, not workers."""
    try:
        return process.name() in ("sh", "bash") or "resource_tracker" in " ".join(process.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return True


def spilled_bytes(directory: Path) -> int:
    """Bytes of the files under a Dask worker's directory: what it spilled to disk."""
    total = 0
    for root, _, files in os.walk(directory):
        for name in files:
            with contextlib.suppress(OSError):  # unspilled meanwhile
                total += os.path.getsize(os.path.join(root, name))
    return total


def run_and_sample(
    cmd: list[str], cluster: DaskCluster | None, interval: float, log: Path
) -> tuple[float, list[tuple[float, str, int]]]:
    """Run the build, sampling RSS; returns (wall seconds, [(t, role, rss bytes)]). On
    Dask, every 8th sample also records each worker's spilled bytes, as role ``spill i``."""
    samples: list[tuple[float, str, int]] = []
    start = time.perf_counter()
    with open(log, "w") as out:
        build = psutil.Popen(cmd, cwd=ROOT, env=worker_env(), stdout=out, stderr=subprocess.STDOUT)
        for tick in itertools.count():
            if build.poll() is not None:
                break
            now = time.perf_counter() - start
            for pid, role in roles(build, cluster).items():
                with contextlib.suppress(psutil.NoSuchProcess):  # it ended meanwhile
                    samples.append((now, role, psutil.Process(pid).memory_info().rss))
            if cluster is not None and tick % 8 == 0:
                for i in range(len(cluster.workers)):
                    spilled = spilled_bytes(cluster.directory / f"worker-{i}")
                    samples.append((now, f"spill {i}", spilled))
            time.sleep(interval)
    wall = time.perf_counter() - start
    if build.returncode:
        sys.exit(f"build failed ({build.returncode}); its output: {log}\n{log.read_text()[-3000:]}")
    return wall, samples


def peaks(samples: list[tuple[float, str, int]]) -> dict[str, tuple[float, float]]:
    """role -> (peak RSS in GB, seconds at the peak); 'sum' is the peak of the total
    memory; ``spill i``: the peak of worker i's spilled bytes on disk."""
    best: dict[str, tuple[float, float]] = {}
    total: dict[float, int] = {}
    for t, role, rss in samples:
        if not role.startswith("spill"):  # disk, not memory
            total[t] = total.get(t, 0) + rss
        if role != "helpers" and rss / 1e9 > best.get(role, (-1, 0))[0]:  # 0 spilled shows
            best[role] = (rss / 1e9, t)
    t_max = max(total, key=total.get)
    best["sum"] = (total[t_max] / 1e9, t_max)
    return best


def learn_vocab(work: Path) -> Path:
    """A vocab learned once from 8 MB of the prose corpus (not measured)."""
    out = work / "vocab"
    if not (out / "vocab.txt").exists():
        write_corpus(work / "vocab-corpus", max_bytes=8_000_000, files=4, repeat=True)
        cmd = [
            sys.executable,
            "-m",
            "pipeline",
            "build",
            "--input",
            str(work / "vocab-corpus" / "*.txt"),
            "--output",
            str(out),
            "--overwrite",
            "--vocab_size",
            "30522",
            "--dupe_factor",
            "1",
            "--num_shards",
            "1",
        ]
        subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    return out / "vocab.txt"


def curate_corpus(directory: Path, mb: float, files: int) -> None:
    """bench/curate_vs_datatrove.py's timed corpus, ``mb`` MB of jsonl in ``files`` files."""
    import types

    sys.path.insert(0, str(ROOT / "bench"))
    from curate_vs_datatrove import grown, main_corpus, planted_corpus, write_inputs

    settings = types.SimpleNamespace(copies=1000, near_rate=0.015, far_rate=0.2, seed=0, mb=mb)
    docs = main_corpus(directory.parent)
    texts = grown(planted_corpus(docs, settings), docs, settings)
    write_inputs(texts, directory, files, whole=False)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--command", choices=["build", "curate"], default="build")
    p.add_argument("--mb", type=float, nargs="+", default=[50, 200], help="corpus sizes")
    p.add_argument("--input", default=None, help="a corpus (glob) instead of --mb of prose")
    p.add_argument("--vocab_file", default=None, help="default: learned from 8 MB of prose")
    p.add_argument("--files", type=int, default=16, help="files per generated corpus")
    p.add_argument("--runners", nargs="+", choices=["direct", "dask"], default=["direct", "dask"])
    p.add_argument("--dupe_factor", type=int, default=5)
    p.add_argument("--memory_limit", default="8GiB", help="each Dask worker's --memory-limit")
    p.add_argument("--interval", type=float, default=0.25, help="seconds between samples")
    p.add_argument("--work", default=None, help="keep corpora and outputs here (reused)")
    p.add_argument("--timeline", default=None, help="write every sample to DIR/*.csv")
    p.add_argument(
        "--dask_npartitions",
        choices=("auto", "files"),
        default="auto",
        help="auto: the build's default (~8 MB of input each, at most one per range); files: "
        "one per input file",
    )
    p.add_argument(
        "--learn_vocab",
        action="store_true",
        help="learn a 30522-token vocab in the build (no --vocab_file)",
    )
    p.add_argument("extra", nargs="*", help="more build flags, after --")
    args = p.parse_args(argv)
    # A SIGTERM (say, from `timeout`) unwinds like Ctrl-C, so each Dask cluster is closed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    work = Path(args.work or tempfile.mkdtemp(prefix="pipeline-memory-"))
    curating = args.command == "curate"
    vocab = None if args.learn_vocab or curating else args.vocab_file or str(learn_vocab(work))
    corpora = []
    if args.input:
        size = sum(os.path.getsize(f) for f in glob.glob(args.input)) / 1e6
        corpora.append((size, args.input, len(glob.glob(args.input))))
    for mb in [] if args.input else args.mb:
        directory = work / f"{'curate-' if curating else ''}corpus-{mb:g}mb"
        if not directory.exists():
            if curating:
                curate_corpus(directory, mb, args.files)
            else:
                write_corpus(directory, max_bytes=int(mb * 1e6), files=args.files, repeat=True)
        pattern = "*.jsonl" if curating else "*.txt"
        if curating:  # never smaller than the planted corpus (32 MB): the size it has
            mb = sum(f.stat().st_size for f in directory.glob(pattern)) / 1e6
        corpora.append((mb, str(directory / pattern), args.files))
    print(f"cpus: {os.cpu_count()}; load average at start: {os.getloadavg()}", flush=True)
    results = []
    for mb, inputs, files in corpora:
        for runner in args.runners:
            out = work / f"{'curated' if curating else 'shards'}-{mb:g}mb-{runner}"
            cmd = [sys.executable, "-m", "pipeline", args.command, "--input", inputs]
            cmd += ["--output", str(out), "--overwrite", "true"]
            if curating:
                cmd += ["--dedup", "minhash", "--filters", "gopher_quality,c4"]
            else:
                given = ["--vocab_size", "30522"] if vocab is None else ["--vocab_file", vocab]
                cmd += [*given, "--dupe_factor", str(args.dupe_factor)]
            cmd += args.extra
            cluster = None
            if runner == "dask":
                cluster = DaskCluster(
                    work / f"dask-{mb:g}mb", workers=2, memory_limit=args.memory_limit
                ).start()
                cmd += [f"--runner={DASK_RUNNER}", f"--dask_client_address={cluster.address}"]
                if args.dask_npartitions == "files":
                    cmd.append(f"--dask_npartitions={files}")
            else:
                cmd += DIRECT
            try:
                wall, samples = run_and_sample(cmd, cluster, args.interval, Path(f"{out}.run.log"))
            finally:
                if cluster is not None:
                    cluster.close()
            if args.timeline:
                Path(args.timeline).mkdir(parents=True, exist_ok=True)
                with open(Path(args.timeline) / f"{mb:g}mb-{runner}.csv", "w", newline="") as f:
                    csv.writer(f).writerows([("seconds", "role", "rss_bytes"), *samples])
            for role, (gb, at) in sorted(peaks(samples).items()):
                row = {
                    "corpus_mb": round(mb, 1),
                    "runner": runner,
                    "wall_s": round(wall, 1),
                    "process": role,
                    "peak_rss_gb": round(gb, 3),
                    "at_s": round(at, 1),
                }
                results.append(row)
                print(
                    f"{mb:7.1f} MB  {runner:6s}  {wall:7.1f} s  {role:12s}  "
                    f"{gb:6.2f} GB at {at:6.1f} s",
                    flush=True,
                )
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
