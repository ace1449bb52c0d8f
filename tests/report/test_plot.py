import importlib.util
import json

import pytest

pytest.importorskip("matplotlib", reason="report.plot draws with matplotlib")

from report.plot import (
    EPOCH_LABEL,
    UNIGRAM_LABEL,
    accuracy_figure,
    epoch_ends,
    loss_figure,
    main,
    read_metrics,
    throughput_figure,
)

BASELINES = {"mlm_baseline_accuracy": 0.06, "nsp_baseline_accuracy": 0.52, "mlm_unigram_loss": 6.3}


def make_records(steps=20, baselines=True) -> list[dict]:
    records = []
    for s in range(1, steps + 1):
        records.append(
            {
                "step": s,
                "split": "train",
                "loss": 10 - s * 0.2,
                "mlm_loss": 9 - s * 0.2,
                "nsp_loss": 0.7,
                "mlm_accuracy": s / 40,
                "nsp_accuracy": 0.5 + s / 100,
                "lr": 1e-4 * s / steps,
                "sequences_per_s": 30.0,
                "tokens_per_s": 3000.0,
                "mfu": None,
            }
        )
        if s % 10 == 0:
            evaluation = {
                "step": s,
                "split": "eval",
                "mlm_accuracy": s / 50,
                "nsp_accuracy": 0.6,
                "mlm_loss": 8 - s * 0.1,
            }
            records.append({**evaluation, **(BASELINES if baselines else {})})
    return records


def write_metrics(path, records):
    path.write_text("\n".join(json.dumps(r) for r in records) + '\n{"step": 21, "lo')


def split(records) -> tuple[list[dict], list[dict]]:
    train = [r for r in records if r["split"] == "train"]
    return train, [r for r in records if r["split"] == "eval"]


def lines(fig) -> dict[str, object]:
    """Label -> Line2D over every axes of the figure."""
    return {line.get_label(): line for ax in fig.axes for line in ax.get_lines()}


def flat_at(line, y) -> bool:
    return line.get_linestyle() == "--" and set(line.get_ydata()) == {y}


def test_plots_every_figure_and_skips_a_torn_line(tmp_path):
    write_metrics(tmp_path / "metrics.jsonl", make_records())
    train, evaluation = read_metrics(tmp_path / "metrics.jsonl")
    assert len(train) == 20 and len(evaluation) == 2
    assert main([str(tmp_path)]) == 0
    for name in ("loss.png", "accuracy.png", "lr.png", "throughput.png"):
        assert (tmp_path / "plots" / name).read_bytes()[:4] == b"\x89PNG"


def test_loss_has_the_unigram_line_and_accuracies_their_baselines():
    train, evaluation = split(make_records())
    loss = lines(loss_figure(train, evaluation))
    assert flat_at(loss[UNIGRAM_LABEL], 6.3)
    assert list(loss["MLM (eval)"].get_ydata()) == [7.0, 6.0]
    accuracy = lines(accuracy_figure(train, evaluation))
    assert flat_at(accuracy["MLM most-frequent-token baseline"], 0.06)
    assert flat_at(accuracy["NSP majority-class baseline"], 0.52)
    assert list(accuracy["MLM (eval)"].get_ydata()) == [0.2, 0.4]
    assert list(accuracy["NSP (eval)"].get_ydata()) == [0.6, 0.6]
    mlm_color = accuracy["MLM (eval)"].get_color()  # each baseline in its accuracy's colour
    assert accuracy["MLM most-frequent-token baseline"].get_color() == mlm_color


def test_throughput_puts_sequences_and_tokens_on_their_own_axes():
    train, _ = split(make_records())
    fig = throughput_figure(train)
    assert len(fig.axes) == 2
    (sequences,), (tokens,) = (ax.get_lines() for ax in fig.axes)
    assert sequences.get_label() == "sequences/s" and set(sequences.get_ydata()) == {30.0}
    assert tokens.get_label() == "real tokens/s" and set(tokens.get_ydata()) == {3000.0}


