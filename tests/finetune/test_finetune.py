"""Fine-tuning: a tiny random-init BERT learns synthetic tasks; files, errors, metrics."""

import json
import random
import re

import pytest
import torch

from finetune.__main__ import main
from finetune.config import FinetuneConfig, parse_config
from finetune.data import (
    DataError,
    check_features,
    encode,
    label_names,
    load_examples,
    load_tokenizer,
)
from finetune.metrics import evaluate
from finetune.squad import squad_normalize, squad_scores
from finetune.train import linear_schedule
from model import BertForSequenceClassification
from tests.helpers import digit_tags, find_digit, has_digit, write_jsonl


def finetune(tmp_path, init_dir, task, make, n_train, *flags):
    train = write_jsonl(tmp_path / "train.jsonl", make(random.Random(1), n_train))
    eval_ = write_jsonl(tmp_path / "eval.jsonl", make(random.Random(2), 200))
    argv = ["--task", task, "--init", str(init_dir), "--train", train, "--eval", eval_]
    argv += ["--lr", "1e-3", "--max-seq-length", "32", "--output-dir", str(tmp_path / "out")]
    assert main([*argv, *flags]) == 0
    return json.loads((tmp_path / "out/eval_results.json").read_text())


@pytest.mark.slow
def test_classification_learns_digit_presence_and_saves(tmp_path, init_dir):
    metrics = finetune(tmp_path, init_dir, "classification", has_digit, 1000, "--epochs", "4")
    assert metrics["accuracy"] > 0.9  # chance: 0.5
    # The saved directory is a complete model: reloaded, it scores the same.
    out = tmp_path / "out"
    model = BertForSequenceClassification.from_hf(out)
    assert model.config.labels == ("no", "yes")
    examples = load_examples("classification", tmp_path / "eval.jsonl")
    features = encode("classification", load_tokenizer(out), examples, ("no", "yes"), 32)
    again = evaluate("classification", model, features, ("no", "yes"), 64, 0)
    assert again["accuracy"] == pytest.approx(metrics["accuracy"])
    assert json.loads((out / "finetune_config.json").read_text())["epochs"] == 4


@pytest.mark.slow
def test_token_classification_tags_digits(tmp_path, init_dir):
    metrics = finetune(tmp_path, init_dir, "token", digit_tags, 500, "--epochs", "3")
    assert metrics["f1"] > 0.9 and metrics["accuracy"] > 0.9  # chance F1 about 0.4


@pytest.mark.slow
def test_question_answering_finds_the_digit(tmp_path, init_dir):
    metrics = finetune(tmp_path, init_dir, "qa", find_digit, 1000, "--epochs", "3")
    assert metrics["exact_match"] > 0.8  # chance: about 1 in 10 positions
    assert metrics["f1"] >= metrics["exact_match"]


def test_token_labels_go_on_the_first_word_piece(init_dir):
    examples = [{"tokens": ["w1w", "7"], "tags": ["O", "DIGIT"], "where": "x:1"}]
    (feature,) = encode("token", load_tokenizer(init_dir), examples, ("DIGIT", "O"), 32)
    # [CLS] w1 ##w 7 [SEP]
    assert feature["labels"] == [-100, 1, -100, 0, -100]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"text": "w1", "label": 1}\n{"text": "w2"\n', r"train.jsonl:2: not JSON"),
        ('{"text": "w1"}\n', r"train.jsonl:1: missing field 'label'"),
        ('["w1", 1]\n', r"train.jsonl:1: expected a JSON object"),
        ("", r"train.jsonl: no examples"),
    ],
)
def test_bad_train_file_exits_2_naming_file_and_line(tmp_path, init_dir, caplog, content, message):
    (tmp_path / "train.jsonl").write_text(content)
    eval_ = write_jsonl(tmp_path / "eval.jsonl", has_digit(random.Random(0), 4))
    argv = ["--task", "classification", "--init", str(init_dir), "--max-seq-length", "32"]
    assert main([*argv, "--train", str(tmp_path / "train.jsonl"), "--eval", eval_]) == 2
    assert any(r.levelname == "ERROR" for r in caplog.records)
    assert re.search(message, caplog.text), caplog.text


