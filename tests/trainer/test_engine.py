"""trainer/engine.py: which engine a DeepSpeed JSON runs on, and the torch engine's step.

The torch engine must step as DeepSpeed's does (the loss divided over accumulation
micro-steps, clipping, the JSON's optimizer and schedule), skip an update whose gradients
are not finite without reading the device, and keep its checkpoints to itself.
"""

import json

import pytest
import torch

from tests.helpers import REPO, args, cpu_ds, records
from trainer.engine import TorchEngine, choose_engine, deepspeed_only
from trainer.run import main


def shipped(name: str) -> dict:
    return json.loads((REPO / "deploy" / name).read_text())


@pytest.mark.parametrize(
    ("name", "engine"),
    [
        ("cpu.json", "torch"),
        ("gpu.json", "torch"),
        ("zero2.json", "deepspeed"),
        ("zero2_phase2.json", "deepspeed"),
        ("zero3.json", "deepspeed"),
    ],
)
def test_auto_picks_the_engine_by_what_the_shipped_config_asks_for(name, engine):
    chosen, why = choose_engine("auto", shipped(name), where=name)
    assert chosen == engine
    if engine == "deepspeed":
        stage = shipped(name)["zero_optimization"]["stage"]
        assert why == f"--engine auto: ZeRO stage {stage} needs DeepSpeed"


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"fp16": {"enabled": True}}, "fp16"),
        (
            {"activation_checkpointing": {"partition_activations": True}},
            '"activation_checkpointing"',
        ),
        ({"optimizer": {"type": "Lamb", "params": {"lr": 1e-3}}}, 'the optimizer "Lamb"'),
        ({"optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "amsgrad": True}}}, "amsgrad"),
        ({"bf16": {"enabled": True, "immediate_grad_update": True}}, "immediate_grad_update"),
        ({"zero_optimization": {"stage": 1}}, "ZeRO stage 1"),
    ],
)
def test_what_only_deepspeed_does_is_named_and_refused_on_the_torch_engine(change, named):
    ds = {**cpu_ds(), **change}
    assert named in deepspeed_only(ds)
    assert choose_engine("auto", ds, where="x")[0] == "deepspeed"
    with pytest.raises(ValueError, match=r"ds\.json: --engine torch does not do .*--engine deep"):
        choose_engine("torch", ds, where="ds.json")
    assert choose_engine("deepspeed", cpu_ds(), where="x") == ("deepspeed", "--engine deepspeed")


def engine_for(model, accumulation=1, clipping=1.0):
    ds = {
        "gradient_clipping": clipping,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.1, "weight_decay": 0.0}},
    }
    return TorchEngine(
        model,
        [{"params": list(model.parameters())}],
        ds,
        device=torch.device("cpu"),
        world_size=1,
        rank=0,
        accumulation=accumulation,
    )


def test_a_step_with_non_finite_gradients_updates_nothing():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    engine = engine_for(model)
    x = torch.randn(4, 3)
    engine.backward(engine(x).sum())
    engine.step()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    moments = engine.optimizer.state[model.weight]["exp_avg"].clone()
    engine.backward(engine(x).sum() * float("nan"))
    engine.step()  # decided on the device: nothing read, nothing updated
    assert not torch.isfinite(engine.get_global_grad_norm())
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert torch.equal(engine.optimizer.state[model.weight]["exp_avg"], moments)
    assert float(engine.optimizer.state[model.weight]["step"]) == 1.0
    engine.backward(engine(x).sum())
    engine.step()
    assert not torch.equal(model.weight, before["weight"])
    assert float(engine.optimizer.state[model.weight]["step"]) == 2.0


def test_accumulated_micro_steps_make_the_step_of_their_whole_batch():
    """Two micro-batches of a mean loss, accumulated, are one step over both (DeepSpeed
    divides each micro-step's loss by the accumulation steps, and so does this engine)."""
    torch.manual_seed(0)
    x, y = torch.randn(8, 5), torch.randn(8, 1)
    first = torch.nn.Linear(5, 1)
    second = torch.nn.Linear(5, 1)
    second.load_state_dict(first.state_dict())
    whole, halves = engine_for(first, clipping=0.0), engine_for(second, 2, clipping=0.0)
    for _ in range(3):
        whole.backward(torch.nn.functional.mse_loss(whole(x), y))
        whole.step()
        for part in (slice(0, 4), slice(4, 8)):
            halves.backward(torch.nn.functional.mse_loss(halves(x[part]), y[part]))
            halves.step()
    assert halves.global_steps == whole.global_steps == 3
    torch.testing.assert_close(second.weight, first.weight)
    torch.testing.assert_close(halves.get_global_grad_norm(), whole.get_global_grad_norm())


def test_a_checkpoint_resumes_only_on_the_engine_that_saved_it(tiny_shards, tmp_path, capsys):
    assert main(args(tmp_path, tiny_shards, "--max-steps", "2", "--log-every", "1")) == 0
    assert "engine: torch (one rank; --engine auto" in capsys.readouterr().err
    state = json.loads((tmp_path / "out/checkpoints/step00000002/trainer_state.json").read_text())
    assert state["engine"] == "torch"
    assert [r["step"] for r in records(tmp_path / "out")] == [1, 2]
    again = args(tmp_path, tiny_shards, "--max-steps", "3", "--resume", "auto")
    assert main([*again, "--engine", "deepspeed"]) == 2
    err = capsys.readouterr().err
    assert "step00000002 was saved by the torch engine and this run is on the deepspeed" in err
    assert "resume it with --engine torch" in err
    assert not (tmp_path / "out/checkpoints/step00000003").exists()
