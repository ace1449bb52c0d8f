"""``python -m trainer.plot RUN_DIR``: PNG plots of a training run's ``metrics.jsonl``.

Writes into ``RUN_DIR/plots/`` (or ``--out``): ``loss.png`` (total, MLM and NSP
loss, with evaluation points), ``accuracy.png`` (MLM and NSP accuracy, train and
eval), ``lr.png`` and ``throughput.png`` (sequences/s and real tokens/s), each
against the optimizer step. The trainer runs it at the end of training.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

logger = logging.getLogger(__name__)

# (file, title, [(key, label)], y label)
FIGURES = (
    ("loss.png", "Loss", [("loss", "total"), ("mlm_loss", "MLM"), ("nsp_loss", "NSP")], "loss"),
    ("accuracy.png", "Accuracy", [("mlm_accuracy", "MLM"), ("nsp_accuracy", "NSP")], "accuracy"),
    ("lr.png", "Learning rate", [("lr", "learning rate")], "lr"),
    ("throughput.png", "Throughput", [("sequences_per_s", "sequences/s"),
                                      ("tokens_per_s", "real tokens/s")], "per second"),
)  # fmt: skip


def read_metrics(path: str | os.PathLike) -> tuple[list[dict], list[dict]]:
    """(train records, eval records) of a metrics.jsonl; blank or torn last lines are skipped.

    Raises:
        FileNotFoundError: no such file.
    """
    train, evaluation = [], []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                logger.warning(
                    "%s: line %d is not JSON (a run killed mid-write?); skipped", path, number
                )
                continue
            (evaluation if record.get("split") == "eval" else train).append(record)
    return train, evaluation


def _series(records: list[dict], key: str) -> tuple[list, list]:
    points = [(r["step"], r[key]) for r in records if r.get(key) is not None and "step" in r]
    return [p[0] for p in points], [p[1] for p in points]


def plot_run(run_dir: str | os.PathLike, out_dir: str | os.PathLike | None = None) -> list[Path]:
    """Write the PNGs; returns their paths.

    Raises:
        FileNotFoundError: RUN_DIR has no metrics.jsonl.
        ValueError: it holds no training record.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pipeline.stats import save_png

    run_dir = Path(run_dir)
    train, evaluation = read_metrics(run_dir / "metrics.jsonl")
    if not train:
        raise ValueError(f"{run_dir / 'metrics.jsonl'} holds no training record")
    out = Path(out_dir) if out_dir else run_dir / "plots"
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, title, keys, ylabel in FIGURES:
        fig, ax = plt.subplots(figsize=(7, 4))
        for key, label in keys:
            ax.plot(*_series(train, key), label=f"{label} (train)")
            steps, values = _series(evaluation, key)
            if steps:
                ax.plot(steps, values, "o--", label=f"{label} (eval)")
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{title}: {run_dir.name}")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = out / name
        save_png(fig, path)
        plt.close(fig)
        paths.append(path)
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.plot", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("run_dir", help="a training output directory holding metrics.jsonl")
    p.add_argument("--out", default=None, help="where to write the PNGs (default: RUN_DIR/plots)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        paths = plot_run(args.run_dir, args.out)
    except (OSError, ValueError) as e:
        logger.error("%s", e)
        return 1
    for path in paths:
        logger.info("wrote %s", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
