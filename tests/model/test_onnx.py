"""ONNX export: onnxruntime matches PyTorch on several shapes; INT8 quantization; the CLI."""

import numpy as np
import pytest
import torch

pytest.importorskip("onnxscript")
onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from model import (  # noqa: E402
    BertConfig,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    HeadConfig,
)
from model.export_onnx import example_inputs, main, session  # noqa: E402
from pipeline.core.wordpiece import SPECIAL_TOKENS  # noqa: E402
from trainer.hf_tokenizer import Vocab, save_tokenizer  # noqa: E402

CFG = BertConfig(
    vocab_size=120,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=96,
    max_position_embeddings=48,
)
SHAPES = [(1, 5), (4, 17), (3, 48)]


def build(kind):
    torch.manual_seed(0)
    if kind == "encoder":
        return BertForPreTraining(CFG)
    cls = {
        "seq": BertForSequenceClassification,
        "token": BertForTokenClassification,
        "qa": BertForQuestionAnswering,
    }[kind]
    labels = ("x", "y") if kind == "qa" else ("a", "b", "c")
    return cls(HeadConfig(CFG, cls.architecture, labels))


def torch_outputs(model, inputs):
    """What each ONNX output should be, from the model's own forward (not the wrapper)."""
    with torch.no_grad():
        out = model.eval()(*inputs)
    if isinstance(model, BertForPreTraining):
        return [out.sequence_output, out.pooled_output]
    if isinstance(model, BertForQuestionAnswering):
        return [out.start_logits, out.end_logits]
    return [out.logits]


def max_rel_err(model, path, shapes, seed=10):
    sess = session(path)
    worst = 0.0
    for i, (b, t) in enumerate(shapes):
        inputs = example_inputs(CFG.vocab_size, b, t, seed + i)
        names = ("input_ids", "token_type_ids", "attention_mask")
        feed = {name: x.numpy() for name, x in zip(names, inputs, strict=True)}
        got = sess.run(None, feed)
        want = torch_outputs(model, inputs)
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert g.shape == tuple(w.shape)
            w = w.numpy()
            if w.ndim == 3:  # hidden states: padding positions hold no defined value
                keep = inputs[2].numpy().astype(bool)
                g, w = g[keep], w[keep]
            worst = max(worst, float(np.abs(g - w).max() / np.abs(w).max()))
    return worst


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["encoder", "seq", "token", "qa"])
def test_onnx_matches_pytorch_on_dynamic_shapes(kind, tmp_path):
    model = build(kind)
    model.save_hf(tmp_path / "hf")
    assert main([str(tmp_path / "hf"), str(tmp_path / "m.onnx")]) == 0
    graph = onnx.load(tmp_path / "m.onnx").graph
    names = [x.name for x in graph.input]
    assert names == ["input_ids", "token_type_ids", "attention_mask"]
    dims = [d.dim_param or d.dim_value for d in graph.input[0].type.tensor_type.shape.dim]
    assert all(isinstance(d, str) for d in dims), dims  # both axes symbolic
    assert max_rel_err(model, tmp_path / "m.onnx", SHAPES) < 1e-4


@pytest.mark.slow
def test_quantized_model_is_int8_and_close(tmp_path):
    model = build("seq")
    model.save_hf(tmp_path / "hf")
    assert main([str(tmp_path / "hf"), str(tmp_path / "q.onnx"), "--quantize"]) == 0
    ops = {n.op_type for n in onnx.load(tmp_path / "q.onnx").graph.node}
    assert "MatMulInteger" in ops or "DynamicQuantizeMatMul" in ops, ops
    # Quantization changes the numbers, but not by much on a fresh model.
    err = max_rel_err(model, tmp_path / "q.onnx", SHAPES[:2])
    assert 1e-6 < err < 0.1


def test_cli_rejects_a_directory_that_is_not_a_model(tmp_path, caplog):
    (tmp_path / "latest").write_text("step1")
    assert main([str(tmp_path), str(tmp_path / "m.onnx")]) == 2
    assert "python -m trainer.export" in caplog.text
    assert not (tmp_path / "m.onnx").exists()


def test_the_exported_tokenizers_output_is_the_graphs_input(tmp_path):
    """A Hugging Face tokenizer's dict (input_ids, token_type_ids, attention_mask) feeds the
    graph as it is: the input names are transformers'."""
    transformers = pytest.importorskip("transformers")
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    words = ["the", "river", "city", "north", "king", "music", "is", "was", "built", "."]
    tokens = [*SPECIAL_TOKENS, *words, *letters, *("##" + c for c in letters)]
    tokens += [f"w{i}" for i in range(CFG.vocab_size - len(tokens))]
    model = build("seq")
    model.save_hf(tmp_path / "hf")
    save_tokenizer(tmp_path / "hf", Vocab(tuple(tokens), True, "test"), model_max_length=48)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert len(tokenizer) == CFG.vocab_size  # the export's vocab, not a fallback
    assert main([str(tmp_path / "hf"), str(tmp_path / "m.onnx")]) == 0
    batch = tokenizer(
        ["The river was built.", "Music"],
        ["North city", "the kings"],
        padding=True,
        return_tensors="np",
    )
    assert set(batch) == {"input_ids", "token_type_ids", "attention_mask"}
    assert batch["token_type_ids"].any() and not batch["attention_mask"].all()  # pairs, padded
    assert tokenizer.unk_token_id not in batch["input_ids"]
    (logits,) = session(tmp_path / "m.onnx").run(None, dict(batch))
    with torch.no_grad():
        want = model.eval()(
            *(torch.from_numpy(batch[k]) for k in ("input_ids", "token_type_ids", "attention_mask"))
        ).logits
    np.testing.assert_allclose(logits, want.numpy(), rtol=1e-4, atol=1e-5)
