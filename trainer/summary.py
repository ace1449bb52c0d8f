"""``python -m trainer.summary RUN_DIR``: what a training run wrote, and whether the model learned.

    python -m trainer.summary runs/tiny            # trainer/run.py --output-dir runs/tiny
    python -m trainer.summary runs/quickstart      # the last step of scripts/quickstart.sh

RUN_DIR is a trainer output directory (``metrics.jsonl``, ``checkpoints/``, ``hf/``,
``logs/``) or a quickstart run, which holds one in ``train/`` beside ``shards/`` and
``heldout/``. Reads the ``metrics.jsonl`` (and a quickstart's ``shards/manifest.json``) and
prints the output paths that exist, the throughput, the last training record and each held-out accuracy beside its
trivial baseline on the same rows (trainer/evaluate.py): always predicting the most frequent
token for MLM, the majority class for NSP. An accuracy less than ``MARGIN`` above its baseline
means the model learned token or label frequencies, not context (the unigram plateau); the
summary then ends with a loud warning instead of a success line.

Exit codes: 0 printed (a warning included), 1 no readable metrics.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from pipeline.options import CommandParser

MARGIN = 0.05  # accuracy above the trivial baseline that counts as learned
# (task, accuracy key, baseline key, baseline name)
TASKS = (
    ("MLM", "mlm_accuracy", "mlm_baseline_accuracy", "most-frequent-token baseline"),
    ("NSP", "nsp_accuracy", "nsp_baseline_accuracy", "majority-class baseline"),
)


def summary_lines(records: list[dict]) -> list[str]:
    """The metrics part of the summary, from the records of a metrics.jsonl.

    Example: a last eval record with mlm_accuracy 0.312, mlm_baseline_accuracy 0.061 gives
    ``"  MLM accuracy 0.312 (most-frequent-token baseline 0.061, +0.251)"``; with
    mlm_accuracy 0.070 instead, a ``WARNING`` block naming MLM ends the lines.
    """
    train = [r for r in records if r.get("split", "train") == "train"]
    evals = [r for r in records if r.get("split") == "eval"]
    lines = []
    speed = [r for r in train[len(train) // 2 :] if r.get("sequences_per_s")]  # past warm-up
    if speed:
        sequences = sum(r["sequences_per_s"] for r in speed) / len(speed)
        tokens = sum(r["tokens_per_s"] for r in speed) / len(speed)
        lines.append(f"throughput:  {sequences:.1f} sequences/s, {tokens:.0f} real tokens/s")
    if train:
        t = train[-1]
        # Accuracies on training rows have no baseline of their own and count memorised
        # rows: only the held-out ones below are printed (metrics.jsonl has both).
        lines.append(f"train (step {t['step']}): loss {t['loss']:.3f}")
    if not evals:
        lines.append("held-out:    no evaluation (no --eval-data): learning not checked")
        return lines
    e = evals[-1]
    rows = f", {e['rows']} rows" if "rows" in e else ""
    lines.append(f"held-out (step {e['step']}{rows}):")
    short = []  # (task, accuracy, baseline) at or near the baseline
    for task, key, baseline_key, baseline_name in TASKS:
        accuracy, baseline = e[key], e.get(baseline_key)
        if baseline is None:  # an older run: no baselines were computed
            lines.append(f"  {task} accuracy {accuracy:.3f} (no baseline in this run's records)")
            continue
        lines.append(f"  {task} accuracy {accuracy:.3f} ({baseline_name} {baseline:.3f}, "
                     f"{accuracy - baseline:+.3f})")  # fmt: skip
        if accuracy < baseline + MARGIN:
            short.append((task, accuracy, baseline))
    unigram = e.get("mlm_unigram_loss")
    if unigram is not None and e.get("mlm_loss") is not None:
        lines.append(f"  MLM loss {e['mlm_loss']:.3f} (unigram (context-free) loss "
                     f"{unigram:.3f}, {e['mlm_loss'] - unigram:+.3f})")  # fmt: skip
    if short:
        lines += _plateau_warning(short, e)
    elif all(e.get(baseline_key) is not None for _, _, baseline_key, _ in TASKS):
        lines.append(f"OK: the model learned: both held-out accuracies beat their trivial "
                     f"baselines by more than {MARGIN}.")  # fmt: skip
    return lines


def _plateau_warning(short: list[tuple[str, float, float]], e: dict) -> list[str]:
    banner = "!" * 78
    body = [f"WARNING: the model did not learn {' or '.join(t for t, _, _ in short)} "
            "beyond a trivial baseline."]  # fmt: skip
    for task, accuracy, baseline in short:
        body.append(f"  held-out {task} accuracy {accuracy:.3f} is less than {MARGIN} above "
                    f"its baseline {baseline:.3f} ({accuracy - baseline:+.3f}).")  # fmt: skip
    if e.get("mlm_unigram_loss") is not None and e.get("mlm_loss") is not None:
        body.append(f"  held-out MLM loss {e['mlm_loss']:.3f} vs the unigram (context-free) "
                    f"loss {e['mlm_unigram_loss']:.3f}.")  # fmt: skip
    body += [
        "  It does no better than guessing from how often tokens or labels occur, ignoring",
        "  the context (the unigram plateau). Train longer (MAX_STEPS), check the learning",
        "  rate and warm-up or the data, and look at the loss and accuracy plots.",
    ]
    return [banner, *(f"!! {line}" for line in body), banner]


def train_dir(run: Path) -> Path:
    """The trainer output directory of ``run``: ``run`` itself, or a quickstart's ``run/train``.

    Raises:
        FileNotFoundError: neither holds a metrics.jsonl (the message names both).
    """
    for candidate in (run, run / "train"):
        if (candidate / "metrics.jsonl").is_file():
            return candidate
    raise FileNotFoundError(
        f"no metrics.jsonl in {run} (a trainer --output-dir) nor in {run / 'train'} "
        "(a quickstart RUN_DIR)"
    )


def path_lines(run: Path, train: Path) -> list[str]:
    """Where the run put its outputs, those that exist (a quickstart's shards with their size
    from the manifest); ``train`` is ``run``'s trainer output directory (:func:`train_dir`)."""
    lines = []
    manifest_path = run / "shards" / "manifest.json"
    if manifest_path.exists():
        m = json.loads(manifest_path.read_text())
        lines.append(f"shards:      {run / 'shards'} ({m['num_rows']} rows, "
                     f"{len(m['shards'])} shard(s), vocab {m['vocab']['size']})")  # fmt: skip
    named = [("held-out:   ", [run / "heldout"]), ("checkpoints:", [train / "checkpoints"]),
             ("HF export:  ", [train / "hf"]), ("plots:      ", [run / "plots", train / "plots"]),
             ("logs:       ", [run / "logs", train / "logs"])]  # fmt: skip
    for name, paths in named:
        found = list(dict.fromkeys(p for p in paths if p.exists()))  # run == train: once
        if found:
            lines.append(f"{name} {', '.join(map(str, found))}")
    return lines


def read_records(path: Path) -> list[dict]:
    """The records of a metrics.jsonl; a torn last line (a killed run) is skipped.

    Raises:
        FileNotFoundError: no such file.
    """
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def main(argv: Sequence[str] | None = None) -> int:
    p = CommandParser(
        prog="python -m trainer.summary",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run_dir", help="a trainer --output-dir (metrics.jsonl) or a quickstart "
                   "RUN_DIR (shards/, train/metrics.jsonl)")  # fmt: skip
    run = Path(p.parse_args(argv).run_dir)
    try:
        train = train_dir(run)
        records = read_records(train / "metrics.jsonl")
    except OSError as err:
        print(f"no metrics to summarise: {err}", file=sys.stderr)
        return 1
    print("\n".join(path_lines(run, train) + summary_lines(records)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
