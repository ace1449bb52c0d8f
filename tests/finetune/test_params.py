"""The fine-tuning controls change what is trained exactly as they say (finetune/params.py,
finetune/train.py): frozen weights stay bit-identical, per-layer learning rates are in
the optimizer, the unfreezing schedule is followed, accumulation equals a bigger batch,
--max-steps stops."""

import dataclasses
import random

import pytest
import torch

from finetune.config import FinetuneConfig
from finetune.data import encode, label_names, load_examples, load_tokenizer
from finetune.params import depth_of, lowest_trainable_depth, param_groups
from finetune.train import train, train_step
from model import BertForSequenceClassification
from tests.helpers import has_digit, write_jsonl

L = 2  # the encoder layers of make_finetune_init's model


@pytest.fixture
def setup(tmp_path, init_dir):
    """(config, fresh model, 48 features) of the digit task on the tiny --init model."""
    path = write_jsonl(tmp_path / "t.jsonl", has_digit(random.Random(0), 48))
    examples = load_examples("classification", path)
    labels = label_names("classification", examples, None, path)
    features = encode("classification", load_tokenizer(init_dir), examples, labels, 32)
    cfg = FinetuneConfig(
        task="classification",
        init=str(init_dir),
        train=path,
        eval=path,
        lr=1e-3,
        batch_size=8,
        epochs=2,
        warmup_ratio=0.0,
    )

    def model():
        torch.manual_seed(0)
        return BertForSequenceClassification.from_hf(init_dir, labels=labels)

    return cfg, model, features


