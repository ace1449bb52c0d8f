"""``python -m report.summary RUN_DIR``: what a training run wrote, and whether the model learned.

    python -m report.summary runs/tiny            # trainer/run.py --output-dir runs/tiny
    python -m report.summary runs/quickstart      # the last step of scripts/quickstart.sh

RUN_DIR is a trainer output directory (``metrics.jsonl``, ``checkpoints/``, ``hf/``,
``logs/``) or a quickstart run, which holds one in ``train/`` beside ``shards/`` and
``heldout/``. Reads the ``metrics.jsonl`` (and a quickstart's ``shards/manifest.json``) and
prints the output paths that exist, the throughput with the time to the first step
(compiling included: ``--compile``), the last training record and each held-out accuracy
beside its trivial baseline on the same rows (trainer/evaluate.py): always predicting the
most frequent token for MLM, the majority class for NSP. An accuracy less than ``MARGIN`` above its baseline
means the model learned token or label frequencies, not context (the unigram plateau); the
summary then ends with a loud warning instead of a success line. So it does when the model
memorises instead of generalizing (:func:`overfitting`): a held-out loss ending more than
``LOSS_RISE`` above its minimum, or a train/held-out accuracy gap over ``ACCURACY_GAP``.
A quickstart's second held-out set (``eval2/metrics.jsonl``, evaluated after training) is
printed beside the first, its ``corpus/corpus.json`` says what the run trained on, and its
``stages.jsonl`` each stage's time, the total and whether it kept the deadline
(report/stages.py). A run on MLM-only shards (records with ``objective: "mlm"``) trained no
NSP: the summary says so instead of comparing an untrained NSP head with its baseline, and
gives the fixed rate its held-out MLM rows were masked at.

Exit codes: 0 printed (a warning included), 1 no readable metrics.
"""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

from pipeline.options import CommandParser
from report.records import read_current
from report.stages import stage_lines

MARGIN = 0.05  # accuracy above the trivial baseline that counts as learned
# A held-out loss that ends more than this above its minimum: the model got worse on unseen
# rows while its training loss fell, i.e. it memorises (the main job's target, issue 24).
LOSS_RISE = 0.05
# Training minus held-out accuracy that counts as memorising. Not 0: sampling noise of a
# window of training rows and of ~800 held-out rows is about 0.01-0.02 (NSP), and a held-out
# set drawn from one source of a mixed corpus sits a few points off the training mix even
# without memorising; 0.10 is well beyond both, and below the 0.17 NSP gap (0.98 training,
# 0.81 held out) of a run that had memorised its 5 epochs.
ACCURACY_GAP = 0.10
GAP_WINDOW = 5  # training records averaged for the gap: one record is one --log-every window
# (task, accuracy key, baseline key, baseline name)
TASKS = (
    ("MLM", "mlm_accuracy", "mlm_baseline_accuracy", "most-frequent-token baseline"),
    ("NSP", "nsp_accuracy", "nsp_baseline_accuracy", "majority-class baseline"),
)


def trained_tasks(records: list[dict]) -> tuple[tuple[str, str, str, str], ...]:
    """The TASKS the run trained: MLM alone when its training records say ``objective``
    ``mlm`` (MLM-only shards), else both (older records have no ``objective``: NSP)."""
    train = [r for r in records if r.get("split", "train") == "train"]
    if train and train[-1].get("objective") == "mlm":
        return TASKS[:1]
    return TASKS


