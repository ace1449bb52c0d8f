"""Shapes, validation and config behaviour of model/ (no reference needed)."""

import json
import os
import stat

import pytest
import torch

from model import BertConfig, BertForPreTraining
from model.bert import dense_labels_to_positions
from tests.torch_helpers import CountHostSyncs

TINY = dict(
    vocab_size=99,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=37,
    max_position_embeddings=64,
)


def batch(b=3, t=16, p=4, vocab=99, seed=0):
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, vocab, (b, t), generator=g)
    segment_ids = torch.zeros(b, t, dtype=torch.long)
    segment_ids[:, t // 2 :] = 1
    attention_mask = torch.ones(b, t, dtype=torch.long)
    attention_mask[0, t - 5 :] = 0
    positions = torch.stack([torch.randperm(t - 6, generator=g)[:p] + 1 for _ in range(b)])
    positions = positions.sort(1).values
    ids = torch.randint(5, vocab, (b, p), generator=g)
    positions[1, -1] = 0  # one padding entry
    return input_ids, segment_ids, attention_mask, positions, ids, torch.tensor([0, 1, 0])


def test_output_shapes_and_loss():
    cfg = BertConfig(**TINY)
    model = BertForPreTraining(cfg).eval()
    out = model(*batch())
    assert out.sequence_output.shape == (3, 16, 32)
    assert out.pooled_output.shape == (3, 32)
    assert out.mlm_logits.shape == (3, 4, 99)
    assert out.nsp_logits.shape == (3, 2)
    torch.testing.assert_close(out.loss, out.mlm_loss + out.nsp_loss)
    # A fresh model predicts near-uniformly: loss close to log(V) + log(2).
    assert abs(out.mlm_loss.item() - torch.log(torch.tensor(99.0)).item()) < 0.5


def test_padding_entries_do_not_change_the_loss():
    model = BertForPreTraining(BertConfig(**TINY)).eval()
    ii, ss, am, pos, ids, nsl = batch()
    base = model(ii, ss, am, pos, ids, nsl).mlm_loss
    ids2 = ids.clone()
    ids2[1, -1] = 7  # id under a padding position (0): ignored
    torch.testing.assert_close(model(ii, ss, am, pos, ids2, nsl).mlm_loss, base)
    ids3 = ids.clone()
    ids3[0, 0] = 8  # a real entry: changes the loss
    assert not torch.allclose(model(ii, ss, am, pos, ids3, nsl).mlm_loss, base)


def test_dense_labels_match_positions():
    labels = torch.tensor([[-100, 7, -100, 9], [-100, -100, 5, -100]])
    pos, ids = dense_labels_to_positions(labels)
    assert pos.tolist() == [[1, 3], [2, 0]]
    assert ids.tolist() == [[7, 9], [5, -100]]
    model = BertForPreTraining(BertConfig(**TINY)).eval()
    ii, ss, am, pos, ids, nsl = batch()
    ids[1, -1] = -100
    dense = torch.full_like(ii, -100)
    for r in range(ii.shape[0]):
        for p, i in zip(pos[r].tolist(), ids[r].tolist(), strict=True):
            if p:
                dense[r, p] = i
    a = model(ii, ss, am, pos, ids, nsl)
    b = model(ii, ss, am, next_sentence_label=nsl, labels=dense)
    torch.testing.assert_close(a.loss, b.loss)


def test_attention_mask_hides_padding():
    model = BertForPreTraining(BertConfig(**TINY)).eval()
    ii, ss, am, *_ = batch()
    out = model(ii, ss, am)
    ii2 = ii.clone()
    ii2[0, -3:] = 11  # change padded tokens of row 0
    out2 = model(ii2, ss, am)
    torch.testing.assert_close(out.sequence_output[0, :11], out2.sequence_output[0, :11])
    torch.testing.assert_close(out.pooled_output, out2.pooled_output)


def test_init_statistics():
    cfg = BertConfig.preset("mini", vocab_size=1000)
    model = BertForPreTraining(cfg)
    w = model.bert.encoder.layer[0].intermediate.dense.weight
    assert abs(w.std().item() - 0.02) < 0.001
    assert model.bert.encoder.layer[0].intermediate.dense.bias.abs().sum() == 0
    assert torch.all(model.bert.embeddings.LayerNorm.weight == 1)
    assert torch.all(model.bert.embeddings.word_embeddings.weight[0] == 0)  # [PAD]
    assert model.cls.predictions.bias.abs().sum() == 0


def test_gradient_checkpointing_gives_same_gradients():
    torch.manual_seed(0)
    cfg = BertConfig(**TINY, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = BertForPreTraining(cfg).train()
    data = batch()
    model(*data).loss.backward()
    ref = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model.set_gradient_checkpointing(True)
    model(*data).loss.backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, ref[n], msg=n)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda d: d.__setitem__(0, d[0].float()), "input_ids must be an integer"),
        (lambda d: d.__setitem__(1, d[1][:, :5]), "segment_ids must have shape"),
        (lambda d: d.__setitem__(2, d[2][:2]), "attention_mask must have shape"),
        (lambda d: d.__setitem__(3, d[3].float()), "masked_lm_positions must be an integer"),
        (lambda d: d.__setitem__(4, d[4][:, :2]), "masked_lm_ids must have shape"),
        (lambda d: d.__setitem__(5, d[5][:2]), "next_sentence_label must have shape"),
    ],
)
def test_bad_input_names_the_tensor(change, match):
    model = BertForPreTraining(BertConfig(**TINY))
    data = list(batch())
    change(data)
    with pytest.raises(ValueError, match=match):
        model(*data)