def test_qa_answer_must_be_in_the_context(tmp_path):
    row = {"question": "q", "context": "w1 w2 7", "answers": {"text": ["7"], "answer_start": [2]}}
    path = write_jsonl(tmp_path / "qa.jsonl", [row])
    with pytest.raises(DataError, match=r"qa.jsonl:1: answer '7' is not at context\[2:\]"):
        load_examples("qa", path)
    # SQuAD-style answers with surrounding spaces are trimmed, their start moved.
    row["answers"] = [{"answer_start": 2, "text": " w2 "}]
    write_jsonl(tmp_path / "qa.jsonl", [row])
    assert load_examples("qa", tmp_path / "qa.jsonl")[0]["answers"] == [("w2", 3)]


def test_ids_outside_the_models_tables_name_the_example(tmp_path, init_dir):
    """Checked once where the data enters: the model checks only shapes on the device."""
    path = write_jsonl(tmp_path / "c.jsonl", has_digit(random.Random(0), 3))
    examples = load_examples("classification", path)
    labels = label_names("classification", examples, None, path)
    features = encode("classification", load_tokenizer(init_dir), examples, labels, 32)
    check_features(features, examples, vocab_size=37, type_vocab_size=2)  # all in range
    top = max(features[0]["input_ids"])  # a model whose vocab ends before this id
    with pytest.raises(
        DataError, match=rf"c.jsonl:1: input_ids values must be in \[0, {top}\), got {top} "
    ):
        check_features(features, examples, vocab_size=top, type_vocab_size=2)
    with pytest.raises(
        DataError, match=r"c.jsonl:1: segment_ids values must be in \[0, 1\), got 1 "
    ):
        check_features(features, examples, vocab_size=37, type_vocab_size=1)


def test_csv_files_are_read_like_jsonl(tmp_path):
    (tmp_path / "t.csv").write_text('tokens,tags\n"w1 7 w2","O DIGIT O"\n')
    assert load_examples("token", tmp_path / "t.csv")[0]["tags"] == ["O", "DIGIT", "O"]
    answers = json.dumps({"text": ["7"], "answer_start": [3]}).replace('"', '""')
    (tmp_path / "q.csv").write_text(f'question,context,answers\ndigit,w1 7,"{answers}"\n')
    assert load_examples("qa", tmp_path / "q.csv")[0]["answers"] == [("7", 3)]
    (tmp_path / "c.tsv").write_text("text\tlabel\n")
    with pytest.raises(DataError, match=r"unknown extension '\.tsv'"):
        load_examples("classification", tmp_path / "c.tsv")


def test_deepspeed_checkpoint_is_pointed_at_trainer_export(tmp_path, init_dir, caplog):
    (tmp_path / "run").mkdir()
    (tmp_path / "run/latest").write_text("step00000010")
    data = write_jsonl(tmp_path / "d.jsonl", has_digit(random.Random(0), 4))
    argv = ["--task", "classification", "--init", str(tmp_path / "run"), "--train", data]
    assert main([*argv, "--eval", data]) == 2
    assert "python -m trainer.export" in caplog.text


def test_labels_come_from_the_data_or_the_saved_head():
    rows = [{"label": "10"}, {"label": "9"}, {"label": "10"}]
    assert label_names("classification", rows, None, "f") == ("9", "10")  # numeric order
    assert label_names("classification", rows, ("10", "9", "8"), "f") == ("10", "9", "8")
    with pytest.raises(DataError, match=r"labels \['9'\] are not among"):
        label_names("classification", rows, ("10",), "f")


def test_squad_metrics_known_answers():
    assert squad_normalize("The  Cat, sat!") == "cat sat"
    assert squad_scores("the cat", ["Cat"]) == (1.0, 1.0)
    em, f1 = squad_scores("black cat sat", ["a black cat", "dog"])
    assert em == 0.0 and f1 == pytest.approx(0.8)  # P 2/3, R 1


def test_schedule_warms_up_then_decays_to_zero():
    f = linear_schedule(warmup=2, total=6)
    assert [f(s) for s in range(7)] == [0.0, 0.5, 1.0, 0.75, 0.5, 0.25, 0.0]


