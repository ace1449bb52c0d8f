"""Options of ``trainer/run.py``: one typed, validated config built from defaults < JSON < flags.

The CLI owns data, model, output, steps and cadence; precision, ZeRO stage, batch sizes,
optimizer and schedule belong to the DeepSpeed JSON (``--ds-config``, see trainer/dsconfig.py),
precision with one override: ``--precision fp32|bf16|auto``, so that one JSON serves both.

    python trainer/run.py --ds-config deploy/cpu.json --data shards/ --model tiny \\
        --output-dir runs/tiny --max-steps 100
    python trainer/run.py --config my_run.json --max-steps 200   # flags override the file

Each option is declared once, as a TrainConfig field with its help (pipeline/options.py).
A ``--config`` file is a JSON object whose keys are the flag names with underscores
(``{"max_steps": 200, "log_every": 5}``); an unknown key is an error naming the file, the
key and the closest known one.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.core.masking import MaskingConfig
from pipeline.options import (
    CommandParser,
    add_options,
    flag,
    option,
    parse_bool,
    parse_options,
)

MASKING = ("static", "dynamic")
PRECISIONS = ("config", "fp32", "bf16", "auto")  # trainer/dsconfig.py with_precision
TEACHER_DTYPES = ("auto", "fp32", "bf16")
DISTILL_INITS = ("auto", "teacher", "random")
COMPILE_MODES = ("off", "model", "step")  # trainer/compiling.py
ENGINES = ("auto", "torch", "deepspeed")  # trainer/engine.py
DEFAULT_MAX_STEPS = 1000
MASK_RATES = (0.05, 0.5)  # the --mask-rate range (trainer/masking.py)


def parse_unpad(text: str) -> bool | str:
    """``--unpad``'s value: ``"auto"``, or a true/false as ``parse_bool`` reads it."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return parse_bool(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected auto, true or false, got {text!r}") from None


