"""The DeepSpeed JSON's keys, checked against the keys the installed DeepSpeed knows.

DeepSpeed ignores a top-level key it does not read (``"gradient_cliping"``: clipping is
silently off), and a misspelt key inside ``zero_optimization`` or ``optimizer.params`` fails
deep inside ``deepspeed.initialize`` with a raw ``ValidationError`` or ``TypeError``. This
module runs before the model is built and names every unknown key with its path and the
closest known one::

    --ds-config my.json: unknown key zero_optimization.stage3_max_live_paramters (did you
    mean stage3_max_live_parameters?) ...

The known keys come from the installed DeepSpeed, so a newer version's keys are accepted:

- top level: the keys ``DeepSpeedConfig`` reads, recorded once by parsing an empty config
  (DeepSpeed has no model of its top level, and some of its keys exist only as literals);
- ``zero_optimization``, ``bf16``, ``fp16``, the monitors, ...: DeepSpeed's own pydantic
  model of the section validates it (``model_validate``, its ``extra="forbid"``), nested
  sections included; each key it refuses as extra gets the closest of that model's fields
  and aliases;
- ``optimizer`` / ``scheduler``: ``type`` must name a class DeepSpeed can build; ``params``
  are that class's keyword arguments, for the class DeepSpeed picks as
  ``DeepSpeedEngine._configure_basic_optimizer`` does (``torch_adam``, ZeRO offload), plus
  the keys the engine consumes itself (``torch_adam``, ``adam_w_mode``, ...);
- ``checkpoint``: the keys DeepSpeedConfig reads from it (``load_universal``,
  ``tag_validation``, ``use_node_local_storage``, ...), recorded as the top level's are; a
  top-level key that belongs there says so;
- other sections (``activation_checkpointing``, ``flops_profiler``, ...): only their name
  is checked.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import inspect
import typing
from typing import Any

# Section -> the pydantic model DeepSpeed builds from it ("module:Class"; skipped when this
# DeepSpeed has no such class).
SECTION_MODELS = {
    "zero_optimization": "deepspeed.runtime.zero.config:DeepSpeedZeroConfig",
    "bf16": "deepspeed.runtime.precision_config:DeepSpeedBF16Config",
    "bfloat16": "deepspeed.runtime.precision_config:DeepSpeedBF16Config",  # old name of bf16
    "fp16": "deepspeed.runtime.precision_config:DeepSpeedFP16Config",
    "tensorboard": "deepspeed.monitor.config:TensorBoardConfig",
    "wandb": "deepspeed.monitor.config:WandbConfig",
    "csv_monitor": "deepspeed.monitor.config:CSVConfig",
    "comet": "deepspeed.monitor.config:CometConfig",
    "comms_logger": "deepspeed.comm.config:CommsLoggerConfig",
    "hybrid_engine": "deepspeed.runtime.config:HybridEngineConfig",
    "compile": "deepspeed.compile.config:CompileConfig",
}
# Read by deepspeed.initialize itself (its device mesh), outside DeepSpeedConfig.
MESH_KEYS = ("sequence_parallel_size", "data_parallel_size")
# Optimizer params the engine pops before building an Adam (engine.get_optimizer_configuration).
ADAM_ENGINE_KEYS = ("torch_adam", "adam_w_mode", "fp32_optimizer_states")
DOCS = "https://www.deepspeed.ai/docs/config-json/"


def check_keys(ds: dict[str, Any], *, where: str) -> None:
    """Refuse keys the installed DeepSpeed does not know, and optimizer or scheduler types
    it cannot build.

    Example: ``{"gradient_cliping": 1.0, ...}`` -> ``ValueError("--ds-config x.json: unknown
    key gradient_cliping (did you mean gradient_clipping?) ...")``.

    Raises:
        ValueError: naming ``where``, each unknown key with its path and a did-you-mean.
    """
    top, in_checkpoint = _recorded_keys()
    problems = [_unknown_top(key, top, in_checkpoint) for key in ds if key not in top]
    for key, value in ds.items():
        model = _section_model(key)
        if model is not None and isinstance(value, dict):
            problems += _model_problems(model, value, key)
    if isinstance(ds.get("checkpoint"), dict):
        problems += [
            _unknown(f"checkpoint.{key}", key, in_checkpoint)
            for key in ds["checkpoint"]
            if key not in in_checkpoint
        ]
    for section in ("optimizer", "scheduler"):
        if isinstance(ds.get(section), dict):
            problems += _builder_problems(ds, section)
    if problems:
        import deepspeed

        them = "them" if len(problems) > 1 else "it"
        raise ValueError(
            f"{where}: {'; '.join(problems)}. Fix or remove {them}: DeepSpeed "
            f"{deepspeed.__version__} would ignore {them} or fail on {them} (its keys: {DOCS})"
        )


def _unknown(path: str, key: str, known, why: str = "") -> str:
    """``"unknown key a.b (did you mean c?)"``; small sections list their keys instead."""
    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
    if close:
        hints = [why, f"did you mean {close[0]}?"]
    elif 0 < len(known) <= 12:
        hints = [why, f"known: {', '.join(sorted(known))}"]
    else:
        hints = [why]
    hint = "; ".join(h for h in hints if h)
    return f"unknown key {path}" + (f" ({hint})" if hint else "")


def _unknown_top(key: str, top, in_checkpoint) -> str:
    """An unknown top-level key; one that belongs in the ``checkpoint`` section says so
    (``load_universal_checkpoint`` -> did you mean checkpoint.load_universal?)."""
    close = difflib.get_close_matches(key, sorted(in_checkpoint), n=1, cutoff=0.6)
    rival = difflib.get_close_matches(key, sorted(top), n=1, cutoff=0.6)
    if close and (not rival or _similarity(key, close[0]) > _similarity(key, rival[0])):
        return f"unknown key {key} (did you mean checkpoint.{close[0]}?)"
    return _unknown(key, key, top)


def _similarity(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, a, b).ratio()


@functools.cache
def _recorded_keys() -> tuple[frozenset[str], frozenset[str]]:
    """The top-level keys DeepSpeedConfig reads, and those of its ``checkpoint`` section:
    recorded while it parses an empty config (``checkpoint`` has no model to read them from)."""
    from deepspeed.runtime.config import DeepSpeedConfig

    top: set[str] = set()
    checkpoint: set[str] = set()

    def recorder(read: set[str]):
        class ReadKeys(dict):  # `read` is outside: DeepSpeedConfig parses a copy of the dict
            def get(self, key, *default):
                read.add(key)
                return super().get(key, *default)

            def __contains__(self, key):
                read.add(key)
                return super().__contains__(key)

            def __getitem__(self, key):
                read.add(key)
                return super().__getitem__(key)

            def keys(self):  # DeepSpeed also asks `key in param_dict.keys()`
                return self

        return ReadKeys

    DeepSpeedConfig(
        recorder(top)(train_micro_batch_size_per_gpu=1, checkpoint=recorder(checkpoint)())
    )
    return frozenset(top | set(MESH_KEYS)), frozenset(checkpoint)


def _section_model(section: str):
    """The pydantic model of a section, or None (no model, or not in this DeepSpeed)."""
    if section not in SECTION_MODELS:
        return None
    module, name = SECTION_MODELS[section].split(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


def _model_problems(model, section: dict[str, Any], path: str) -> list[str]:
    """The keys of ``section`` DeepSpeed's model refuses (its ``extra="forbid"``), nested
    sections included, each with the closest key the model takes there.

    The model validates as DeepSpeed builds the section (``"auto"`` values dropped first);
    its other errors (a wrong type, a rule between keys) are left to ``deepspeed.initialize``,
    which raises them as it does without this check.
    """
    from deepspeed.utils import logger
    from pydantic import ValidationError

    disabled, logger.disabled = logger.disabled, True  # its deprecation warnings: later, once
    errors = []
    try:
        model.model_validate(section)
    except ValidationError as err:
        errors = [e for e in err.errors() if e["type"] == "extra_forbidden"]
    finally:
        logger.disabled = disabled
    problems = []
    for error in errors:
        *parents, key = error["loc"]
        where = ".".join(map(str, [path, *error["loc"]]))
        names = _names(_model_at(model, parents))  # {field name or alias: field name}
        if key in names:  # a field given by its name and its alias: DeepSpeed refuses one
            other = next(k for k, n in names.items() if n == names[key] and k != key)
            problems.append(f"{where} is also given as {other} (keep one)")
        else:
            problems.append(_unknown(where, str(key), names))
    return problems + _auto_problems(model, section, path)


def _auto_problems(model, section: dict[str, Any], path: str, parents=()) -> list[str]:
    """Keys set to ``"auto"`` that the model does not take: DeepSpeed drops ``"auto"`` values
    before its model sees them, so a misspelt key set to ``"auto"`` would pass unseen."""
    problems = []
    for key, value in section.items():
        if isinstance(value, dict):
            problems += _auto_problems(model, value, path, (*parents, key))
            continue
        names = _names(_model_at(model, parents)) if value == "auto" else None
        if names and key not in names:
            problems.append(_unknown(".".join([path, *parents, key]), key, names))
    return problems


def _model_at(model, loc):
    """The model of the section at ``loc`` inside ``model``: ``("offload_optimizer",)`` ->
    DeepSpeedZeroOffloadOptimizerConfig; None where the path leads to no model."""
    from pydantic import BaseModel

    for key in loc:
        name = _names(model).get(key)
        kind = model.model_fields[name].annotation if name else None
        kinds = (kind, *typing.get_args(kind))  # Optional[Model] -> Model
        model = next((k for k in kinds if isinstance(k, type) and issubclass(k, BaseModel)), None)
    return model


def _names(model) -> dict[str, str]:
    """{field name or alias: field name}: the keys ``model`` takes; {} for None."""
    fields = model.model_fields if model is not None else {}
    return {n: n for n in fields} | {f.alias: n for n, f in fields.items() if f.alias}


def _builder_problems(ds: dict[str, Any], section: str) -> list[str]:
    """``optimizer`` / ``scheduler``: its own keys, its type, and params against the class."""
    from deepspeed.runtime.constants import LEGACY_FUSION, OPTIMIZER_PARAMS, TYPE

    spec = ds[section]
    own = {TYPE, OPTIMIZER_PARAMS} | ({LEGACY_FUSION} if section == "optimizer" else set())
    problems = [_unknown(f"{section}.{k}", k, own) for k in spec if k not in own]
    kind = spec.get(TYPE)
    if not isinstance(kind, str):
        return problems
    if section == "optimizer":
        types, cls = _optimizer_types(), optimizer_class(ds)
        buildable = kind.lower() in _ds_optimizers() or kind in types.values()
    else:
        types, cls = _scheduler_types(), scheduler_class(kind)
        buildable = cls is not None
    if not buildable:
        close = difflib.get_close_matches(kind.lower(), list(types), n=1, cutoff=0.6)
        hint = f"did you mean {types[close[0]]}?" if close else f"one of {sorted(types.values())}"
        return [*problems, f"{section}.type {kind!r} is not one DeepSpeed can build ({hint})"]
    params = spec.get(OPTIMIZER_PARAMS)
    if cls is None or not isinstance(params, dict):
        return problems
    signature = inspect.signature(cls).parameters
    if any(p.kind is p.VAR_KEYWORD for p in signature.values()):
        return problems
    known = set(list(signature)[1:])  # [1:]: the params / optimizer argument
    if section == "optimizer" and kind.lower() in ("adam", "adamw"):
        known |= set(ADAM_ENGINE_KEYS)
    for key in params:
        if key == "max_grad_norm" and key not in known:
            problems.append(f"{section}.params.max_grad_norm: use the top-level gradient_clipping")
        elif key not in known:
            why = f"{cls.__name__} takes no such argument"
            problems.append(_unknown(f"{section}.params.{key}", key, known, why))
    return problems


def optimizer_class(ds: dict[str, Any]) -> type | None:
    """The class DeepSpeed builds for ``ds["optimizer"]``, picked as
    ``DeepSpeedEngine._configure_basic_optimizer`` picks it; None for no optimizer, an
    unknown type, or one whose class is not looked up here (mup's, Muon).

    Example: ``{"optimizer": {"type": "AdamW", "params": {"torch_adam": true}}}`` ->
    ``torch.optim.AdamW``; without ``torch_adam``: DeepSpeed's ``FusedAdam``, or
    ``DeepSpeedCPUAdam`` with the optimizer offloaded to CPU or NVMe.
    """
    import torch

    spec = ds.get("optimizer")
    kind = spec.get("type") if isinstance(spec, dict) else None
    if not isinstance(kind, str):
        return None
    name = kind.lower()
    if name not in _ds_optimizers():  # DeepSpeed: getattr(torch.optim, type)
        return getattr(torch.optim, kind) if kind in _optimizer_types().values() else None
    params = spec.get("params") if isinstance(spec.get("params"), dict) else {}
    offload = _offload_device(ds) in ("cpu", "nvme")
    if name in ("adam", "adamw"):
        if params.get("torch_adam"):
            adamw = name == "adamw" or params.get("adam_w_mode", True)
            return torch.optim.AdamW if adamw else torch.optim.Adam
        from deepspeed.ops.adam import DeepSpeedCPUAdam, FusedAdam

        return DeepSpeedCPUAdam if offload else FusedAdam
    if name == "adagrad":
        from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad

        return DeepSpeedCPUAdagrad if offload else torch.optim.Adagrad
    if name == "lamb":
        from deepspeed.ops.lamb import FusedLamb

        return FusedLamb
    if name == "lion":
        from deepspeed.ops.lion import DeepSpeedCPULion, FusedLion

        return DeepSpeedCPULion if offload else FusedLion
    return None


def scheduler_class(kind: str) -> type | None:
    """The class DeepSpeed builds for ``scheduler.type``: from its lr_schedules, else from
    torch.optim.lr_scheduler; None when neither has it."""
    import torch
    from deepspeed.runtime import lr_schedules

    names = set(_scheduler_types().values())
    for module in (lr_schedules, torch.optim.lr_scheduler):
        cls = getattr(module, kind, None)
        if kind in names and isinstance(cls, type):
            return cls
    return None


def _ds_optimizers() -> list[str]:
    """DeepSpeed's own optimizer names (lower case; it matches ``type`` in any case)."""
    from deepspeed.runtime.config import DEEPSPEED_OPTIMIZERS

    return DEEPSPEED_OPTIMIZERS


@functools.cache
def _optimizer_types() -> dict[str, str]:
    """{lower-case name: name} of every optimizer type: DeepSpeed's and torch.optim's."""
    import torch

    torch_names = [
        n
        for n, c in vars(torch.optim).items()
        if isinstance(c, type)
        and issubclass(c, torch.optim.Optimizer)
        and c is not torch.optim.Optimizer
    ]
    return {n: n for n in _ds_optimizers()} | {n.lower(): n for n in torch_names}


@functools.cache
def _scheduler_types() -> dict[str, str]:
    """{lower-case name: name} of every scheduler type: DeepSpeed's and torch's."""
    import torch
    from deepspeed.runtime import lr_schedules

    base = torch.optim.lr_scheduler.LRScheduler
    torch_names = [
        n
        for n, c in vars(torch.optim.lr_scheduler).items()
        if isinstance(c, type) and issubclass(c, base) and c is not base and not n.startswith("_")
    ]
    return {n.lower(): n for n in [*lr_schedules.VALID_LR_SCHEDULES, *torch_names]}


def _offload_device(ds: dict[str, Any]) -> str | None:
    zero = ds.get("zero_optimization")
    offload = zero.get("offload_optimizer") if isinstance(zero, dict) else None
    return offload.get("device") if isinstance(offload, dict) else None
