"""Parity with the reference: transformers' BertForPreTraining, same weights and batch."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from model import BertConfig, BertForPreTraining, num_parameters  # noqa: E402

CFG = BertConfig(
    vocab_size=211,
    hidden_size=64,
    num_hidden_layers=3,
    num_attention_heads=4,
    intermediate_size=96,
    max_position_embeddings=40,
)


def hf_model(cfg: BertConfig):
    hf_cfg = transformers.BertConfig(
        **{k: v for k, v in cfg.to_dict().items() if k not in ("architectures",)}
    )
    hf_cfg._attn_implementation = "sdpa"
    return transformers.BertForPreTraining(hf_cfg)


def padded_batch(vocab=211, seed=0):
    """Rows of varying length, both segments, masked positions padded with 0."""
    g = torch.Generator().manual_seed(seed)
    lengths = [40, 33, 17, 8]
    b, t, p = len(lengths), max(lengths), 6
    input_ids = torch.zeros(b, t, dtype=torch.long)
    segment_ids = torch.zeros(b, t, dtype=torch.long)
    attention_mask = torch.zeros(b, t, dtype=torch.long)
    positions = torch.zeros(b, p, dtype=torch.long)
    ids = torch.zeros(b, p, dtype=torch.long)
    labels = torch.full((b, t), -100)
    for r, n in enumerate(lengths):
        input_ids[r, :n] = torch.randint(5, vocab, (n,), generator=g)
        segment_ids[r, n // 2 : n] = 1
        attention_mask[r, :n] = 1
        k = min(p, max(1, n // 6))
        pos = (torch.randperm(n - 2, generator=g)[:k] + 1).sort().values
        positions[r, :k] = pos
        ids[r, :k] = torch.randint(5, vocab, (k,), generator=g)
        labels[r, pos] = ids[r, :k]
    nsl = torch.tensor([0, 1, 1, 0])
    return input_ids, segment_ids, attention_mask, positions, ids, nsl, labels


def rel_err(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item()


def test_forward_and_backward_match_transformers():
    torch.manual_seed(0)
    ref = hf_model(CFG).eval()
    ours = BertForPreTraining(CFG).eval()
    missing, unexpected = ours.load_state_dict(ref.state_dict(), strict=False)
    assert not missing
    assert set(unexpected) <= {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}

    ii, ss, am, pos, ids, nsl, labels = padded_batch()
    out = ours(ii, ss, am, pos, ids, nsl)
    r = ref(
        input_ids=ii,
        token_type_ids=ss,
        attention_mask=am,
        labels=labels,
        next_sentence_label=nsl,
        output_hidden_states=True,
    )
    valid = am.bool()
    assert rel_err(out.sequence_output[valid], r.hidden_states[-1][valid]) < 1e-5
    ref_pooled = ref.bert.pooler(r.hidden_states[-1])
    assert rel_err(out.pooled_output, ref_pooled) < 1e-5
    gathered = r.prediction_logits.gather(1, pos[..., None].expand(-1, -1, CFG.vocab_size))
    real = pos > 0
    assert rel_err(out.mlm_logits[real], gathered[real]) < 1e-5
    assert rel_err(out.nsp_logits, r.seq_relationship_logits) < 1e-5
    assert rel_err(out.loss, r.loss) < 1e-5

    out.loss.backward()
    r.loss.backward()
    ref_grads = dict(ref.named_parameters())
    for name, p in ours.named_parameters():
        assert p.grad is not None, name
        if name.endswith("attention.self.key.bias"):
            # Zero in exact arithmetic (a key bias shifts all of a query's scores
            # equally, and softmax ignores shifts): both sides hold rounding noise.
            assert p.grad.abs().max() < 1e-9 and ref_grads[name].grad.abs().max() < 1e-9, name
            continue
        assert rel_err(p.grad, ref_grads[name].grad) < 1e-4, name


@pytest.mark.parametrize("preset", ["base", "large"])
def test_parameter_count_matches_transformers(preset):
    cfg = BertConfig.preset(preset)
    with torch.device("meta"):
        ours = num_parameters(BertForPreTraining(cfg))
        ref = hf_model(cfg).num_parameters()
    assert ours == ref
    assert ours > (300e6 if preset == "large" else 100e6)


def test_save_hf_loads_in_transformers(tmp_path):
    torch.manual_seed(1)
    ours = BertForPreTraining(CFG).eval()
    ours.save_hf(tmp_path)
    ref, info = transformers.BertForPreTraining.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    ii, ss, am, *_ = padded_batch()
    r = ref.eval()(input_ids=ii, token_type_ids=ss, attention_mask=am)
    o = ours(ii, ss, am)
    assert rel_err(o.nsp_logits, r.seq_relationship_logits) < 1e-5


def test_from_hf_loads_a_transformers_save(tmp_path):
    torch.manual_seed(2)
    ref = hf_model(CFG).eval()
    ref.save_pretrained(tmp_path)
    ours = BertForPreTraining.from_hf(tmp_path).eval()
    assert ours.config == CFG
    ii, ss, am, pos, ids, nsl, labels = padded_batch()
    o = ours(ii, ss, am, pos, ids, nsl)
    r = ref(
        input_ids=ii, token_type_ids=ss, attention_mask=am, labels=labels, next_sentence_label=nsl
    )
    assert rel_err(o.loss, r.loss) < 1e-5
    # Tied weights stay tied after loading.
    assert ours.cls.predictions.word_embeddings[0] is ours.bert.embeddings.word_embeddings


def test_from_hf_rejects_mismatched_shapes(tmp_path):
    BertForPreTraining(CFG).save_hf(tmp_path)
    cfg = (tmp_path / "config.json").read_text().replace('"vocab_size": 211', '"vocab_size": 300')
    (tmp_path / "config.json").write_text(cfg)
    with pytest.raises(ValueError, match=r"word_embeddings.weight has shape \(211, 64\)"):
        BertForPreTraining.from_hf(tmp_path)
