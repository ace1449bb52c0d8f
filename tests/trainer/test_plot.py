import json

import pytest

from trainer.plot import main, read_metrics


def write_metrics(path, steps=20):
    records = []
    for s in range(1, steps + 1):
        records.append({"step": s, "loss": 10 - s * 0.2, "mlm_loss": 9 - s * 0.2, "nsp_loss": 0.7,
                        "mlm_accuracy": s / 40, "nsp_accuracy": 0.5 + s / 100, "lr": 1e-4 * s / steps,
                        "sequences_per_s": 30.0, "tokens_per_s": 3000.0, "mfu": None})  # fmt: skip
        if s % 10 == 0:
            records.append(
                {"step": s, "split": "eval", "mlm_accuracy": s / 50, "nsp_accuracy": 0.6}
            )
    path.write_text("\n".join(json.dumps(r) for r in records) + '\n{"step": 21, "lo')


def test_plots_every_figure_and_skips_a_torn_line(tmp_path):
    write_metrics(tmp_path / "metrics.jsonl")
    train, evaluation = read_metrics(tmp_path / "metrics.jsonl")
    assert len(train) == 20 and len(evaluation) == 2
    assert main([str(tmp_path)]) == 0
    for name in ("loss.png", "accuracy.png", "lr.png", "throughput.png"):
        assert (tmp_path / "plots" / name).read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("content", [None, ""])
def test_missing_or_empty_metrics_fail_clearly(tmp_path, content, caplog):
    if content is not None:
        (tmp_path / "metrics.jsonl").write_text(content)
    assert main([str(tmp_path)]) == 1
    assert "metrics.jsonl" in caplog.text
