"""Options of ``trainer/run.py``: one typed, validated config built from defaults < JSON < flags.

The CLI owns data, model, output, steps and cadence; precision, ZeRO stage, batch sizes,
optimizer and schedule belong to the DeepSpeed JSON (``--ds-config``, see trainer/dsconfig.py).

    python trainer/run.py --ds-config deploy/cpu.json --data shards/ --model tiny \\
        --output-dir runs/tiny --max-steps 100
    python trainer/run.py --config my_run.json --max-steps 200   # flags override the file

A ``--config`` file is a JSON object whose keys are the flag names with underscores
(``{"max_steps": 200, "log_every": 5}``); an unknown key is an error naming the key and file.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MASKING = ("static", "dynamic")
TEACHER_DTYPES = ("auto", "fp32", "bf16")
DISTILL_INITS = ("auto", "teacher", "random")
DEFAULT_MAX_STEPS = 1000


@dataclass(frozen=True)
class TrainConfig:
    """Everything ``trainer/run.py`` takes besides the DeepSpeed JSON (saved with each checkpoint)."""

    ds_config: str  # DeepSpeed JSON (deploy/zero2.json, deploy/cpu.json, ...)
    data: str  # shard directory with manifest.json: local path or gs:// s3:// URI
    output_dir: str  # checkpoints/, tensorboard/, metrics.jsonl, hf/ go here
    # A preset name (tiny ... large; vocab_size and pad id taken from the shards' manifest)
    # or a Hugging Face style config.json (used as is, and checked against the manifest).
    # None: "base", or the config of --init-from-hf when that is given.
    model: str | None = None
    # Optimizer steps (not micro-batches). None: 1000, or no step limit with --max-minutes.
    max_steps: int | None = None
    # A time budget in minutes of training (trainer/schedule.py): WarmupDecayLR decays over
    # it and the run stops when it is spent. With --max-steps too, whichever comes first.
    max_minutes: float | None = None
    save_every: int = 1000  # checkpoint cadence in optimizer steps; 0: only at the end
    log_every: int = 10
    eval_data: str | None = None  # held-out shard directory, read once per evaluation
    eval_every: int = 0  # 0: evaluate only at the end (when eval_data is set)
    resume: str | None = None  # "auto": latest checkpoint in output_dir if any; or a path
    init_from_hf: str | None = None  # start from these weights (e.g. phase 1 -> phase 2)
    dropout: float | None = None  # hidden and attention dropout; None: the model config's
    seed: int = 42
    masking: str = "static"  # static: the shards' masks; dynamic: re-mask every epoch
    num_workers: int = 2  # DataLoader worker processes per rank
    shuffle_window: int = 65536  # rows shuffled together within an epoch
    skip_corrupt: bool = False  # skip (and count) shards failing the start-up check
    verify_shards: bool = False  # also check every shard's sha256 at start-up (reads all)
    peak_tflops: float | None = None  # device peak for MFU; None: a table of known GPUs
    unpad: bool = True  # encoder on real tokens only (model/unpad.py); false: padded path
    export_hf: bool = True  # write output_dir/hf (Hugging Face format) at the end
    record_samples: bool = False  # append the row ids each rank trains on to samples-rankN.txt
    # Seconds a scheduler allows between SIGTERM and SIGKILL (trainer/signals.py): a warning
    # at the first checkpoint when a step plus a save take longer. 0: no check.
    signal_grace: float = 30.0
    # Knowledge distillation (trainer/distillation.py): the --model is the student.
    teacher: str | None = None  # a Hugging Face BertForPreTraining directory; None: pretraining
    teacher_dtype: str = "auto"  # auto: bf16 on a CUDA device with bf16, else fp32
    distill_temperature: float = 2.0  # T of the soft targets (DistilBERT's)
    distill_kl_weight: float = 5.0  # soft-target KL, times T² (DistilBERT's alpha_ce)
    distill_hard_weight: float = 2.0  # MLM (+ NSP) loss on the shards' labels (alpha_mlm)
    # Cosine loss between the last hidden states (alpha_cos); needs equal hidden sizes.
    # None: 1.0 when the teacher's and student's hidden sizes match, else 0.
    distill_cos_weight: float | None = None
    distill_nsp: bool = True  # false: NSP leaves the loss (soft and hard), as in DistilBERT
    # Student initialisation: teacher = its embeddings, evenly spaced layers and heads (needs
    # the same widths); random = the usual init; auto = teacher when the widths match (and
    # no --init-from-hf), else random.
    distill_init: str = "auto"

    def __post_init__(self) -> None:
        """Raises ValueError naming the flag of the first invalid value."""
        for name in ("ds_config", "data", "output_dir", "model", "eval_data", "resume", "teacher"):
            value = getattr(self, name)
            if (value is not None or name in ("ds_config", "data", "output_dir")) and (
                not isinstance(value, str) or not value
            ):
                raise ValueError(f"--{_flag(name)} must be a non-empty string, got {value!r}")
        positive = ("max_steps", "log_every", "shuffle_window")
        non_negative = ("save_every", "eval_every", "num_workers", "seed")
        for name in (*positive, *non_negative):
            value = getattr(self, name)
            if value is None and name == "max_steps":
                continue
            low = 1 if name in positive else 0
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"--{_flag(name)} must be an int >= {low}, got {value!r}")
        if self.masking not in MASKING:
            raise ValueError(f"--masking must be one of {MASKING}, got {self.masking!r}")
        if self.peak_tflops is not None and not self.peak_tflops > 0:
            raise ValueError(f"--peak-tflops must be > 0, got {self.peak_tflops!r}")
        if self.dropout is not None and not (
            isinstance(self.dropout, (int, float)) and 0.0 <= self.dropout < 1.0
        ):
            raise ValueError(f"--dropout must be in [0, 1), got {self.dropout!r}")
        if not (isinstance(self.signal_grace, (int, float)) and self.signal_grace >= 0):
            raise ValueError(f"--signal-grace must be >= 0, got {self.signal_grace!r}")
        if self.max_minutes is not None and not (
            isinstance(self.max_minutes, (int, float)) and self.max_minutes > 0
        ):
            raise ValueError(f"--max-minutes must be > 0, got {self.max_minutes!r}")
        for name in ("skip_corrupt", "verify_shards", "unpad", "export_hf", "record_samples",
                     "distill_nsp"):  # fmt: skip
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"--{_flag(name)} must be true or false")
        self._check_distillation()

    def _check_distillation(self) -> None:
        """Raises ValueError naming the flag: a bad distillation value, or one without --teacher."""
        if self.teacher is None:
            given = [f"--{_flag(f.name)}" for f in dataclasses.fields(self)
                     if f.name.startswith(("distill_", "teacher_"))
                     and getattr(self, f.name) != f.default]  # fmt: skip
            if given:
                raise ValueError(f"{' '.join(given)} only apply with --teacher")
            return
        if self.teacher_dtype not in TEACHER_DTYPES:
            raise ValueError(f"--teacher-dtype must be one of {TEACHER_DTYPES}")
        if self.distill_init not in DISTILL_INITS:
            raise ValueError(f"--distill-init must be one of {DISTILL_INITS}")
        if self.distill_init == "teacher" and self.init_from_hf is not None:
            raise ValueError("--distill-init teacher and --init-from-hf both set the student")
        if not (
            isinstance(self.distill_temperature, (int, float)) and self.distill_temperature > 0
        ):
            raise ValueError(f"--distill-temperature must be > 0, got {self.distill_temperature!r}")
        weights = ("distill_kl_weight", "distill_hard_weight", "distill_cos_weight")
        for name in weights:
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and value >= 0):
                raise ValueError(f"--{_flag(name)} must be >= 0, got {value!r}")
        if not any(getattr(self, name) for name in weights[:2]):
            raise ValueError(
                "--distill-kl-weight and --distill-hard-weight are both 0: nothing would train "
                "the MLM head"
            )

    @property
    def step_limit(self) -> int | None:
        """Steps to stop at: --max-steps, else 1000 without a time budget, else none."""
        if self.max_steps is not None:
            return self.max_steps
        return None if self.max_minutes is not None else DEFAULT_MAX_STEPS

    @property
    def budget_s(self) -> float | None:
        """The time budget in seconds, or None."""
        return None if self.max_minutes is None else 60.0 * self.max_minutes

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _flag(name: str) -> str:
    return name.replace("_", "-")


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


_HELP = {
    "ds_config": "DeepSpeed JSON: precision, ZeRO, batch sizes, optimizer, schedule",
    "data": "shard directory (manifest.json + shard-*.arrow); local or gs:// s3://",
    "output_dir": "checkpoints/, tensorboard/, metrics.jsonl and hf/ are written here",
    "model": "preset (tiny mini small medium base large) or a config.json [base]",
    "max_steps": "optimizer steps to train for, counting those before a resume "
    f"(default: {DEFAULT_MAX_STEPS}, or no limit with --max-minutes)",
    "max_minutes": "time budget: train this many minutes (counting those before a resume), "
    "WarmupDecayLR decaying over them; the first of this and --max-steps ends the run",
    "save_every": "checkpoint every N steps (0: only at the end)",
    "log_every": "metrics every N steps",
    "eval_data": "held-out shard directory for MLM/NSP accuracy",
    "eval_every": "evaluate every N steps (0: only at the end)",
    "resume": "'auto' (latest checkpoint of --output-dir, if any) or a checkpoint path",
    "init_from_hf": "initial weights from a Hugging Face BertForPreTraining directory",
    "dropout": "hidden and attention dropout (default: the model config's; 0 suits short runs)",
    "seed": "seed of data order, dynamic masks, dropout and initialisation",
    "masking": "static: the shards' masks; dynamic: re-mask each epoch (RoBERTa-style)",
    "num_workers": "DataLoader worker processes per rank",
    "shuffle_window": "rows shuffled together within an epoch",
    "skip_corrupt": "skip and count shards that fail the start-up check instead of failing",
    "verify_shards": "check every shard's sha256 at start-up (reads the whole dataset once)",
    "peak_tflops": "peak TFLOP/s of one device for MFU (default: known GPUs; none on CPU)",
    "unpad": "run the encoder on real tokens only (false: the padded reference path)",
    "export_hf": "write a Hugging Face export to OUTPUT_DIR/hf at the end",
    "record_samples": "append each rank's trained row ids to OUTPUT_DIR/samples-rankN.txt",
    "teacher": "distil from this Hugging Face BertForPreTraining directory (the --model is the "
    "student; trainer/distillation.py)",
    "teacher_dtype": "teacher's precision: auto (bf16 on CUDA with bf16, else fp32), fp32, bf16",
    "distill_temperature": "temperature T of the soft targets",
    "distill_kl_weight": "weight of the soft-target KL (times T²) of the MLM and NSP heads",
    "distill_hard_weight": "weight of the MLM + NSP loss on the shards' labels",
    "distill_cos_weight": "weight of the cosine loss between last hidden states (needs equal "
    "hidden sizes; default: 1 when they are equal, else 0)",
    "distill_nsp": "distil NSP too (false: no NSP loss at all, as in DistilBERT)",
    "distill_init": "student init: teacher (embeddings, evenly spaced layers, heads; same "
    "widths), random, or auto (teacher when the widths match)",
    "signal_grace": "seconds a scheduler allows between SIGTERM and SIGKILL (SLURM KillWait, "
    "Kubernetes terminationGracePeriodSeconds): warn at the first checkpoint when a step plus "
    "a save take longer (0: no check)",
}

EPILOG = """\
Ctrl-C (SIGINT) or SIGTERM: every rank finishes the optimizer step in progress and saves a
checkpoint, rank 0 prints the command that resumes the run (--resume auto), and the run exits
130 (SIGINT) or 143 (SIGTERM). A second signal, a second or more later, exits at once with
the same codes; a checkpoint being written then is never resumed (trainer/signals.py).

