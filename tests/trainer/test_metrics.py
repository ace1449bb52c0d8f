"""Console lines of the training metrics: compact progress with an ETA, evaluations beside baselines."""

import pytest
import torch

from trainer.metrics import eval_line, format_duration, progress_line, target_histogram

TRAIN = {
    "step": 300,
    "split": "train",
    "loss": 6.1234,
    "mlm_accuracy": 0.1234,
    "nsp_accuracy": 0.654,
    "lr": 9e-4,
    "grad_norm": 1.2,
    "sequences_per_s": 46.2,
    "tokens_per_s": 3512.4,
    "mfu": None,
}


@pytest.mark.parametrize(
    ("seconds", "text"), [(None, "?"), (0.4, "0s"), (42, "42s"), (252, "4m12s"), (3720, "1h02m")]
)
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


def test_progress_line_is_compact_and_ends_with_the_eta():
    assert progress_line(TRAIN, 1500, 252) == (
        "step 300/1500  loss 6.1234  MLM acc 0.123  NSP acc 0.654  lr 9.00e-04  "
        "46.2 seq/s  3512 tok/s  ETA 4m12s"
    )
    assert progress_line({**TRAIN, "mfu": 0.412}, 1500, None).endswith("MFU 41.2%  ETA ?")
    with_baselines = {**TRAIN, "mlm_baseline_accuracy": 0.0612, "nsp_baseline_accuracy": 0.512}
    assert "MLM acc 0.123 (baseline 0.061)  NSP acc 0.654 (baseline 0.512)  lr" in progress_line(
        with_baselines, 1500, 252
    )


def test_target_histogram_counts_real_targets_and_labelled_rows():
    batch = {
        "masked_lm_positions": torch.tensor([[3, 5, 0], [1, 4, 0]]),
        # the zeros are padding; -100 at a real position has no target (as in the losses)
        "masked_lm_ids": torch.tensor([[7, 7, 0], [2, -100, 0]]),
        "next_sentence_label": torch.tensor([1, -100]),
    }
    counts = target_histogram(batch, vocab_size=9)
    assert counts.dtype == torch.float64 and counts.shape == (11,)
    assert counts[:9].tolist() == [0, 0, 1, 0, 0, 0, 0, 2, 0]
    assert counts[9:].tolist() == [0, 1]  # one row labelled 1, the unlabelled one not counted


def test_eval_line_puts_each_number_beside_its_baseline():
    record = {
        "step": 500,
        "split": "eval",
        "mlm_accuracy": 0.3124,
        "nsp_accuracy": 0.7,
        "mlm_loss": 5.1023,
        "mlm_baseline_accuracy": 0.0612,
        "nsp_baseline_accuracy": 0.512,
        "mlm_unigram_loss": 6.31,
    }
    assert eval_line(record) == (
        "eval at step 500: MLM acc 0.312 (most-frequent-token 0.061)  "
        "NSP acc 0.700 (majority 0.512)  MLM loss 5.102 (unigram 6.310)"
    )
    old = {"step": 500, "split": "eval", "mlm_accuracy": 0.3124, "nsp_accuracy": 0.7}
    assert eval_line(old) == "eval at step 500: MLM acc 0.312  NSP acc 0.700"


def test_model_flops_count_real_tokens_per_row_attention_and_real_predictions():
    from model import BertConfig
    from trainer.metrics import model_flops

    cfg = BertConfig(
        vocab_size=10,
        hidden_size=4,
        num_hidden_layers=1,
        num_attention_heads=1,
        intermediate_size=8,
    )
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    # 3 tokens x 256, 2² + 1² pairs x 16, 1 prediction x 112, 2 rows x 48; x3 (backward).
    assert model_flops(cfg, mask, 1) == 3 * (768 + 80 + 112 + 96)
