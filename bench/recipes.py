"""The main job's three recipes, like for like: Google's NSP pairs with static 15% masks,
MLM-only rows masked by the trainer at 15%, and at 30%.

    python bench/recipes.py                       # 4,000 steps each, the three at once
    python bench/recipes.py --max-steps 400 --out runs/recipes-small
    python bench/recipes.py --train-minutes 30    # the same time budget instead of steps

Each recipe is ``bash scripts/quickstart.sh`` with its defaults (the same corpus, vocab,
model ``tiny``, batch, held-out documents) and ``OBJECTIVE``/``MASK_RATE`` set, in
``OUT/NAME``; the quickstart's default corpus is written once, into ``OUT/corpus``. The three run at the same time by default (``--one-at-a-time`` to run them in
turn), so they share the machine's load: their training times, under the same load, are
what one budget would give each. With ``--max-steps`` (default) the runs are reproducible
step for step; with ``--train-minutes`` each gets that budget.

Then every model is evaluated on every held-out set, so the recipes meet on the same rows:
the NSP build's held-out rows (Google's pairs with the pipeline's static 15% masks) and the
MLM build's held-out rows (packed sentences, masked by the trainer at a fixed 15% with a
fixed seed), each from the same held-out documents (the stdlib set and the packages' set).
A run's own sets are the quickstart's evaluations; the others are evaluated by resuming the
final checkpoint with its budget spent (no step runs), as the quickstart evaluates its
second set. The three builds learn the same vocab from the same corpus, which is checked
(a held-out set of another vocab is refused anyway). Every accuracy is printed beside its
most-frequent-token baseline on the same rows. The fill-mask demo runs each export on the
same ``--fillmask-n`` sentences of the NSP build's stdlib held-out rows (one segment each).

Results go to ``OUT/recipes.json`` and the table to the console.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

RECIPES = {  # name: the quickstart's settings
    "nsp": {"OBJECTIVE": "nsp"},
    "mlm15": {"OBJECTIVE": "mlm"},
    "mlm30": {"OBJECTIVE": "mlm", "MASK_RATE": "0.3"},
}
LABELS = {
    "nsp": "NSP pairs, static 15%",
    "mlm15": "MLM-only, dynamic 15%",
    "mlm30": "MLM-only, dynamic 30%",
}
HELD_OUT = {"heldout": "stdlib set", "heldout2": "packages' set"}
ROW_KINDS = {"nsp": "NSP rows", "mlm15": "MLM rows"}  # whose build's held-out rows


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_corpus(out: Path) -> dict[str, str]:
    """The quickstart's default corpus and held-out files, written once into ``out`` for
    every recipe: the quickstart's settings that name them."""
    if not (out / "corpus.json").is_file():
        cmd = [sys.executable, "-m", "pipeline", "corpus", "--output", str(out), "--files", "10"]
        cmd += ["--sources", "docstrings", "reference", "--packages", "default"]
        subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return {
        "CORPUS": f"{out}/stdlib-docs-00[0-8].txt {out}/packages-00?.txt",
        "HELDOUT": f"{out}/stdlib-docs-009.txt",
        "HELDOUT2": f"{out}/packages-heldout.txt",
    }


def quickstart(run: Path, settings: dict[str, str], budget: dict[str, str]) -> subprocess.Popen:
    run.mkdir(parents=True, exist_ok=True)
    corpus = run.parent / "corpus"
    if not (run / "corpus").exists():  # what the summary says the run trained on
        (run / "corpus").symlink_to(corpus)
    env = {**os.environ, **write_corpus(corpus), **settings, **budget, "RUN_DIR": str(run)}
    console = open(run.with_suffix(".console"), "w")  # noqa: SIM115 (closed with the process)
    return subprocess.Popen(
        ["bash", "scripts/quickstart.sh"], cwd=ROOT, env=env, stdout=console, stderr=console
    )


def records(path: Path) -> list[dict]:
    lines = path.read_text().splitlines() if path.is_file() else []
    return [json.loads(line) for line in lines if line.strip()]


