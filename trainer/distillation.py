"""Knowledge distillation on the pretraining shards: DistilBERT's loss, with a frozen teacher.

    python trainer/run.py --ds-config deploy/cpu.json --data shards/ --model tiny \\
        --teacher runs/mini/hf --output-dir runs/tiny-distilled --max-steps 2000
    deepspeed --num_gpus 8 trainer/run.py --ds-config deploy/zero3.json --data shards/ \\
        --model student.json --teacher hf/bert-base --output-dir runs/distil --max-steps 100000

``--teacher`` turns a pretraining run into a distillation run of its ``--model`` (the
student): the same streaming, checkpoints, exact resume, metrics, signals and time budget
(trainer/loop.py); only the loss differs. Per micro-batch::

    loss = kl_weight * T² * (KL_mlm + KL_nsp) + hard_weight * (CE_mlm + CE_nsp)
           + cos_weight * mean(1 - cos(h_student, h_teacher))

- ``KL_mlm``: KL(teacher || student) of the MLM distributions at temperature T, at the masked
  positions (both models run their MLM head only there), summed over the vocab and averaged
  over the positions, as DistilBERT's ``KLDivLoss(reduction="batchmean")``; T² keeps the
  gradient's scale independent of T (Hinton et al. 2015). ``KL_nsp``: the same for the NSP
  head over the rows. ``CE_*``: the usual losses on the shards' labels.
- ``--distill-nsp false`` drops both NSP terms (DistilBERT drops NSP; the student's pooler
  and NSP head then do not train, and its held-out NSP accuracy means nothing).
- The cosine term compares the last hidden states at every real token (DistilBERT's
  ``CosineEmbeddingLoss``). It needs equal hidden sizes: we add no learned projection (it
  would be a parameter that trains with the student yet is not part of it, so the export
  would leave it out); a nonzero ``--distill-cos-weight`` with different widths is an error.
- Defaults are DistilBERT's: T 2, weights 5 (KL), 2 (hard), 1 (cosine; 0 when widths differ).

Metrics: ``loss`` is this objective; ``mlm_loss`` / ``nsp_loss`` stay the hard losses, as in
pretraining, so runs compare; ``kl_loss`` (T² (KL_mlm + KL_nsp)) and ``cos_loss`` are added.
FLOPs and MFU count the teacher's forward pass too.

The teacher: loaded from a Hugging Face directory (ours or transformers'), in eval mode
(no dropout), ``requires_grad`` off, run under ``torch.no_grad``; DeepSpeed never sees it,
so it is in no optimizer, no checkpoint, and ZeRO-3 does not partition it (it is loaded
outside any ``zero.Init``; checked). bf16 on a CUDA device that has bf16, else fp32
(``--teacher-dtype`` overrides). Its identity (path and sha256 of ``model.safetensors``)
goes into every checkpoint; a resume with another teacher, or none, is refused.

Student initialisation (``--distill-init``): DistilBERT's, from the teacher when the widths
match: embeddings, the layers :func:`teacher_layers` picks, pooler and heads.

The teacher's vocabulary must be the shards': its config (vocab_size, [PAD] id, positions)
is checked as the student's is, and its vocab.txt, when the directory has one (our exports
do), token for token.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from model import BertConfig, BertForPreTraining, BertPreTrainingOutput, load_hf
from model.hf import CONFIG_NAME, WEIGHTS_NAME
from pipeline.core.vocab import parse_vocab
from pipeline.shards.shard_format import VOCAB_NAME

from .config import TrainConfig, resolve_unpad
from .metrics import model_flops
from .prepare import check_fit
from .shards import ShardSet

logger = logging.getLogger(__name__)
# Fields that must be equal to copy teacher weights into the student (all but the depth,
# dropout and init range).
INIT_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_attention_heads",
    "intermediate_size",
    "hidden_act",
    "max_position_embeddings",
    "type_vocab_size",
    "layer_norm_eps",
    "pad_token_id",
)
TEACHER_INPUTS = ("input_ids", "segment_ids", "attention_mask", "masked_lm_positions")


@dataclass(frozen=True)
class LossWeights:
    temperature: float
    kl: float
    hard: float
    cos: float
    nsp: bool


@dataclass
class DistillationOutput(BertPreTrainingOutput):
    """The student's output with ``loss`` the distillation objective (module docstring)."""

    kl_loss: torch.Tensor | None = None  # T² (KL_mlm + KL_nsp)
    cos_loss: torch.Tensor | None = None  # mean(1 - cos); None when its weight is 0