exit codes: 0 done; 2 bad arguments, configuration or data; 3 non-finite loss or weights;
130 / 143 stopped by SIGINT / SIGTERM (resume with --resume auto)."""


def build_parser() -> argparse.ArgumentParser:
    """Flags of every TrainConfig field; defaults are SUPPRESSed so only given flags override."""
    p = argparse.ArgumentParser(
        prog="trainer/run.py",
        description="Pretrain BERT (MLM + NSP) on pipeline shards with DeepSpeed.",
        argument_default=argparse.SUPPRESS,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", help="JSON file of defaults for these flags (flags win)")
    p.add_argument("--local_rank", "--local-rank", type=int, help=argparse.SUPPRESS)
    types = {f.name: f.type for f in dataclasses.fields(TrainConfig)}
    for field in dataclasses.fields(TrainConfig):
        kind = types[field.name]
        convert = {"int": int, "int | None": int, "bool": _bool, "float | None": float,
                   "float": float}.get(str(kind), str)  # fmt: skip
        choices = {"masking": MASKING, "teacher_dtype": TEACHER_DTYPES,
                   "distill_init": DISTILL_INITS}.get(field.name)  # fmt: skip
        extra = {"choices": choices} if choices else {}
        shown = field.default not in (dataclasses.MISSING, None)
        default = f" (default: {field.default})" if shown else ""
        p.add_argument(
            f"--{_flag(field.name)}",
            dest=field.name,
            type=convert,
            help=_HELP[field.name] + default,
            **extra,
        )
    return p


def load_json_defaults(path: str) -> dict[str, Any]:
    """Read a ``--config`` file.

    Raises:
        ValueError: unreadable, not a JSON object, or an unknown key (names the file and key).
    """
    try:
        values = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"--config {path}: cannot read: {err}") from err
    if not isinstance(values, dict):
        raise ValueError(f"--config {path}: expected a JSON object")
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"--config {path}: unknown key(s) {unknown}; known: {sorted(known)}")
    return values


def parse_args(argv: Sequence[str]) -> TrainConfig:
    """Defaults < ``--config`` JSON < flags -> TrainConfig.

    Raises:
        ValueError: a missing required option, an unknown key or an invalid value.
        SystemExit: from argparse for an unknown flag or ``--help``.
    """
    args = vars(build_parser().parse_args(list(argv)))
    args.pop("local_rank", None)  # the deepspeed launcher passes it; we read LOCAL_RANK
    config_file = args.pop("config", None)
    values = load_json_defaults(config_file) if config_file else {}
    values.update(args)
    missing = [f"--{_flag(n)}" for n in ("ds_config", "data", "output_dir") if n not in values]
    if missing:
        raise ValueError(f"missing required option(s): {' '.join(missing)}")
    return TrainConfig(**values)
