"""trainer/evaluate.py: known-answer baselines, and evaluation over hand-made batches.

The batches hold 4 real rows with MLM targets {7: 3, 9: 1} and NSP labels (0: 1, 1: 3),
padding entries in ``masked_lm_positions`` (position 0, id 0, as trainer/data.py's
collate pads) and one filler row (no targets, label -100): every number below changes
if padding entries or the filler row were counted.
"""

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from model import BertConfig, BertForPreTraining
from model.bert import BertPreTrainingOutput
from trainer.evaluate import baselines, evaluate

TINY = BertConfig(
    vocab_size=200,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=64,
)
P = 5  # masked_lm_positions per row: 4 of 5 entries of each real row are padding
UNIGRAM = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))  # entropy of {7: 3, 9: 1}


def test_baselines_known_answer():
    target_counts = torch.zeros(10, dtype=torch.float64)
    target_counts[7], target_counts[9] = 3, 1
    got = baselines(target_counts, torch.tensor([1.0, 3.0], dtype=torch.float64))
    assert got == pytest.approx(
        {"mlm_baseline_accuracy": 0.75, "nsp_baseline_accuracy": 0.75, "mlm_unigram_loss": UNIGRAM}
    )
    assert round(UNIGRAM, 3) == 0.562  # the docstring's example


def test_baselines_of_nothing_are_zero_and_no_labels_none():
    empty = baselines(torch.zeros(10, dtype=torch.float64), torch.zeros(2, dtype=torch.float64))
    assert empty == {
        "mlm_baseline_accuracy": 0.0,
        "nsp_baseline_accuracy": None,  # MLM-only rows: no NSP label, no baseline
        "mlm_unigram_loss": 0.0,
    }


def _batch(lengths, targets, labels, row_ids, *, seed):
    """A collated batch: rows of ``lengths`` real tokens, ``targets`` [(position, id), ...]
    per row (padded to P with position 0, id 0), ``labels`` next_sentence_label."""
    g = torch.Generator().manual_seed(seed)
    b, t = len(lengths), 8 * math.ceil(max(lengths) / 8)
    batch = {
        "input_ids": torch.zeros(b, t, dtype=torch.long),
        "segment_ids": torch.zeros(b, t, dtype=torch.long),
        "attention_mask": torch.zeros(b, t, dtype=torch.long),
        "masked_lm_positions": torch.zeros(b, P, dtype=torch.long),
        "masked_lm_ids": torch.zeros(b, P, dtype=torch.long),
        "next_sentence_label": torch.tensor(labels),
        "row_ids": torch.tensor(row_ids),
    }
    for r, (n, row_targets) in enumerate(zip(lengths, targets, strict=True)):
        batch["input_ids"][r, :n] = torch.randint(5, TINY.vocab_size, (n,), generator=g)
        batch["segment_ids"][r, n // 2 : n] = 1
        batch["attention_mask"][r, :n] = 1
        for k, (position, token) in enumerate(row_targets):
            batch["masked_lm_positions"][r, k] = position
            batch["masked_lm_ids"][r, k] = token
            batch["input_ids"][r, position] = 103  # [MASK]
    return batch


def make_batches():
    """Two batches: 4 real rows, targets {7: 3, 9: 1}, labels (1, 0, 1, 1), one filler row."""
    return [
        _batch([8, 6], [[(2, 7)], [(3, 9)]], [1, 0], [0, 1], seed=0),
        _batch([12, 5, 9], [[(4, 7)], [(1, 7)], []], [1, 1, -100], [2, 3, -1], seed=1),
    ]


class Engine(nn.Module):
    """What evaluate() uses of a DeepSpeed engine: module, eval(), train(), __call__."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, *args):
        return self.module(*args)


class Uniform(nn.Module):
    """A model with all-zero logits: every target costs ln V, every argmax is 0."""

    def __init__(self, vocab_size: int):
        super().__init__()
        self.config = SimpleNamespace(vocab_size=vocab_size)

    def forward(self, input_ids, segment_ids, attention_mask, masked_lm_positions):
        b, p = masked_lm_positions.shape
        return BertPreTrainingOutput(
            loss=None,
            mlm_loss=None,
            nsp_loss=None,
            prediction_logits=torch.zeros(b * p, self.config.vocab_size),
            nsp_logits=torch.zeros(b, 2),
            hidden=None,
            pooled_output=None,
            prediction_index=torch.arange(b * p),
            prediction_shape=(b, p),
        )


def test_evaluate_counts_only_real_targets_and_labels():
    engine = Engine(Uniform(TINY.vocab_size)).train()
    got = evaluate(engine, make_batches(), torch.device("cpu"))
    assert got.pop("objective") == "mlm+nsp"
    # Counted, the 21 padding entries (id 0) would be the most frequent target (21/25),
    # and argmax 0 would be "correct" on each of them.
    assert got == pytest.approx(
        {
            "mlm_baseline_accuracy": 0.75,
            "nsp_baseline_accuracy": 0.75,
            "mlm_unigram_loss": UNIGRAM,
            "mlm_loss": math.log(TINY.vocab_size),
            "mlm_accuracy": 0.0,
            "nsp_loss": math.log(2),
            "nsp_accuracy": 0.25,  # argmax 0 is right on the one label-0 row
            "rows": 4,
        }
    )
    assert engine.module.training  # put back in training mode


def test_evaluate_tiny_bert_matches_a_direct_computation():
    torch.manual_seed(0)
    model = BertForPreTraining(TINY)
    batches = make_batches()
    engine = Engine(model).eval()
    got = evaluate(engine, [dict(b) for b in batches], torch.device("cpu"))
    assert not engine.module.training  # left in eval mode
    mlm_losses, mlm_correct, nsp_losses, nsp_correct = [], 0, [], 0
    with torch.no_grad():
        for b in batches:
            out = model(
                b["input_ids"], b["segment_ids"], b["attention_mask"], b["masked_lm_positions"]
            )
            real = b["masked_lm_positions"] != 0
            logits, ids = out.mlm_logits[real], b["masked_lm_ids"][real]
            mlm_losses += F.cross_entropy(logits, ids, reduction="none").tolist()
            mlm_correct += int((logits.argmax(-1) == ids).sum())
            valid = b["next_sentence_label"] >= 0
            labels, nsp = b["next_sentence_label"][valid], out.nsp_logits[valid]
            nsp_losses += F.cross_entropy(nsp, labels, reduction="none").tolist()
            nsp_correct += int((nsp.argmax(-1) == labels).sum())
    assert len(mlm_losses) == 4 and len(nsp_losses) == 4
    assert got["mlm_loss"] == pytest.approx(sum(mlm_losses) / 4, rel=1e-5)
    assert got["mlm_accuracy"] == mlm_correct / 4
    assert got["nsp_loss"] == pytest.approx(sum(nsp_losses) / 4, rel=1e-5)
    assert got["nsp_accuracy"] == nsp_correct / 4
    assert got["rows"] == 4
    assert got["mlm_baseline_accuracy"] == 0.75 and got["nsp_baseline_accuracy"] == 0.75
    assert got["mlm_unigram_loss"] == pytest.approx(UNIGRAM)
