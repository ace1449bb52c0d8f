"""Held-out evaluation: MLM and NSP loss and accuracy over one pass of a shard directory.

Every rank reads its slices of the evaluation stream (trainer/data.py, ``finite=True``), so
all ranks run the same number of forward passes (ZeRO-3 gathers weights in each); filler
rows that complete the last global batch carry no target and count nowhere. Sums are
all-reduced, so the result is over exactly the rows of the directory.

Each record also carries the trivial baselines of the same held-out rows, so an accuracy is
never read without its margin: ``mlm_baseline_accuracy`` (always predicting the most
frequent target token of these rows), ``nsp_baseline_accuracy`` (always predicting their
majority class) and ``mlm_unigram_loss`` (the entropy, in nats, of their target tokens: the
MLM loss of a model that ignores the context and knows only token frequencies).

Held-out MLM-only rows (trainer/masking.py EvalMasker) are masked at one fixed rate with a
fixed seed, the same positions in every run; they have no NSP target, and a model trained on
MLM-only shards has no trained NSP head: then the NSP keys are None and ``objective`` says
``mlm`` (``mlm+nsp`` otherwise).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import distributed

_KEYS = ("mlm_loss", "mlm_correct", "mlm_total", "nsp_loss", "nsp_correct", "nsp_total", "rows")


def batch_sums(out, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """float64 (7,): summed MLM loss, correct, targets; summed NSP loss, correct, targets;
    rows (those with a row id: not a filler).

    Args:
        out: the model output for ``batch`` (prediction_logits (R, V) over the
            prediction slots the head ran on, nsp_logits (B, 2)).
        batch: masked_lm_positions / masked_lm_ids (B, P), next_sentence_label (B,),
            -100 where a row has no NSP target; row_ids (B,), -1 on a filler row.
    """
    ids = out.prediction_targets(batch["masked_lm_positions"], batch["masked_lm_ids"])  # (R,)
    targets = ids != -100
    logits = out.prediction_logits.float()
    mlm_loss = F.cross_entropy(logits, ids, ignore_index=-100, reduction="sum")
    mlm_correct = (logits.argmax(-1) == ids).sum()
    labels = batch["next_sentence_label"]
    valid = labels >= 0
    nsp_loss = F.cross_entropy(out.nsp_logits.float(), labels, ignore_index=-100, reduction="sum")
    nsp_correct = ((out.nsp_logits.argmax(-1) == labels) & valid).sum()
    rows = (batch["row_ids"] >= 0).sum()
    values = (mlm_loss, mlm_correct, targets.sum(), nsp_loss, nsp_correct, valid.sum(), rows)
    return torch.stack([v.double() for v in values])


def baselines(target_counts: torch.Tensor, label_counts: torch.Tensor) -> dict[str, float]:
    """Trivial baselines from the held-out target histograms.

    Args:
        target_counts: float64 (V,), how often each token id is an MLM target.
        label_counts: float64 (2,), rows with next_sentence_label 0 and 1.

    Example: targets {7: 3, 9: 1}, labels (1, 3) -> mlm_baseline_accuracy 0.75,
    nsp_baseline_accuracy 0.75, mlm_unigram_loss 0.562 (nats); labels (0, 0) (MLM-only rows)
    -> nsp_baseline_accuracy None.
    """
    total = float(target_counts.sum())
    p = target_counts[target_counts > 0] / max(total, 1.0)
    labelled = float(label_counts.sum())
    return {
        "mlm_baseline_accuracy": float(target_counts.max()) / total if total else 0.0,
        "nsp_baseline_accuracy": float(label_counts.max()) / labelled if labelled else None,
        "mlm_unigram_loss": float(-(p * p.log()).sum()) if total else 0.0,
    }


@torch.no_grad()
def evaluate(engine, loader, device: torch.device, trains_nsp: bool = True) -> dict:
    """Held-out loss, accuracy and baselines (see the module docstring) over the whole loader;
    ``trains_nsp`` False (MLM-only training shards): no NSP values."""
    was_training = engine.module.training
    engine.eval()
    sums = torch.zeros(len(_KEYS), dtype=torch.float64, device=device)
    vocab_size = engine.module.config.vocab_size
    target_counts = torch.zeros(vocab_size, dtype=torch.float64, device=device)
    label_counts = torch.zeros(2, dtype=torch.float64, device=device)
    try:
        for batch in loader:
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            out = engine(
                batch["input_ids"],
                batch["segment_ids"],
                batch["attention_mask"],
                batch["masked_lm_positions"],
            )
            sums += batch_sums(out, batch)
            targets = batch["masked_lm_ids"][batch["masked_lm_positions"] != 0]
            target_counts += torch.bincount(targets, minlength=vocab_size).double()
            labels = batch["next_sentence_label"]
            label_counts += torch.bincount(labels[labels >= 0], minlength=2).double()
    finally:
        if was_training:
            engine.train()
    c = dict(zip(_KEYS, distributed.all_reduce_sum(sums).tolist(), strict=True))
    histograms = distributed.all_reduce_sum(torch.cat([target_counts, label_counts])).cpu()
    record = {
        **baselines(histograms[:vocab_size], histograms[vocab_size:]),
        "mlm_loss": c["mlm_loss"] / max(c["mlm_total"], 1.0),
        "mlm_accuracy": c["mlm_correct"] / max(c["mlm_total"], 1.0),
        "nsp_loss": c["nsp_loss"] / c["nsp_total"] if c["nsp_total"] else None,
        "nsp_accuracy": c["nsp_correct"] / c["nsp_total"] if c["nsp_total"] else None,
        "rows": int(c["rows"]),
        "objective": "mlm+nsp" if trains_nsp else "mlm",
    }
    if not trains_nsp:  # an untrained NSP head scored on NSP rows means nothing
        record.update(nsp_loss=None, nsp_accuracy=None, nsp_baseline_accuracy=None)
    return record
