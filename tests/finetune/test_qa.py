"""QA with a document stride and SQuAD 2.0 answers: windows, decoding, scores, learning."""

import json
import math
import random

import numpy as np
import pytest

from finetune.__main__ import main
from finetune.config import FinetuneConfig
from finetune.data import DataError, load_examples, load_tokenizer
from finetune.qa import answer_token_span, doc_windows, encode_qa, is_max_context
from finetune.squad import (
    Decoding,
    best_span,
    best_threshold,
    decode_example,
    squad_scores,
    squad_v2_metrics,
)
from tests.helpers import DIGITS, FINETUNE_WORDS, write_jsonl

WORDS_0_19 = " ".join(FINETUNE_WORDS)  # "w0 w1 ... w19": 20 tokens of the test vocab


def qa_config(**overrides) -> FinetuneConfig:
    settings = {"max_seq_length": 12, "doc_stride": 4, **overrides}
    return FinetuneConfig(task="qa", init="i", train="t", eval="e", **settings)


def example(context, answers=(), question="digit"):
    answers = [(text, context.index(text)) for text in answers]
    return {"question": question, "context": context, "answers": answers, "where": "x:1"}


def test_windows_step_by_the_stride_and_cover_the_context():
    assert doc_windows(10, 4, 3) == [(0, 4), (3, 4), (6, 4)]
    assert doc_windows(20, 8, 4) == [(0, 8), (4, 8), (8, 8), (12, 8)]
    assert doc_windows(3, 4, 2) == [(0, 3)]
    assert doc_windows(0, 4, 2) == [(0, 0)]
    assert doc_windows(10, 4, 9) == [(0, 4), (4, 4), (8, 2)]  # stride > window: no gap


def test_max_context_is_googles_choice():
    windows = [(0, 4), (2, 4)]
    assert [is_max_context(windows, 0, p) for p in range(6)] == [1, 1, 1, 0, 0, 0]
    assert [is_max_context(windows, 1, p) for p in range(6)] == [0, 0, 0, 1, 1, 1]
    assert is_max_context([(0, 4), (3, 4)], 0, 3)  # 0.04 both: the first


def test_answer_tokens_from_character_offsets():
    assert answer_token_span([(0, 2), (3, 5), (5, 8)], 3, 8) == (1, 2)
    assert answer_token_span([(0, 2), (3, 5), (5, 8)], 6, 7) == (2, 2)  # inside a word
    assert answer_token_span([(0, 2), (3, 5)], 2, 3) is None  # only the space


def test_long_context_gives_overlapping_windows_with_the_answer_positions(init_dir):
    """20 context tokens, room 12 - 1 (question) - 3 = 8, stride 4: windows at 0, 4, 8, 12.
    The answer w10 w11 (context tokens 10-11) is wholly in windows 1 and 2 only."""
    tokenizer = load_tokenizer(init_dir)
    features = encode_qa(tokenizer, [example(WORDS_0_19, ["w10 w11"])], qa_config())
    assert [f["window"] for f in features] == [(0, 8), (4, 8), (8, 8), (12, 8)]
    vocab = tokenizer.get_vocab()
    cls, sep, digit = vocab["[CLS]"], vocab["[SEP]"], vocab["digit"]
    words = [vocab[f"w{i}"] for i in range(4, 12)]
    assert features[1]["input_ids"] == [cls, digit, sep, *words, sep]
    assert features[1]["segment_ids"] == [0, 0, 0] + [1] * 9
    positions = [(f["start_positions"], f["end_positions"]) for f in features]
    # [CLS] digit [SEP] then the window: token t of the context at 3 + t - start.
    assert positions == [(0, 0), (3 + 10 - 4, 3 + 11 - 4), (3 + 10 - 8, 3 + 11 - 8), (0, 0)]
    # Token 10 has 6 left / 1 right in window 1, 2 left / 5 right in window 2.
    assert features[1]["max_context"][10 - 4] is False
    assert features[2]["max_context"][10 - 8] is True
    assert {f["example_index"] for f in features} == {0}


def test_unanswerable_questions_point_every_window_at_cls(init_dir):
    features = encode_qa(load_tokenizer(init_dir), [example(WORDS_0_19)], qa_config())
    assert len(features) == 4
    assert all(f["start_positions"] == f["end_positions"] == 0 for f in features)


def test_a_question_that_leaves_no_room_is_an_error(init_dir):
    tokenizer = load_tokenizer(init_dir)
    long_question = example(WORDS_0_19, question=WORDS_0_19)
    with pytest.raises(DataError, match=r"x:1: the question's 9 tokens leave no room"):
        encode_qa(tokenizer, [long_question], qa_config(max_query_length=9))
    # --max-query-length cuts it to 5 tokens: room 4.
    features = encode_qa(tokenizer, [long_question], qa_config(max_query_length=5))
    assert all(len(f["input_ids"]) <= 12 for f in features)