def last_eval(path: Path) -> dict:
    evals = [r for r in records(path) if r.get("split") == "eval"]
    if not evals:
        sys.exit(f"no evaluation in {path}")
    return evals[-1]


def evaluate(run: Path, name: str, held_out: Path, out: Path, budget: list[str]) -> dict:
    """The final checkpoint of ``run`` on ``held_out`` (no step runs): its eval record (one
    already in ``out`` is read, for ``--reuse``)."""
    if (out / "metrics.jsonl").is_file():
        return last_eval(out / "metrics.jsonl")
    options = ["--mask-rate", RECIPES[name]["MASK_RATE"]] if "MASK_RATE" in RECIPES[name] else []
    cmd = [
        "deepspeed",
        "--num_gpus",
        "2",
        "--master_port",
        str(free_port()),
        "trainer/run.py",
        "--ds-config",
        "deploy/cpu.json",
        *options,
        "--data",
        str(run / "shards"),
        "--eval-data",
        str(held_out),
        "--model",
        "tiny",
        "--output-dir",
        str(out),
        "--resume",
        str(run / "train" / "checkpoints"),
        "--dropout",
        "0",
        *budget,
        "--export-hf",
        "false",
        "--save-every",
        "0",
    ]
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    with open(out.with_suffix(".log"), "w") as log:
        done = subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode:
        sys.exit(f"evaluation of {run} on {held_out} failed ({done.returncode}): {log.name}")
    return last_eval(out / "metrics.jsonl")


