"""A time budget (``--max-minutes``): DeepSpeed's ``WarmupDecayLR`` laid over time, not steps.

With a fixed allocation (a cluster slot, the main job's 15 minutes) the number of steps a
machine can do is unknown in advance, so a step-based decay either ends early or is cut
off before it reaches its low rate. :class:`TimeBudgetLR` keeps the JSON's
``WarmupDecayLR`` parameters and changes only what the decay is measured in:

- warmup: ``warmup_num_steps`` optimizer steps, from ``warmup_min_lr`` to
  ``warmup_max_lr`` (linear or log, as DeepSpeed does). Warmup stays in steps: it is
  there for Adam's moment estimates, which count updates, not seconds;
- decay: linear from ``warmup_max_lr`` when warmup ends to ``warmup_min_lr`` when the
  budget is spent. If warmup is still running when the decay line falls below it, the
  lower of the two holds, so the rate reaches its floor at the budget on any machine.

The clock is the run's training time (the loop's wall time, evaluations and checkpoints
included, earlier runs of a resumed run too), the same on every rank: the trainer
sets it from one all-reduce per step (``elapsed_s``) before DeepSpeed's ``step()``.
``state_dict`` carries what a resume needs.
"""

from __future__ import annotations

from typing import Any

from deepspeed.runtime.lr_schedules import WarmupLR

_PARAMS = ("warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type")


class TimeBudgetLR(WarmupLR):
    """``WarmupDecayLR`` whose decay ends when ``budget_s`` seconds of training are spent.

    Example: budget 100 s, warmup 10 steps, max lr 1e-3; warmup ends at 20 s -> lr 1e-3
    at 20 s, 5e-4 at 60 s, 0 at 100 s.
    """

    def __init__(self, optimizer, *, budget_s: float, **params: Any):
        if not budget_s > 0:
            raise ValueError(f"the time budget must be > 0 seconds, got {budget_s!r}")
        self.budget_s = float(budget_s)
        self.elapsed_s = 0.0
        self.warmup_end_s: float | None = None  # training time when warmup finished
        super().__init__(optimizer, **params)

    def _get_gamma(self) -> float:
        warm = super()._get_gamma()  # DeepSpeed's warmup, then 1.0
        if self.warmup_end_s is None and self.last_batch_iteration >= self.warmup_num_steps:
            self.warmup_end_s = min(self.elapsed_s, self.budget_s)
        start = self.warmup_end_s if self.warmup_end_s is not None else 0.0
        decay = (self.budget_s - self.elapsed_s) / max(self.budget_s - start, 1e-9)
        return max(0.0, min(warm, decay, 1.0))

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "budget_s": self.budget_s,
            "elapsed_s": self.elapsed_s,
            "warmup_end_s": self.warmup_end_s,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.elapsed_s = float(state.get("elapsed_s", 0.0))
        self.warmup_end_s = state.get("warmup_end_s")
        # The budget is the current run's flag: a resumed run may be given more time.


def time_budget_scheduler(ds: dict[str, Any], budget_s: float, *, where: str):
    """Take the JSON's ``WarmupDecayLR`` out of ``ds`` (in place) and return a factory
    ``optimizer -> TimeBudgetLR`` for ``deepspeed.initialize(lr_scheduler=...)``.

    Raises:
        ValueError: no scheduler, or one other than WarmupDecayLR (its meaning over time
            would be a guess), or an unknown parameter (names the file and key).
    """
    scheduler = ds.get("scheduler")
    kind = scheduler.get("type") if isinstance(scheduler, dict) else None
    if kind != "WarmupDecayLR":
        found = f"its scheduler is {kind!r}" if kind else "it has no scheduler"
        raise ValueError(
            f"{where}: --max-minutes lays a WarmupDecayLR schedule over the time budget, "
            f"but {found}. Use WarmupDecayLR, or --max-steps"
        )
    params = dict(scheduler.get("params", {}))
    params.pop("total_num_steps", None)  # the budget takes its place
    unknown = sorted(set(params) - set(_PARAMS))
    if unknown:
        raise ValueError(f"{where}: unknown WarmupDecayLR parameter(s) {unknown}")
    del ds["scheduler"]

    def factory(optimizer) -> TimeBudgetLR:
        return TimeBudgetLR(optimizer, budget_s=budget_s, **params)

    return factory
