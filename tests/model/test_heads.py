"""Fine-tuning heads: parity with transformers' classes, HF round trips, loading rules."""

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from model import (  # noqa: E402
    BertConfig,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    HeadConfig,
)
from tests.helpers import HEADS_MODEL  # noqa: E402

CFG = BertConfig(**HEADS_MODEL)
LABELS = ("a", "b", "c")
OURS = {
    "seq": BertForSequenceClassification,
    "token": BertForTokenClassification,
    "qa": BertForQuestionAnswering,
}


def rel_err(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item()


def hf_config(labels=LABELS):
    values = {k: v for k, v in CFG.to_dict().items() if k != "architectures"}
    cfg = transformers.BertConfig(**values, id2label=dict(enumerate(labels)))
    cfg._attn_implementation = "sdpa"
    return cfg


def labels_for(kind):
    return LABELS if kind != "qa" else ("x", "y")


def ours_config(kind):
    return HeadConfig(CFG, OURS[kind].architecture, labels_for(kind))


def padded_batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = [40, 23, 9]
    b, t = len(lengths), max(lengths)
    input_ids = torch.zeros(b, t, dtype=torch.long)
    segment_ids = torch.zeros(b, t, dtype=torch.long)
    attention_mask = torch.zeros(b, t, dtype=torch.long)
    token_labels = torch.full((b, t), -100)
    for r, n in enumerate(lengths):
        input_ids[r, :n] = torch.randint(5, CFG.vocab_size, (n,), generator=g)
        segment_ids[r, n // 2 : n] = 1
        attention_mask[r, :n] = 1
        token_labels[r, 1 : n - 1] = torch.randint(0, 3, (n - 2,), generator=g)
    targets = {
        "seq": {"labels": torch.tensor([2, 0, 1])},
        "token": {"labels": token_labels},
        # 45 is past the end: ignored in the loss, as transformers does.
        "qa": {
            "start_positions": torch.tensor([3, 0, 45]),
            "end_positions": torch.tensor([7, 0, 45]),
        },
    }
    return input_ids, segment_ids, attention_mask, targets


def outputs(out):
    if hasattr(out, "logits"):
        return [out.logits]
    return [out.start_logits, out.end_logits]


def max_rel_err(kind, ours, ref, attention_mask):
    """Over every output; per-position outputs compared at real tokens only (padded
    positions differ only in how the ignored mask value is spelled)."""
    valid = attention_mask.bool()
    pairs = zip(outputs(ours), outputs(ref), strict=True)
    return max(rel_err(a, b) if kind == "seq" else rel_err(a[valid], b[valid]) for a, b in pairs)


def ref_class(kind):
    return getattr(transformers, OURS[kind].architecture)


@pytest.mark.parametrize("kind", ["seq", "token", "qa"])
def test_forward_loss_and_grads_match_transformers(kind):
    torch.manual_seed(0)
    ref = ref_class(kind)(hf_config(labels_for(kind))).eval()
    ours = OURS[kind](ours_config(kind)).eval()
    missing, unexpected = ours.load_state_dict(ref.state_dict(), strict=True)
    assert not missing and not unexpected
    ii, ss, am, targets = padded_batch()
    out = ours(ii, ss, am, **targets[kind])
    r = ref(input_ids=ii, token_type_ids=ss, attention_mask=am, **targets[kind])
    assert max_rel_err(kind, out, r, am) < 1e-5
    assert rel_err(out.loss, r.loss) < 1e-5
    out.loss.backward()
    r.loss.backward()
    ref_grads = dict(ref.named_parameters())
    for name, p in ours.named_parameters():
        if name.endswith("attention.self.key.bias"):  # zero in exact arithmetic: noise
            assert p.grad.abs().max() < 1e-9 and ref_grads[name].grad.abs().max() < 1e-9
            continue
        assert rel_err(p.grad, ref_grads[name].grad) < 1e-4, name


def test_regression_head_uses_mse_like_transformers():
    torch.manual_seed(0)
    ref = transformers.BertForSequenceClassification(hf_config(("score",))).eval()
    ours = BertForSequenceClassification(
        HeadConfig(CFG, "BertForSequenceClassification", ("score",))
    )
    ours.load_state_dict(ref.state_dict())
    ii, ss, am, _ = padded_batch()
    y = torch.tensor([0.5, -1.0, 2.0])
    r = ref(input_ids=ii, token_type_ids=ss, attention_mask=am, labels=y)
    assert rel_err(ours.eval()(ii, ss, am, labels=y).loss, r.loss) < 1e-5


@pytest.mark.parametrize("kind", ["seq", "token", "qa"])
def test_save_hf_loads_in_transformers_and_back(kind, tmp_path):
    torch.manual_seed(1)
    ours = OURS[kind](ours_config(kind)).eval()
    ours.save_hf(tmp_path)
    ref, info = ref_class(kind).from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert ref.config.num_labels == ours.config.num_labels
    if kind != "qa":
        assert ref.config.id2label == dict(enumerate(LABELS))
    ii, ss, am, _ = padded_batch()
    r = ref.eval()(input_ids=ii, token_type_ids=ss, attention_mask=am)
    assert max_rel_err(kind, ours(ii, ss, am), r, am) < 1e-5

    again = OURS[kind].from_hf(tmp_path)
    assert again.config == ours.config
    for (name, a), b in zip(ours.state_dict().items(), again.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("kind", ["seq", "token", "qa"])
def test_from_hf_loads_a_transformers_save(kind, tmp_path):
    torch.manual_seed(2)
    ref = ref_class(kind)(hf_config(labels_for(kind))).eval()
    ref.save_pretrained(tmp_path)
    ours = OURS[kind].from_hf(tmp_path).eval()
    assert ours.config.bert == CFG
    assert ours.config.labels == labels_for(kind)
    ii, ss, am, targets = padded_batch()
    r = ref(input_ids=ii, token_type_ids=ss, attention_mask=am, **targets[kind])
    out = ours(ii, ss, am, **targets[kind])
    assert max_rel_err(kind, out, r, am) < 1e-5
    assert rel_err(out.loss, r.loss) < 1e-5


def test_from_pretraining_export_keeps_encoder_and_initialises_head(tmp_path):
    torch.manual_seed(3)
    pre = BertForPreTraining(CFG)
    pre.save_hf(tmp_path)
    torch.manual_seed(4)
    model = BertForSequenceClassification.from_hf(tmp_path, labels=("neg", "pos"))
    assert model.config.labels == ("neg", "pos")
    pre_state = pre.state_dict()
    for name, value in model.state_dict().items():
        if name.startswith("bert."):
            assert torch.equal(value, pre_state[name]), name
    assert not any(k.startswith("cls.") for k in model.state_dict())
    w, b = model.classifier.weight, model.classifier.bias
    assert w.shape == (2, 64) and torch.count_nonzero(b) == 0
    assert 0.015 < w.std().item() < 0.025  # normal(0, initializer_range)
    token = BertForTokenClassification.from_hf(tmp_path, labels=LABELS)
    assert token.bert.pooler is None and token.classifier.weight.shape == (3, 64)
    qa = BertForQuestionAnswering.from_hf(tmp_path)  # two outputs, no labels needed
    assert qa.qa_outputs.weight.shape == (2, 64)


def test_from_transformers_pretraining_save(tmp_path):
    torch.manual_seed(5)
    values = {k: v for k, v in CFG.to_dict().items() if k != "architectures"}
    ref = transformers.BertForPreTraining(transformers.BertConfig(**values))
    ref.save_pretrained(tmp_path)  # its config.json carries id2label LABEL_0/1: not our head
    model = BertForTokenClassification.from_hf(tmp_path, labels=LABELS)
    torch.testing.assert_close(
        model.bert.embeddings.word_embeddings.weight, ref.bert.embeddings.word_embeddings.weight
    )


def test_loading_errors_name_the_problem(tmp_path):
    BertForPreTraining(CFG).save_hf(tmp_path / "pre")
    with pytest.raises(ValueError, match="pass labels"):
        BertForSequenceClassification.from_hf(tmp_path / "pre")
    BertForSequenceClassification(ours_config("seq")).save_hf(tmp_path / "seq")
    with pytest.raises(ValueError, match=r"labels \['a', 'b', 'c'\], not \['x', 'y'\]"):
        BertForSequenceClassification.from_hf(tmp_path / "seq", labels=("x", "y"))
    config = json.loads((tmp_path / "seq/config.json").read_text())
    config["hidden_size"] = 32
    config["num_attention_heads"] = 2
    (tmp_path / "seq/config.json").write_text(json.dumps(config))
    with pytest.raises(
        ValueError, match=r"bert\..* has shape \(.*64.*\), config.json implies \(.*32.*\)"
    ):
        BertForSequenceClassification.from_hf(tmp_path / "seq")
    ds = tmp_path / "run"
    (ds / "step00000010").mkdir(parents=True)
    (ds / "latest").write_text("step00000010")
    (ds / "step00000010/mp_rank_00_model_states.pt").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"python -m trainer\.export"):
        BertForSequenceClassification.from_hf(ds, labels=("x", "y"))


def test_head_config_validation():
    with pytest.raises(ValueError, match="distinct"):
        HeadConfig(CFG, "BertForSequenceClassification", ("a", "a"))
    with pytest.raises(ValueError, match="2 outputs"):
        HeadConfig(CFG, "BertForQuestionAnswering", ("a", "b", "c"))
    with pytest.raises(ValueError, match="architecture"):
        HeadConfig(CFG, "BertForMaskedLM", ("a",))
    with pytest.raises(ValueError, match="needs a BertForTokenClassification"):
        BertForTokenClassification(ours_config("seq"))


def test_dropout_sits_before_the_classifier_and_round_trips(tmp_path):
    cfg = BertConfig(
        **{**CFG.__dict__, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    )
    ii, ss, am, _ = padded_batch()
    for kind in ("seq", "token"):
        cls = OURS[kind]
        plain = cls(HeadConfig(cfg, cls.architecture, LABELS)).train()
        torch.testing.assert_close(plain(ii, ss, am).logits, plain(ii, ss, am).logits)
        noisy = cls(HeadConfig(cfg, cls.architecture, LABELS, classifier_dropout=0.5)).train()
        assert not torch.allclose(noisy(ii, ss, am).logits, noisy(ii, ss, am).logits)
        noisy.save_hf(tmp_path / kind)
        assert cls.from_hf(tmp_path / kind).config.classifier_dropout == 0.5
