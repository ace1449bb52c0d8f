import json

import pytest

from trainer.plot import (
    UNIGRAM_LABEL,
    accuracy_figure,
    loss_figure,
    main,
    read_metrics,
    throughput_figure,
)

BASELINES = {"mlm_baseline_accuracy": 0.06, "nsp_baseline_accuracy": 0.52, "mlm_unigram_loss": 6.3}


def make_records(steps=20, baselines=True) -> list[dict]:
    records = []
    for s in range(1, steps + 1):
        records.append({"step": s, "split": "train", "loss": 10 - s * 0.2, "mlm_loss": 9 - s * 0.2,
                        "nsp_loss": 0.7, "mlm_accuracy": s / 40, "nsp_accuracy": 0.5 + s / 100,
                        "lr": 1e-4 * s / steps, "sequences_per_s": 30.0, "tokens_per_s": 3000.0,
                        "mfu": None})  # fmt: skip
        if s % 10 == 0:
            evaluation = {"step": s, "split": "eval", "mlm_accuracy": s / 50, "nsp_accuracy": 0.6,
                          "mlm_loss": 8 - s * 0.1}  # fmt: skip
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
    loss = lines(loss_figure(train, evaluation, "run"))
    assert flat_at(loss[UNIGRAM_LABEL], 6.3)
    assert list(loss["MLM (eval)"].get_ydata()) == [7.0, 6.0]
    accuracy = lines(accuracy_figure(train, evaluation, "run"))
    assert flat_at(accuracy["MLM most-frequent-token baseline"], 0.06)
    assert flat_at(accuracy["NSP majority-class baseline"], 0.52)
    assert list(accuracy["MLM (eval)"].get_ydata()) == [0.2, 0.4]
    assert list(accuracy["NSP (eval)"].get_ydata()) == [0.6, 0.6]
    mlm_color = accuracy["MLM (eval)"].get_color()  # each baseline in its accuracy's colour
    assert accuracy["MLM most-frequent-token baseline"].get_color() == mlm_color


def test_throughput_puts_sequences_and_tokens_on_their_own_axes():
    train, _ = split(make_records())
    fig = throughput_figure(train, "run")
    assert len(fig.axes) == 2
    (sequences,), (tokens,) = (ax.get_lines() for ax in fig.axes)
    assert sequences.get_label() == "sequences/s" and set(sequences.get_ydata()) == {30.0}
    assert tokens.get_label() == "real tokens/s" and set(tokens.get_ydata()) == {3000.0}


def test_an_older_run_without_baselines_still_plots(tmp_path):
    records = make_records(baselines=False)
    train, evaluation = split(records)
    assert UNIGRAM_LABEL not in lines(loss_figure(train, evaluation, "old"))
    assert not [k for k in lines(accuracy_figure(train, evaluation, "old")) if "baseline" in k]
    write_metrics(tmp_path / "metrics.jsonl", records)
    assert main([str(tmp_path)]) == 0


@pytest.mark.parametrize("content", [None, ""])
def test_missing_or_empty_metrics_fail_clearly(tmp_path, content, caplog):
    if content is not None:
        (tmp_path / "metrics.jsonl").write_text(content)
    assert main([str(tmp_path)]) == 1
    assert "metrics.jsonl" in caplog.text
