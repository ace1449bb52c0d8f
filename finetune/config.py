"""The settings of one ``python -m finetune`` run: defaults < ``--config`` JSON < flags.

Each setting is declared once, as a ``FinetuneConfig`` field with its help
(pipeline/options.py: the flags, ``--help`` and the ``--config`` JSON keys come from it).
``FinetuneConfig`` validates every value where it is built (an unknown JSON key or a bad
value raises ValueError naming it) and is saved as ``finetune_config.json`` beside the model.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.options import CommandParser, add_options, option, parse_options

TASKS = ("classification", "qa", "similarity", "token")


@dataclass(frozen=True)
class FinetuneConfig:
    """One run's settings: defaults < ``--config`` JSON < flags; saved beside the model."""

    task: str = option(help="what the head learns (file formats: see above)", choices=TASKS)
    init: str = option(help="Hugging Face directory with a tokenizer: the weights to start from")
    train: str = option(help="training file (.jsonl/.json or .csv)")
    eval: str = option(help="evaluation file (.jsonl/.json or .csv), after every epoch")
    output_dir: str | None = option(None, "write the model, tokenizer and results here")
    overwrite: bool = option(False, "write over an earlier result in --output-dir")
    epochs: int = option(3, "passes over --train (unless --max-steps)")
    max_steps: int = option(0, "stop after this many optimizer steps; 0: --epochs decide")
    lr: float = option(3e-5, "peak learning rate, after warmup")
    batch_size: int = option(32, "examples per forward pass (micro batch)")
    grad_accum: int = option(1, "micro batches per optimizer step: batch K * --batch-size")
    max_seq_length: int = option(0, "tokens per sequence (0: qa 384, else 128); see --doc-stride")
    warmup_ratio: float = option(0.1, "fraction of all steps warming up linearly")
    warmup_steps: int = option(0, "warmup steps; > 0 overrides --warmup-ratio")
    weight_decay: float = option(0.01, "AdamW weight decay (none on biases, LayerNorm)")
    freeze_layers: int = option(0, "freeze the embeddings and the lowest N encoder layers")
    gradual_unfreeze: bool = option(False, "epoch e trains the head + top e-1 layers")
    layer_lr_decay: float = option(1.0, "layer l learns at lr * D^(L-l); 1: off")
    seed: int = option(42, "head initialisation, dropout and shuffling")
    device: str = option(
        "auto", "where to train: auto (the GPU when there is one), cpu, cuda or cuda:N"
    )
    # QA only (Google's run_squad.py names and defaults; finetune/qa.py, finetune/squad.py).
    max_query_length: int = option(64, "qa: question tokens kept (the rest cut)")
    doc_stride: int = option(128, "qa: tokens between the starts of a context's windows")
    max_answer_length: int = option(30, "qa: longest answer predicted, in tokens")
    n_best_size: int = option(20, "qa: top start and end logits paired per window")
    null_score_diff_threshold: float = option(
        0.0, "qa: predict no answer when null score - best span score > this"
    )

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {list(TASKS)}, got {self.task!r}")
        if self.max_seq_length == 0:  # the task's default, resolved so that it is saved
            object.__setattr__(self, "max_seq_length", 384 if self.task == "qa" else 128)
        for f in dataclasses.fields(self):
            value, kind = getattr(self, f.name), {"int": int, "float": (int, float)}.get(f.type)
            if f.type == "bool" and not isinstance(value, bool):
                raise ValueError(f"{_name(f.name)} must be true or false, got {value!r}")
            if kind and (isinstance(value, bool) or not isinstance(value, kind)):
                raise ValueError(f"{_name(f.name)} must be a number ({f.type}), got {value!r}")
        checks = {
            "epochs": (self.epochs > 0, "> 0"),
            "max_steps": (self.max_steps >= 0, ">= 0"),
            "batch_size": (self.batch_size > 0, "> 0"),
            "grad_accum": (self.grad_accum > 0, "> 0"),
            "max_seq_length": (self.max_seq_length >= 8, ">= 8"),
            "lr": (self.lr > 0, "> 0"),
            "weight_decay": (self.weight_decay >= 0, ">= 0"),
            "warmup_ratio": (0 <= self.warmup_ratio < 1, "in [0, 1)"),
            "warmup_steps": (self.warmup_steps >= 0, ">= 0"),
            "freeze_layers": (self.freeze_layers >= 0, ">= 0"),
            "layer_lr_decay": (0 < self.layer_lr_decay <= 1, "in (0, 1]"),
            "seed": (self.seed >= 0, ">= 0"),
            "max_query_length": (self.max_query_length > 0, "> 0"),
            "doc_stride": (self.doc_stride > 0, "> 0"),
            "max_answer_length": (self.max_answer_length > 0, "> 0"),
            "n_best_size": (self.n_best_size > 0, "> 0"),
            "null_score_diff_threshold": (math.isfinite(self.null_score_diff_threshold), "finite"),
        }
        device = self.device.split(":")
        if device[0] not in ("auto", "cpu", "cuda") or (
            len(device) > 1 and (device[0] != "cuda" or not device[1].isdigit())
        ):
            raise ValueError(
                f"{_name('device')} must be auto, cpu, cuda or cuda:N, got {self.device!r}"
            )
        for name, (ok, rule) in checks.items():
            if not ok:
                raise ValueError(f"{_name(name)} must be {rule}, got {getattr(self, name)!r}")


def _name(key: str) -> str:
    """How a setting is named in errors: ``"warmup_ratio (--warmup-ratio)"``."""
    return f"{key} (--{key.replace('_', '-')})"


def parse_config(argv: Sequence[str] | None, doc: str = "") -> FinetuneConfig:
    """Flags over ``--config`` JSON over defaults; ``doc`` is the ``--help`` text.

    Raises:
        ValueError: an unreadable ``--config``, an unknown key (named) or a bad value.
    """
    parser = CommandParser.of_doc("python -m finetune", doc)
    add_options(parser, FinetuneConfig, sep="-")
    argv = sys.argv[1:] if argv is None else argv
    config, _ = parse_options(parser, FinetuneConfig, argv, sep="-")
    return config
