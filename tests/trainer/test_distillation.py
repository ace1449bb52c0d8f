"""Knowledge distillation (trainer/distillation.py): the loss against hand computations, the
student's initialisation, a frozen teacher, exact resume and refusals of trainer/run.py."""

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from model import BertConfig, BertForPreTraining, load_hf
from tests.helpers import ds_json
from tests.torch_helpers import CountHostSyncs
from trainer import distillation, export, loop
from trainer.config import parse_args
from trainer.distillation import (
    LossWeights,
    cosine_loss,
    distillation_loss,
    init_from_teacher,
    real_token_states,
    soft_target_kl,
    teacher_layers,
)
from trainer.run import main

TINY = {
    "vocab_size": 200,
    "hidden_size": 32,
    "num_hidden_layers": 4,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
}


def tiny_batch(seed=0, rows=4, width=12):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([width, width - 3, width - 5, 6])[:rows]
    mask = (torch.arange(width)[None] < lengths[:, None]).long()
    input_ids = torch.randint(5, 200, (rows, width), generator=g) * mask
    positions = torch.tensor([[1, 3, 0], [2, 4, 5], [1, 0, 0], [3, 4, 0]])[:rows]
    ids = torch.randint(5, 200, positions.shape, generator=g).masked_fill(positions == 0, -100)
    return {
        "input_ids": input_ids,
        "segment_ids": torch.zeros_like(input_ids),
        "attention_mask": mask,
        "masked_lm_positions": positions,
        "masked_lm_ids": ids,
        "next_sentence_label": torch.tensor([0, 1, 1, 0])[:rows],
    }


def model(seed, **overrides) -> BertForPreTraining:
    torch.manual_seed(seed)
    return BertForPreTraining(
        BertConfig(
            **{**TINY, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, **overrides}
        )
    )


def test_soft_target_kl_matches_a_hand_computation():
    keep = torch.tensor([True])
    # T 2: teacher [2 ln 3, 0] / 2 -> (0.75, 0.25); student uniform. T² x KL = 4 x ...
    kl = soft_target_kl(torch.zeros(1, 2), torch.tensor([[2 * math.log(3), 0.0]]), keep, 2.0)
    assert kl.item() == pytest.approx(4 * (0.75 * math.log(1.5) + 0.25 * math.log(0.5)), 1e-6)
    # T 1: teacher uniform, student [ln 2, 0] -> (2/3, 1/3).
    kl = soft_target_kl(torch.tensor([[math.log(2), 0.0]]), torch.zeros(1, 2), keep, 1.0)
    assert kl.item() == pytest.approx(0.5 * math.log(0.75) + 0.5 * math.log(1.5), 1e-6)
    # The mean over kept rows: a dropped row with wild logits changes nothing; none kept: 0.
    student = torch.tensor([[0.0, 0.0], [50.0, -50.0], [0.0, 0.0]])
    teacher = torch.tensor([[2 * math.log(3), 0.0], [-50.0, 50.0], [2 * math.log(3), 0.0]])
    both = soft_target_kl(student, teacher, torch.tensor([True, False, True]), 2.0)
    assert both.item() == pytest.approx(4 * (0.75 * math.log(1.5) + 0.25 * math.log(0.5)), 1e-6)
    assert soft_target_kl(student, teacher, torch.zeros(3, dtype=torch.bool), 2.0).item() == 0


def test_t_squared_keeps_the_gradient_at_t_times_the_probability_gap():
    # d/ds T² KL(p_t || softmax(s / T)) = T (softmax(s / T) - p_t), per kept row / N.
    student = torch.tensor([[1.0, -1.0, 0.5]], requires_grad=True)
    teacher = torch.tensor([[0.0, 2.0, -1.0]])
    for t in (1.0, 4.0):
        student.grad = None
        soft_target_kl(student, teacher, torch.tensor([True]), t).backward()
        expected = t * (torch.softmax(student.detach() / t, -1) - torch.softmax(teacher / t, -1))
        torch.testing.assert_close(student.grad, expected)


