"""MLM-only training: shards without next_sentence_label, masking at --mask-rate, evaluation at
one fixed rate, and the NSP loss left out (trainer/data.py, trainer/evaluate.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from model import BertConfig, BertForPreTraining
from tests.helpers import TINY


def _tiny_batch(b: int = 6, t: int = 12, labels: torch.Tensor | None = None) -> dict:
    gen = torch.Generator().manual_seed(0)
    positions = torch.tensor([[1, 3, 0]] * b)
    return {
        "input_ids": torch.randint(5, TINY["vocab_size"], (b, t), generator=gen),
        "segment_ids": torch.zeros(b, t, dtype=torch.long),
        "attention_mask": torch.ones(b, t, dtype=torch.long),
        "masked_lm_positions": positions,
        "masked_lm_ids": torch.randint(5, TINY["vocab_size"], (b, 3), generator=gen),
        "next_sentence_label": labels if labels is not None else torch.full((b,), -100),
    }


def test_all_ignored_nsp_labels_give_no_nsp_loss_and_no_nan():
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(**TINY)).eval()
    out = model(**_tiny_batch())
    assert out.nsp_loss.item() == 0.0 and torch.isfinite(out.loss)
    assert torch.equal(out.loss, out.mlm_loss)
    out.loss.backward()
    assert model.cls.seq_relationship.weight.grad.abs().max() == 0  # the NSP head learns nothing


def test_labelled_nsp_loss_is_torch_mean_bitwise():
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(**TINY)).eval()
    labels = torch.tensor([0, 1, 1, 0, 1, 1])
    out = model(**_tiny_batch(labels=labels))
    assert torch.equal(out.nsp_loss, F.cross_entropy(out.nsp_logits.float(), labels))
    half = torch.tensor([0, -100, 1, -100, 1, -100])  # the mean over the labelled rows only
    out = model(**_tiny_batch(labels=half))
    keep = half >= 0
    expected = F.cross_entropy(out.nsp_logits.float()[keep], half[keep])
    assert torch.allclose(out.nsp_loss, expected, atol=1e-6)