def soft_target_kl(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, keep: torch.Tensor, t: float
) -> torch.Tensor:
    """T² x the mean over the kept rows of KL(softmax(teacher / T) || softmax(student / T)).

    Args:
        student_logits, teacher_logits: float (..., K), e.g. MLM (B, P, V) or NSP (B, 2).
        keep: bool (...): the rows that count (masked positions with a target, labelled rows).
        t: the temperature T > 0.

    Example: student [0, 0], teacher [2 ln 3, 0], T 2 -> teacher (0.75, 0.25), student
    (0.5, 0.5): KL = 0.75 ln 1.5 + 0.25 ln 0.5 = 0.1308, times 4 = 0.5232. No kept row: 0.
    """
    # Every row is computed and the dropped ones zeroed (not selected with ``keep``):
    # boolean selection would wait for the device to size its result.
    student = F.log_softmax(student_logits.float() / t, -1)
    teacher = F.log_softmax(teacher_logits.float() / t, -1)
    per_row = F.kl_div(student, teacher, log_target=True, reduction="none").sum(-1)
    kl = torch.where(keep, per_row, 0.0).sum()
    return kl * (t * t) / keep.sum().clamp_min(1)


def cosine_loss(student_hidden: torch.Tensor, teacher_hidden: torch.Tensor) -> torch.Tensor:
    """Mean over rows of 1 - cos(student, teacher); both (N, H). Equal rows -> 0, orthogonal -> 1."""
    cos = F.cosine_similarity(student_hidden.float(), teacher_hidden.float(), dim=-1)
    return (1.0 - cos).mean()


def real_token_states(out: BertPreTrainingOutput, attention_mask: torch.Tensor) -> torch.Tensor:
    """(N, H) last hidden states of the real tokens, row-major (packed or padded output)."""
    if out.packing is not None:
        return out.hidden  # packed in row-major order already (model/unpad.py)
    return out.hidden[attention_mask.bool()]


def distillation_loss(
    student: BertPreTrainingOutput,
    teacher: BertPreTrainingOutput,
    batch: dict[str, torch.Tensor],
    w: LossWeights,
) -> DistillationOutput:
    """The student's output with ``loss`` the weighted objective (module docstring).

    Args:
        student: its output with hard losses (masked_lm_ids and next_sentence_label given).
        teacher: its output for the same inputs.
        batch: masked_lm_positions (B, P) (0: padding), next_sentence_label (B,) (-100: none),
            attention_mask (B, T).
    """
    positions = batch["masked_lm_positions"]
    if student.prediction_logits.shape == teacher.prediction_logits.shape:
        # Both heads ran on the same prediction slots (the same batch's real predictions,
        # or all B * P): compare their rows as they are.
        keep = positions.flatten().index_select(0, student.prediction_index) != 0
        kl = soft_target_kl(
            student.prediction_logits, teacher.prediction_logits, keep, w.temperature
        )
    else:  # one ran padded, the other unpadded: lay both out by slot
        kl = soft_target_kl(student.mlm_logits, teacher.mlm_logits, positions != 0, w.temperature)
    hard = student.mlm_loss
    if w.nsp:
        rows = batch["next_sentence_label"] >= 0
        kl = kl + soft_target_kl(student.nsp_logits, teacher.nsp_logits, rows, w.temperature)
        hard = hard + student.nsp_loss
    loss = w.kl * kl + w.hard * hard
    cos = None
    if w.cos:
        mask = batch["attention_mask"]
        cos = cosine_loss(real_token_states(student, mask), real_token_states(teacher, mask))
        loss = loss + w.cos * cos
    fields = {f.name: getattr(student, f.name) for f in dataclasses.fields(student)}
    return DistillationOutput(
        **{**fields, "loss": loss},
        kl_loss=kl.detach(),
        cos_loss=None if cos is None else cos.detach(),
    )


def teacher_layers(teacher_depth: int, student_depth: int) -> list[int]:
    """Teacher layers for the student's, evenly spaced with the first and last kept.

    ``(12, 6) -> [0, 2, 4, 7, 9, 11]`` (DistilBERT's choice), ``(4, 2) -> [0, 3]``,
    ``(4, 1) -> [0]``.

    Raises:
        ValueError: the student is deeper than the teacher.
    """
    if not 1 <= student_depth <= teacher_depth:
        raise ValueError(
            f"a student of {student_depth} layers cannot take them from a teacher of "
            f"{teacher_depth}"
        )
    if student_depth == 1:
        return [0]
    step = (teacher_depth - 1) / (student_depth - 1)
    return [int(i * step + 0.5) for i in range(student_depth)]


