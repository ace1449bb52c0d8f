"""Checks before the first step: a manifest given for its directory, a resume into another model."""

import dataclasses
import logging

import pytest

from model import BertConfig
from trainer.config import TrainConfig
from trainer.prepare import check_paths, check_resumed_model

VOCAB = {"vocab_size": 200, "pad_token_id": 0}


def train_config(**values) -> TrainConfig:
    values.setdefault("model", "tiny")
    return TrainConfig(ds_config="ds.json", data="shards", output_dir="out", **values)


def checkpoint_of(tmp_path, cfg: BertConfig) -> tuple[str, str]:
    """A checkpoint directory holding only the model's config.json (what the check reads)."""
    cfg.to_json(tmp_path / "checkpoints" / "step00000006" / "config.json")
    return str(tmp_path / "checkpoints"), "step00000006"


def test_a_manifest_path_is_taken_for_its_directory(tmp_path, caplog):
    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "manifest.json").write_text("{}")
    config = train_config(eval_data=str(shards / "manifest.json"))
    config = dataclasses.replace(config, data=str(shards / "manifest.json"))
    with caplog.at_level(logging.INFO, logger="trainer"):
        checked = check_paths(config)
    assert (checked.data, checked.eval_data) == (str(shards), str(shards))
    logged = f"--data {shards}/manifest.json is a manifest: reading its shard directory {shards}"
    assert logged in caplog.text
    assert check_paths(checked) == checked  # a directory stays as it is
    with pytest.raises(FileNotFoundError, match=r"no-such/manifest\.json: no such directory"):
        check_paths(dataclasses.replace(config, data=str(tmp_path / "no-such" / "manifest.json")))


def test_resuming_into_another_model_size_names_the_fields_and_the_flag(tmp_path):
    resume = checkpoint_of(tmp_path, BertConfig.preset("tiny", **VOCAB))
    mini = BertConfig.preset("mini", **VOCAB)
    with pytest.raises(ValueError) as err:
        check_resumed_model(train_config(model="mini", resume="auto"), mini, *resume)
    assert str(err.value) == (
        f"--resume auto: the checkpoint {resume[0]}/{resume[1]} is a model with hidden_size=128, "
        "num_hidden_layers=2, num_attention_heads=2, intermediate_size=512; this run builds "
        "hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024 "
        "(--model mini). Resume with --model tiny, or give a new --output-dir to start afresh"
    )


def test_a_custom_model_is_named_by_its_config_json_and_vocab_by_the_data(tmp_path):
    custom = BertConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, **VOCAB
    )
    resume = checkpoint_of(tmp_path, custom)
    with pytest.raises(ValueError, match=r"\(--model base\)\. Resume with --model "):
        check_resumed_model(
            train_config(model="base", resume="runs/x"), BertConfig(**VOCAB), *resume
        )
    with pytest.raises(ValueError, match=r"config\.json, or leave out --resume to start afresh"):
        check_resumed_model(train_config(resume="runs/x"), BertConfig(**VOCAB), *resume)
    other_vocab = dataclasses.replace(custom, vocab_size=300)
    with pytest.raises(ValueError, match=r"vocab_size=200; .* vocab_size=300 .* shards it was"):
        check_resumed_model(train_config(model="m.json", resume="auto"), other_vocab, *resume)


def test_dropout_may_change_on_resume_and_a_universal_checkpoint_is_not_checked(tmp_path):
    tiny = BertConfig.preset("tiny", **VOCAB)
    resume = checkpoint_of(tmp_path, tiny)
    dropout = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    no_dropout = dataclasses.replace(tiny, **dropout)
    check_resumed_model(train_config(model="tiny", resume="auto", dropout=0.0), no_dropout, *resume)
    (tmp_path / "universal").mkdir()  # ds_to_universal copies no config.json
    base = BertConfig(**VOCAB)
    check_resumed_model(train_config(resume="auto"), base, str(tmp_path), "universal")