def fill_mask(run: Path, held_out: Path, n: int) -> tuple[int, int, int]:
    """(top 1, top 5, n) of the fill-mask demo of ``run``'s export on ``held_out``."""
    cmd = [sys.executable, "-m", "trainer.fillmask", str(run / "train" / "hf"), str(held_out)]
    done = subprocess.run([*cmd, "-n", str(n)], cwd=ROOT, capture_output=True, text=True)
    found = re.search(r"top 1: (\d+)/(\d+), in top 5: (\d+)/", done.stdout)
    if done.returncode or not found:
        sys.exit(f"fill-mask on {run} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return int(found[1]), int(found[3]), int(found[2])


def accuracy(record: dict, task: str) -> str:
    value, base = record.get(f"{task}_accuracy"), record.get(f"{task}_baseline_accuracy")
    if value is None:
        return "not trained" if task == "nsp" else "-"
    return f"{value:.3f} ({base:.3f})"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", default="runs/recipes", help="where the runs go (default: %(default)s)")
    p.add_argument("--max-steps", type=int, default=4000, help="steps per recipe (default 4000)")
    p.add_argument("--train-minutes", type=float, default=None, help="a time budget instead")
    p.add_argument("--one-at-a-time", action="store_true", help="the recipes in turn")
    p.add_argument("--fillmask-n", type=int, default=50, help="fill-mask sentences (default 50)")
    p.add_argument("--reuse", action="store_true", help="evaluate runs already in --out")
    args = p.parse_args(argv)
    out = Path(args.out).resolve()
    if args.train_minutes is not None:
        budget = {"TRAIN_MINUTES": f"{args.train_minutes:g}"}
    else:
        budget = {"MAX_STEPS": str(args.max_steps)}
    runs = {name: out / name for name in RECIPES}
    load = [os.getloadavg()]
    start = time.time()
    if not args.reuse:
        print(f"load average at start: {load[0]}; {budget}", flush=True)
        running = []
        for name, settings in RECIPES.items():
            running.append((name, quickstart(runs[name], settings, budget)))
            if args.one_at_a_time:
                running[-1][1].wait()
        for name, process in running:
            if process.wait():
                sys.exit(
                    f"{name}: the quickstart failed ({process.returncode}): see {name}.console"
                )
            print(f"{name}: done at {time.time() - start:.0f} s", flush=True)
        load.append(os.getloadavg())

    vocabs = {
        name: json.loads((run / "shards/manifest.json").read_text())["vocab"]["sha256"]
        for name, run in runs.items()
    }
    if len(set(vocabs.values())) != 1:
        sys.exit(f"the recipes learned different vocabs: {vocabs}")

    for held in HELD_OUT:  # the MLM recipes' own held-out builds are the same rows
        a, b = (sorted((runs[n] / held).glob("shard-*")) for n in ("mlm15", "mlm30"))
        if [x.read_bytes() for x in a] != [x.read_bytes() for x in b]:
            sys.exit(f"the MLM recipes' {held} builds differ: {a} against {b}")

    results = {}
    for name, run in runs.items():
        train = [r for r in records(run / "train/metrics.jsonl") if r.get("split") != "eval"]
        steps = max(r["step"] for r in train)
        final = [r for r in train if r.get("train_seconds") is not None]
        seconds = final[-1]["train_seconds"] if final else None
        # The trainer's own flags for a budget already spent: the steps it took.
        spent = ["--max-steps", str(steps)]
        result = {"steps": steps, "train_seconds": seconds, "eval": {}}
        for kind_run, kind in ROW_KINDS.items():
            for held, label in HELD_OUT.items():
                held_out = runs[kind_run] / held
                if not held_out.is_dir():
                    continue
                if RECIPES[kind_run]["OBJECTIVE"] == RECIPES[name]["OBJECTIVE"]:
                    # rows of the run's own kind: its quickstart evaluated its own build of
                    # these documents, the same rows (checked above)
                    metrics = run / ("train" if held == "heldout" else "eval2") / "metrics.jsonl"
                    record = last_eval(metrics)
                else:
                    target = run / f"xeval-{kind_run}-{held}"
                    record = evaluate(run, name, held_out, target, spent)
                result["eval"][f"{kind}, {label}"] = record
        top1, top5, n = fill_mask(run, runs["nsp"] / "heldout", args.fillmask_n)
        result["fill_mask"] = {"top1": top1, "top5": top5, "n": n}
        results[name] = result
        print(f"{name}: evaluated", flush=True)

    # Under one load the recipes' step times compare: what each had done when the first
    # one ended (its training seconds) is what that budget gives it, with the held-out MLM
    # accuracy of its last evaluation by then.
    budget_s = min(r["train_seconds"] for r in results.values() if r["train_seconds"])
    print(f"\nat the first recipe's end ({budget_s:.0f} s of training, the three running):")
    for name, run in runs.items():
        logged = records(run / "train/metrics.jsonl")
        train = [r for r in logged if r.get("split") != "eval" and r.get("train_seconds")]
        reached = max((r["step"] for r in train if r["train_seconds"] <= budget_s), default=0)
        evals = [r for r in logged if r.get("split") == "eval" and r["step"] <= reached]
        last = f"{accuracy(evals[-1], 'mlm')} at step {evals[-1]['step']}" if evals else "-"
        results[name]["at_budget"] = {"seconds": budget_s, "steps": reached}
        print(f"  {LABELS[name]}: step {reached}; MLM on its own stdlib rows then: {last}")

    sets = list(next(iter(results.values()))["eval"])
    print("\nheld-out MLM accuracy at 15% (most-frequent-token baseline on the same rows):")
    header = ["recipe", "steps", "train s", *sets, "NSP (NSP rows, stdlib)", "fill-mask 1/5"]
    print(" | ".join(header))
    for name, r in results.items():
        nsp = r["eval"][sets[0]]
        fm = r["fill_mask"]
        cells = [
            LABELS[name],
            str(r["steps"]),
            f"{r['train_seconds']:.0f}" if r["train_seconds"] is not None else "?",
            *(accuracy(r["eval"][s], "mlm") for s in sets),
            accuracy(nsp, "nsp"),
            f"{fm['top1']}/{fm['n']}, {fm['top5']}/{fm['n']}",
        ]
        print(" | ".join(cells))
    summary = {"budget": budget, "load": load, "vocab_sha256": vocabs["nsp"], "runs": results}
    (out / "recipes.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"\n{out / 'recipes.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