def test_config_flags_override_json_and_unknown_keys_fail(tmp_path):
    (tmp_path / "c.json").write_text(json.dumps({"task": "qa", "lr": 5e-5, "epochs": 2}))
    base = ["--init", "i", "--train", "t", "--eval", "e", "--config", str(tmp_path / "c.json")]
    cfg = parse_config([*base, "--epochs", "4"])
    assert (cfg.task, cfg.lr, cfg.epochs, cfg.warmup_ratio) == ("qa", 5e-5, 4, 0.1)
    (tmp_path / "c.json").write_text(json.dumps({"task": "qa", "learning_rate": 1}))
    with pytest.raises(ValueError, match=r"c.json: unknown key\(s\) \['learning_rate'\]"):
        parse_config(base)
    (tmp_path / "c.json").write_text(json.dumps({"task": "qa", "epoch": 1}))
    with pytest.raises(ValueError, match=r"\['epoch'\] \(did you mean 'epochs'\?\)"):
        parse_config(base)
    (tmp_path / "c.json").write_text("task: qa")
    with pytest.raises(ValueError, match=r"--config .*c.json: not valid JSON"):
        parse_config(base)
    (tmp_path / "c.json").write_text(json.dumps({"task": "qa", "gradual_unfreeze": True}))
    assert parse_config(base).gradual_unfreeze
    assert not parse_config([*base, "--gradual-unfreeze", "false"]).gradual_unfreeze
    assert parse_config([*base[:-2], "--task", "token", "--gradual-unfreeze"]).gradual_unfreeze
    with pytest.raises(ValueError, match="warmup_ratio"):
        FinetuneConfig(task="qa", init="i", train="t", eval="e", warmup_ratio=1.5)


def test_a_head_of_the_task_keeps_its_label_order_and_refuses_unknown_labels(
    tmp_path, init_dir, caplog
):
    import shutil

    head_dir = tmp_path / "head"
    shutil.copytree(init_dir, head_dir)
    labels = ("zebra", "apple")  # not sorted: the data's own order would be apple, zebra
    BertForSequenceClassification.from_hf(init_dir, labels=labels).save_hf(head_dir)
    rows = [{"text": "w1 w2", "label": "apple"}, {"text": "w3", "label": "zebra"}] * 4
    train = write_jsonl(tmp_path / "train.jsonl", rows)
    argv = [
        "--task",
        "classification",
        "--init",
        str(head_dir),
        "--train",
        train,
        "--eval",
        train,
        "--max-steps",
        "1",
        "--max-seq-length",
        "16",
        "--output-dir",
        str(tmp_path / "out"),
    ]
    assert main(argv) == 0
    assert BertForSequenceClassification.from_hf(tmp_path / "out").config.labels == labels
    other = write_jsonl(tmp_path / "other.jsonl", [*rows, {"text": "w4", "label": "mango"}])
    assert main([*argv[:5], other, "--eval", train, *argv[8:], "--overwrite"]) == 2
    assert "labels ['mango'] are not among the model's ['zebra', 'apple']" in caplog.text


def test_device_is_checked_and_the_model_runs_where_it_says(tmp_path, init_dir, caplog):
    with pytest.raises(ValueError, match=r"device \(--device\) must be auto, cpu, cuda or cuda:N"):
        FinetuneConfig(task="classification", init="x", train="t", eval="e", device="gpu")
    train = write_jsonl(tmp_path / "train.jsonl", has_digit(random.Random(1), 16))
    argv = [
        "--task",
        "classification",
        "--init",
        str(init_dir),
        "--train",
        train,
        "--eval",
        train,
        "--max-seq-length",
        "32",
        "--max-steps",
        "1",
    ]
    if not torch.cuda.is_available():  # a GPU asked for where torch sees none
        assert main([*argv, "--device", "cuda"]) == 2
        assert "--device cuda: torch sees 0 GPU(s) on this machine" in caplog.text
    caplog.clear()
    with caplog.at_level("INFO"):
        assert main([*argv, "--device", "auto"]) == 0
    where = "cuda" if torch.cuda.is_available() else "cpu"
    assert f"labels ('no', 'yes'), on {where}" in caplog.text


def test_an_earlier_result_is_kept_unless_overwrite(tmp_path, init_dir, caplog):
    first = finetune(tmp_path, init_dir, "classification", has_digit, 40, "--max-steps", "2")
    out = tmp_path / "out"
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    train, eval_ = str(tmp_path / "train.jsonl"), str(tmp_path / "eval.jsonl")
    argv = ["--task", "classification", "--init", str(init_dir), "--train", train]
    argv += [
        "--eval",
        eval_,
        "--max-steps",
        "3",
        "--max-seq-length",
        "32",
        "--output-dir",
        str(out),
    ]
    assert main(argv) == 2
    assert "eval_results.json: --output-dir holds an earlier fine-tune's result" in caplog.text
    assert "--overwrite" in caplog.text
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert main([*argv, "--overwrite"]) == 0
    assert json.loads((out / "finetune_config.json").read_text())["max_steps"] == 3
    assert "accuracy" in first