@dataclass(frozen=True)
class TrainConfig:
    """Everything ``trainer/run.py`` takes besides the DeepSpeed JSON (saved with each checkpoint)."""

    # deploy/gpu.json, deploy/cpu.json, deploy/zero2.json, ... (trainer/dsconfig.py)
    ds_config: str = option(
        help="DeepSpeed JSON: precision, ZeRO, batch sizes, optimizer, schedule"
    )
    data: str = option(help="shard directory (manifest.json + shard-*.arrow); local or gs:// s3://")
    output_dir: str = option(
        help="checkpoints/, tensorboard/, metrics.jsonl and hf/ are written here"
    )
    # trainer/dsconfig.py with_precision: the JSON's bf16/fp16 sections, or an override.
    precision: str = option(
        "config",
        "config (as the DeepSpeed JSON says), fp32, bf16, or auto (bf16 where the device "
        "has it natively: CUDA with bf16, a CPU with AVX512-BF16 or AMX; else fp32)",
        choices=PRECISIONS,
    )
    # trainer/engine.py: auto runs a JSON without ZeRO, offload or fp16 on torch's engine.
    engine: str = option(
        "auto",
        "auto (torch's engine where the DeepSpeed JSON asks for no ZeRO partitioning, "
        "offload or fp16; else DeepSpeed's), torch, or deepspeed",
        choices=ENGINES,
    )
    # A preset name (tiny ... large; vocab_size and pad id taken from the shards' manifest)
    # or a Hugging Face style config.json (used as is, and checked against the manifest).
    # None: the config of --init-from-hf, which must then be given. No default: any size is
    # wrong on one kind of machine (base takes hours on a CPU to show anything, tiny wastes a
    # GPU), and a default that followed the machine would make one command train different
    # models on a laptop and a cluster.
    model: str | None = option(
        None,
        "preset (tiny mini small medium base large) or a config.json; required unless "
        "--init-from-hf gives the config",
    )
    # Optimizer steps (not micro-batches). None: 1000, or no step limit with --max-minutes.
    max_steps: int | None = option(
        None,
        "optimizer steps to train for, counting those before a resume "
        f"(default: {DEFAULT_MAX_STEPS}, or no limit with --max-minutes)",
    )
    # A time budget in minutes of training (trainer/schedule.py): WarmupDecayLR decays over
    # it and the run stops when it is spent. With --max-steps too, whichever comes first.
    max_minutes: float | None = option(
        None,
        "time budget: train this many minutes (counting those before a resume), "
        "WarmupDecayLR decaying over them; the first of this and --max-steps ends the run",
    )
    save_every: int = option(1000, "checkpoint every N steps (0: only at the end)")
    log_every: int = option(10, "metrics every N steps")
    # Read once per evaluation.
    eval_data: str | None = option(None, "held-out shard directory for MLM/NSP accuracy")
    eval_every: int = option(0, "evaluate every N steps (0: only at the end)")
    resume: str | None = option(
        None, "'auto' (latest checkpoint of --output-dir, if any) or a checkpoint path"
    )
    # trainer/checkpoint.py check_start: a start that would train beside later checkpoints
    # of --output-dir (running a stopped run's command again without --resume) is refused.
    overwrite: bool = option(
        False,
        "start as asked in an --output-dir holding later checkpoints: delete them (and, "
        "on a fresh start, the run's metrics, TensorBoard logs, plots and export)",
    )
    # E.g. phase 1 -> phase 2.
    init_from_hf: str | None = option(
        None, "initial weights from a Hugging Face BertForPreTraining directory"
    )
    dropout: float | None = option(
        None, "hidden and attention dropout (default: the model config's; 0 suits short runs)"
    )
    seed: int = option(42, "seed of data order, dynamic masks, dropout and initialisation")
    masking: str = option(
        "static",
        "static: the shards' masks; dynamic: re-mask each epoch (RoBERTa-style); unmasked "
        "MLM shards are always masked dynamically",
        choices=MASKING,
    )
    # trainer/masking.py. None: the manifest's masked_lm_prob (0.15 for unmasked MLM shards).
    mask_rate: float | None = option(
        None,
        "dynamic masking rate in [0.05, 0.5], prediction slots ceil(rate * max_seq_length) "
        "(needs --masking dynamic on shards with static masks; default: the manifest's rate, "
        "0.15 for unmasked MLM shards)",
    )
    mask_split: str = option(
        "0.8,0.1,0.1", "dynamic masking: shares of [MASK], kept and random-id predictions"
    )
    # None: as the shards were built (trainer/masking.py default_whole_word).
    whole_word_mask: bool | None = option(
        None,
        "dynamic masking of whole words (MLM shards: their continues_word groups, Chinese "
        "words included; NSP shards: ## pieces) [default: as the shards were built]",
    )
    # The same positions in every run, so runs trained at different rates compare.
    eval_mask_rate: float = option(
        0.15, "rate at which held-out MLM rows are masked (fixed seed; NSP rows: static masks)"
    )
    num_workers: int = option(2, "DataLoader worker processes per rank")
    shuffle_window: int = option(65536, "rows shuffled together within an epoch")
    skip_corrupt: bool = option(
        False, "skip and count shards that fail the start-up check instead of failing"
    )
    verify_shards: bool = option(
        False, "check every shard's sha256 at start-up (reads the whole dataset once)"
    )
    peak_tflops: float | None = option(
        None, "peak TFLOP/s of one device for MFU (default: known GPUs; none on CPU)"
    )
    # model/unpad.py; auto: resolve_unpad
    unpad: str = option(
        "auto",
        "run the encoder on real tokens only: true, false (the padded reference path), or "
        "auto: true on CPU, false on CUDA, where the padded path was the faster on an H200 "
        "(deploy/README.md)",
        type=parse_unpad,
        nargs="?",
        const=True,
        metavar="auto|true|false",
    )
    # trainer/compiling.py: what each mode compiles, and why it is off by default.
    compile: str = option(
        "off",
        "torch.compile: off, model (encoder, heads and loss) or step (model and the "
        "optimizer step)",
        choices=COMPILE_MODES,
    )
    compile_cache: str | None = option(
        None, "inductor's cache directory for --compile (default: OUTPUT_DIR/compile-cache)"
    )
    export_hf: bool = option(True, "write a Hugging Face export to OUTPUT_DIR/hf at the end")
    plots: bool = option(True, "write PNGs of the run's metrics to OUTPUT_DIR/plots at the end")
    record_samples: bool = option(
        False, "append each rank's trained row ids to OUTPUT_DIR/samples-rankN.txt"
    )
    # How the run talks, not what it does: pipeline/console.py.
    verbose: bool = option(
        False, "every log record on the console, as the log file has them (or BERT_VERBOSE=1)"
    )
    # trainer/signals.py
    signal_grace: float = option(
        30.0,
        "seconds a scheduler allows between SIGTERM and SIGKILL (SLURM KillWait, "
        "Kubernetes terminationGracePeriodSeconds): warn at the first checkpoint when a step "
        "plus a save take longer (0: no check)",
    )
    # trainer/failure.py. A dead or failing rank ends the run within seconds whatever this
    # says; this bounds a rank that is alive but stuck (a deadlock, a hung file system). It
    # must exceed the longest wait of a healthy run, where the ranks wait in a barrier for one
    # rank's lone work: rank 0 converting a checkpoint to universal on a resume with another
    # number of ranks, or writing the export. torch's default is 30 minutes.
    collective_timeout: float = option(
        600.0, "seconds a collective waits for a rank that is alive but does not come"
    )
    # Knowledge distillation (trainer/distillation.py): the --model is the student.
    # None: pretraining.
    teacher: str | None = option(
        None,
        "distil from this Hugging Face BertForPreTraining directory (the --model is the "
        "student; trainer/distillation.py)",
    )
    teacher_dtype: str = option(
        "auto",
        "teacher's precision: auto (bf16 on CUDA with bf16, else fp32), fp32, bf16",
        choices=TEACHER_DTYPES,
    )
    # DistilBERT's.
    distill_temperature: float = option(2.0, "temperature T of the soft targets")
    # DistilBERT's alpha_ce.
    distill_kl_weight: float = option(
        5.0, "weight of the soft-target KL (times T²) of the MLM and NSP heads"
    )
    # DistilBERT's alpha_mlm.
    distill_hard_weight: float = option(2.0, "weight of the MLM + NSP loss on the shards' labels")
    # DistilBERT's alpha_cos. None: 1.0 when the hidden sizes match, else 0.
    distill_cos_weight: float | None = option(
        None,
        "weight of the cosine loss between last hidden states (needs equal hidden sizes; "
        "default: 1 when they are equal, else 0)",
    )
    distill_nsp: bool = option(True, "distil NSP too (false: no NSP loss at all, as in DistilBERT)")
    # auto: teacher when the widths match and no --init-from-hf, else random.
    distill_init: str = option(
        "auto",
        "student init: teacher (embeddings, evenly spaced layers, heads; same "
        "widths), random, or auto (teacher when the widths match)",
        choices=DISTILL_INITS,
    )

    def __post_init__(self) -> None:
        """Raises ValueError naming the flag of the first invalid value."""
        strings = ("model", "eval_data", "resume", "teacher", "compile_cache")
        for name in ("ds_config", "data", "output_dir", *strings):
            value = getattr(self, name)
            if (value is not None or name in ("ds_config", "data", "output_dir")) and (
                not isinstance(value, str) or not value
            ):
                raise ValueError(f"--{_flag(name)} must be a non-empty string, got {value!r}")
        if self.model is None and self.init_from_hf is None:
            raise ValueError(
                "--model is required: a preset (tiny mini small medium base large; tiny "
                "trains in minutes on a CPU, base and large are GPU sizes) or a config.json "
                "(or --init-from-hf, whose config is used)"
            )
        positive = ("max_steps", "log_every", "shuffle_window")
        non_negative = ("save_every", "eval_every", "num_workers", "seed")
        for name in (*positive, *non_negative):
            value = getattr(self, name)
            if value is None and name == "max_steps":
                continue
            low = 1 if name in positive else 0
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"--{_flag(name)} must be an int >= {low}, got {value!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"--precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.engine not in ENGINES:
            raise ValueError(f"--engine must be one of {ENGINES}, got {self.engine!r}")
        if self.compile not in COMPILE_MODES:
            raise ValueError(f"--compile must be one of {COMPILE_MODES}, got {self.compile!r}")
        if self.masking not in MASKING:
            raise ValueError(f"--masking must be one of {MASKING}, got {self.masking!r}")
        self._check_masking()
        if self.peak_tflops is not None and not self.peak_tflops > 0:
            raise ValueError(f"--peak-tflops must be > 0, got {self.peak_tflops!r}")
        if self.dropout is not None and not (
            isinstance(self.dropout, (int, float)) and 0.0 <= self.dropout < 1.0
        ):
            raise ValueError(f"--dropout must be in [0, 1), got {self.dropout!r}")
        if not (isinstance(self.signal_grace, (int, float)) and self.signal_grace >= 0):
            raise ValueError(f"--signal-grace must be >= 0, got {self.signal_grace!r}")
        timeout = self.collective_timeout
        if isinstance(timeout, bool) or not (isinstance(timeout, (int, float)) and timeout > 0):
            raise ValueError(f"--collective-timeout must be > 0, got {timeout!r}")
        if self.max_minutes is not None and not (
            isinstance(self.max_minutes, (int, float)) and self.max_minutes > 0
        ):
            raise ValueError(f"--max-minutes must be > 0, got {self.max_minutes!r}")
        if self.unpad != "auto" and not isinstance(self.unpad, bool):
            raise ValueError(f"--unpad must be auto, true or false, got {self.unpad!r}")
        for name in (
            "skip_corrupt",
            "verify_shards",
            "export_hf",
            "plots",
            "record_samples",
            "distill_nsp",
            "overwrite",
            "verbose",
        ):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"--{_flag(name)} must be true or false")
        self._check_distillation()

    def _check_masking(self) -> None:
        """Raises ValueError naming the flag: a rate outside MASK_RATES, a bad split."""
        low, high = MASK_RATES
        for name in ("mask_rate", "eval_mask_rate"):
            rate = getattr(self, name)
            if rate is None:
                continue
            if (
                isinstance(rate, bool)
                or not isinstance(rate, (int, float))
                or not low <= rate <= high
            ):
                raise ValueError(f"--{_flag(name)} must be in [{low}, {high}], got {rate!r}")
        self.mask_shares  # noqa: B018 (parsing it is the check)
        if self.whole_word_mask is not None and not isinstance(self.whole_word_mask, bool):
            raise ValueError("--whole-word-mask must be true or false")

    def _check_distillation(self) -> None:
        """Raises ValueError naming the flag: a bad distillation value, or one without --teacher."""
        if self.teacher is None:
            given = [
                f"--{_flag(f.name)}"
                for f in dataclasses.fields(self)
                if f.name.startswith(("distill_", "teacher_"))
                and getattr(self, f.name) != f.default
            ]
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
    def mask_shares(self) -> tuple[float, float, float]:
        """--mask-split parsed: ``"0.8,0.1,0.1"`` -> ``(0.8, 0.1, 0.1)``, the shares of
        [MASK], kept and random-id predictions.

        Raises:
            ValueError: not three numbers in [0, 1] summing to 1 (naming --mask-split).
        """
        try:
            parts = tuple(float(x) for x in self.mask_split.split(","))
            if len(parts) != 3:
                raise ValueError
            MaskingConfig(mask_split=parts)  # the one rule for a split
        except ValueError:
            raise ValueError(
                f"--mask-split must be three shares MASK,KEEP,RANDOM in [0, 1] summing to 1 "
                f"(e.g. 0.8,0.1,0.1), got {self.mask_split!r}"
            ) from None
        return parts

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


