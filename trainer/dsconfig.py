"""The DeepSpeed JSON: read it, check its batch sizes against the world size, resolve it.

DeepSpeed's own conventions hold (``train_micro_batch_size_per_gpu``,
``gradient_accumulation_steps``, ``train_batch_size``, ``optimizer``, ``scheduler``, ``bf16``,
``zero_optimization``, ...). The trainer adds two things, both logged:

- the three batch sizes are resolved before DeepSpeed starts, so a config that does not fit
  the world size fails with a message naming the file and the numbers (DeepSpeed's own
  check is an ``AssertionError`` raised after the model is built);
- a ``WarmupDecayLR`` scheduler without ``total_num_steps`` (or with ``"auto"``) decays over
  ``--max-steps``.

``--precision`` (:func:`with_precision`) may override the JSON's ``bf16``/``fp16``: fp32,
bf16, or auto (bf16 where the device computes it natively, else fp32). ``config`` (the
default) keeps what the JSON says.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .config import PRECISIONS

if TYPE_CHECKING:
    import torch

_BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


@dataclass(frozen=True)
class BatchSizes:
    """Resolved batch sizes: ``train_batch_size = micro * accumulation * world_size``."""

    micro: int  # rows per rank per forward pass
    accumulation: int  # micro-batches per optimizer step
    world_size: int

    @property
    def global_micro(self) -> int:
        """Rows all ranks consume per micro-step."""
        return self.micro * self.world_size

    @property
    def per_step(self) -> int:
        """Rows per optimizer step (DeepSpeed's train_batch_size)."""
        return self.micro * self.accumulation * self.world_size


def load_ds_config(path: str) -> dict[str, Any]:
    """Read a DeepSpeed JSON file.

    Raises:
        ValueError: missing, unreadable or not a JSON object (names the file).
    """
    try:
        values = json.loads(Path(path).read_text())
    except FileNotFoundError as err:
        raise ValueError(f"--ds-config {path} does not exist") from err
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"--ds-config {path}: cannot read: {err}") from err
    if not isinstance(values, dict):
        raise ValueError(f"--ds-config {path}: expected a JSON object")
    return values


def resolve_batch_sizes(ds: dict[str, Any], world_size: int, *, where: str) -> BatchSizes:
    """DeepSpeed's rule: any two of the three batch keys fix the third; all three must agree.

    Example: ``{"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4}`` with 2 ranks
    -> ``BatchSizes(micro=4, accumulation=4, world_size=2)``.

    Raises:
        ValueError: a key is not a positive int, none of micro/train batch is given, or the
            sizes do not fit ``world_size`` (the message names the file and all numbers).
    """
    given = {k: ds[k] for k in _BATCH_KEYS if k in ds}
    for key, value in given.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{where}: {key} must be a positive int, got {value!r}")
    total = given.get("train_batch_size")
    micro = given.get("train_micro_batch_size_per_gpu")
    accumulation = given.get("gradient_accumulation_steps")
    if micro is None and total is None:
        raise ValueError(f"{where}: set train_micro_batch_size_per_gpu (or train_batch_size)")
    if micro is None:
        accumulation = accumulation or 1
        micro, rest = divmod(total, accumulation * world_size)
    elif accumulation is None:
        accumulation, rest = divmod(total, micro * world_size) if total else (1, 0)
    else:
        rest = 0 if total is None else total - micro * accumulation * world_size
    sizes = BatchSizes(micro=micro, accumulation=accumulation, world_size=world_size)
    if rest or micro < 1 or accumulation < 1:
        raise ValueError(
            f"{where}: batch sizes {given} do not fit {world_size} rank(s): train_batch_size "
            f"must equal train_micro_batch_size_per_gpu x gradient_accumulation_steps x "
            f"world_size ({world_size}); change the JSON or the number of ranks"
        )
    return sizes


def resolve_ds_config(
    ds: dict[str, Any], world_size: int, max_steps: int, *, where: str
) -> tuple[dict[str, Any], BatchSizes]:
    """A copy of ``ds`` with explicit batch sizes and a WarmupDecayLR length.

    Raises:
        ValueError: see resolve_batch_sizes; a scheduler that is not a JSON object.
    """
    sizes = resolve_batch_sizes(ds, world_size, where=where)
    out = copy.deepcopy(ds)
    out["train_batch_size"] = sizes.per_step
    out["train_micro_batch_size_per_gpu"] = sizes.micro
    out["gradient_accumulation_steps"] = sizes.accumulation
    scheduler = out.get("scheduler")
    if scheduler is not None:
        if not isinstance(scheduler, dict) or not isinstance(scheduler.get("params", {}), dict):
            raise ValueError(f"{where}: scheduler must be an object with a params object")
        params = scheduler.setdefault("params", {})
        if scheduler.get("type") == "WarmupDecayLR" and params.get("total_num_steps", "auto") in (
            "auto",
            None,
        ):
            params["total_num_steps"] = max_steps
    return out, sizes


def warmup_warning(ds: dict[str, Any], steps: int | None) -> str | None:
    """A warning when the JSON's warmup takes half or more of a run of ``steps`` optimizer
    steps (None: a time budget, whose warmup is checked by nobody), else None: such a run
    spends most of its updates at a low learning rate and ends near where it began.

    Example: warmup_num_steps 100 and 100 steps -> a warning that the whole run warms up.
    """
    scheduler = ds.get("scheduler")
    if not steps or not isinstance(scheduler, dict):
        return None
    warmup = scheduler.get("params", {}).get("warmup_num_steps")
    if not isinstance(warmup, int) or warmup * 2 < steps:
        return None
    share = "the whole run warms up" if warmup >= steps else f"{warmup / steps:.0%} of it warms up"
    return (
        f"the scheduler's warmup_num_steps {warmup} against --max-steps {steps}: {share}, "
        f"so the learning rate spends the run below its peak and the model learns little; "
        f"give more steps, or a DeepSpeed JSON with a shorter warmup"
    )


def precision(ds: dict[str, Any]) -> str:
    """ "bf16", "fp16" or "fp32", as the JSON enables them."""
    for name in ("bf16", "fp16"):
        if isinstance(ds.get(name), dict) and ds[name].get("enabled", False) is True:
            return name
    return "fp32"


def bf16_native(device: torch.device) -> bool:
    """Whether ``device`` computes bf16 matmuls natively: a CUDA device with bf16 support,
    or a CPU with AVX512-BF16 or AMX (where oneDNN runs them at about twice fp32's speed)."""
    import torch

    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type != "cpu":
        return False
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)


def with_precision(ds: dict[str, Any], choice: str, device: torch.device) -> dict[str, Any]:
    """``ds`` with ``--precision`` applied (a copy; ``ds`` itself for "config").

    Example: cpu.json with "bf16" -> its copy with ``"bf16": {"enabled": true}``; "fp32"
    -> bf16 and fp16 sections disabled; "auto" -> "bf16" where :func:`bf16_native`, else
    "fp32". Other keys of a ``bf16`` section (``immediate_grad_update``, ...) stay.

    Raises:
        ValueError: an unknown choice.
    """
    if choice not in PRECISIONS:
        raise ValueError(f"--precision must be one of {PRECISIONS}, got {choice!r}")
    if choice == "config":
        return ds
    if choice == "auto":
        choice = "bf16" if bf16_native(device) else "fp32"
    out = copy.deepcopy(ds)
    for name in ("bf16", "fp16"):
        section = out.get(name) if isinstance(out.get(name), dict) else {}
        if name == choice or section:
            out[name] = {**section, "enabled": name == choice}
    return out