VALUES_OUT_OF_RANGE = [
    (lambda d: d.__setitem__(0, d[0].clone().fill_(99)), r"input_ids values must be in \[0, 99\)"),
    (lambda d: d.__setitem__(1, d[1] + 2), r"segment_ids values must be in \[0, 2\)"),
    (lambda d: d.__setitem__(3, d[3] + 100), r"masked_lm_positions values must be in \[0, 16\)"),
    (lambda d: d.__setitem__(4, d[4] + 1000), r"masked_lm_ids values must be in \[0, 99\)"),
]


@pytest.mark.parametrize(("change", "match"), VALUES_OUT_OF_RANGE)
def test_debug_checks_name_a_value_out_of_range(change, match, monkeypatch):
    """Value ranges are checked where data enters (tests/trainer/test_data.py); in forward
    only with BERT_DEBUG_CHECKS=1, since each check is a device-to-host sync."""
    monkeypatch.setattr("model.bert.DEBUG_CHECKS", True)
    model = BertForPreTraining(BertConfig(**TINY))
    data = list(batch())
    change(data)
    with pytest.raises(ValueError, match=match):
        model(*data)


@pytest.mark.parametrize(("unpad", "syncs"), [(False, 0), (True, 1)])
def test_a_training_step_syncs_with_the_host_only_to_pack(unpad, syncs, monkeypatch):
    """No value checks in forward (they moved to the data path); the unpadded encoder's one
    sync sizes its packing (model/unpad.py)."""
    monkeypatch.setattr("model.bert.DEBUG_CHECKS", False)
    model = BertForPreTraining(BertConfig(**TINY), unpad=unpad)
    data = batch()
    with CountHostSyncs() as counter:
        out = model(*data)
    assert (out.packing is not None) == unpad
    assert counter.count == syncs
    with CountHostSyncs() as counter:
        out.loss.backward()
    assert counter.count == 0
    monkeypatch.setattr("model.bert.DEBUG_CHECKS", True)
    with CountHostSyncs() as counter:
        model(*data)
    assert counter.count > syncs  # the counter sees the debug checks' syncs


def test_too_long_sequence():
    model = BertForPreTraining(BertConfig(**TINY))
    ii = torch.ones(1, 65, dtype=torch.long)
    with pytest.raises(ValueError, match="max_position_embeddings=64"):
        model(ii, torch.zeros_like(ii), torch.ones_like(ii))


def test_config_presets_and_validation(tmp_path):
    assert BertConfig.preset("tiny").num_hidden_layers == 2
    large = BertConfig.preset("large")
    assert (large.hidden_size, large.num_attention_heads, large.intermediate_size) == (
        1024,
        16,
        4096,
    )
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        BertConfig.preset("huge")
    with pytest.raises(ValueError, match="divisible by num_attention_heads"):
        BertConfig(hidden_size=100, num_attention_heads=3)
    with pytest.raises(ValueError, match="hidden_act"):
        BertConfig(hidden_act="swish")
    cfg = BertConfig.preset("small", vocab_size=1234)
    cfg.to_json(tmp_path / "config.json")
    assert BertConfig.from_json(tmp_path / "config.json") == cfg
    bad = json.loads((tmp_path / "config.json").read_text()) | {"hiden_size": 3}
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"bad.json: unknown key\(s\) \['hiden_size'\]"):
        BertConfig.from_json(tmp_path / "bad.json")
    del bad["hiden_size"], bad["vocab_size"]
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"missing key\(s\) \['vocab_size'\]"):
        BertConfig.from_json(tmp_path / "bad.json")
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(ValueError, match=r"broken\.json"):
        BertConfig.from_json(tmp_path / "broken.json")


def test_save_hf_writes_files_others_can_read(tmp_path, umask_022):
    model = BertForPreTraining(BertConfig(**TINY))
    for _ in range(2):  # a fresh directory, then over the existing files
        model.save_hf(tmp_path / "hf")
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "hf").iterdir()}
        # not the 0600 of tempfile.mkstemp or safetensors' save_file; no temp file left
        assert modes == {"config.json": 0o644, "model.safetensors": 0o644}
    os.umask(0o077)  # a stricter umask is honoured
    BertConfig(**TINY).to_json(tmp_path / "private.json")
    assert stat.S_IMODE((tmp_path / "private.json").stat().st_mode) == 0o600