def window_logits(features, spans):
    """Zero logits, with ``spans[w] = (start token, end token, start logit, end logit)`` of
    the context set in window w."""
    out = []
    for w, f in enumerate(features):
        start, end = np.zeros(len(f["input_ids"])), np.zeros(len(f["input_ids"]))
        if w in spans:
            s, e, start_logit, end_logit = spans[w]
            assert all(0 <= t - f["window"][0] < f["window"][1] for t in (s, e)), (w, s, e)
            at = f["context_position"] - f["window"][0]
            start[at + s], end[at + e] = start_logit, end_logit
        out.append((start, end))
    return out


def test_decoding_maps_the_best_span_back_to_the_text_in_its_max_context(init_dir):
    context = WORDS_0_19.replace("w10", "w10,")  # offsets, not a detokenizer: "w10, w11"
    features = encode_qa(load_tokenizer(init_dir), [example(context, ["w10"])], qa_config())
    assert len(features) == 5  # the comma is a token: 21
    decoding = Decoding(max_answer_length=30)
    logits = window_logits(features, {2: (10, 12, 3.0, 3.0)})
    assert decode_example(features, logits, decoding)[0] == "w10, w11"
    # A higher span in window 2 (context tokens 8-15) starts at token 14 (w13), 1 token
    # from the window's end; window 3 (12-19) is its max context: barred, as Google's.
    logits = window_logits(features, {2: (14, 14, 10.0, 1.0), 3: (14, 15, 4.0, 3.0)})
    assert decode_example(features, logits, decoding)[0] == "w13 w14"
    assert features[2]["max_context"][14 - 8] is False
    # Longer than --max-answer-length: the next best, w13 alone (4 + 0), wins.
    assert decode_example(features, logits, Decoding(max_answer_length=1))[0] == "w13"


def test_null_answer_when_cls_beats_the_best_span_by_the_threshold(init_dir):
    features = encode_qa(load_tokenizer(init_dir), [example(WORDS_0_19)], qa_config())
    logits = window_logits(features, {1: (7, 7, 2.0, 2.0)})  # span "w7": 4.0
    for w, score in ((0, 5.0), (1, 2.0), (2, 9.0), (3, 9.0)):  # null: the smallest, 2 + 0
        logits[w][0][0] = score
    on = Decoding(predict_null=True)
    assert decode_example(features, logits, on) == ("w7", "w7", -2.0)  # -2 <= 0: the span
    logits[1][0][0] = 7.0  # null now min(5, 7, 9, 9) = 5: diff 1.0
    assert decode_example(features, logits, on) == ("", "w7", 1.0)
    threshold = Decoding(predict_null=True, null_score_diff_threshold=1.5)
    assert decode_example(features, logits, threshold)[0] == "w7"
    assert decode_example(features, logits, Decoding(predict_null=False))[0] == "w7"


def test_best_span_pairs_the_top_starts_and_ends():
    start = np.array([0.0, 5.0, 1.0, 9.0])
    end = np.array([0.0, 1.0, 6.0, 0.0])
    allowed = np.array([False, True, True, True])
    assert best_span(start, end, allowed, allowed, Decoding()) == (11.0, 1, 2)  # e < s barred
    only_3 = np.array([False, False, False, True])
    assert best_span(start, end, only_3, only_3, Decoding()) == (9.0, 3, 3)
    # With n-best 1 only (3, 0) is paired, and e < s: no candidate.
    assert best_span(start, end, allowed, allowed, Decoding(n_best_size=1)) is None


def test_v2_scores_known_answers():
    assert squad_scores("", [""]) == (1.0, 1.0)  # no answer, none predicted
    assert squad_scores("the cat", [""]) == (0.0, 0.0)
    assert squad_scores("", ["cat"]) == (0.0, 0.0)
    assert squad_scores("The", [""]) == (1.0, 1.0)  # normalises to nothing
    em, f1 = squad_scores("black cat sat", ["a black cat", "dog"])
    assert em == 0.0 and f1 == pytest.approx(0.8)  # P 2/3, R 1
    examples = [
        example("a black cat", ["a black cat"]),
        example("dog", ["dog"]),
        example("w1"),
        example("w2"),
    ]
    predictions = ["black cat sat", "dog", "", "x"]
    spans = ["black cat sat", "dog", "w1", "x"]
    metrics = squad_v2_metrics(examples, predictions, spans, [-3.0, -1.0, 2.0, -2.0])
    expected = {
        "exact_match": 0.5,
        "f1": 0.7,
        "has_ans_exact_match": 0.5,
        "has_ans_f1": 0.9,
        "has_ans_total": 2,
        "no_ans_exact_match": 0.5,
        "no_ans_f1": 0.5,
        "no_ans_total": 2,
    }
    assert {k: metrics[k] for k in expected} == pytest.approx(expected)
    # Sorted by diff: #0 -3, #3 -2, #1 -1, #2 2. At t = -1 all but #2 give their span:
    # F1 0.8 + 0 + 1 + 1 (null for #2); at t = -3 (only #0): 0.8 + 1 + 1 (null #3) + 0 (null #1).
    assert metrics["best_f1"] == pytest.approx(0.7) and metrics["best_f1_thresh"] == -3.0
    assert metrics["best_exact_match"] == 0.5 and metrics["best_exact_match_thresh"] == -4.0
    assert squad_v2_metrics(examples[:2], ["black cat", "dog"], ["", ""], [0.0, 0.0]) == {
        "exact_match": 1.0,
        "f1": 1.0,
    }