def init_from_teacher(student: BertForPreTraining, teacher: BertForPreTraining) -> list[int]:
    """Copy the teacher's embeddings, :func:`teacher_layers`, pooler and heads; returns the layers.

    Raises:
        ValueError: the widths differ (naming the fields), or the student is deeper.
    """
    differ = width_differences(teacher.config, student.config)
    if differ:
        raise ValueError(f"cannot initialise the student from the teacher: {differ}")
    layers = teacher_layers(teacher.config.num_hidden_layers, student.config.num_hidden_layers)
    source = teacher.state_dict()
    state = {}
    for key in student.state_dict():
        name = key
        if key.startswith("bert.encoder.layer."):
            index, rest = key[len("bert.encoder.layer.") :].split(".", 1)
            name = f"bert.encoder.layer.{layers[int(index)]}.{rest}"
        state[key] = source[name]
    student.load_state_dict(state, strict=True)
    return layers


def width_differences(teacher: BertConfig, student: BertConfig) -> str:
    """``"hidden_size 256 (teacher) != 128 (student), ..."`` over INIT_FIELDS; "" when equal."""
    return ", ".join(
        f"{name} {getattr(teacher, name)} (teacher) != {getattr(student, name)} (student)"
        for name in INIT_FIELDS
        if getattr(teacher, name) != getattr(student, name)
    )


