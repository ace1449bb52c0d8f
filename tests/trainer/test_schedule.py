"""The time budget (--max-minutes): WarmupDecayLR laid over time, a clean stop, resumable."""

import json

import pytest
import torch

from tests.helpers import args, records
from trainer import loop
from trainer.run import main
from trainer.schedule import TimeBudgetLR, time_budget_scheduler


def scheduler(budget_s=100.0, warmup=4):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    params = {
        "warmup_min_lr": 0.0,
        "warmup_max_lr": 1e-3,
        "warmup_num_steps": warmup,
        "warmup_type": "linear",
    }
    return TimeBudgetLR(opt, budget_s=budget_s, **params)


def test_warmup_counts_steps_and_the_decay_ends_with_the_budget():
    s = scheduler()
    lrs = []
    for elapsed in (1, 2, 3, 4, 20, 60, 100, 130):
        s.elapsed_s = float(elapsed)
        s.step()
        lrs.append(s.get_last_lr()[0])
    # Warmup over 4 steps (DeepSpeed's linear warmup starts at 0), done at the 5th step
    # (20 s), then linear from 1e-3 at 20 s to 0 at 100 s, and 0 past the budget.
    expected = [0.0, 2.5e-4, 5e-4, 7.5e-4, 1e-3, 5e-4, 0.0, 0.0]
    assert lrs == pytest.approx(expected, abs=1e-12)


def test_a_slow_machine_still_ends_at_the_floor():
    s = scheduler(budget_s=10.0, warmup=100)  # warmup longer than the budget allows
    s.elapsed_s = 9.0
    for _ in range(50):
        s.step()
    assert s.get_last_lr()[0] == pytest.approx(1e-4)  # the decay line caps the warmup
    s.elapsed_s = 10.0
    s.step()
    assert s.get_last_lr()[0] == 0.0


def test_state_dict_round_trip_keeps_the_clock():
    s = scheduler()
    for elapsed in (1, 2, 3, 4, 5, 30):
        s.elapsed_s = float(elapsed)
        s.step()
    resumed = scheduler(budget_s=200.0)
    resumed.load_state_dict(s.state_dict())
    assert (resumed.last_batch_iteration, resumed.elapsed_s) == (5, 30.0)
    assert resumed.warmup_end_s == s.warmup_end_s == 5.0
    resumed.step()
    assert resumed.get_last_lr()[0] == pytest.approx(1e-3 * (200 - 30) / (200 - 5))


def test_only_warmup_decay_is_laid_over_time():
    ds = {"scheduler": {"type": "WarmupLR", "params": {}}}
    with pytest.raises(ValueError, match=r"WarmupDecayLR.*'WarmupLR'"):
        time_budget_scheduler(ds, 60.0, where="ds.json")
    ds = {"scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_step": 10}}}
    with pytest.raises(ValueError, match="warmup_num_step"):
        time_budget_scheduler(ds, 60.0, where="ds.json")
    ds = {"scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 9}}}
    assert callable(time_budget_scheduler(ds, 60.0, where="ds.json"))
    assert "scheduler" not in ds  # DeepSpeed gets the object instead


class FakeTime:
    """The loop's clock: one second per reading, so a run's length does not depend on the CPU."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        self.now += 1.0
        return self.now


def test_run_stops_at_the_budget_and_resumes_with_its_clock(tiny_shards, tmp_path, monkeypatch):
    monkeypatch.setattr(loop, "time", FakeTime())
    extra = ["--max-minutes", "0.5", "--log-every", "1", "--save-every", "0", "--dropout", "0"]
    assert main(args(tmp_path, tiny_shards, *extra, scheduler=warmup_decay(3))) == 0
    out = tmp_path / "out"
    first = records(out)
    steps = [r["step"] for r in first]
    assert 5 < steps[-1] < 30, steps  # stopped by the clock, not a step limit
    assert first[-1]["train_seconds"] >= 30 > first[-2]["train_seconds"]
    peak = max(r["lr"] for r in first)
    assert peak == pytest.approx(1e-3, rel=0.2)
    assert first[-1]["lr"] < 0.1 * peak  # decayed to its floor with the budget
    tag = (out / "checkpoints" / "latest").read_text()
    trainer_state = json.loads((out / "checkpoints" / tag / "trainer_state.json").read_text())
    assert trainer_state["train_seconds"] == first[-1]["train_seconds"]
    saved = json.loads((out / "checkpoints" / tag / "config.json").read_text())
    assert saved["hidden_dropout_prob"] == saved["attention_probs_dropout_prob"] == 0.0

    monkeypatch.setattr(loop, "time", FakeTime())
    extra = ["--max-minutes", "1", "--log-every", "1", "--save-every", "0", "--resume", "auto"]
    assert main(args(tmp_path, tiny_shards, *extra, scheduler=warmup_decay(3))) == 0
    second = records(out)[len(first) :]
    assert second[0]["step"] == steps[-1] + 1
    assert second[0]["train_seconds"] > first[-1]["train_seconds"]  # the clock continued
    assert second[-1]["train_seconds"] >= 60 > second[-2]["train_seconds"]


def warmup_decay(warmup: int) -> dict:
    return {
        "type": "WarmupDecayLR",
        "params": {
            "warmup_min_lr": 0.0,
            "warmup_max_lr": 1e-3,
            "warmup_num_steps": warmup,
            "warmup_type": "linear",
            "total_num_steps": "auto",
        },
    }
