"""model/hf.py: the one state-dict layer every model class loads and saves through."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import load_file, save_file

from model import (
    BertConfig,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    hf,
)
from tests.helpers import HEADS_MODEL, REPO

CFG = BertConfig(**HEADS_MODEL)
# Each class as from_hf is called for a pretraining export (a new head needs labels).
LOADERS = {
    "pretraining": lambda d: BertForPreTraining.from_hf(d),
    "seq": lambda d: BertForSequenceClassification.from_hf(d, labels=("neg", "pos")),
    "token": lambda d: BertForTokenClassification.from_hf(d, labels=("a", "b", "c")),
    "qa": lambda d: BertForQuestionAnswering.from_hf(d),
}


def test_hf_imports_no_model_class():
    # The package's __init__ imports every class, so load model/hf.py under a bare
    # "model" package: only what hf.py itself imports ends up in sys.modules.
    code = textwrap.dedent(f"""
        import sys, types
        package = types.ModuleType("model")
        package.__path__ = [{str(REPO / "model")!r}]
        sys.modules["model"] = package
        import model.hf
        print(sorted(m for m in sys.modules if m.startswith("model.")))
    """)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "['model.config', 'model.hf']"


@pytest.fixture
def pretraining_export(tmp_path):
    torch.manual_seed(0)
    model = BertForPreTraining(CFG)
    model.save_hf(tmp_path)
    return tmp_path, model.state_dict()


@pytest.mark.parametrize("kind", LOADERS)
def test_every_class_loads_a_pretraining_export_through_hf(kind, pretraining_export, monkeypatch):
    directory, saved = pretraining_export
    calls, load_weights = [], hf.load_weights

    def spy(model, path, **kwargs):
        calls.append(type(model).__name__)
        load_weights(model, path, **kwargs)

    monkeypatch.setattr(hf, "load_weights", spy)
    model = LOADERS[kind](directory)
    assert calls == [type(model).__name__]
    for key, value in model.state_dict().items():
        if key.startswith("bert."):
            assert torch.equal(value, saved[key]), key


@pytest.mark.parametrize("kind", LOADERS)
def test_a_missing_encoder_tensor_is_named_by_every_class(kind, pretraining_export):
    directory, _ = pretraining_export
    key = "bert.encoder.layer.1.attention.self.query.weight"
    state = load_file(directory / hf.WEIGHTS_NAME)
    del state[key]
    save_file(state, directory / hf.WEIGHTS_NAME)
    with pytest.raises(ValueError, match=rf"model\.safetensors: missing keys \['{key}'\]"):
        LOADERS[kind](directory)


@pytest.mark.parametrize("kind", LOADERS)
def test_a_shape_mismatch_names_the_key_and_both_shapes(kind, pretraining_export):
    directory, _ = pretraining_export
    config = json.loads((directory / hf.CONFIG_NAME).read_text())
    config["vocab_size"] = 300
    (directory / hf.CONFIG_NAME).write_text(json.dumps(config))
    with pytest.raises(
        ValueError,
        match=r"bert\.embeddings\.word_embeddings\.weight has shape \(211, 64\), "
        r"config\.json implies \(300, 64\)",
    ):
        LOADERS[kind](directory)


def test_read_weights_normalises_transformers_variants(tmp_path):
    w, b = torch.randn(5, 4), torch.randn(5)
    save_file(
        {
            "embeddings.position_ids": torch.arange(8)[None],  # a buffer
            "encoder.layer.0.output.dense.bias": b[:4].clone(),  # a bare BertModel's key
            "cls.predictions.decoder.weight": w,  # tied: stands in for the embeddings
            "cls.predictions.decoder.bias": b,
        },
        tmp_path / "w.safetensors",
    )
    state = hf.read_weights(tmp_path / "w.safetensors")
    assert sorted(state) == [
        "bert.embeddings.word_embeddings.weight",
        "bert.encoder.layer.0.output.dense.bias",
        "cls.predictions.bias",
    ]
    assert torch.equal(state["bert.embeddings.word_embeddings.weight"], w)
    assert torch.equal(state["cls.predictions.bias"], b)


def test_unexpected_tensors_are_refused_unless_dropped(pretraining_export):
    directory, _ = pretraining_export
    state = load_file(directory / hf.WEIGHTS_NAME)
    save_file({**state, "classifier.weight": torch.zeros(2, 64)}, directory / hf.WEIGHTS_NAME)
    with pytest.raises(ValueError, match=r"unexpected keys \['classifier\.weight'\]"):
        BertForPreTraining.from_hf(directory)
    # A new head drops what it does not take: here the MLM/NSP heads and the classifier.
    head = BertForSequenceClassification.from_hf(directory, labels=("neg", "pos"))
    assert not torch.equal(head.classifier.weight, torch.zeros(2, 64))  # a new head, not the file's
