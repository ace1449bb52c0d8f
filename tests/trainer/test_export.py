"""trainer/export.py + trainer/hf_tokenizer.py: the export carries the shards' tokenizer.

Checkpoints here are stage-0 DeepSpeed layouts written directly (mp_rank_00_model_states.pt
holding {"module": state_dict}), so no training run is needed; tests/trainer/test_run.py
exports real ones.
"""

import json
import logging
import shutil
import stat
from pathlib import Path

import pytest
import torch

from model import BertConfig, BertForPreTraining
from pipeline.core.vocab import build_tokenizer, read_vocab
from trainer import export
from trainer.hf_tokenizer import TOKENIZER_FILES, shard_dir_of

transformers = pytest.importorskip("transformers")

SAMPLE = "The ancient king founded a school by the river in Rémy's café!"


def write_checkpoint(tmp_path: Path, data: str, vocab_size: int = 200) -> Path:
    """A run's output directory with one stage-0 checkpoint that trained on ``data``."""
    config = BertConfig.preset("tiny", vocab_size=vocab_size, max_position_embeddings=64)
    torch.manual_seed(0)
    model = BertForPreTraining(config)
    ckpt = tmp_path / "run" / "checkpoints" / "step00000001"
    ckpt.mkdir(parents=True)
    torch.save({"module": model.state_dict()}, ckpt / "mp_rank_00_model_states.pt")
    config.to_json(ckpt / "config.json")
    (ckpt / "train_config.json").write_text(json.dumps({"data": data, "max_steps": 1}))
    (ckpt.parent / "latest").write_text(ckpt.name)
    return tmp_path / "run"


def cased_copy(shards: Path, tmp_path: Path) -> Path:
    """manifest.json (do_lower_case false) and vocab.txt of ``shards``: all the export reads."""
    copy = tmp_path / "cased"
    copy.mkdir()
    shutil.copy(shards / "vocab.txt", copy / "vocab.txt")
    manifest = json.loads((shards / "manifest.json").read_text())
    assert manifest["vocab"]["do_lower_case"] is True
    manifest["vocab"]["do_lower_case"] = False
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


def test_export_carries_the_training_shards_tokenizer(small_shards, tmp_path, umask_022):
    run = write_checkpoint(tmp_path, str(small_shards))
    out = export.export(run, tmp_path / "hf")
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()}
    names = ["config.json", "model.safetensors", *TOKENIZER_FILES]
    assert modes == dict.fromkeys(names, 0o644)  # usable as is by others: no 0600 temp files
    assert (out / "vocab.txt").read_bytes() == (small_shards / "vocab.txt").read_bytes()
    assert json.loads((out / "tokenizer_config.json").read_text())["model_max_length"] == 64

    tokens = read_vocab(small_shards / "vocab.txt")
    theirs = transformers.AutoTokenizer.from_pretrained(out)
    assert len(theirs) == len(tokens) == 200  # not a 5-token fallback vocab
    special = (
        theirs.cls_token,
        theirs.sep_token,
        theirs.mask_token,
        theirs.pad_token,
        theirs.unk_token,
    )
    assert special == ("[CLS]", "[SEP]", "[MASK]", "[PAD]", "[UNK]")
    assert theirs.mask_token_id == tokens.index("[MASK]") and theirs.do_lower_case is True
    assert theirs.convert_tokens_to_ids(tokens) == list(range(200))
    ours = build_tokenizer(tokens, do_lower_case=True).encode(SAMPLE).ids
    assert theirs(SAMPLE)["input_ids"] == ours
    assert ours.count(tokens.index("[UNK]")) < 3  # the sample is mostly in the vocab

    fill = transformers.pipeline("fill-mask", model=str(out), top_k=5)
    predictions = fill("the ancient [MASK] founded a school .")
    assert len(predictions) == 5 and all(0 <= p["score"] <= 1 for p in predictions)