def test_best_threshold_sweeps_the_diffs():
    assert best_threshold(np.array([1.0, 0.0]), np.array([0.0, 1.0]), [-2.0, 3.0]) == (1.0, -2.0)
    # Saying nothing everywhere is best: t below the smallest diff.
    assert best_threshold(np.array([0.0, 0.0]), np.array([1.0, 1.0]), [1.0, 2.0]) == (1.0, 0.0)
    # No span anywhere (diff inf): always "".
    assert best_threshold(np.array([0.0]), np.array([1.0]), [math.inf]) == (1.0, 0.0)


def test_v2_records_may_have_no_answer(tmp_path):
    rows = [
        {"question": "q", "context": "w1 w2", "answers": [], "is_impossible": True},
        {"question": "q", "context": "w1 w2", "answers": {"text": [], "answer_start": []}},
        {"question": "q", "context": "w1 w2", "is_impossible": "true"},
    ]
    assert [e["answers"] for e in load_examples("qa", write_jsonl(tmp_path / "a.jsonl", rows))] == [
        [],
        [],
        [],
    ]
    bad = {
        "question": "q",
        "context": "w1 w2",
        "is_impossible": True,
        "answers": [{"text": "w2", "answer_start": 3}],
    }
    with pytest.raises(DataError, match=r"b.jsonl:1: is_impossible is true but 'answers' has 1"):
        load_examples("qa", write_jsonl(tmp_path / "b.jsonl", [bad]))
    with pytest.raises(DataError, match=r"c.jsonl:1: missing field 'answers'"):
        load_examples("qa", write_jsonl(tmp_path / "c.jsonl", [{"question": "q", "context": "w"}]))


def test_qa_defaults_are_googles_run_squad():
    cfg = FinetuneConfig(task="qa", init="i", train="t", eval="e")
    assert (cfg.max_seq_length, cfg.max_query_length, cfg.doc_stride) == (384, 64, 128)
    assert (cfg.max_answer_length, cfg.n_best_size, cfg.null_score_diff_threshold) == (30, 20, 0)
    assert FinetuneConfig(task="token", init="i", train="t", eval="e").max_seq_length == 128
    with pytest.raises(ValueError, match=r"doc_stride \(--doc-stride\) must be > 0"):
        qa_config(doc_stride=0)


def far_digits(rng, n):
    """Question "digit"; contexts of 40-80 words (one token each), a third without a digit
    (unanswerable), the others with one digit anywhere, about half past the 28th word."""
    rows = []
    for i in range(n):
        words = [rng.choice(FINETUNE_WORDS) for _ in range(rng.randint(40, 80))]
        row = {"question": "digit", "context": " ".join(words), "answers": []}
        if i % 3:
            at = rng.randrange(len(words))
            words[at] = rng.choice(DIGITS)
            start = len(" ".join(words[:at])) + (1 if at else 0)
            row.update(
                context=" ".join(words), answers=[{"text": words[at], "answer_start": start}]
            )
        rows.append(row)
    return rows


@pytest.mark.slow
def test_qa_learns_answers_past_the_first_window_and_when_there_is_none(tmp_path, init_dir):
    """max-seq-length 32 leaves 28 context tokens a window; contexts of 40-80 tokens need
    the stride. Always answering "" scores the NoAns share (1/3); truncation could find
    only the answers in the first 28 tokens (measured: EM 1.0, HasAns 1.0, NoAns 1.0,
    against 0.33 and a truncation ceiling of 0.40 on the answerable)."""
    train = write_jsonl(tmp_path / "train.jsonl", far_digits(random.Random(1), 600))
    eval_rows = far_digits(random.Random(2), 150)
    eval_ = write_jsonl(tmp_path / "eval.jsonl", eval_rows)
    argv = ["--task", "qa", "--init", str(init_dir), "--train", train, "--eval", eval_]
    argv += ["--lr", "1e-3", "--max-seq-length", "32", "--doc-stride", "12", "--epochs", "3"]
    assert main([*argv, "--batch-size", "32", "--output-dir", str(tmp_path / "out")]) == 0
    metrics = json.loads((tmp_path / "out/eval_results.json").read_text())
    no_answer_share = sum(not r["answers"] for r in eval_rows) / len(eval_rows)
    starts = [r["answers"][0]["answer_start"] for r in eval_rows if r["answers"]]
    in_first_window = sum(
        len(r["context"][:s].split()) < 28
        for r, s in zip([r for r in eval_rows if r["answers"]], starts, strict=True)
    ) / len(starts)
    assert metrics["exact_match"] > no_answer_share + 0.5
    assert metrics["has_ans_exact_match"] > 0.8 > in_first_window + 0.2
    assert metrics["no_ans_exact_match"] > 0.8
