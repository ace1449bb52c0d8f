"""``--compile {off,model,step}``: torch.compile for the trainer's engine.

- ``off`` (the default): eager, as before.
- ``model``: the engine's ``compile()`` (DeepSpeed's), which calls ``nn.Module.compile`` on
  the model in place: the encoder, both heads and the loss. In place matters twice: the
  state dict keeps its plain names (``torch.compile(model)`` would wrap it in an
  ``OptimizedModule`` whose names start with ``_orig_mod.``, in every checkpoint and
  export), and the parameters DeepSpeed registered its ZeRO-1/2 gradient hooks on, and
  partitions, stay the same objects (DeepSpeed PR #4878 added ``engine.compile`` for this).
- ``step``: ``model`` and the torch optimizer's ``step`` (the one inside DeepSpeed's wrapper,
  over its flat ZeRO partitions or the parameters), compiled with ``torch.compile``.

What runs compiled: model/unpad.py keeps its host bookkeeping out of the graphs
(``torch.compiler.disable`` on ``Packing.from_mask``, which reads the row lengths in one
device sync, and on ``packed_attention``, whose grids are sized by them on the host);
dynamo would otherwise specialise on every row length and recompile every batch until its
cache limit, then run eager. So the graphs are the dense work between them: embeddings,
each layer's projections, GELU, LayerNorms and residuals, both heads and the losses.

Bounded recompiles: the unpadded path changes N (the batch's real tokens), M (its real
predictions) and the padded width every batch. The graphs are compiled with
``dynamic=True`` (symbolic sizes from the first batch) instead of bucketing N: the
attention grids would still differ per batch, and a symbolic N costs no recompile. A run
then compiles a bounded set of graphs (a batch without padding runs them too: the trainer
unpads every batch, so that every rank runs the same graphs: model/bert.py's
``set_unpadded``);
:func:`graph_count` reports them and each train record carries the count
(``compiled_graphs``), and tests/trainer/test_compile.py fails if it keeps growing.

Caches: inductor's FX graph and kernel caches go to ``--compile-cache`` (default
``OUTPUT_DIR/compile-cache``), so a resumed or repeated run in the same directory reuses
the compiled kernels. The time to the first step, compiling included, is each train
record's ``first_step_s``; a time-budgeted run counts it inside its budget (the clock
starts before the first step).

    python trainer/run.py --ds-config deploy/cpu.json --data shards/ --model tiny \\
        --output-dir runs/tiny --max-steps 200 --compile model

In bf16 on CPU the packed rows are rounded up to a bucket (model/unpad.py); that rounding
runs outside the graphs too (``pad_to_bucket``), else dynamo would guard on N and
recompile every batch.

bench/compile_speed.py measures what pays (compiled/eager step ratios, interleaved, with
ranges over repeats; ``--batches probe`` for issue 35's probe batches, ``--dynamic`` and
``--compile-mode`` for torch.compile's options) and lists the graph breaks (``--explain``:
``Packing.from_mask`` and each layer's ``packed_attention``, on purpose). What compiling
can gain on CPU is bounded by the share of a step that is not matmuls: the matmuls stay
extern calls to the same MKL/oneDNN kernels, and fusing removes only the memory passes of
the elementwise work, the LayerNorms, the softmax of the MLM loss and the optimizer. On
this project's 2-core CPU that bound kept the gains under the targets (docs/training.md
gives them), so the default is off.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch

from .config import COMPILE_MODES as MODES

logger = logging.getLogger(__name__)

CACHE_NAME = "compile-cache"
# torch.compile options of every compiled region (see the module docstring).
COMPILE_KWARGS = {"dynamic": True}


def cache_dir(output_dir: str, named: str | None) -> Path:
    """Where inductor keeps its caches: ``named``, else ``OUTPUT_DIR/compile-cache``."""
    return Path(named) if named else Path(output_dir, CACHE_NAME)


def use_cache(directory: Path) -> None:
    """Point inductor's (and Triton's, on GPU) caches at ``directory``, before compiling.

    Both are read from the environment when a cache is first used. Set here whatever the
    environment had, so that the run's directory is the one used: a cache shared by runs
    is one named with ``--compile-cache``.
    """
    directory.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(directory)
    os.environ["TRITON_CACHE_DIR"] = str(directory / "triton")


def apply(engine, config) -> None:
    """``--compile`` and ``--compile-cache`` of ``config`` (a TrainConfig) on ``engine``."""
    if config.compile == "off":
        return
    use_cache(cache_dir(config.output_dir, config.compile_cache))
    compile_engine(engine, config.compile)


def check_zero(ds: dict, mode: str, *, where: str) -> None:
    """Refuse ``--compile`` with ZeRO stage 3.

    Stage 3 partitions the parameters themselves and gathers each one around its module's
    forward; compiled through ``engine.compile``, the graphs meet the empty partitions and
    the first step fails inside inductor ("b must be 2D", on one CPU rank and on two).
    Stages 1 and 2 compiled on two ranks train as eager: the trainer runs every batch on
    the same path (``set_unpadded(every_batch=True)``, model/bert.py), which stage 2's
    gradient buckets need (docs/results.md).

    Raises:
        ValueError: ``mode`` is not off and ``ds`` enables stage 3.
    """
    stage = (ds.get("zero_optimization") or {}).get("stage", 0)
    if mode != "off" and stage == 3:
        raise ValueError(
            f"{where}: --compile {mode} does not run with ZeRO stage 3 (the compiled graphs "
            f'meet its partitioned parameters); use "zero_optimization": {{"stage": 2}}, '
            f"or --compile off"
        )


def compile_engine(engine, mode: str) -> None:
    """Compile ``engine`` (a DeepSpeedEngine) as ``mode`` says; ``off`` leaves it alone.

    Raises:
        ValueError: an unknown mode.
    """
    if mode not in MODES:
        raise ValueError(f"--compile must be one of {MODES}, got {mode!r}")
    if mode == "off":
        return
    engine.compile(backend="inductor", compile_kwargs=dict(COMPILE_KWARGS))
    if mode == "step":
        compile_step(torch_optimizer(engine.optimizer))
    logger.info("compiled: %s (torch.compile %s)", mode, COMPILE_KWARGS)


def compile_step(optimizer: torch.optim.Optimizer) -> None:
    """``optimizer.step`` compiled, but for a step at a learning rate of 0, which runs eager.

    Compiled, torch's Adam and AdamW take their "capturable" form, which folds the step
    size (lr / bias correction) into the denominator: at lr 0 a zero second moment (a
    parameter whose gradient has been 0, such as a position no row reached) makes 0 / 0,
    and the weights NaN (pytorch/pytorch#126514; so with torch 2.13 on CPU, every ``dynamic``
    setting). A warmup from ``warmup_min_lr`` 0 (deploy/cpu.json) starts there.
    The eager step keeps the same state (moments, step count) as the compiled one.
    """
    eager, compiled = optimizer.step, torch.compile(optimizer.step, **COMPILE_KWARGS)

    def step(closure=None):
        if any(float(group["lr"]) == 0.0 for group in optimizer.param_groups):
            return eager(closure)
        return compiled(closure)

    optimizer.step = step


def torch_optimizer(optimizer) -> torch.optim.Optimizer:
    """The torch optimizer inside DeepSpeed's wrappers (ZeRO's, bf16's), or ``optimizer``.

    Raises:
        ValueError: none is found (a DeepSpeed op's optimizer is compiled as it is).
    """
    seen = optimizer
    while not isinstance(seen, torch.optim.Optimizer) and hasattr(seen, "optimizer"):
        seen = seen.optimizer
    if not isinstance(seen, torch.optim.Optimizer):
        raise ValueError(f"--compile step needs a torch optimizer, got {type(optimizer).__name__}")
    return seen


def graph_count() -> int:
    """Distinct graphs dynamo compiled in this process so far (forward regions and the
    optimizer step; an autograd backward is compiled with its forward and not counted)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])