def test_do_lower_case_comes_from_the_manifest(small_shards, tmp_path):
    run = write_checkpoint(tmp_path, str(cased_copy(small_shards, tmp_path)))
    out = export.export(run, tmp_path / "hf")
    assert json.loads((out / "tokenizer_config.json").read_text())["do_lower_case"] is False
    tokens = read_vocab(small_shards / "vocab.txt")
    theirs = transformers.AutoTokenizer.from_pretrained(out)(SAMPLE)["input_ids"]
    assert theirs == build_tokenizer(tokens, do_lower_case=False).encode(SAMPLE).ids
    assert theirs != build_tokenizer(tokens, do_lower_case=True).encode(SAMPLE).ids


def test_gone_shards_leave_the_model_exported_with_a_warning(small_shards, tmp_path, caplog):
    gone = tmp_path / "deleted_shards"
    run = write_checkpoint(tmp_path, str(gone))
    with caplog.at_level(logging.WARNING, logger="trainer.export"):
        out = export.export(run, tmp_path / "hf")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    assert str(gone) in caplog.text and "--vocab" in caplog.text
    assert transformers.BertForMaskedLM.from_pretrained(out) is not None

    # --vocab names the shards (or their vocab.txt) instead.
    flag = str(small_shards / "vocab.txt")
    assert export.main([str(run), str(tmp_path / "hf2"), "--vocab", flag]) == 0
    assert (tmp_path / "hf2" / "vocab.txt").read_bytes() == Path(flag).read_bytes()


def test_vocab_that_does_not_fit_the_model(small_shards, tmp_path, caplog):
    run = write_checkpoint(tmp_path, str(small_shards), vocab_size=300)
    with pytest.raises(ValueError, match="has 200 tokens, the model's vocab_size is 300"):
        export.export(run, tmp_path / "hf", vocab=small_shards)
    assert not (tmp_path / "hf").exists()  # refused before writing anything
    assert export.main([str(run), str(tmp_path / "hf"), "--vocab", str(tmp_path)]) == 2
    # Found through train_config.json instead: a warning, and the model without a tokenizer.
    with caplog.at_level(logging.WARNING, logger="trainer.export"):
        out = export.export(run, tmp_path / "hf")
    assert "vocab_size is 300" in caplog.text and not (out / "vocab.txt").exists()


def test_shard_dir_of_accepts_the_directory_or_its_vocab():
    assert shard_dir_of("gs://b/shards/vocab.txt") == "gs://b/shards"
    assert shard_dir_of("gs://b/shards/") == "gs://b/shards/"
    assert shard_dir_of("/data/shards/vocab.txt") == "/data/shards"


@pytest.mark.parametrize("layout", ["fp32_groups", "fp32_groups_flat"])
def test_stage0_16bit_checkpoint_exports_the_fp32_master_weights(layout):
    """bf16/fp16 without ZeRO: the module holds 16-bit copies; the optimizer's fp32 groups
    (per tensor: torch's optimizers; flat: DeepSpeed's fused ones) are the weights."""
    masters = {
        "a.weight": torch.randn(3, 2),
        "a.bias": torch.randn(3),
        "b.LayerNorm.weight": torch.randn(3),
        "b.weight": torch.randn(4, 3),
    }
    module = {k: v.bfloat16() for k, v in masters.items()}
    groups = [
        [masters["a.weight"], masters["b.weight"]],  # decayed, then not (prepare.py)
        [masters["a.bias"], masters["b.LayerNorm.weight"]],
    ]
    if layout == "fp32_groups_flat":  # DeepSpeed pads a flat group for alignment
        groups = [torch.cat([*(t.flatten() for t in g), torch.zeros(2)]) for g in groups]
    states = {"module": module, "optimizer": {layout: groups}}
    out = export.master_weights(states, where="ckpt")
    assert out.keys() == masters.keys()
    assert all(torch.equal(out[k], masters[k]) for k in masters)
    assert export.master_weights({"module": module, "optimizer": {"state": {}}}, where="x") == {}
    states["optimizer"][layout] = groups[:1]
    with pytest.raises(ValueError, match="ckpt: 1 fp32 groups for 2 parameter groups"):
        export.master_weights(states, where="ckpt")