def test_cosine_loss_known_answers():
    a = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    assert cosine_loss(a, 3 * a).item() == pytest.approx(0.0, abs=1e-6)
    assert cosine_loss(a, a.flip(1)).item() == pytest.approx(1.0)  # orthogonal rows
    assert cosine_loss(a, -a).item() == pytest.approx(2.0)


def test_loss_is_the_weighted_sum_of_its_pieces():
    batch = tiny_batch()
    student, teacher = model(1), model(2)
    s = student(**batch)
    with torch.no_grad():
        t = teacher(*(batch[k] for k in distillation.TEACHER_INPUTS))
    targets, rows = batch["masked_lm_positions"] != 0, torch.ones(4, dtype=torch.bool)
    kl_mlm = soft_target_kl(s.mlm_logits, t.mlm_logits, targets, 3.0)
    kl_nsp = soft_target_kl(s.nsp_logits, t.nsp_logits, rows, 3.0)
    mask = batch["attention_mask"].bool()
    cos = cosine_loss(s.sequence_output[mask], t.sequence_output[mask])
    assert kl_mlm > 0 and kl_nsp > 0 and cos > 0

    def loss(kl, hard, cos_w, nsp=True):
        return distillation_loss(s, t, batch, LossWeights(3.0, kl, hard, cos_w, nsp))

    torch.testing.assert_close(loss(1, 0, 0).loss, kl_mlm + kl_nsp)
    torch.testing.assert_close(loss(0, 1, 0).loss, s.mlm_loss + s.nsp_loss)  # = pretraining
    torch.testing.assert_close(loss(0, 0, 1).loss, cos)
    torch.testing.assert_close(loss(0.5, 2, 0, nsp=False).loss, 0.5 * kl_mlm + 2 * s.mlm_loss)
    out = loss(5, 2, 1)
    torch.testing.assert_close(out.loss, 5 * (kl_mlm + kl_nsp) + 2 * s.loss + cos)
    assert out.cos_loss.item() == pytest.approx(cos.item()) and loss(5, 2, 0).cos_loss is None
    assert out.mlm_loss is s.mlm_loss  # the hard losses stay, for the metrics
    same = distillation_loss(s, student(**batch), batch, LossWeights(2.0, 1, 0, 1, True))
    assert same.kl_loss.item() == pytest.approx(0, abs=1e-6)  # a teacher equal to the student
    assert same.cos_loss.item() == pytest.approx(0, abs=1e-6)


def test_mlm_kl_is_the_same_whichever_path_each_model_ran():
    """The unpadded head runs on the real predictions only, the padded one on every slot;
    a padded teacher and an unpadded student still compare the same predictions."""
    batch = tiny_batch()
    student, teacher = model(1), model(2)
    s = student(**batch)
    inputs = [batch[k] for k in distillation.TEACHER_INPUTS]
    with torch.no_grad():
        t_unpadded = teacher(*inputs)
        teacher.set_unpadded(False)
        t_padded = teacher(*inputs)
    assert s.packing is not None and t_padded.packing is None
    assert s.prediction_logits.shape[0] < t_padded.prediction_logits.shape[0]
    weights = LossWeights(2.0, 1, 0, 0, False)
    mixed = distillation_loss(s, t_padded, batch, weights).kl_loss
    same = distillation_loss(s, t_unpadded, batch, weights).kl_loss
    assert mixed > 0
    torch.testing.assert_close(mixed, same, atol=1e-5, rtol=1e-5)
    with CountHostSyncs() as counter:
        distillation_loss(s, t_unpadded, batch, weights)
    assert counter.count == 0


def test_packed_and_padded_hidden_states_line_up():
    batch, m = tiny_batch(), model(1)
    packed = m(*(batch[k] for k in distillation.TEACHER_INPUTS))
    m.set_unpadded(False)
    padded = m(*(batch[k] for k in distillation.TEACHER_INPUTS))
    assert packed.packing is not None and padded.packing is None
    mask = batch["attention_mask"]
    torch.testing.assert_close(
        real_token_states(packed, mask), real_token_states(padded, mask), atol=1e-5, rtol=1e-5
    )