def resolve_unpad(unpad: bool | str, device_type: str) -> bool:
    """Whether the encoder runs unpadded on ``device_type`` ("cpu", "cuda", ...).

    ``auto`` is unpadded on CPU (faster there, the more so the more padding) and padded
    elsewhere: on a GPU the padded step measured as fast or faster than both unpadded paths,
    whose nested-tensor one spends its time in the host's dispatch of jagged tensors
    (docs/results.md, "BERT-Base and -Large on an H200").
    """
    if unpad == "auto":
        return device_type == "cpu"
    return bool(unpad)


def _flag(name: str) -> str:
    return flag(name, "-")[2:]


EPILOG = """\
Ctrl-C (SIGINT) or SIGTERM: every rank finishes the optimizer step in progress and saves a
checkpoint, rank 0 prints the command that resumes the run (--resume auto), and the run exits
130 (SIGINT) or 143 (SIGTERM). A second signal, a second or more later, exits at once with
the same codes; a checkpoint being written then is never resumed (trainer/signals.py).

exit codes: 0 done; 2 bad arguments, configuration or data; 3 non-finite loss or weights;
130 / 143 stopped by SIGINT / SIGTERM (resume with --resume auto)."""


def build_parser() -> argparse.ArgumentParser:
    """``--config FILE`` and one flag per TrainConfig field, dashed (``--max-steps``)."""
    p = CommandParser(
        prog="trainer/run.py",
        description="Pretrain BERT (MLM + NSP) on pipeline shards with DeepSpeed.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # The deepspeed launcher passes it; we read LOCAL_RANK.
    p.add_argument("--local_rank", "--local-rank", type=int, help=argparse.SUPPRESS)
    add_options(p, TrainConfig, sep="-")
    return p


def parse_args(argv: Sequence[str]) -> TrainConfig:
    """Defaults < ``--config`` JSON < flags -> TrainConfig.

    Raises:
        ValueError: a bad ``--config`` file, a missing required option or an invalid value.
        SystemExit: an unknown flag (exit 2, one line naming the closest) or ``--help``.
    """
    config, _ = parse_options(build_parser(), TrainConfig, argv, sep="-")
    return config
