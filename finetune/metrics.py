"""Metrics of ``python -m finetune``: accuracy, per-word tag F1, SQuAD EM/F1, Pearson and
Spearman correlation.

What each task reports is described in the module doc of ``finetune/__main__.py``.
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from collections.abc import Sequence

import numpy as np
import torch

from finetune.data import IGNORE_INDEX, collate

MAX_ANSWER_TOKENS = 30  # longest span considered when decoding QA predictions
OUTSIDE_TAG = "O"


def f1_score(tp: int, n_pred: int, n_gold: int) -> float:
    """Harmonic mean of precision tp/n_pred and recall tp/n_gold; 0 when either is 0."""
    return 2 * tp / (n_pred + n_gold) if tp else 0.0


def squad_normalize(text: str) -> str:
    """SQuAD's answer normalisation: ``"The  Cat!"`` -> ``"cat"``."""
    text = "".join(c for c in text.lower() if c not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def squad_scores(prediction: str, answers: Sequence[str]) -> tuple[float, float]:
    """(exact match, token F1), each the best over the gold ``answers``."""
    pred = squad_normalize(prediction).split()
    best = (0.0, 0.0)
    for answer in answers:
        gold = squad_normalize(answer).split()
        common = sum((Counter(pred) & Counter(gold)).values())
        best = max(best, (float(pred == gold), f1_score(common, len(pred), len(gold))))
    return best


def best_span(start: torch.Tensor, end: torch.Tensor, allowed: torch.Tensor) -> tuple[int, int]:
    """argmax of start[s] + end[e] over allowed s <= e < s + MAX_ANSWER_TOKENS; all (T,)."""
    scores = start[:, None] + end[None, :]  # (T, T)
    s, e = torch.meshgrid(torch.arange(len(start)), torch.arange(len(end)), indexing="ij")
    ok = (e >= s) & (e - s < MAX_ANSWER_TOKENS) & allowed[:, None] & allowed[None, :]
    flat = int(scores.masked_fill(~ok, -math.inf).argmax())
    return divmod(flat, len(end))


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
    try:
        for i in range(0, len(features), batch_size):
            chunk = features[i : i + batch_size]
            batch = collate(chunk, pad_id)
            inputs = {k: batch[k] for k in ("input_ids", "segment_ids", "attention_mask")}
            yield chunk, batch, model(**inputs)
    finally:
        model.train()


def evaluate(task: str, model, features: list[dict], labels, batch_size: int, pad_id: int) -> dict:
    """The task's metrics on ``features`` (see ``finetune/__main__.py``), as fractions in [0, 1]."""
    if task == "qa":
        em = f1 = 0.0
        for chunk, batch, out in _outputs(model, features, batch_size, pad_id):
            width = batch["input_ids"].shape[1]
            for j, f in enumerate(chunk):
                mask = f["context_mask"] + [0] * (width - len(f["context_mask"]))
                s, e = best_span(out.start_logits[j], out.end_logits[j], torch.tensor(mask).bool())
                text = f["example"]["context"][f["offsets"][s][0] : f["offsets"][e][1]]
                scores = squad_scores(text, [a for a, _ in f["example"]["answers"]])
                em, f1 = em + scores[0], f1 + scores[1]
        return {"exact_match": em / len(features), "f1": f1 / len(features)}
    if task == "similarity":
        pairs = [(out.logits[:, 0].float(), batch["labels"]) for _, batch, out in
                 _outputs(model, features, batch_size, pad_id)]  # fmt: skip
        pred = torch.cat([p for p, _ in pairs]).numpy()
        gold = torch.cat([g for _, g in pairs]).numpy()
        return {"pearson": pearson(pred, gold), "spearman": spearman(pred, gold),
                "mse": float(np.mean((pred - gold) ** 2))}  # fmt: skip
    preds, golds = [], []
    for _, batch, out in _outputs(model, features, batch_size, pad_id):
        scored = batch["labels"] != IGNORE_INDEX  # (B,) or (B, T)
        preds.append(out.logits.argmax(-1)[scored])
        golds.append(batch["labels"][scored])
    pred, gold = torch.cat(preds), torch.cat(golds)
    metrics = {"accuracy": (pred == gold).float().mean().item()}
    if task == "token":
        outside = labels.index(OUTSIDE_TAG) if OUTSIDE_TAG in labels else -1
        tp = int(((pred == gold) & (gold != outside)).sum())
        metrics["f1"] = f1_score(tp, int((pred != outside).sum()), int((gold != outside).sum()))
    return metrics