def test_teacher_layers_are_evenly_spaced_with_first_and_last():
    assert teacher_layers(12, 6) == [0, 2, 4, 7, 9, 11]  # DistilBERT's
    assert teacher_layers(4, 2) == [0, 3]
    assert teacher_layers(4, 4) == [0, 1, 2, 3]
    assert teacher_layers(4, 1) == [0]
    with pytest.raises(ValueError, match="5 layers cannot take them from a teacher of 3"):
        teacher_layers(3, 5)


def test_student_init_copies_embeddings_the_chosen_layers_and_heads():
    teacher, student = model(1), model(2, num_hidden_layers=2)
    assert init_from_teacher(student, teacher) == [0, 3]
    t, s = teacher.state_dict(), student.state_dict()
    for key, value in s.items():
        source = key.replace("encoder.layer.1.", "encoder.layer.3.")
        assert torch.equal(value, t[source]), key
    assert not torch.equal(
        s["bert.encoder.layer.1.output.dense.weight"], t["bert.encoder.layer.1.output.dense.weight"]
    )
    with pytest.raises(ValueError, match=r"hidden_size 32 \(teacher\) != 64 \(student\)"):
        init_from_teacher(model(3, hidden_size=64, intermediate_size=64), teacher)


def test_distillation_flags_need_a_teacher():
    required = [
        "--ds-config",
        "ds.json",
        "--data",
        "shards",
        "--output-dir",
        "out",
        "--model",
        "tiny",
    ]
    with pytest.raises(ValueError, match="--distill-temperature only apply with --teacher"):
        parse_args([*required, "--distill-temperature", "4"])
    with pytest.raises(ValueError, match="both 0"):
        parse_args(
            [*required, "--teacher", "t", "--distill-kl-weight", "0", "--distill-hard-weight", "0"]
        )
    config = parse_args([*required, "--teacher", "t", "--distill-nsp", "false"])
    assert (config.distill_nsp, config.distill_kl_weight, config.distill_cos_weight) == (
        False,
        5.0,
        None,
    )


# --- trainer/run.py --teacher: one rank in this process ------------------------------------


def save_teacher(directory: Path, shards: Path, seed: int = 1) -> Path:
    model(seed).save_hf(directory)
    shutil.copy(shards / "vocab.txt", directory / "vocab.txt")
    return directory


def run_args(tmp: Path, shards: Path, teacher: Path, out: str, steps: int, *extra: str):
    # A constant rate after warmup: a run stopped at step 3 is the first half of a 6-step run.
    constant = {"warmup_num_steps": 2, "warmup_max_lr": 1e-3, "warmup_type": "linear"}
    ds = ds_json(tmp, scheduler={"type": "WarmupLR", "params": constant})
    student = BertConfig(**{**TINY, "num_hidden_layers": 2, "hidden_dropout_prob": 0.1})
    (tmp / "student.json").write_text(json.dumps(student.to_dict()))
    return [
        "--ds-config",
        ds,
        "--data",
        str(shards),
        "--model",
        str(tmp / "student.json"),
        "--teacher",
        str(teacher),
        "--output-dir",
        str(tmp / out),
        "--max-steps",
        str(steps),
        "--save-every",
        "3",
        "--log-every",
        "3",
        "--num-workers",
        "0",
        *extra,
    ]


@pytest.fixture(scope="module")
def distilled(tiny_shards, tmp_path_factory):
    """A 6-step run, and the same run stopped after step 3 and resumed; the Distiller kept."""
    tmp = tmp_path_factory.mktemp("distill")
    teacher = save_teacher(tmp / "teacher", tiny_shards)
    seen = []

    class Recorded(distillation.Distiller):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            seen.append(self)

    patch = pytest.MonkeyPatch()
    patch.setattr(loop, "Distiller", Recorded)
    try:
        eval_flags = ["--eval-data", str(tiny_shards)]
        assert main(run_args(tmp, tiny_shards, teacher, "straight", 6, *eval_flags)) == 0
        assert main(run_args(tmp, tiny_shards, teacher, "resumed", 3, "--export-hf", "false")) == 0
        resumed = run_args(tmp, tiny_shards, teacher, "resumed", 6, "--resume", "auto")
        assert main([*resumed, "--export-hf", "false"]) == 0
    finally:
        patch.undo()
    return tmp, teacher, seen


