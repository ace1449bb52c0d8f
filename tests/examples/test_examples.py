"""The reuse examples run on real shards built by the pipeline inside the test."""

import json
import sys
from pathlib import Path

import pytest

from pipeline.cli.corpus import write_corpus
from pipeline.cli.main import main as pipeline_main

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    work = tmp_path_factory.mktemp("examples")
    write_corpus(work / "corpus", max_bytes=120_000, files=2)
    out = work / "shards"
    args = [
        "--vocab_size",
        "600",
        "--dupe_factor",
        "2",
        "--max_seq_length",
        "64",
        "--max_predictions_per_seq",
        "10",
        "--num_shards",
        "2",
    ]
    assert (
        pipeline_main(
            ["build", "--input", str(work / "corpus" / "*.txt"), "--output", str(out), *args]
        )
        == 0
    )
    return out


def test_datasets_reads_the_shards(shards):
    datasets = pytest.importorskip("datasets")
    files = sorted(str(p) for p in shards.glob("shard-*.arrow"))
    manifest = json.loads((shards / "manifest.json").read_text())
    ds = datasets.load_dataset(
        "arrow", data_files=files, split="train", cache_dir=str(shards.parent / "c")
    )
    assert len(ds) == manifest["num_rows"]
    one = datasets.Dataset.from_file(files[0])
    assert len(one) == manifest["shards"][0]["rows"]
    row = ds.with_format("torch")[0]
    assert row["input_ids"].dtype.is_floating_point is False and row["input_ids"][0] == 2


def test_hf_trainer_example(shards, tmp_path, capsys):
    pytest.importorskip("transformers")
    import hf_trainer

    assert (
        hf_trainer.main(
            [
                "--shards",
                str(shards),
                "--output-dir",
                str(tmp_path),
                "--max-steps",
                "6",
                "--batch-size",
                "8",
                "--hidden-size",
                "64",
            ]
        )
        == 0
    )
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["steps"] == 6 and 0 < result["train_loss"] < 20
    assert (tmp_path / "config.json").exists()


def test_collator_puts_labels_at_masked_positions():
    import hf_trainer

    row = {
        "input_ids": [2, 4, 9, 3, 7, 3],
        "segment_ids": [0, 0, 0, 0, 1, 1],
        "masked_lm_positions": [1, 4],
        "masked_lm_ids": [8, 6],
        "next_sentence_label": 1,
    }
    batch = hf_trainer.collate([row])
    assert batch["input_ids"].shape == (1, 8)
    assert batch["labels"][0].tolist() == [-100, 8, -100, -100, 6, -100, -100, -100]
    assert batch["attention_mask"][0].tolist() == [1] * 6 + [0, 0]


@pytest.mark.slow  # 25 training steps until the loss falls
def test_torch_dataloader_example_trains(shards, capsys):
    import torch_dataloader

    assert (
        torch_dataloader.main(["--shards", str(shards), "--steps", "25", "--batch-size", "16"]) == 0
    )
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["rows"] > 100
    assert result["last_loss"] < result["first_loss"]