def test_an_older_run_without_baselines_still_plots(tmp_path):
    records = make_records(baselines=False)
    train, evaluation = split(records)
    assert UNIGRAM_LABEL not in lines(loss_figure(train, evaluation))
    assert not [k for k in lines(accuracy_figure(train, evaluation)) if "baseline" in k]
    write_metrics(tmp_path / "metrics.jsonl", records)
    assert main([str(tmp_path)]) == 0


@pytest.mark.parametrize("content", [None, ""])
def test_missing_or_empty_metrics_fail_clearly(tmp_path, content, caplog):
    if content is not None:
        (tmp_path / "metrics.jsonl").write_text(content)
    assert main([str(tmp_path)]) == 1
    assert "metrics.jsonl" in caplog.text


def epoch_lines(fig) -> list[float]:
    """Steps of the dotted epoch-end lines over every axes of the figure."""
    return [
        line.get_xdata()[0]
        for ax in fig.axes
        for line in ax.get_lines()
        if line.get_linestyle() == ":" and len(set(line.get_xdata())) == 1
    ]


def test_epoch_ends_are_interpolated_between_records():
    train = [
        {"step": 100, "epoch": 0.8},
        {"step": 150, "epoch": 1.2},
        {"step": 200, "epoch": 1.6},
        {"step": 300, "epoch": 2.4},
        {"step": 400, "epoch": 3.2},
    ]
    ends = epoch_ends(train)
    assert [k for k, _ in ends] == [1, 2, 3]
    assert [step for _, step in ends] == pytest.approx([125.0, 250.0, 375.0])
    assert epoch_ends([{"step": 1}, {"step": 2}]) == []  # an older run: no epoch key


def test_plots_are_titled_by_what_they_show_and_the_legend_is_off_the_lines():
    train, evaluation = split(make_records())
    for fig in (loss_figure(train, evaluation), accuracy_figure(train, evaluation)):
        (ax,) = fig.axes
        assert "run" not in ax.get_title() and "held-out" in ax.get_title()
        legend = ax.get_legend()
        assert legend.get_bbox_to_anchor().bounds[0] > ax.get_window_extent().bounds[0]
        fig.canvas.draw()  # the legend lies right of the axes, over no line
        assert legend.get_window_extent().x0 >= ax.get_window_extent().x1


@pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None, reason="trains first: needs the train extra"
)
def test_epoch_markers_sit_where_a_test_runs_epochs_end(small_shards, tmp_path):
    """A real run of several epochs: each marker is at the step whose data position crosses
    a multiple of the shards' rows, on both the loss and the accuracy plot."""
    import json as json_

    from tests.helpers import args, records
    from trainer.run import main as train_main

    extra = ["--max-steps", "30", "--log-every", "1", "--save-every", "0", "--export-hf", "false"]
    assert train_main(args(tmp_path, small_shards, *extra)) == 0
    train = records(tmp_path / "out")
    rows = json_.loads((small_shards / "manifest.json").read_text())["num_rows"]
    per_step = train[0]["samples"] / train[0]["step"]  # the global batch
    expected = [k * rows / per_step for k in range(1, int(train[-1]["samples"] // rows) + 1)]
    assert len(expected) >= 1  # at least one epoch ends within the run
    assert [step for _, step in epoch_ends(train)] == pytest.approx(expected)
    for fig in (loss_figure(train, []), accuracy_figure(train, [])):
        assert epoch_lines(fig) == pytest.approx(expected)
        assert EPOCH_LABEL in lines(fig)


def test_mlm_only_runs_show_no_nsp_and_accuracies_name_their_masking_rates():
    records = []
    for r in make_records():
        r = {k: v for k, v in r.items() if not k.startswith("nsp")}
        if r["split"] == "train":
            r["mask_rate"] = 0.3
        else:
            r.update(eval_mask_rate=0.15, nsp_baseline_accuracy=None)
        records.append(r)
    train, evaluation = split(records)
    accuracy = lines(accuracy_figure(train, evaluation))
    assert not [label for label in accuracy if "NSP" in label], list(accuracy)
    # Training rows masked at 30% against held-out rows at 15%: said, not left to guess.
    assert "MLM (train, masked at 30%)" in accuracy and "MLM (eval, masked at 15%)" in accuracy
    assert not [label for label in lines(loss_figure(train, evaluation)) if "NSP" in label]
