"""The settings of one ``python -m finetune`` run: defaults < ``--config`` JSON < flags.

``FinetuneConfig`` validates every value where it is built (an unknown JSON key or a bad
value raises ValueError naming it) and is saved as ``finetune_config.json`` beside the model.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TASKS = ("classification", "qa", "token")
PATHS = ("task", "init", "train", "eval", "output_dir")  # strings, not typed numbers


@dataclass(frozen=True)
class FinetuneConfig:
    """One run's settings: defaults < ``--config`` JSON < flags; saved beside the model."""

    task: str  # classification | token | qa
    init: str  # Hugging Face directory with a tokenizer
    train: str
    eval: str
    output_dir: str | None = None  # None: nothing written
    epochs: int = 3
    lr: float = 3e-5  # peak learning rate, after warmup
    batch_size: int = 32
    max_seq_length: int = 128
    warmup_ratio: float = 0.1  # fraction of all steps spent warming up linearly
    weight_decay: float = 0.01
    seed: int = 42  # head initialisation, dropout and shuffling

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {list(TASKS)}, got {self.task!r}")
        for name in ("epochs", "batch_size", "max_seq_length", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative int, got {value!r}")
        checks = {
            "epochs": (self.epochs > 0, "> 0"),
            "batch_size": (self.batch_size > 0, "> 0"),
            "max_seq_length": (self.max_seq_length >= 8, ">= 8"),
            "lr": (self.lr > 0, "> 0"),
            "weight_decay": (self.weight_decay >= 0, ">= 0"),
            "warmup_ratio": (0 <= self.warmup_ratio < 1, "in [0, 1)"),
        }
        for name, (ok, rule) in checks.items():
            if not ok:
                raise ValueError(f"{name} must be {rule}, got {getattr(self, name)!r}")


def parse_config(argv: Sequence[str] | None, doc: str = "") -> FinetuneConfig:
    """Flags over ``--config`` JSON over defaults; ``doc`` is the ``--help`` text.

    Raises:
        ValueError: an unreadable ``--config``, an unknown key (named) or a bad value.
    """
    parser = argparse.ArgumentParser(
        prog="python -m finetune",
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", help="JSON file with any of the settings below")
    parser.add_argument("--task", choices=TASKS)
    for name in PATHS[1:]:
        parser.add_argument("--" + name.replace("_", "-"), dest=name)
    for field in dataclasses.fields(FinetuneConfig):
        if field.name not in PATHS:
            kind = int if field.type == "int" else float
            parser.add_argument("--" + field.name.replace("_", "-"), dest=field.name, type=kind)
    args = vars(parser.parse_args(argv))
    values: dict[str, Any] = {}
    config_path = args.pop("config")
    if config_path:
        try:
            values = json.loads(Path(config_path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"cannot read {config_path}: {e}") from e
        known = {f.name for f in dataclasses.fields(FinetuneConfig)}
        if not isinstance(values, dict) or set(values) - known:
            raise ValueError(f"{config_path}: unknown key(s) {sorted(set(values) - known)}")
    values.update({k: v for k, v in args.items() if v is not None})
    missing = [k for k in ("task", "init", "train", "eval") if k not in values]
    if missing:
        raise ValueError(f"missing setting(s) {missing} (flags --task --init --train --eval)")
    return FinetuneConfig(**values)
