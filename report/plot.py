"""``python -m report.plot RUN_DIR``: PNG plots of a training run's ``metrics.jsonl``.

Writes into ``RUN_DIR/plots/`` (or ``--output-dir``), each against the optimizer step:

- ``loss.png``: total, MLM and NSP loss (train lines, eval points) and a dashed line at the
  unigram (context-free) loss of the held-out MLM targets: an MLM loss on that line means
  the model has learnt token frequencies, not context. Dotted lines mark where each epoch
  of the training data ends (:func:`epoch_ends`): a training loss that drops there while
  the held-out one rises is a model memorising its rows.
- ``accuracy.png``: MLM and NSP accuracy (train lines, eval points) and dashed lines at their
  trivial baselines on the same held-out rows (most frequent token; majority class), the
  epochs' ends dotted too; the legend sits beside the axes, off the lines.
- ``lr.png``; ``throughput.png``: sequences/s and real tokens/s, each on its own y axis.

Records of older runs, without the baseline keys, plot without those lines. The trainer
runs this at the end of training.

Exit codes: 0 written, 1 no readable metrics, 2 bad flags or no matplotlib.
"""

from __future__ import annotations

import importlib.util
import itertools
import logging
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from pipeline.options import CommandParser
from report.records import read_current

logger = logging.getLogger(__name__)

LOSSES = (("loss", "total"), ("mlm_loss", "MLM"), ("nsp_loss", "NSP"))
# (accuracy key, label, baseline key of the eval records, baseline label)
ACCURACIES = (
    ("mlm_accuracy", "MLM", "mlm_baseline_accuracy", "MLM most-frequent-token baseline"),
    ("nsp_accuracy", "NSP", "nsp_baseline_accuracy", "NSP majority-class baseline"),
)
UNIGRAM_LABEL = "unigram (context-free) loss"
EPOCH_LABEL = "end of an epoch"


def read_metrics(path: str | os.PathLike) -> tuple[list[dict], list[dict]]:
    """(train records, eval records) of a metrics.jsonl's current run (report/records.py:
    none of a run started over in the same directory, none a resume did again); blank or
    torn lines are skipped.

    Raises:
        FileNotFoundError: no such file.
    """
    train, evaluation = [], []
    for record in read_current(path):
        (evaluation if record.get("split") == "eval" else train).append(record)
    return train, evaluation


def _series(records: list[dict], key: str) -> tuple[list, list]:
    points = [(r["step"], r[key]) for r in records if r.get(key) is not None and "step" in r]
    return [p[0] for p in points], [p[1] for p in points]


def _last(records: list[dict], key: str) -> float | None:
    """The last record's value of ``key`` (None when no record has it: an older run)."""
    values = [r[key] for r in records if r.get(key) is not None]
    return values[-1] if values else None


def epoch_ends(train: list[dict]) -> list[tuple[int, float]]:
    """(epoch, step) where each epoch of the training data ends, from the records' ``epoch``
    (stream position / rows, trainer/loop.py): the data position grows by one global batch a
    step, so the step where it crosses a whole epoch is interpolated between the two records
    around it. Records without ``epoch`` (older runs) give none.

    Example: records (step 100, epoch 0.8), (step 150, epoch 1.2) -> ``[(1, 125.0)]``.
    """
    points = [(r["step"], r["epoch"]) for r in train if r.get("epoch") is not None]
    ends = []
    for (s0, e0), (s1, e1) in itertools.pairwise(points):
        for k in range(math.floor(e0) + 1, math.floor(e1) + 1):
            ends.append((k, s0 + (k - e0) / (e1 - e0) * (s1 - s0)))
    return ends


def _mark_epochs(ax, train: list[dict]) -> None:
    """A dotted vertical line at each epoch's end, labelled with the epoch at the top."""
    for k, step in epoch_ends(train):
        ax.axvline(
            step,
            color="0.5",
            linestyle=":",
            linewidth=1,
            label=EPOCH_LABEL if k == 1 else "_nolegend_",
        )
        ax.annotate(
            f"epoch {k}",
            (step, 1),
            xycoords=("data", "axes fraction"),
            xytext=(2, -2),
            textcoords="offset points",
            va="top",
            fontsize=7,
            color="0.4",
        )


def _legend_outside(fig, ax) -> None:
    """The legend right of the axes, where it covers no line."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0, fontsize="small")
    fig.tight_layout()


def _axes(title: str, ylabel: str):
    from matplotlib.figure import Figure  # no pyplot: no global figure state to close

    fig = Figure(figsize=(9, 4))
    ax = fig.subplots()
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    return fig, ax


def _rate(records: list[dict], key: str) -> str:
    """``", masked at 15%"`` from the records' last ``key`` (a masking rate), else ``""``."""
    rate = _last(records, key)
    return f", masked at {100 * rate:g}%" if rate is not None else ""


