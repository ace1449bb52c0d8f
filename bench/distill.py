"""Does distillation pay on this corpus? A distilled student against the same student from scratch.

    python bench/distill.py                                  # ~50 min on 2 cores
    python bench/distill.py --run-dir runs/distill --steps 600 --teacher-minutes 15
    python bench/distill.py --teacher-preset mini --teacher-layers 0 --student-preset tiny
    python bench/distill.py --stop-after teacher             # shards and teacher only

Stages (each skipped when its output exists in ``--run-dir``, so a rerun reuses them):

1. ``shards``: the main job's data (scripts/quickstart.sh): Python's docstrings and language
   reference, files 0-8 -> training shards (vocab 8,000, dupe 5, seq 128), file 9 -> held-out
   shards with the same vocab.
2. ``teacher``: ``--teacher-preset`` with ``--teacher-layers`` (default: ``tiny``'s width,
   4 layers) trained by the main job's recipe (deploy/cpu.json, dropout 0, a
   ``--teacher-minutes`` time budget, two CPU ranks), exported to ``teacher/hf``. (``mini``
   for 10 minutes stayed on the unigram plateau on this machine under load.)
3. The student, the teacher's width with ``--student-layers`` (default 2: ``tiny``), for
   ``--steps`` steps: distilled (trainer/distillation.py, DistilBERT's loss weights and
   init from teacher layers) and from scratch on the hard MLM + NSP loss, with the same seed,
   data order, batch and schedule (``--max-steps``: the same rate step for step). With
   ``--ablations 1`` also: distilled from a random init (with and without the cosine term),
   and initialised from the teacher but trained on the hard loss alone, to tell the two
   halves of DistilBERT's recipe apart. ``--student-preset``: a student of another width
   too, distilled (random init, no cosine: the widths differ) and from scratch.
4. Each run ends with held-out MLM/NSP accuracy (trainer/evaluate.py); the table prints them
   beside the teacher's and beside the trivial baselines of the same held-out rows.
5. Inference speed: teacher and students (``BertForPreTraining`` forward with the MLM head at
   the masked positions, as evaluation runs it) on 8 batches of 32 held-out rows, fp32, the
   same threads, alternating rounds; the median round gives rows/s and the speed-up.

Results: the console and ``RUN_DIR/results.json``; every stage's log in ``RUN_DIR/logs/``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def run_stage(name: str, cmd: list[str], run_dir: Path) -> float:
    """Run ``cmd`` with its output in RUN_DIR/logs/NAME.log; returns its wall seconds.

    Raises:
        RuntimeError: the command failed (the end of its log is printed first).
    """
    path = run_dir / "logs" / f"{name}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(REPO), "BERT_VERBOSE": "1"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    log(f"{name}: {' '.join(cmd)}")
    start = time.perf_counter()
    with open(path, "w", encoding="utf-8") as out:
        done = subprocess.run(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        print("".join(path.read_text().splitlines(keepends=True)[-40:]), file=sys.stderr)
        raise RuntimeError(f"{name} failed with exit code {done.returncode} (log: {path})")
    log(f"{name}: done in {seconds:.0f} s ({path})")
    return seconds


def build_shards(run_dir: Path, workers: int) -> None:
    shards, heldout, corpus = run_dir / "shards", run_dir / "heldout", run_dir / "corpus"
    if (heldout / "manifest.json").is_file():
        log(f"shards: reusing {shards} and {heldout}")
        return
    py = sys.executable
    beam = [f"--direct_num_workers={workers}", "--direct_running_mode=multi_processing"]
    run_stage(
        "corpus",
        [
            py,
            "-m",
            "pipeline.cli.corpus",
            "--output",
            str(corpus),
            "--files",
            "10",
            "--sources",
            "docstrings",
            "reference",
        ],
        run_dir,
    )
    train_files = sorted(str(p) for p in corpus.glob("stdlib-docs-00[0-8].txt"))
    run_stage(
        "shards",
        [
            py,
            "-m",
            "pipeline",
            "build",
            "--input",
            *train_files,
            "--output",
            str(shards),
            "--overwrite",
            "--vocab_size",
            "8000",
            "--dupe_factor",
            "5",
            "--max_seq_length",
            "128",
            *beam,
        ],
        run_dir,
    )
    run_stage(
        "heldout",
        [
            py,
            "-m",
            "pipeline",
            "build",
            "--input",
            str(corpus / "stdlib-docs-009.txt"),
            "--output",
            str(heldout),
            "--overwrite",
            "--vocab_file",
            str(shards / "vocab.txt"),
            "--dupe_factor",
            "1",
            "--max_seq_length",
            "128",
            *beam,
        ],
        run_dir,
    )


def train(name: str, run_dir: Path, args, *flags: str) -> dict:
    """One trainer/run.py run (deepspeed launcher, --ranks CPU ranks) with held-out evaluation;
    returns {"seconds", "eval", "train"} (reused when RUN_DIR/NAME/hf exists)."""
    out = run_dir / name
    seconds = None
    if not (out / "hf" / "model.safetensors").is_file():
        shutil.rmtree(out, ignore_errors=True)
        launcher = shutil.which("deepspeed", path=str(Path(sys.executable).parent)) or "deepspeed"
        cmd = [
            launcher,
            "--num_gpus",
            str(args.ranks),
            "trainer/run.py",
            "--ds-config",
            args.ds_config,
            "--data",
            str(run_dir / "shards"),
            "--eval-data",
            str(run_dir / "heldout"),
            "--output-dir",
            str(out),
            "--dropout",
            "0",
            "--log-every",
            "50",
            "--save-every",
            "0",
            "--seed",
            str(args.seed),
            *flags,
        ]
        seconds = run_stage(name, cmd, run_dir)
    else:
        log(f"{name}: reusing {out}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if r["split"] == "eval"]
    trains = [r for r in records if r["split"] == "train"]
    return {"seconds": seconds, "eval": evals[-1], "train": trains[-1]}


def model_json(run_dir: Path, preset: str, layers: int) -> tuple[str, str]:
    """(name, --model): ``preset`` with ``layers`` layers as a config.json in RUN_DIR (the
    shards' vocab), or the preset's name when ``layers`` is its own depth or 0."""
    from model import PRESETS, BertConfig
    from pipeline.shards.shard_format import read_manifest

    if layers in (0, PRESETS[preset][0]):
        return preset, preset
    vocab = read_manifest(str(run_dir / "shards"))["vocab"]
    cfg = BertConfig.preset(
        preset,
        num_hidden_layers=layers,
        vocab_size=vocab["size"],
        pad_token_id=vocab["special_ids"]["pad"],
    )
    name = f"{preset}-{layers}L"
    cfg.to_json(run_dir / f"{name}.json")
    return name, str(run_dir / f"{name}.json")


def inference_speed(run_dir: Path, models: dict[str, Path], rounds: int, threads: int) -> dict:
    """Rows/s of each exported model over the held-out rows (median of alternating rounds)."""
    import torch

    from model import BertForPreTraining
    from trainer.data import PretrainingStream, StreamSpec
    from trainer.shards import ShardSet

    torch.set_num_threads(threads)
    loaded = {name: BertForPreTraining.from_hf(path).eval() for name, path in models.items()}
    stream = PretrainingStream(
        ShardSet(str(run_dir / "heldout")), StreamSpec(micro=32, world_size=1, rank=0, seed=0)
    )
    batches = [stream.batch(i) for i in range(8)]
    keys = ("input_ids", "segment_ids", "attention_mask", "masked_lm_positions")

    def forward(model) -> None:
        with torch.inference_mode():
            for b in batches:
                model(*(b[k] for k in keys))

    for model in loaded.values():  # warm-up
        forward(model)
    times: dict[str, list[float]] = {name: [] for name in loaded}
    for _ in range(rounds):
        for name, model in loaded.items():
            start = time.perf_counter()
            forward(model)
            times[name].append(time.perf_counter() - start)
    rows = sum(int(b["input_ids"].shape[0]) for b in batches)
    return {name: rows / statistics.median(t) for name, t in times.items()}


def table(results: dict) -> str:
    e0 = results["runs"]["teacher"]["eval"]
    lines = [
        f"held-out: {e0['rows']} rows; baselines: MLM most-frequent-token "
        f"{e0['mlm_baseline_accuracy']:.3f}, NSP majority {e0['nsp_baseline_accuracy']:.3f}, "
        f"MLM unigram loss {e0['mlm_unigram_loss']:.3f}",
        f"{'run':<34}{'steps':>7}{'train s':>9}{'MLM acc':>9}{'NSP acc':>9}{'MLM loss':>10}"
        f"{'rows/s inf':>12}{'speed-up':>10}",
    ]
    speed = results["inference_rows_per_s"]
    for name, r in results["runs"].items():
        e, t = r["eval"], r["train"]
        rate = speed.get("teacher" if name == "teacher" else r["model"])
        ratio = f"{rate / speed['teacher']:.2f}x" if rate else ""
        lines.append(
            f"{name:<34}{t['step']:>7}{t['train_seconds']:>9.0f}{e['mlm_accuracy']:>9.3f}"
            f"{e['nsp_accuracy']:>9.3f}{e['mlm_loss']:>10.3f}"
            f"{(f'{rate:.0f}' if rate else ''):>12}{ratio:>10}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run-dir", default="runs/distill")
    p.add_argument("--teacher-preset", default="tiny")
    p.add_argument("--teacher-layers", type=int, default=4, help="0: the preset's depth")
    p.add_argument("--teacher-minutes", type=float, default=15.0)
    p.add_argument("--student-layers", type=int, default=2, help="of the teacher's width")
    p.add_argument("--student-preset", help="a student of another width too (random init)")
    p.add_argument(
        "--ablations",
        type=int,
        default=1,
        help="1: also the same-width student distilled from a random init, and "
        "initialised from the teacher but trained on the hard loss alone",
    )
    p.add_argument("--steps", type=int, default=600, help="student optimizer steps")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--workers", type=int, default=2, help="Beam DirectRunner workers")
    p.add_argument("--ds-config", default="deploy/cpu.json")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--rounds", type=int, default=5, help="inference timing rounds")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--stop-after", choices=("shards", "teacher"))
    args = p.parse_args(argv)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    run_dir = (REPO / args.run_dir).resolve()
    start = time.perf_counter()
    build_shards(run_dir, args.workers)
    if args.stop_after == "shards":
        return 0
    name, model = model_json(run_dir, args.teacher_preset, args.teacher_layers)
    runs = {
        "teacher": train(
            "teacher", run_dir, args, "--model", model, "--max-minutes", str(args.teacher_minutes)
        )
    }
    runs["teacher"]["model"] = name
    if args.stop_after == "teacher":
        return 0
    teacher = ["--teacher", str(run_dir / "teacher" / "hf")]
    students = [model_json(run_dir, args.teacher_preset, args.student_layers)]
    if args.student_preset and args.student_preset != students[0][0]:
        students.append((args.student_preset, args.student_preset))
    models = {"teacher": run_dir / "teacher" / "hf"}
    for i, (name, model) in enumerate(students):
        steps = ["--model", model, "--max-steps", str(args.steps)]
        runs[f"{name}-distilled"] = train(f"{name}-distilled", run_dir, args, *steps, *teacher)
        runs[f"{name}-scratch"] = train(f"{name}-scratch", run_dir, args, *steps)
        if i == 0 and args.ablations:  # which half of DistilBERT's recipe does the work
            runs[f"{name}-distilled-random-init"] = train(
                f"{name}-distilled-random-init",
                run_dir,
                args,
                *steps,
                *teacher,
                "--distill-init",
                "random",
            )
            runs[f"{name}-distilled-random-init-no-cos"] = train(
                f"{name}-distilled-random-init-no-cos",
                run_dir,
                args,
                *steps,
                *teacher,
                "--distill-init",
                "random",
                "--distill-cos-weight",
                "0",
            )
            runs[f"{name}-teacher-init-hard-loss"] = train(
                f"{name}-teacher-init-hard-loss",
                run_dir,
                args,
                *steps,
                *teacher,
                "--distill-kl-weight",
                "0",
                "--distill-cos-weight",
                "0",
                "--distill-hard-weight",
                "1",
            )
        models[name] = run_dir / f"{name}-distilled" / "hf"
        for key in runs:
            runs[key].setdefault("model", name)
    log("inference speed ...")
    speed = inference_speed(run_dir, models, args.rounds, args.threads)
    results = {
        "settings": vars(args),
        "runs": runs,
        "inference_rows_per_s": speed,
        "wall_seconds": time.perf_counter() - start,
        "load_average": os.getloadavg(),
    }
    (run_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(table(results))
    log(f"results: {run_dir / 'results.json'} ({results['wall_seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