def test_a_distillation_run_finishes_with_its_metrics_and_an_export(distilled):
    tmp, teacher, _ = distilled
    records = [json.loads(x) for x in (tmp / "straight" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["split"] == "train"]
    assert [r["step"] for r in train] == [3, 6]
    for r in train:  # loss = 5 kl + 2 (mlm + nsp) + 1 cos (widths match: cosine on)
        expected = 5 * r["kl_loss"] + 2 * (r["mlm_loss"] + r["nsp_loss"]) + r["cos_loss"]
        assert r["loss"] == pytest.approx(expected, rel=1e-5) and r["cos_loss"] > 0
    evals = [r for r in records if r["split"] == "eval"]
    assert evals[-1]["step"] == 6 and "mlm_baseline_accuracy" in evals[-1]
    exported = load_hf(tmp / "straight" / "hf")
    assert exported.config.num_hidden_layers == 2  # the student, not the teacher
    state = json.loads((tmp / "straight/checkpoints/step00000006/trainer_state.json").read_text())
    assert state["teacher"] == distillation.teacher_identity(teacher)


def test_the_teacher_stays_frozen_and_outside_deepspeed(distilled):
    tmp, teacher_dir, seen = distilled
    reference = load_hf(teacher_dir).state_dict()
    teacher = seen[0].model
    assert not teacher.training
    for name, p in teacher.named_parameters():
        assert not p.requires_grad and p.grad is None, name
    for key, value in teacher.state_dict().items():
        assert torch.equal(value, reference[key]), key  # bit-identical after 6 steps
    # The checkpoint holds the student only: its weights, and its optimizer state.
    ckpt = torch.load(
        tmp / "straight/checkpoints/step00000006/mp_rank_00_model_states.pt",
        map_location="cpu",
        weights_only=False,
    )
    student_keys = set(model(0, num_hidden_layers=2).state_dict())
    assert set(ckpt["module"]) == student_keys
    optimizer_params = sum(len(g["params"]) for g in ckpt["optimizer"]["param_groups"])
    assert optimizer_params == len(list(model(0, num_hidden_layers=2).parameters()))


def test_a_resumed_distillation_run_ends_with_the_uninterrupted_weights(distilled):
    tmp, _, _ = distilled
    tag = "step00000006"
    straight = export.consolidated_state_dict(str(tmp / "straight" / "checkpoints"), tag)
    resumed = export.consolidated_state_dict(str(tmp / "resumed" / "checkpoints"), tag)
    assert straight.keys() == resumed.keys()
    for key in straight:  # dropout is on: the RNG states were restored too
        assert torch.equal(straight[key], resumed[key]), key
    first = export.consolidated_state_dict(str(tmp / "resumed" / "checkpoints"), "step00000003")
    assert not torch.equal(first["cls.predictions.bias"], resumed["cls.predictions.bias"])


def test_resume_with_another_teacher_or_none_is_refused(distilled, tiny_shards, caplog):
    tmp, teacher, _ = distilled
    other = save_teacher(tmp / "other-teacher", tiny_shards, seed=7)
    argv = run_args(tmp, tiny_shards, other, "straight", 8, "--resume", "auto")
    assert main(argv) == 2
    assert "was distilled from" in caplog.text and "--teacher" in caplog.text
    no_teacher = [a for a in argv if a not in ("--teacher", str(other))]
    assert main(no_teacher) == 2
    assert f"resume it with --teacher {teacher.resolve()}" in caplog.text
    latest = (tmp / "straight" / "checkpoints" / "latest").read_text()
    assert latest == "step00000006"  # nothing trained


def test_a_teacher_of_another_vocabulary_is_refused(tiny_shards, tmp_path, caplog):
    small = tmp_path / "vocab300"
    model(1, vocab_size=300).save_hf(small)
    assert main(run_args(tmp_path, tiny_shards, small, "out", 2)) == 2
    assert f"--teacher {small}: the model has vocab_size 300" in caplog.text
    renamed = save_teacher(tmp_path / "renamed", tiny_shards)
    tokens = (renamed / "vocab.txt").read_text().split("\n")
    tokens[150] = "zzzz"
    (renamed / "vocab.txt").write_text("\n".join(tokens))
    assert main(run_args(tmp_path, tiny_shards, renamed, "out", 2)) == 2
    assert "token 150 is 'zzzz' there" in caplog.text
    # A vocab.txt that is the shards' cut short: refused naming both lengths.
    (renamed / "vocab.txt").write_text("\n".join([*tokens[:150], ""]))
    assert main(run_args(tmp_path, tiny_shards, renamed, "out", 2)) == 2
    assert "it has 150 tokens and the shards' 200" in caplog.text
    assert not (tmp_path / "out" / "checkpoints").exists()


def test_cosine_with_different_widths_is_refused(tiny_shards, tmp_path, caplog):
    wide = tmp_path / "wide"
    model(1, hidden_size=64, intermediate_size=128).save_hf(wide)
    argv = run_args(tmp_path, tiny_shards, wide, "out", 2, "--distill-cos-weight", "1")
    assert main(argv) == 2
    assert "needs equal hidden sizes" in caplog.text


def test_teacher_precision_follows_the_device(monkeypatch):
    cpu = torch.device("cpu")
    assert distillation.resolve_dtype("auto", cpu) == torch.float32  # CPU: fp32 unless asked
    assert distillation.resolve_dtype("bf16", cpu) == torch.bfloat16
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert distillation.resolve_dtype("auto", cuda) == torch.bfloat16
    assert distillation.resolve_dtype("fp32", cuda) == torch.float32
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert distillation.resolve_dtype("auto", cuda) == torch.float32


def test_zero3_partitions_the_student_only_and_the_teacher_runs_in_bf16(tiny_shards, tmp_path):
    # On CPU --teacher-dtype bf16 asks for what CUDA with bf16 gets by default (auto).
    teacher_dir = save_teacher(tmp_path / "teacher", tiny_shards)
    cuda = torch.cuda.is_available()
    extra = ["--export-hf", "false"] + ([] if cuda else ["--teacher-dtype", "bf16"])
    argv = run_args(tmp_path, tiny_shards, teacher_dir, "out", 3, *extra)
    ds = json.loads((tmp_path / "ds.json").read_text())
    ds["zero_optimization"] = {"stage": 3}
    if cuda:
        ds["bf16"] = {"enabled": True}
    (tmp_path / "ds.json").write_text(json.dumps(ds))
    seen = []

    class Recorded(distillation.Distiller):
        def __call__(self, engine, batch):
            seen.append((self.model, engine.module))
            return super().__call__(engine, batch)

    patch = pytest.MonkeyPatch()
    patch.setattr(loop, "Distiller", Recorded)
    try:
        assert main(argv) == 0
    finally:
        patch.undo()
    teacher, student = seen[0]
    assert all(p.dtype == torch.bfloat16 for p in teacher.parameters())
    assert not any(hasattr(p, "ds_id") for p in teacher.parameters())  # not partitioned
    assert all(hasattr(p, "ds_id") for p in student.parameters())  # ZeRO-3 partitioned
    reference = load_hf(teacher_dir).to(torch.bfloat16).state_dict()
    for key, value in teacher.state_dict().items():
        assert torch.equal(value.cpu(), reference[key]), key
    state = export.consolidated_state_dict(str(tmp_path / "out" / "checkpoints"), "step00000003")
    saved = {k for k in state if not k.startswith("cls.predictions.decoder.")}  # tied names
    assert saved == set(model(0, num_hidden_layers=2).state_dict())