def _curves(
    ax, train: list[dict], evaluation: list[dict], key: str, label: str, *, rates: bool = False
) -> str | None:
    """The train line and the eval points of ``key`` in one colour; returns the colour, or
    None when neither has data (NSP on MLM-only rows: no legend entry for it). ``rates``:
    name the masking rate of each (MLM accuracy: training rows may be masked at another
    rate than the held-out ones, and accuracy depends on it)."""
    train_points, (steps, values) = _series(train, key), _series(evaluation, key)
    if not train_points[0] and not steps:
        return None
    train_rate = _rate(train, "mask_rate") if rates else ""
    eval_rate = _rate(evaluation, "eval_mask_rate") if rates else ""
    (line,) = ax.plot(*train_points, label=f"{label} (train{train_rate})")
    if steps:
        ax.plot(steps, values, "o:", color=line.get_color(), label=f"{label} (eval{eval_rate})")
    return line.get_color()


def loss_figure(train: list[dict], evaluation: list[dict]):
    """Losses, with the held-out unigram loss (``mlm_unigram_loss``) as a dashed line and
    the epochs' ends as dotted ones."""
    fig, ax = _axes("Training and held-out loss (MLM, NSP, total)", "loss (nats)")
    colors = {key: _curves(ax, train, evaluation, key, label) for key, label in LOSSES}
    unigram = _last(evaluation, "mlm_unigram_loss")
    if unigram is not None and colors["mlm_loss"] is not None:
        ax.axhline(unigram, color=colors["mlm_loss"], linestyle="--", label=UNIGRAM_LABEL)
    _mark_epochs(ax, train)
    _legend_outside(fig, ax)
    return fig


def accuracy_figure(train: list[dict], evaluation: list[dict]):
    """Accuracies, each with its held-out trivial baseline as a dashed line, and the epochs'
    ends as dotted lines; the legend beside the axes, off the lines."""
    fig, ax = _axes(
        "Training and held-out accuracy (MLM, NSP) beside trivial baselines", "accuracy"
    )
    for key, label, baseline_key, baseline_label in ACCURACIES:
        color = _curves(ax, train, evaluation, key, label, rates=key == "mlm_accuracy")
        baseline = _last(evaluation, baseline_key)
        if baseline is not None and color is not None:
            ax.axhline(baseline, color=color, linestyle="--", label=baseline_label)
    ax.set_ylim(0, 1)
    _mark_epochs(ax, train)
    _legend_outside(fig, ax)
    return fig


def lr_figure(train: list[dict]):
    fig, ax = _axes("Learning rate schedule", "lr")
    ax.plot(*_series(train, "lr"), label="learning rate")
    ax.legend()
    fig.tight_layout()
    return fig


def throughput_figure(train: list[dict]):
    """Sequences/s on the left axis, real tokens/s on the right: on one axis the first
    (about 100 times smaller) would lie flat on zero."""
    fig, ax = _axes("Training throughput", "sequences/s")
    (sequences,) = ax.plot(*_series(train, "sequences_per_s"), color="C0", label="sequences/s")
    right = ax.twinx()
    (tokens,) = right.plot(*_series(train, "tokens_per_s"), color="C1", label="real tokens/s")
    right.set_ylabel("real tokens/s")
    for axis, line in ((ax, sequences), (right, tokens)):
        axis.set_ylim(bottom=0)
        axis.yaxis.label.set_color(line.get_color())
    ax.legend(handles=[sequences, tokens], loc="lower right")
    fig.tight_layout()
    return fig


def plot_run(run_dir: str | os.PathLike, out_dir: str | os.PathLike | None = None) -> list[Path]:
    """Write the PNGs; returns their paths.

    Raises:
        FileNotFoundError: RUN_DIR has no metrics.jsonl.
        ValueError: it holds no training record.
    """
    import io

    from pipeline.shards.shard_writer import atomic_write_bytes

    run_dir = Path(run_dir)
    train, evaluation = read_metrics(run_dir / "metrics.jsonl")
    if not train:
        raise ValueError(f"{run_dir / 'metrics.jsonl'} holds no training record")
    out = Path(out_dir) if out_dir else run_dir / "plots"
    out.mkdir(parents=True, exist_ok=True)
    figures = {
        "loss.png": loss_figure(train, evaluation),
        "accuracy.png": accuracy_figure(train, evaluation),
        "lr.png": lr_figure(train),
        "throughput.png": throughput_figure(train),
    }
    for name, fig in figures.items():
        png = io.BytesIO()
        fig.savefig(png, format="png", dpi=100, bbox_inches="tight")  # the legend outside
        atomic_write_bytes(out / name, png.getvalue())
    return [out / name for name in figures]


def main(argv: Sequence[str] | None = None) -> int:
    p = CommandParser.of_doc("python -m report.plot", __doc__)
    p.add_argument("run_dir", help="a training output directory holding metrics.jsonl")
    p.add_argument(
        "--output-dir", default=None, help="where to write the PNGs (default: RUN_DIR/plots)"
    )
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if importlib.util.find_spec("matplotlib") is None:
        logger.error("python -m report.plot needs matplotlib: pip install matplotlib")
        return 2
    try:
        paths = plot_run(args.run_dir, args.output_dir)
    except (OSError, ValueError) as e:
        logger.error("%s", e)
        return 1
    for path in paths:
        logger.info("wrote %s", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
