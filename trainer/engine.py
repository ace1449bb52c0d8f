"""``--engine``: which engine steps the model, torch's own or DeepSpeed's.

Both read the same DeepSpeed JSON and sit under the same loop (trainer/loop.py), launcher
(``deepspeed``, torchrun, SLURM), checkpoints directory and export. ``auto``, the default,
runs a config on the torch engine when it asks for nothing that only DeepSpeed does (ZeRO
partitioning, offload, fp16's loss scaler, DeepSpeed's own optimizers or features); any
other on DeepSpeed's, naming what made the choice in the start line.

Why two: DeepSpeed's engine does per-parameter host work on every step (gradient hooks and
bucket copies, partition bookkeeping, inf/NaN checks, device reads) that ZeRO needs and a
model that fits one device does not. On the micro-BERT of bench/step_overhead.py (Base's
207 parameter tensors, compute about nil) that work is what separates the trainer from its
bare model step; on a GPU it keeps the host behind the device. BERT's sizes, Large
included (16 bytes a parameter for weights, gradients and Adam: 5.4 GB), fit one GPU
without partitioning, so deploy/gpu.json asks for none (measured: docs/results.md, "The
trainer's host work per step").

The torch engine, in DeepSpeed's terms:

- batch: ``train_micro_batch_size_per_gpu`` rows a forward, the loss divided by
  ``gradient_accumulation_steps`` in ``backward`` (as DeepSpeed does), the optimizer stepped
  on the last micro-step of each;
- ``bf16``: fp32 weights, the forward under ``torch.autocast(bfloat16)``, gradients in fp32:
  the mixed precision of most trainers (DeepSpeed's bf16 keeps bf16 weights beside fp32
  master copies; ``data_types.grad_accum_dtype`` fp32 is the same gradients);
- ``optimizer``: ``Adam``/``AdamW`` as torch's AdamW (Adam with ``adam_w_mode`` false),
  fused where torch has the kernel (CUDA, CPU), with the JSON's lr, betas, eps and weight
  decay over trainer/prepare.py's two parameter groups;
- ``scheduler``: DeepSpeed's own classes (``deepspeed.runtime.lr_schedules``) built from
  the JSON as DeepSpeed builds them, or the trainer's time-budget one, stepped after each
  optimizer step;
- ``gradient_clipping``: ``clip_grad_norm_`` (foreach); its norm stays on the device and
  is what ``get_global_grad_norm`` returns, read by the loop on log steps only;
- several ranks: ``DistributedDataParallel`` (gradients as views of its buckets, no buffer
  broadcast), its all-reduce skipped on accumulation micro-steps (``no_sync``);
- a step whose gradient norm is not finite updates nothing, decided on the device (fused
  AdamW's ``found_inf``): the loop stops the run at its next read (trainer/loop.py), and
  until then the weights stay as they were.

Checkpoints: rank 0 writes ``mp_rank_00_model_states.pt`` as a DeepSpeed stage-0 checkpoint
lays it out (``module``, ``optimizer``, ``lr_scheduler``, the client state at the top), so
trainer/export.py reads it as it reads theirs, and any number of ranks resumes it with no
conversion. A checkpoint's trainer_state.json names its engine; a resume on the other one
is refused with the flag that resumes it, since the optimizer states differ in form.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Any

import torch

from .config import ENGINES

logger = logging.getLogger(__name__)
MODEL_STATES = "mp_rank_00_model_states.pt"

# Keys of a DeepSpeed JSON the torch engine does (above), or that only tune DeepSpeed's
# logging and loading, which it has none of. Any other key needs DeepSpeed.
_TOP_KEYS = frozenset(
    {
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
        "gradient_clipping",
        "bf16",
        "fp16",
        "data_types",
        "optimizer",
        "scheduler",
        "zero_optimization",
        "steps_per_print",
        "wall_clock_breakdown",
        "timers",
        "checkpoint",
    }
)
_OPTIMIZER_PARAMS = frozenset({"lr", "betas", "eps", "weight_decay", "torch_adam", "adam_w_mode"})
_BF16_KEYS = frozenset({"enabled", "check_grad_overflow"})
# DeepSpeed's own keys in a model states file; the rest is the client state.
_OWN_KEYS = frozenset(
    {"module", "optimizer", "lr_scheduler", "global_steps", "dp_world_size", "engine", "ds_config"}
)


def deepspeed_only(ds: dict[str, Any]) -> str | None:
    """What in ``ds`` only DeepSpeed's engine does, in words, or None.

    Example: ``{"zero_optimization": {"stage": 2}}`` -> ``"ZeRO stage 2"``.
    """
    for key in ds:
        if key not in _TOP_KEYS:
            return f'"{key}"'
    stage = (ds.get("zero_optimization") or {}).get("stage", 0)
    if stage:
        return f"ZeRO stage {stage}"
    if (ds.get("fp16") or {}).get("enabled"):
        return "fp16 (DeepSpeed's loss scaler)"
    extra = sorted(set(ds.get("bf16") or {}) - _BF16_KEYS)
    if extra:
        return f'"bf16.{extra[0]}"'
    accumulate = (ds.get("data_types") or {}).get("grad_accum_dtype", "fp32")
    if set(ds.get("data_types") or {}) - {"grad_accum_dtype"} or accumulate not in ("fp32", None):
        return f'"data_types" other than grad_accum_dtype fp32 ({ds["data_types"]})'
    optimizer = ds.get("optimizer")
    if optimizer is not None:
        kind = str(optimizer.get("type", "")).lower()
        if kind not in ("adam", "adamw"):
            return f'the optimizer "{optimizer.get("type")}"'
        extra = sorted(set(optimizer.get("params") or {}) - _OPTIMIZER_PARAMS)
        if extra:
            return f'"optimizer.params.{extra[0]}"'
    scheduler = ds.get("scheduler")
    if scheduler is not None:
        from deepspeed.runtime import lr_schedules

        if scheduler.get("type") not in lr_schedules.VALID_LR_SCHEDULES:
            return f'the scheduler "{scheduler.get("type")}"'
    return None


def choose_engine(flag: str, ds: dict[str, Any], *, where: str) -> tuple[str, str]:
    """(engine, why) for ``--engine flag`` and the resolved DeepSpeed JSON ``ds``.

    Raises:
        ValueError: ``--engine torch`` with something only DeepSpeed does (named), or an
            unknown engine.
    """
    if flag not in ENGINES:
        raise ValueError(f"--engine must be one of {ENGINES}, got {flag!r}")
    needs = deepspeed_only(ds)
    if flag == "deepspeed":
        return "deepspeed", "--engine deepspeed"
    if flag == "torch":
        if needs:
            raise ValueError(
                f"{where}: --engine torch does not do {needs}; use --engine deepspeed (or auto)"
            )
        return "torch", "--engine torch"
    if needs:
        return "deepspeed", f"--engine auto: {needs} needs DeepSpeed"
    return "torch", "--engine auto: no ZeRO partitioning, offload or fp16 asked for"


def check_resumed_engine(saved: dict[str, Any], engine: str, why: str, where: str) -> None:
    """Refuse to resume a checkpoint (its trainer_state.json ``saved``) on another engine.

    Raises:
        ValueError: names both engines and the flag that resumes the checkpoint.
    """
    theirs = saved.get("engine", "deepspeed")  # checkpoints from before the torch engine
    if theirs != engine:
        raise ValueError(
            f"{where} was saved by the {theirs} engine and this run is on the {engine} "
            f"engine ({why}); their optimizer states differ in form: resume it with "
            f"--engine {theirs}"
        )


class TorchEngine:
    """The model, optimizer and schedule of one rank, stepped as DeepSpeed's engine is
    (``engine(**batch)``, ``backward(loss)``, ``step()`` every micro-step), without it."""

    def __init__(
        self,
        model: torch.nn.Module,
        param_groups: list[dict],
        ds: dict[str, Any],
        *,
        device: torch.device,
        world_size: int,
        rank: int,
        accumulation: int,
        scheduler_factory=None,
    ):
        self.module = model.to(device)
        self.device, self.world_size, self.global_rank = device, world_size, rank
        self.accumulation = accumulation
        self.micro_steps = self.global_steps = 0
        self.clipping = float(ds.get("gradient_clipping") or 0.0)
        bf16 = bool((ds.get("bf16") or {}).get("enabled"))
        self.autocast = torch.bfloat16 if bf16 else None
        self.ds = ds
        self.optimizer, self.fused = _optimizer(param_groups, ds.get("optimizer") or {}, device)
        self.lr_scheduler = (
            scheduler_factory(self.optimizer)
            if scheduler_factory is not None
            else _scheduler(ds.get("scheduler"), self.optimizer)
        )
        self._params = [p for p in model.parameters() if p.requires_grad]
        self._ddp = None
        if world_size > 1:
            from torch.nn.parallel import DistributedDataParallel

            self._ddp = DistributedDataParallel(
                model,
                device_ids=[device.index] if device.type == "cuda" else None,
                gradient_as_bucket_view=True,
                broadcast_buffers=False,  # BERT's buffers are constants
            )
        self._no_sync: contextlib.AbstractContextManager | None = None
        self._norm: torch.Tensor | None = None

    # -- what the loop, evaluation and checkpoints call, by DeepSpeed's names

    def __call__(self, *args, **kwargs):
        training = self.module.training and torch.is_grad_enabled()
        model = self._ddp if (self._ddp is not None and training) else self.module
        if training and self._ddp is not None and not self.is_gradient_accumulation_boundary():
            self._no_sync = self._ddp.no_sync()  # closed after this micro-step's backward
            self._no_sync.__enter__()
        enabled = self.autocast is not None
        with torch.autocast(self.device.type, dtype=self.autocast, enabled=enabled):
            return model(*args, **kwargs)

    def backward(self, loss: torch.Tensor) -> None:
        """``loss`` divided by the accumulation steps, backward (DDP reduces on the last)."""
        try:
            (loss / self.accumulation if self.accumulation > 1 else loss).backward()
        finally:
            if self._no_sync is not None:
                self._no_sync.__exit__(None, None, None)
                self._no_sync = None

    def is_gradient_accumulation_boundary(self) -> bool:
        return (self.micro_steps + 1) % self.accumulation == 0

    def step(self) -> None:
        """On the last micro-step of an optimizer step: clip, update (skipped on the device
        when the gradient norm is not finite), schedule; otherwise nothing."""
        boundary = self.is_gradient_accumulation_boundary()
        self.micro_steps += 1
        if not boundary:
            return
        if self.clipping > 0:
            norm = torch.nn.utils.clip_grad_norm_(self._params, self.clipping, foreach=True)
        else:
            grads = [p.grad for p in self._params if p.grad is not None]
            norm = torch.nn.utils.get_total_norm(grads, foreach=True)
        self._norm = norm
        if self.fused:  # read by the fused kernel on the device: no sync, no step counted
            self.optimizer.found_inf = (~torch.isfinite(norm)).to(torch.float32)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
        self.global_steps += 1

    @property
    def skips_non_finite_updates(self) -> bool:
        """Whether a step whose gradient norm is not finite leaves the weights as they were
        (fused AdamW's ``found_inf``), so the loop may read its flag after the update."""
        return self.fused

    def get_lr(self) -> list[float]:
        return [group["lr"] for group in self.optimizer.param_groups]

    def get_global_grad_norm(self) -> torch.Tensor | None:
        """The last optimizer step's gradient norm (before clipping), on the device."""
        return self._norm

    def zero_optimization_stage(self) -> int:
        return 0

    def bfloat16_enabled(self) -> bool:
        return self.autocast is torch.bfloat16

    def train(self, mode: bool = True) -> None:
        self.module.train(mode)

    def eval(self) -> None:
        self.module.eval()

    def compile(self, backend: str = "inductor", compile_kwargs: dict | None = None) -> None:
        """``nn.Module.compile`` in place: parameter objects, names and DDP's hooks stay."""
        self.module.compile(backend=backend, **(compile_kwargs or {}))

    def save_checkpoint(
        self, directory: str, tag: str, client_state: dict, save_latest: bool = False
    ) -> None:
        """Rank 0 writes ``directory/tag/mp_rank_00_model_states.pt`` (temp file, then
        rename); the replicas of the other ranks are the same. ``save_latest`` is the
        trainer's to do (trainer/checkpoint.py) and is ignored."""
        if self.global_rank != 0:
            return
        states = {
            "module": self.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "lr_scheduler": None if self.lr_scheduler is None else self.lr_scheduler.state_dict(),
            "global_steps": self.global_steps,
            "dp_world_size": self.world_size,
            "engine": "torch",
            "ds_config": self.ds,
            **client_state,
        }
        path = Path(directory, tag)
        path.mkdir(parents=True, exist_ok=True)
        temp = path / f".{MODEL_STATES}.{os.getpid()}.tmp"
        try:
            torch.save(states, temp)
            os.replace(temp, path / MODEL_STATES)
        finally:
            temp.unlink(missing_ok=True)

    def load_checkpoint(self, directory: str, tag: str) -> tuple[str, dict]:
        """Weights, optimizer and schedule of ``directory/tag``; returns (path, client state).

        Raises:
            ValueError: the file was not written by this engine (names it).
        """
        path = Path(directory, tag, MODEL_STATES)
        states = torch.load(path, map_location="cpu", weights_only=False)
        if states.get("engine") != "torch":
            raise ValueError(
                f"{path} was written by DeepSpeed's engine, not the torch engine: "
                f"resume it with --engine deepspeed"
            )
        self.module.load_state_dict(states["module"])
        self.optimizer.load_state_dict(states["optimizer"])
        if self.lr_scheduler is not None and states.get("lr_scheduler") is not None:
            self.lr_scheduler.load_state_dict(states["lr_scheduler"])
        self.global_steps = int(states.get("global_steps", 0))
        self.micro_steps = self.global_steps * self.accumulation
        return str(path.parent), {k: v for k, v in states.items() if k not in _OWN_KEYS}


def _optimizer(
    groups: list[dict], config: dict, device: torch.device
) -> tuple[torch.optim.Optimizer, bool]:
    """torch's AdamW (or Adam) from the JSON's ``optimizer`` section, fused where torch
    has the kernel for ``device``; (optimizer, fused)."""
    params = dict(config.get("params") or {})
    kind = str(config.get("type", "AdamW")).lower()
    decoupled = kind == "adamw" or params.pop("adam_w_mode", True)
    params.pop("adam_w_mode", None)
    params.pop("torch_adam", None)  # DeepSpeed's switch between its Adam and torch's
    if "betas" in params:
        params["betas"] = tuple(params["betas"])
    cls = torch.optim.AdamW if decoupled else torch.optim.Adam
    try:  # the optimizer fills in each group's defaults: each try gets its own copies
        return cls([dict(g) for g in groups], fused=True, **params), True
    except RuntimeError:  # "fused=True requires all the params to be ... supported devices"
        return cls([dict(g) for g in groups], foreach=True, **params), False


def _scheduler(config: dict | None, optimizer: torch.optim.Optimizer):
    """DeepSpeed's scheduler class named by the JSON's ``scheduler`` section, or None."""
    if not config:
        return None
    from deepspeed.runtime import lr_schedules

    return getattr(lr_schedules, config["type"])(optimizer, **(config.get("params") or {}))
