"""Metrics of ``python -m finetune``: accuracy, per-word tag F1, SQuAD EM/F1 (decoded and
scored in finetune/squad.py), Pearson and Spearman correlation.

What each task reports is described in the module doc of ``finetune/__main__.py``.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from finetune.data import IGNORE_INDEX, collate
from finetune.squad import Decoding, evaluate_qa

OUTSIDE_TAG = "O"


def f1_score(tp: int, n_pred: int, n_gold: int) -> float:
    """Harmonic mean of precision tp/n_pred and recall tp/n_gold; 0 when either is 0."""
    return 2 * tp / (n_pred + n_gold) if tp else 0.0


def ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks, ties given their average rank: ``[10, 20, 10, 5] -> [2.5, 4, 2.5, 1]``."""
    x = np.asarray(x, dtype=np.float64)
    order = np.argsort(x, kind="stable")
    sorted_x = x[order]
    # Each run of equal values [i, j) gets the mean of ranks i+1..j, (i + j + 1) / 2.
    starts = np.flatnonzero(np.r_[True, sorted_x[1:] != sorted_x[:-1]])
    ends = np.r_[starts[1:], len(x)]
    out = np.empty(len(x))
    out[order] = np.repeat((starts + ends + 1) / 2, ends - starts)
    return out


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson's r of two (N,) arrays; 0.0 when either is constant (r is undefined)."""
    x, y = np.asarray(x, np.float64) - np.mean(x), np.asarray(y, np.float64) - np.mean(y)
    denominator = math.sqrt(float(x @ x) * float(y @ y))
    return float(x @ y) / denominator if denominator else 0.0


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rho: Pearson's r of the ranks, ties averaged (scipy.stats.spearmanr's)."""
    return pearson(ranks(x), ranks(y))


@torch.no_grad()
def _outputs(model, features: list[dict], batch_size: int, pad_id: int):
    """Yields (features of a batch, their padded batch, the model's output) in eval mode."""
    model.eval()
    device = next(model.parameters()).device
    try:
        for i in range(0, len(features), batch_size):
            chunk = features[i : i + batch_size]
            batch = collate(chunk, pad_id)
            inputs = {
                k: batch[k].to(device) for k in ("input_ids", "segment_ids", "attention_mask")
            }
            yield chunk, batch, model(**inputs)
    finally:
        model.train()


def evaluate(
    task: str,
    model,
    features: list[dict],
    labels,
    batch_size: int,
    pad_id: int,
    decoding: Decoding | None = None,
) -> dict:
    """The task's metrics on ``features`` (see ``finetune/__main__.py``), as fractions in
    [0, 1]; QA decodes with ``decoding`` (default: ``Decoding()``)."""
    if task == "qa":
        logits = []
        for chunk, _, out in _outputs(model, features, batch_size, pad_id):
            start = out.start_logits.float().cpu().numpy()  # one copy per batch
            end = out.end_logits.float().cpu().numpy()
            for j, f in enumerate(chunk):
                n = len(f["input_ids"])
                logits.append((start[j, :n], end[j, :n]))
        return evaluate_qa(features, logits, decoding or Decoding())
    if task == "similarity":
        pairs = [
            (out.logits[:, 0].float().cpu(), batch["labels"])
            for _, batch, out in _outputs(model, features, batch_size, pad_id)
        ]
        pred = torch.cat([p for p, _ in pairs]).numpy()
        gold = torch.cat([g for _, g in pairs]).numpy()
        return {
            "pearson": pearson(pred, gold),
            "spearman": spearman(pred, gold),
            "mse": float(np.mean((pred - gold) ** 2)),
        }
    preds, golds = [], []
    for _, batch, out in _outputs(model, features, batch_size, pad_id):
        scored = batch["labels"] != IGNORE_INDEX  # (B,) or (B, T)
        preds.append(out.logits.argmax(-1).cpu()[scored])
        golds.append(batch["labels"][scored])
    pred, gold = torch.cat(preds), torch.cat(golds)
    metrics = {"accuracy": (pred == gold).float().mean().item()}
    if task == "token":
        outside = labels.index(OUTSIDE_TAG) if OUTSIDE_TAG in labels else -1
        tp = int(((pred == gold) & (gold != outside)).sum())
        metrics["f1"] = f1_score(tp, int((pred != outside).sum()), int((gold != outside).sum()))
    return metrics
