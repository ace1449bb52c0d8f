"""QA features with a document stride, as Google's run_squad.py makes them.

A context longer than a sequence's room is cut into overlapping windows of its tokens
(``doc_windows``), each a feature ``[CLS] question [SEP] window [SEP]``. Training points a
window at the answer's tokens when the whole answer is inside it, else at [CLS] (position
0, "no answer"), as Google and transformers do; an unanswerable question (SQuAD 2.0)
points every window at [CLS]. For decoding, each feature keeps its window and which of
its tokens have their "max context" there (``is_max_context``); finetune/squad.py turns
the logits of all of an example's windows into one answer.
"""

from __future__ import annotations

from typing import Any

from tokenizers import Tokenizer

from finetune.data import DataError

SPECIALS_PER_FEATURE = 3  # [CLS] question [SEP] window [SEP]


def doc_windows(n_tokens: int, max_tokens: int, stride: int) -> list[tuple[int, int]]:
    """``(start, length)`` of each window over ``n_tokens`` context tokens: windows of at
    most ``max_tokens`` starting ``min(length, stride)`` apart (Google's loop; a stride
    longer than a window leaves no gap, only no overlap); one empty window for no tokens.

    ``doc_windows(10, 4, 3) -> [(0, 4), (3, 4), (6, 4)]``; ``doc_windows(3, 4, 2) -> [(0, 3)]``
    """
    assert max_tokens > 0 and stride > 0, (max_tokens, stride)
    windows, start = [], 0
    while True:
        length = min(n_tokens - start, max_tokens)
        windows.append((start, length))
        if start + length >= n_tokens:
            return windows
        start += min(length, stride)


def is_max_context(windows: list[tuple[int, int]], index: int, position: int) -> bool:
    """Whether window ``index`` is the one where context token ``position`` has the most
    context: the largest min(tokens left, tokens right) + 0.01 * window length, the first
    on ties (Google's ``_check_is_max_context``).

    With windows ``[(0, 4), (2, 4)]``: token 2 scores 1.04 in the first (2 left, 1 right)
    and 0.04 in the second (0 left): the first's; token 3 scores 0.04 and 1.04: the
    second's. With ``[(0, 4), (3, 4)]`` token 3 scores 0.04 in both: the first's.
    """
    best, best_score = None, None
    for i, (start, length) in enumerate(windows):
        if start <= position < start + length:
            left, right = position - start, start + length - 1 - position
            score = min(left, right) + 0.01 * length
            if best_score is None or score > best_score:
                best, best_score = i, score
    return best == index


def answer_token_span(
    offsets: list[tuple[int, int]], start: int, end: int
) -> tuple[int, int] | None:
    """First and last context token overlapping the characters ``[start, end)``; None when
    no token does. ``offsets``: each token's ``(start, end)`` in the context.

    ``answer_token_span([(0, 2), (3, 5), (5, 8)], 3, 8) -> (1, 2)``
    """
    inside = [i for i, (s, e) in enumerate(offsets) if s < end and e > start]
    return (inside[0], inside[-1]) if inside else None


def encode_qa(tokenizer: Tokenizer, examples: list[dict], cfg) -> list[dict[str, Any]]:
    """The features of all ``examples``, each example's windows in order.

    Args:
        tokenizer: the --init tokenizer; its truncation is switched off here.
        examples: parsed QA examples (``question``, ``context``, ``answers`` as
            ``[(text, answer_start), ...]``, empty for no answer, ``where``).
        cfg: ``max_seq_length``, ``max_query_length`` and ``doc_stride`` of a FinetuneConfig.

    Returns:
        Per window: ``input_ids``, ``segment_ids`` (lists of int), ``start_positions`` and
        ``end_positions`` (int, 0 when the answer is not wholly in the window) and, for
        decoding, ``example`` and ``example_index``, ``window`` (start, length in context
        tokens), ``context_position`` (where the window begins in ``input_ids``),
        ``doc_offsets`` (the example's context token offsets, one list shared by its
        windows) and ``max_context`` (per window token, ``is_max_context``).

    Raises:
        DataError: a question leaves no room for the context, or an answer covers no token.
        ValueError: the tokenizer has no [CLS] or [SEP].
    """
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    if cls_id is None or sep_id is None:
        raise ValueError("the --init tokenizer has no [CLS] or no [SEP] token")
    tokenizer.no_truncation()
    questions = tokenizer.encode_batch([e["question"] for e in examples], add_special_tokens=False)
    contexts = tokenizer.encode_batch([e["context"] for e in examples], add_special_tokens=False)
    features = []
    for index, (e, q, c) in enumerate(zip(examples, questions, contexts, strict=True)):
        query_ids = q.ids[: cfg.max_query_length]
        room = cfg.max_seq_length - len(query_ids) - SPECIALS_PER_FEATURE
        if room <= 0:
            raise DataError(
                f"{e['where']}: the question's {len(query_ids)} tokens leave no room for the "
                f"context in --max-seq-length {cfg.max_seq_length}; lower --max-query-length"
            )
        answer = _answer_tokens(e, c.offsets)
        windows = doc_windows(len(c.ids), room, cfg.doc_stride)
        offset = len(query_ids) + 2  # [CLS] question [SEP]
        for w, (start, length) in enumerate(windows):
            inside = answer and start <= answer[0] and answer[1] < start + length
            features.append(
                {
                    "input_ids": [
                        cls_id,
                        *query_ids,
                        sep_id,
                        *c.ids[start : start + length],
                        sep_id,
                    ],
                    "segment_ids": [0] * offset + [1] * (length + 1),
                    "start_positions": answer[0] - start + offset if inside else 0,
                    "end_positions": answer[1] - start + offset if inside else 0,
                    "example": e,
                    "example_index": index,
                    "window": (start, length),
                    "context_position": offset,
                    "doc_offsets": c.offsets,
                    "max_context": [is_max_context(windows, w, start + i) for i in range(length)],
                }
            )
    return features


def _answer_tokens(example: dict, offsets: list[tuple[int, int]]) -> tuple[int, int] | None:
    """The first answer's first and last context token (training uses the first, as
    Google's); None for a question without answers. Raises DataError."""
    if not example["answers"]:
        return None
    text, start = example["answers"][0]
    span = answer_token_span(offsets, start, start + len(text))
    if span is None:
        raise DataError(f"{example['where']}: answer {text!r} covers no token of the context")
    return span
