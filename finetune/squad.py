"""QA answers from the logits of an example's windows, and SQuAD 1.1 / 2.0 scores.

Decoding (Google's run_squad.py ``write_predictions``): in each window the ``n_best_size``
highest start and end logits are paired; a pair is a candidate when both ends are context
tokens, the start has its max context in this window (finetune/qa.py), start <= end and
the span is at most ``max_answer_length`` tokens. The best candidate over all windows,
by start + end logit, is cut from the context by its token offsets. The null score is
start + end logit at [CLS], the smallest over the windows; with ``predict_null`` (the
training data had unanswerable questions) the answer is "" when null score - best span
score > ``null_score_diff_threshold``.

Scores follow the official SQuAD 2.0 evaluation script: answers normalised (lower case,
no punctuation, no articles, single spaces); "" matches an example without gold answers
(EM = F1 = 1), and any other prediction scores 0 there; the best over the gold answers
otherwise. Beside EM/F1 it reports the HasAns/NoAns splits and the threshold on
null score - best span score that would have scored best on this set (not applied).
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Decoding:
    """How QA logits become answers (the flags of the same names, finetune/config.py)."""

    n_best_size: int = 20
    max_answer_length: int = 30  # in tokens
    null_score_diff_threshold: float = 0.0
    predict_null: bool = False  # may the answer be "" (SQuAD 2.0)


def squad_normalize(text: str) -> str:
    """SQuAD's answer normalisation: ``"The  Cat!"`` -> ``"cat"``."""
    text = "".join(c for c in text.lower() if c not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def squad_scores(prediction: str, answers: Sequence[str]) -> tuple[float, float]:
    """(exact match, token F1), each the best over the gold ``answers``; an answer that
    normalises to nothing ("" for no answer) scores 1 against a prediction that does too,
    else 0 (the v2 script's rule). ``squad_scores("", [""]) -> (1.0, 1.0)``."""
    pred = squad_normalize(prediction).split()
    best = (0.0, 0.0)
    for answer in answers:
        gold = squad_normalize(answer).split()
        common = sum((Counter(pred) & Counter(gold)).values())
        if not pred or not gold:
            f1 = float(pred == gold)
        else:
            f1 = 2 * common / (len(pred) + len(gold)) if common else 0.0
        best = max(best, (float(pred == gold), f1))
    return best


def gold_answers(example: dict) -> list[str]:
    """The texts scored against: those that do not normalise to nothing, else ``[""]``."""
    return [a for a, _ in example["answers"] if squad_normalize(a)] or [""]


def best_span(
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    can_start: np.ndarray,
    can_end: np.ndarray,
    decoding: Decoding,
) -> tuple[float, int, int] | None:
    """``(score, start, end)`` of the best candidate span of one window, or None.

    Args:
        start_logits, end_logits: float (T,), the window's logits.
        can_start, can_end: bool (T,), positions a span may start / end at.
        decoding: ``n_best_size`` and ``max_answer_length``.
    """
    n = decoding.n_best_size
    starts = np.argsort(-start_logits, kind="stable")[:n]
    ends = np.argsort(-end_logits, kind="stable")[:n]
    best = None
    for s in starts:
        for e in ends:
            if not (can_start[s] and can_end[e] and s <= e < s + decoding.max_answer_length):
                continue
            score = float(start_logits[s] + end_logits[e])
            if best is None or score > best[0]:
                best = (score, int(s), int(e))
    return best


def decode_example(
    features: list[dict], logits: list[tuple[np.ndarray, np.ndarray]], decoding: Decoding
) -> tuple[str, str, float]:
    """The answer of one example from its windows' features and (start, end) logits.

    Returns:
        ``(prediction, best span text, null score - best span score)``: the prediction is
        "" when null answers are on and the difference is over the threshold; with no
        candidate span at all, ``("", "", inf)``.
    """
    null, best = math.inf, None
    for f, (start_logits, end_logits) in zip(features, logits, strict=True):
        null = min(null, float(start_logits[0] + end_logits[0]))
        at, (_, length) = f["context_position"], f["window"]
        can_end = np.zeros(len(start_logits), bool)
        can_end[at : at + length] = True
        can_start = can_end.copy()
        can_start[at : at + length] = f["max_context"]
        span = best_span(start_logits, end_logits, can_start, can_end, decoding)
        if span is not None and (best is None or span[0] > best[0]):
            best = (span[0], f, span[1], span[2])
    if best is None:
        return "", "", math.inf
    score, f, s, e = best
    first, last = (f["window"][0] + p - f["context_position"] for p in (s, e))
    text = f["example"]["context"][f["doc_offsets"][first][0] : f["doc_offsets"][last][1]]
    diff = null - score
    null_wins = decoding.predict_null and diff > decoding.null_score_diff_threshold
    return ("" if null_wins else text), text, diff


def squad_v2_metrics(
    examples: list[dict], predictions: list[str], spans: list[str], diffs: list[float]
) -> dict[str, float]:
    """EM and F1 (fractions) of ``predictions``; with unanswerable examples also the
    ``has_ans_*`` / ``no_ans_*`` splits and the best threshold over ``diffs``
    (``best_exact_match``/``best_f1`` and their ``*_thresh``), the v2 script's
    ``find_all_best_thresh`` computed with the best span texts ``spans``.
    """
    golds = [gold_answers(e) for e in examples]
    scores = np.array([squad_scores(p, g) for p, g in zip(predictions, golds, strict=True)])
    has_ans = np.array([bool(e["answers"]) for e in examples])
    metrics = {"exact_match": float(scores[:, 0].mean()), "f1": float(scores[:, 1].mean())}
    if has_ans.all():
        return metrics
    for name, rows in (("has_ans", has_ans), ("no_ans", ~has_ans)):
        if rows.any():
            metrics[f"{name}_exact_match"] = float(scores[rows, 0].mean())
            metrics[f"{name}_f1"] = float(scores[rows, 1].mean())
            metrics[f"{name}_total"] = int(rows.sum())
    span_scores = np.array([squad_scores(t, g) for t, g in zip(spans, golds, strict=True)])
    null_scores = np.array([squad_scores("", g) for g in golds])
    for column, name in ((0, "exact_match"), (1, "f1")):
        best, thresh = best_threshold(span_scores[:, column], null_scores[:, column], diffs)
        metrics[f"best_{name}"], metrics[f"best_{name}_thresh"] = best, thresh
    return metrics


def best_threshold(
    span_scores: np.ndarray, null_scores: np.ndarray, diffs: Sequence[float]
) -> tuple[float, float]:
    """The best mean score over thresholds t, predicting "" iff diff > t, and that t.

    Args:
        span_scores, null_scores: float (N,), each example's score with its best span
            and with "".
        diffs: (N,) null score - best span score (inf: no span; always "").

    ``best_threshold([1, 0], [0, 1], [-2.0, 3.0]) -> (1.0, -2.0)``: at t = -2 the first
    example answers with its span, the second says nothing. When saying nothing
    everywhere is best, t is 1 below the smallest finite diff.
    """
    diffs = np.asarray(diffs, np.float64)
    finite = np.flatnonzero(np.isfinite(diffs))
    total = float(np.sum(null_scores))
    if not len(finite):
        return total / len(diffs), 0.0
    order = finite[np.argsort(diffs[finite], kind="stable")]
    best, thresh = total, float(diffs[order[0]]) - 1.0
    for k, i in enumerate(order):
        total += float(span_scores[i] - null_scores[i])  # example i now answers with its span
        last_of_tie = k + 1 == len(order) or diffs[order[k + 1]] != diffs[i]
        if last_of_tie and total > best:
            best, thresh = total, float(diffs[i])
    return best / len(diffs), thresh


def evaluate_qa(
    features: list[dict], logits: list[tuple[np.ndarray, np.ndarray]], decoding: Decoding
) -> dict[str, float]:
    """SQuAD metrics of ``features`` (finetune/qa.py; an example's windows consecutive)
    and their per-feature (start, end) logits, float (T,) each."""
    examples, predictions, spans, diffs = [], [], [], []
    i = 0
    while i < len(features):
        j = i
        while j < len(features) and features[j]["example_index"] == features[i]["example_index"]:
            j += 1
        prediction, span, diff = decode_example(features[i:j], logits[i:j], decoding)
        examples.append(features[i]["example"])
        predictions.append(prediction)
        spans.append(span)
        diffs.append(diff)
        i = j
    return squad_v2_metrics(examples, predictions, spans, diffs)
