"""The quickstart's summary: each held-out accuracy beside its baseline; a plateau is loud."""

import importlib.util
import json

import pytest

from report.summary import main, overfitting, summary_lines

TRAIN = [
    {
        "step": s,
        "split": "train",
        "loss": 9.0 - s / 1000,
        "mlm_accuracy": 0.1,
        "nsp_accuracy": 0.6,
        "sequences_per_s": 40.0 + s / 100,
        "tokens_per_s": 3000.0,
    }
    for s in (500, 1000, 1500)
]
BASELINES = {
    "mlm_baseline_accuracy": 0.061,
    "nsp_baseline_accuracy": 0.512,
    "mlm_unigram_loss": 6.31,
}


def evaluation(mlm, nsp, **extra):
    return {
        "step": 1500,
        "split": "eval",
        "mlm_accuracy": mlm,
        "nsp_accuracy": nsp,
        "mlm_loss": 4.2,
        "rows": 800,
        **extra,
    }


def test_a_model_that_learned_gets_each_baseline_beside_its_accuracy_and_a_success_line():
    lines = summary_lines([*TRAIN, evaluation(0.312, 0.7, **BASELINES)])
    assert "  MLM accuracy 0.312 (most-frequent-token baseline 0.061, +0.251)" in lines
    assert "  NSP accuracy 0.700 (majority-class baseline 0.512, +0.188)" in lines
    assert "  MLM loss 4.200 (unigram (context-free) loss 6.310, -2.110)" in lines
    assert lines[-1].startswith("OK: the model learned")
    assert not any("WARNING" in line for line in lines)
    assert lines[0] == "throughput:  52.5 sequences/s, 3000 real tokens/s"  # steps 1000, 1500


@pytest.mark.parametrize(
    ("mlm", "nsp", "named"),
    [(0.07, 0.7, "MLM"), (0.312, 0.55, "NSP"), (0.061, 0.512, "MLM or NSP")],
)
def test_a_plateau_gives_a_loud_warning_instead_of_success(mlm, nsp, named):
    lines = summary_lines([*TRAIN, evaluation(mlm, nsp, **BASELINES)])
    text = "\n".join(lines)
    assert f"WARNING: the model did not learn {named} beyond a trivial baseline." in text
    assert "unigram plateau" in text and lines[-1].startswith("!!!!")
    assert len([line for line in lines if line.startswith("!!")]) >= 5
    assert not any(line.startswith("OK") for line in lines)


def test_the_time_to_the_first_step_is_beside_the_throughput():
    eager = [{**r, "first_step_s": 0.09, "compiled_graphs": None} for r in TRAIN]
    compiled = [{**r, "first_step_s": 21.44, "compiled_graphs": 8} for r in TRAIN]
    throughput = "throughput:  52.5 sequences/s, 3000 real tokens/s"
    assert summary_lines(eager)[0] == f"{throughput}; first step 0.1 s"
    assert summary_lines(compiled)[0] == f"{throughput}; first step 21.4 s (compiled, 8 graphs)"
    assert summary_lines(TRAIN)[0] == throughput  # records from before first_step_s


def test_older_records_without_baselines_print_without_a_verdict():
    lines = summary_lines([*TRAIN, evaluation(0.312, 0.7)])
    assert "  MLM accuracy 0.312 (no baseline in this run's records)" in lines
    assert not any(line.startswith(("OK", "!!")) for line in lines)


def test_no_evaluation_says_learning_was_not_checked():
    lines = summary_lines(TRAIN)
    assert lines[-1].endswith("learning not checked")


def test_main_prints_a_quickstarts_paths_and_metrics(tmp_path, capsys):
    for path in ("train/hf", "train/logs", "logs", "heldout"):
        (tmp_path / path).mkdir(parents=True)
    records = [*TRAIN, evaluation(0.312, 0.7, **BASELINES)]
    (tmp_path / "train" / "metrics.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in records) + '{"step": 16'
    )
    assert main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"HF export:   {tmp_path / 'train' / 'hf'}" in out and "OK: the model learned" in out
    assert f"logs:        {tmp_path / 'logs'}, {tmp_path / 'train' / 'logs'}" in out
    assert f"held-out:    {tmp_path / 'heldout'}" in out and "checkpoints:" not in out
    assert main([str(tmp_path / "nothing")]) == 1


@pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None, reason="trains first: needs the train extra"
)
def test_a_plain_trainer_output_dir_is_summarised(small_shards, tmp_path, capsys):
    """``trainer/run.py --output-dir OUT`` writes OUT/metrics.jsonl (no train/ below it)."""
    from tests.helpers import args
    from trainer.run import main as train

    extra = [
        "--max-steps",
        "2",
        "--log-every",
        "1",
        "--save-every",
        "0",
        "--eval-data",
        str(small_shards),
        "--eval-every",
        "2",
        "--plots",
        "true",
    ]
    assert train(args(tmp_path, small_shards, *extra)) == 0
    out = tmp_path / "out"
    capsys.readouterr()
    assert main([str(out)]) == 0
    text = capsys.readouterr().out
    assert "train (step 2, " in text and " epochs): loss" in text and "held-out (step 2" in text
    assert f"HF export:   {out / 'hf'}" in text and f"logs:        {out / 'logs'}" in text
    assert f"checkpoints: {out / 'checkpoints'}" in text  # the final one
    assert f"plots:       {out / 'plots'}\n" in text  # written by the trainer
    assert "shards:" not in text and "held-out:   " not in text  # none there: none named
    assert main([str(tmp_path)]) == 1  # neither layout: both places looked in are named
    err = capsys.readouterr().err
    assert f"no metrics.jsonl in {tmp_path} " in err and f"nor in {tmp_path / 'train'} " in err


def losses(mlm, nsp, **accuracies):
    """Eval records at steps 500, 1000, ... with these held-out losses."""
    return [
        {
            "step": 500 * (i + 1),
            "split": "eval",
            "mlm_accuracy": 0.3,
            "nsp_accuracy": 0.8,
            "mlm_loss": m,
            "nsp_loss": n,
            "rows": 800,
            **BASELINES,
            **accuracies,
        }
        for i, (m, n) in enumerate(zip(mlm, nsp, strict=True))
    ]


def test_a_rising_held_out_loss_is_called_overfitting_with_what_to_do():
    records = [*TRAIN, *losses([5.0, 4.8, 4.82], [0.50, 0.47, 0.70])]
    lines = summary_lines(records)
    text = "\n".join(lines)
    assert overfitting(TRAIN, losses([5.0, 4.8, 4.82], [0.50, 0.47, 0.70])) == [
        "held-out NSP loss rose from its minimum 0.470 (step 1000) to 0.700 at step 1500 (+0.230)"
    ]  # MLM rose 0.02, within LOSS_RISE
    assert "WARNING: the model memorises its training rows (overfitting):" in text
    assert "more text" in text and "fewer epochs" in text
    assert not any(line.startswith("OK") for line in lines)


@pytest.mark.parametrize("curve", [[0.6, 0.5, 0.45], [0.5, 0.5, 0.5], [0.5, 0.47, 0.5]])
def test_a_flat_or_falling_held_out_loss_is_not_overfitting(curve):
    evals = losses([5.0, 4.8, 4.7], curve)
    assert overfitting(TRAIN, evals) == []
    assert summary_lines([*TRAIN, *evals])[-1].startswith("OK: the model learned and generalizes")


def test_a_wide_train_held_out_accuracy_gap_is_called_overfitting():
    train = [{**r, "nsp_accuracy": 0.98} for r in TRAIN]  # held out: 0.8
    found = overfitting(train, losses([5.0, 4.9], [0.5, 0.45]))
    assert found == ["NSP accuracy 0.180 higher on training rows (0.980) than held out (0.800)"]


def test_a_gap_on_one_of_two_held_out_sets_is_a_domain_shift_not_memorising():
    """Training NSP 0.90: 0.20 above the first held-out set (0.70, another source than most
    of the corpus) but 0.04 above the second (0.86, a slice of the corpus itself)."""
    train = [{**r, "nsp_accuracy": 0.90} for r in TRAIN]
    evals = losses([5.0, 4.9], [0.5, 0.45], nsp_accuracy=0.70)
    assert overfitting(train, evals) == [
        "NSP accuracy 0.200 higher on training rows (0.900) than held out (0.700)"
    ]
    assert overfitting(train, evals, {**evals[-1], "nsp_accuracy": 0.86}) == []
    assert overfitting(train, evals, {**evals[-1], "nsp_accuracy": 0.78}) == [
        "NSP accuracy 0.120 higher on training rows (0.900) than held out (0.780)"
    ]  # both sets far below training: memorising


def test_the_corpus_and_a_second_held_out_set_are_printed(tmp_path, capsys):
    (tmp_path / "train").mkdir()
    (tmp_path / "eval2").mkdir()
    (tmp_path / "corpus").mkdir()
    lines = "".join(json.dumps(r) + "\n" for r in [*TRAIN, evaluation(0.312, 0.7, **BASELINES)])
    (tmp_path / "train" / "metrics.jsonl").write_text(lines)
    second = evaluation(0.35, 0.75, **BASELINES)
    (tmp_path / "eval2" / "metrics.jsonl").write_text(json.dumps(second) + "\n")
    manifest = {
        "bytes": 17_500_000,
        "sha256": "ab" * 32,
        "sources": [
            {"name": "python-docstrings", "version": "3.11.7"},
            {"name": "numpy", "version": "2.4.6"},
        ],
    }
    (tmp_path / "corpus" / "corpus.json").write_text(json.dumps(manifest))
    assert main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"corpus:      17.5 MB, sha256 {'ab' * 32}" in out
    assert "python-docstrings 3.11.7, numpy 2.4.6" in out
    assert "second held-out (step 1500, 800 rows):\n  MLM accuracy 0.350" in out