def snapshot(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def changed_depths(before, model) -> set[int]:
    return {depth_of(n, L) for n, p in model.named_parameters() if not torch.equal(p, before[n])}


def test_depths_of_parameter_names():
    assert depth_of("bert.embeddings.word_embeddings.weight", 12) == 0
    assert depth_of("bert.encoder.layer.0.attention.self.query.weight", 12) == 1
    assert depth_of("bert.encoder.layer.11.output.LayerNorm.bias", 12) == 12
    assert depth_of("bert.pooler.dense.weight", 12) == 13  # read by the head only
    assert depth_of("classifier.weight", 12) == 13


def test_frozen_layers_are_bit_identical_after_training(setup):
    cfg, make_model, features = setup
    model = make_model()
    before = snapshot(model)
    train(dataclasses.replace(cfg, freeze_layers=1), model, features, lambda m: {}, 0)
    # The embeddings (0) and layer 0 (1) frozen; layer 1 (2) and the head (3) trained.
    assert changed_depths(before, model) == {2, 3}
    frozen = [n for n in before if depth_of(n, L) <= 1]
    assert len(frozen) == 5 + 16 and all(
        torch.equal(before[n], model.get_parameter(n)) for n in frozen
    )


def test_layer_lr_decay_sets_each_groups_learning_rate(setup):
    cfg, make_model, _ = setup
    groups = param_groups(make_model(), dataclasses.replace(cfg, layer_lr_decay=0.5))
    lr_of = {g["depth"]: g["lr"] for g in groups}
    # head lr; layer l: lr * D^(L - l) (depth l + 1); embeddings lr * D^(L + 1)
    assert lr_of == pytest.approx({3: 1e-3, 2: 5e-4, 1: 2.5e-4, 0: 1.25e-4})
    no_decay = [g for g in groups if g["weight_decay"] == 0.0]
    assert {g["depth"] for g in no_decay} == {0, 1, 2, 3}  # biases and LayerNorm, each depth
    assert sum(len(g["params"]) for g in groups) == len(list(make_model().parameters()))


def test_layer_lr_decay_reaches_the_optimizer(setup, monkeypatch):
    """The groups train() builds carry the decayed rates (LambdaLR keeps them as initial_lr)."""
    cfg, make_model, features = setup
    seen = []
    real = torch.optim.AdamW

    def spy(groups, **kwargs):
        optimizer = real(groups, **kwargs)
        seen.append(optimizer)
        return optimizer

    monkeypatch.setattr(torch.optim, "AdamW", spy)
    train(
        dataclasses.replace(cfg, layer_lr_decay=0.5, max_steps=1),
        make_model(),
        features,
        lambda m: {},
        0,
    )
    initial = {g["depth"]: g["initial_lr"] for g in seen[0].param_groups}
    assert initial == pytest.approx({3: 1e-3, 2: 5e-4, 1: 2.5e-4, 0: 1.25e-4})


def test_gradual_unfreeze_follows_the_schedule(setup):
    """Epoch e trains depths >= L + 2 - e: the head, then the top layer, ..., embeddings last."""
    cfg, make_model, features = setup
    cfg = dataclasses.replace(cfg, gradual_unfreeze=True, epochs=L + 2)
    model = make_model()
    trainable, changed, before = [], [], [snapshot(model)]

    def after_epoch(m):
        trainable.append({depth_of(n, L) for n, p in m.named_parameters() if p.requires_grad})
        changed.append(changed_depths(before[-1], m))
        before.append(snapshot(m))
        return {}

    train(cfg, model, features, after_epoch, 0)
    assert trainable == [{3}, {2, 3}, {1, 2, 3}, {0, 1, 2, 3}]
    assert changed == trainable
    assert [lowest_trainable_depth(cfg, L, e) for e in (1, 2, 3, 4, 5)] == [3, 2, 1, 0, 0]
    # With --freeze-layers the frozen floor holds while unfreezing.
    floor = dataclasses.replace(cfg, freeze_layers=1)
    assert [lowest_trainable_depth(floor, L, e) for e in (1, 2, 3, 4)] == [3, 2, 2, 2]


def test_grad_accum_equals_one_big_batch(setup):
    """K micro batches of b (dropout off) give the update of one batch of K * b."""
    cfg, make_model, features = setup
    batch = features[:24]
    models = [make_model(), make_model()]
    losses = []
    for model, micro in zip(models, (8, 24), strict=True):
        optimizer = torch.optim.AdamW(param_groups(model, cfg), lr=cfg.lr)
        losses.append(train_step(model, optimizer, batch, micro, 0))
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    for (name, a), b in zip(models[0].named_parameters(), models[1].parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
    # ... and not that of the first micro batch alone (the test can fail).
    alone = make_model()
    train_step(alone, torch.optim.AdamW(param_groups(alone, cfg), lr=cfg.lr), batch[:8], 8, 0)
    assert not torch.allclose(alone.classifier.weight, models[1].classifier.weight, atol=1e-6)


def test_max_steps_stops_and_the_schedule_ends_there(setup):
    cfg, make_model, features = setup
    model, steps = make_model(), []
    model.register_forward_hook(lambda m, args, out: steps.append(1) if m.training else None)
    evaluations = []
    cfg = dataclasses.replace(cfg, max_steps=3, grad_accum=2, warmup_steps=1, epochs=99)
    seen = []
    real_step = torch.optim.AdamW.step

    def counting_step(self, *a, **k):
        seen.append(self.param_groups[0]["lr"])
        return real_step(self, *a, **k)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.optim.AdamW, "step", counting_step)
        train(cfg, model, features, lambda m: evaluations.append(1) or {}, 0)
    assert len(steps) == 3 * 2  # 3 optimizer steps of 2 micro batches
    assert seen == pytest.approx([0.0, 1e-3, 5e-4])  # warmup 1 step, then decay to 0 at 3
    assert len(evaluations) == 1  # 48 examples, 16 a step: stopped in the first epoch


def test_bad_controls_name_the_flag(tmp_path, init_dir, caplog):
    from finetune.__main__ import main

    with pytest.raises(ValueError, match=r"layer_lr_decay \(--layer-lr-decay\) must be in"):
        FinetuneConfig(task="qa", init="i", train="t", eval="e", layer_lr_decay=0)
    with pytest.raises(ValueError, match=r"grad_accum \(--grad-accum\) must be > 0"):
        FinetuneConfig(task="qa", init="i", train="t", eval="e", grad_accum=0)
    path = write_jsonl(tmp_path / "d.jsonl", has_digit(random.Random(0), 4))
    argv = ["--task", "classification", "--init", str(init_dir), "--train", path, "--eval", path]
    assert main([*argv, "--max-seq-length", "32", "--freeze-layers", "3"]) == 2
    assert "--freeze-layers 3 > the model's 2 encoder layers" in caplog.text