def teacher_identity(directory: str | Path) -> dict[str, str]:
    """{"path": absolute directory, "sha256": of its model.safetensors}."""
    digest = hashlib.sha256()
    with open(Path(directory, WEIGHTS_NAME), "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    return {"path": str(Path(directory).resolve()), "sha256": digest.hexdigest()}


def check_resumed_teacher(saved: dict | None, current: dict | None, where: str) -> None:
    """Refuse to resume checkpoint ``where`` with another teacher than it was trained with.

    Raises:
        ValueError: naming both teachers and what to pass instead.
    """
    if saved == current or (saved and current and saved["sha256"] == current["sha256"]):
        if saved and current and saved["path"] != current["path"]:
            logger.info("teacher moved: %s -> %s (same sha256)", saved["path"], current["path"])
        return
    if current is None:
        raise ValueError(
            f"checkpoint {where} is a distillation run from the teacher {saved['path']} "
            f"(sha256 {saved['sha256'][:12]}…): resume it with --teacher {saved['path']}"
        )
    if saved is None:
        raise ValueError(
            f"checkpoint {where} was trained without a teacher: resuming it with --teacher "
            "would change its loss midway; to distil into its weights start a new run with "
            "--init-from-hf (python -m trainer.export makes the directory)"
        )
    raise ValueError(
        f"checkpoint {where} was distilled from {saved['path']} (sha256 "
        f"{saved['sha256'][:12]}…) but --teacher {current['path']} has sha256 "
        f"{current['sha256'][:12]}…: pass the checkpoint's teacher, or start a new run "
        "(another --output-dir)"
    )


def resolve_dtype(choice: str, device: torch.device) -> torch.dtype:
    """--teacher-dtype: auto is bf16 on a CUDA device with bf16 support, else fp32."""
    if choice == "bf16":
        return torch.bfloat16
    if choice == "auto" and device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


class Distiller:
    """The teacher and the loss of one run; called in place of the engine's forward."""

    def __init__(self, config: TrainConfig, student: BertConfig, shards: ShardSet):
        """Check the teacher against the shards and the student (no weights loaded yet).

        Raises:
            FileNotFoundError: no config.json / model.safetensors in --teacher.
            ValueError: another vocabulary than the shards', rows longer than its positions,
                a cosine weight with different widths, --distill-init teacher that cannot be.
        """
        self.directory = config.teacher
        for name in (CONFIG_NAME, WEIGHTS_NAME):
            if not Path(self.directory, name).is_file():
                raise FileNotFoundError(f"--teacher {self.directory}: no {name}")
        self.teacher_config = BertConfig.from_json(Path(self.directory, CONFIG_NAME))
        check_teacher_vocab(self.directory, self.teacher_config, shards)
        widths = width_differences(self.teacher_config, student)
        same_hidden = self.teacher_config.hidden_size == student.hidden_size
        cos = config.distill_cos_weight
        if cos is None:
            cos = 1.0 if same_hidden else 0.0
        if cos and not same_hidden:
            raise ValueError(
                f"--distill-cos-weight {cos} needs equal hidden sizes, but the teacher's is "
                f"{self.teacher_config.hidden_size} and the student's {student.hidden_size} "
                "(no projection is learned): pass --distill-cos-weight 0"
            )
        if config.distill_init == "teacher" and widths:
            raise ValueError(f"--distill-init teacher: {widths}")
        self.init = config.distill_init == "teacher" or (
            config.distill_init == "auto" and not widths and config.init_from_hf is None
        )
        if self.init:  # fail here rather than after the engine is built
            teacher_layers(self.teacher_config.num_hidden_layers, student.num_hidden_layers)
        self.weights = LossWeights(
            config.distill_temperature,
            config.distill_kl_weight,
            config.distill_hard_weight,
            cos,
            config.distill_nsp,
        )
        self.identity = teacher_identity(self.directory)
        self.unpad, self.dtype_choice = config.unpad, config.teacher_dtype
        self.model: BertForPreTraining | None = None

    def prepare(self, student: BertForPreTraining, device: torch.device, *, fresh: bool) -> None:
        """Load the teacher (frozen, eval) onto ``device``; initialise a ``fresh`` student from
        it when --distill-init says so. Call before ``deepspeed.initialize``."""
        teacher = load_hf(self.directory).eval().requires_grad_(False)
        assert not any(hasattr(p, "ds_id") for p in teacher.parameters()), "ZeRO-3 partitioned"
        teacher.set_unpadded(resolve_unpad(self.unpad, device.type))
        how = "from the checkpoint"
        if fresh:
            how = "random init"
            if self.init:
                how = f"from teacher layers {init_from_teacher(student, teacher)}"
        dtype = resolve_dtype(self.dtype_choice, device)
        self.model = teacher.to(device=device, dtype=dtype)
        c, w = self.teacher_config, self.weights
        logger.info(
            "teacher %s (%d layers, hidden %d, sha256 %s…, %s on %s); student %s; loss: T %g, "
            "KL %g, hard %g, cosine %g, NSP %s",
            self.directory,
            c.num_hidden_layers,
            c.hidden_size,
            self.identity["sha256"][:12],
            str(dtype).removeprefix("torch."),
            device.type,
            how,
            w.temperature,
            w.kl,
            w.hard,
            w.cos,
            "on" if w.nsp else "off",
        )

    def __call__(self, engine, batch: dict[str, torch.Tensor]) -> DistillationOutput:
        """The student's forward through ``engine`` and the teacher's on the same batch."""
        with torch.no_grad():
            teacher = self.model(*(batch[k] for k in TEACHER_INPUTS))
        student = engine(**batch)
        return distillation_loss(student, teacher, batch, self.weights)

    def forward_flops(self, batch: dict[str, torch.Tensor]) -> float:
        """FLOPs of the teacher's forward pass (a third of model_flops' forward + backward)."""
        predictions = int((batch["masked_lm_positions"] != 0).sum())
        return model_flops(self.teacher_config, batch["attention_mask"], predictions) / 3.0


def check_teacher_vocab(directory: str, cfg: BertConfig, shards: ShardSet) -> None:
    """The teacher reads the shards: vocab size, [PAD] id, positions; vocab.txt if it has one.

    Raises:
        ValueError: naming --teacher, the file and the first difference.
    """
    try:
        check_fit(cfg, shards.manifest)
    except ValueError as err:
        raise ValueError(f"--teacher {directory}: {err}") from err
    path = Path(directory, VOCAB_NAME)
    if not path.is_file():
        logger.warning(
            "--teacher %s has no %s: only its vocab size and [PAD] id were checked against "
            "the shards'",
            directory,
            VOCAB_NAME,
        )
        return
    name = shards.manifest["vocab"]["file"]
    ours = parse_vocab(shards.read_text(name), f"{shards.directory}/{name}")
    theirs = parse_vocab(path.read_text(encoding="utf-8"), str(path))
    if theirs != ours:
        differ = [i for i, (a, b) in enumerate(zip(theirs, ours, strict=False)) if a != b]
        where = (
            f"token {differ[0]} is {theirs[differ[0]]!r} there and {ours[differ[0]]!r}"
            if differ
            else f"it has {len(theirs)} tokens and the shards' {len(ours)}"
        )
        raise ValueError(
            f"--teacher {directory}: its {VOCAB_NAME} is not the shards' vocabulary: {where} "
            f"in {shards.directory}/{name}; distil on shards built with the teacher's vocab "
            "(pipeline build --vocab_file)"
        )