def summary_lines(records: list[dict], second: list[dict] | None = None) -> list[str]:
    """The metrics part of the summary, from the records of a metrics.jsonl (and those of a
    second held-out set's evaluation, ``second``, evaluated after training).

    Example: a last eval record with mlm_accuracy 0.312, mlm_baseline_accuracy 0.061 gives
    ``"  MLM accuracy 0.312 (most-frequent-token baseline 0.061, +0.251)"``; with
    mlm_accuracy 0.070 instead, a ``WARNING`` block naming MLM ends the lines; a held-out loss
    that ends more than ``LOSS_RISE`` above its minimum gives an overfitting ``WARNING``.
    """
    train = [r for r in records if r.get("split", "train") == "train"]
    evals = [r for r in records if r.get("split") == "eval"]
    lines = []
    speed = [r for r in train[len(train) // 2 :] if r.get("sequences_per_s")]  # past warm-up
    if speed:
        sequences = sum(r["sequences_per_s"] for r in speed) / len(speed)
        tokens = sum(r["tokens_per_s"] for r in speed) / len(speed)
        lines.append(
            f"throughput:  {sequences:.1f} sequences/s, {tokens:.0f} real tokens/s"
            + first_step(train[-1])
        )
    if train:
        t = train[-1]
        epochs = f", {t['epoch']:.2f} epochs" if t.get("epoch") is not None else ""
        # Accuracies on training rows have no baseline of their own and count memorised
        # rows: only the held-out ones below are printed (metrics.jsonl has both).
        lines.append(f"train (step {t['step']}{epochs}): loss {t['loss']:.3f}")
    tasks = trained_tasks(records)
    if tasks != TASKS:
        lines.append("objective:   MLM only (MLM-only shards): NSP was not trained")
    if not evals:
        lines.append("held-out:    no evaluation (no --eval-data): learning not checked")
        return lines
    short = _heldout_lines(evals[-1], "held-out", lines, tasks)
    second_evals = [r for r in second or () if r.get("split") == "eval"]
    if second_evals:
        short += _heldout_lines(second_evals[-1], "second held-out", lines, tasks)
    overfit = overfitting(train, evals, second_evals[-1] if second_evals else None, tasks)
    if short:
        lines += _plateau_warning(short, evals[-1])
    if overfit:
        lines += _overfit_warning(overfit)
    if not short and not overfit and all(evals[-1].get(k) is not None for _, _, k, _ in tasks):
        lines.append(
            f"OK: the model learned and generalizes: held-out accuracies beat their "
            f"trivial baselines by more than {MARGIN}, held-out losses end within "
            f"{LOSS_RISE} of their minimum, train/held-out accuracy gaps are under "
            f"{ACCURACY_GAP}."
        )
    return lines


def first_step(record: dict) -> str:
    """The time to the first step (``first_step_s``: compiling included, trainer/compiling.py)
    as the throughput line's end, or "" for records without it.

    Example: first_step_s 21.4, compiled_graphs 8 -> ``"; first step 21.4 s (compiled, 8
    graphs)"``; first_step_s 0.09, compiled_graphs None -> ``"; first step 0.1 s"``.
    """
    seconds = record.get("first_step_s")
    if seconds is None:
        return ""
    graphs = record.get("compiled_graphs")
    compiled = f" (compiled, {graphs} graphs)" if graphs is not None else ""
    return f"; first step {seconds:.1f} s{compiled}"


def _heldout_lines(
    e: dict, name: str, lines: list[str], tasks=TASKS
) -> list[tuple[str, float, float]]:
    """Appends one held-out record's accuracies of the trained ``tasks`` beside their
    baselines (and the MLM loss beside the unigram loss) to ``lines``; returns the (task,
    accuracy, baseline) near it."""
    rows = f", {e['rows']} rows" if "rows" in e else ""
    rate = e.get("eval_mask_rate")
    masked = f", masked at {100 * rate:g}%" if rate is not None else ""
    lines.append(f"{name} (step {e['step']}{rows}{masked}):")
    short = []  # (task, accuracy, baseline) at or near the baseline
    for task, key, baseline_key, baseline_name in tasks:
        accuracy, baseline = e.get(key), e.get(baseline_key)
        if accuracy is None:  # NSP trained, but these held-out rows have no NSP label
            lines.append(f"  {task} not evaluated (the held-out rows have no {task} target)")
            continue
        if baseline is None:  # an older run: no baselines were computed
            lines.append(f"  {task} accuracy {accuracy:.3f} (no baseline in this run's records)")
            continue
        lines.append(
            f"  {task} accuracy {accuracy:.3f} ({baseline_name} {baseline:.3f}, "
            f"{accuracy - baseline:+.3f})"
        )
        if accuracy < baseline + MARGIN:
            short.append((task if name == "held-out" else f"{task} ({name})", accuracy, baseline))
    unigram = e.get("mlm_unigram_loss")
    if unigram is not None and e.get("mlm_loss") is not None:
        lines.append(
            f"  MLM loss {e['mlm_loss']:.3f} (unigram (context-free) loss "
            f"{unigram:.3f}, {e['mlm_loss'] - unigram:+.3f})"
        )
    if tasks != TASKS:
        lines.append("  NSP not trained (MLM-only shards): no NSP accuracy or baseline")
    return short


def overfitting(
    train: list[dict], evals: list[dict], second: dict | None = None, tasks=TASKS
) -> list[str]:
    """What says the model memorises its training rows instead of generalizing, one line
    each ([] for none): a held-out loss (MLM, NSP) that ends more than ``LOSS_RISE`` above
    its minimum over the evaluations, or a training accuracy more than ``ACCURACY_GAP`` above
    the held-out one at the last evaluation (training accuracy: the mean of the training
    records of the last ``GAP_WINDOW`` logs up to that step).

    With a second held-out set (``second``: its last evaluation, at the same step), the gap
    is taken to the held-out set nearer the training accuracy: memorising shows on every
    unseen set, while a set from one source of a mixed corpus (the stdlib's docstrings in a
    corpus mostly of the packages' prose) sits lower on that one alone.

    Example: held-out NSP losses 0.47 (step 4500), 0.70 (step 6000) ->
    ``["held-out NSP loss rose from its minimum 0.470 (step 4500) to 0.700 at step 6000
    (+0.230)"]``.
    """
    found = []
    losses = (("MLM", "mlm_loss"), ("NSP", "nsp_loss"))[: len(tasks)]
    for task, key in losses:
        points = [(r["step"], r[key]) for r in evals if r.get(key) is not None]
        if len(points) < 2:
            continue
        best_step, best = min(points, key=lambda p: p[1])
        last_step, last = points[-1]
        if last - best > LOSS_RISE:
            found.append(
                f"held-out {task} loss rose from its minimum {best:.3f} (step "
                f"{best_step}) to {last:.3f} at step {last_step} ({last - best:+.3f})"
            )
    window = [r for r in train if r["step"] <= evals[-1]["step"]][-GAP_WINDOW:]
    for task, key, _, _ in tasks:
        values = [r[key] for r in window if r.get(key) is not None]
        held = [e[key] for e in (evals[-1], second) if e is not None and e.get(key) is not None]
        if values and held:
            trained, nearest = sum(values) / len(values), max(held)
            if trained - nearest > ACCURACY_GAP:
                found.append(
                    f"{task} accuracy {trained - nearest:.3f} higher on training rows "
                    f"({trained:.3f}) than held out ({nearest:.3f})"
                )
    return found


def _overfit_warning(found: list[str]) -> list[str]:
    banner = "!" * 78
    body = [
        "WARNING: the model memorises its training rows (overfitting):",
        *(f"  {line}." for line in found),
        "  Give it more text (a bigger corpus: CORPUS, CORPUS_PACKAGES) or fewer epochs",
        "  (a smaller TRAIN_MINUTES or MAX_STEPS: stop near the step of the lowest held-out",
        "  loss), or re-mask each epoch (--masking dynamic); see loss.png and accuracy.png,",
        "  where the dotted lines mark the epochs.",
    ]
    return [banner, *(f"!! {line}" for line in body), banner]


def _plateau_warning(short: list[tuple[str, float, float]], e: dict) -> list[str]:
    banner = "!" * 78
    body = [
        f"WARNING: the model did not learn {' or '.join(t for t, _, _ in short)} "
        "beyond a trivial baseline."
    ]
    for task, accuracy, baseline in short:
        body.append(
            f"  held-out {task} accuracy {accuracy:.3f} is less than {MARGIN} above "
            f"its baseline {baseline:.3f} ({accuracy - baseline:+.3f})."
        )
    if e.get("mlm_unigram_loss") is not None and e.get("mlm_loss") is not None:
        body.append(
            f"  held-out MLM loss {e['mlm_loss']:.3f} vs the unigram (context-free) "
            f"loss {e['mlm_unigram_loss']:.3f}."
        )
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
        lines.append(
            f"shards:      {run / 'shards'} ({m['num_rows']} rows, "
            f"{len(m['shards'])} shard(s), vocab {m['vocab']['size']})"
        )
    named = [
        ("held-out:   ", [run / "heldout", run / "heldout2"]),
        ("checkpoints:", [train / "checkpoints"]),
        ("HF export:  ", [train / "hf"]),
        ("plots:      ", [run / "plots", train / "plots"]),
        ("logs:       ", [run / "logs", train / "logs"]),
    ]
    for name, paths in named:
        found = list(dict.fromkeys(p for p in paths if p.exists()))  # run == train: once
        if found:
            lines.append(f"{name} {', '.join(map(str, found))}")
    return lines


def read_records(path: Path) -> list[dict]:
    """The records of a metrics.jsonl's current run (report/records.py); torn lines (a killed
    run's last) are skipped.

    Raises:
        FileNotFoundError: no such file.
    """
    return read_current(path)


def main(argv: Sequence[str] | None = None) -> int:
    p = CommandParser.of_doc("python -m report.summary", __doc__)
    p.add_argument(
        "run_dir",
        help="a trainer --output-dir (metrics.jsonl) or a quickstart "
        "RUN_DIR (shards/, train/metrics.jsonl)",
    )
    run = Path(p.parse_args(argv).run_dir)
    try:
        train = train_dir(run)
        records = read_records(train / "metrics.jsonl")
    except OSError as err:
        print(f"no metrics to summarise: {err}", file=sys.stderr)
        return 1
    second_path = run / "eval2" / "metrics.jsonl"  # a quickstart's second held-out set
    second = read_records(second_path) if second_path.is_file() else None
    lines = path_lines(run, train) + corpus_lines(run / "corpus" / "corpus.json")
    lines += stage_lines(run / "stages.jsonl")
    print("\n".join(lines + summary_lines(records, second)))
    return 0


def corpus_lines(path: Path) -> list[str]:
    """What the run trained on, from a quickstart's ``corpus/corpus.json``
    (pipeline/cli/corpus.py): size, sha256, each source with its version; [] without one."""
    if not path.is_file():
        return []
    m = json.loads(path.read_text(encoding="utf-8"))
    sources = ", ".join(f"{s['name']} {s['version']}" for s in m["sources"])
    return [
        f"corpus:      {m['bytes'] / 1e6:.1f} MB, sha256 {m['sha256']}",
        *textwrap.wrap(
            f"from: {sources}",
            90,
            initial_indent="             ",
            subsequent_indent="               ",
        ),
    ]


if __name__ == "__main__":
    sys.exit(main())
