"""Fine-tuning heads on our encoder, with transformers' names and ``config.json`` keys.

``BertForSequenceClassification`` (the pooled ``[CLS]`` vector, dropout, a linear
``classifier``), ``BertForTokenClassification`` (every position's vector, dropout,
``classifier``; no pooler) and ``BertForQuestionAnswering`` (``qa_outputs``: a start
and an end logit per position; no pooler) have the parameter names, losses and
dropout placement of the ``transformers`` classes of the same names, so a directory
written by :meth:`save_hf` loads there with no missing or unexpected keys, and the
other way round::

    model = BertForSequenceClassification.from_hf("hf/base", labels=("neg", "pos"))
    model.save_hf("out/")   # transformers.BertForSequenceClassification.from_pretrained("out/")

Label count. ``BertConfig`` describes the encoder only (parity with the pretraining
``config.json``); the head's settings live in :class:`HeadConfig`, which wraps it and
is written into the same ``config.json`` under transformers' keys: ``architectures``,
``id2label`` / ``label2id`` (transformers derives ``num_labels`` from them) and
``classifier_dropout``. ``from_hf`` on a directory that already holds the same head
loads it with its labels; on any other BERT directory (our pretraining export, a
transformers ``BertForPreTraining`` / ``BertModel`` save, another head) it keeps the
``bert.*`` weights, drops the rest (the MLM/NSP heads) and initialises a new head,
normal(0, ``initializer_range``) weights and zero bias, for the ``labels`` given.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from . import hf
from .bert import IGNORE_INDEX, BertModel, init_weights, validate_inputs
from .config import BertConfig, write_text_atomic

# Re-exported: callers import them from here as well as from model.hf.
from .hf import CONFIG_NAME, read_hf_config

logger = logging.getLogger(__name__)

QA_LABELS = ("LABEL_0", "LABEL_1")  # transformers' default: start and end logits


@dataclass(frozen=True)
class HeadConfig:
    """A BERT encoder config plus the head's settings.

    Attributes:
        bert: the encoder's hyper-parameters.
        architecture: transformers' class name, e.g. "BertForSequenceClassification".
        labels: label names in id order (``id2label``); their number is ``num_labels``.
            Sequence classification with one label is regression (MSE loss).
        classifier_dropout: dropout before the classifier; None means
            ``bert.hidden_dropout_prob``, as in transformers.
    """

    bert: BertConfig
    architecture: str
    labels: tuple[str, ...] = QA_LABELS
    classifier_dropout: float | None = None

    def __post_init__(self) -> None:
        if self.architecture not in HEADS:
            raise ValueError(
                f"architecture must be one of {sorted(HEADS)}, got {self.architecture!r}"
            )
        labels = self.labels
        if not labels or not all(isinstance(x, str) for x in labels):
            raise ValueError(f"labels must be a non-empty tuple of str, got {labels!r}")
        if len(set(labels)) != len(labels):
            raise ValueError(f"labels must be distinct, got {labels!r}")
        if self.architecture == "BertForQuestionAnswering" and len(labels) != 2:
            raise ValueError(
                f"question answering has 2 outputs (start, end), got labels {labels!r}"
            )
        p = self.classifier_dropout
        if p is not None and not 0.0 <= p < 1.0:
            raise ValueError(f"classifier_dropout must be in [0, 1) or None, got {p!r}")

    @property
    def num_labels(self) -> int:
        return len(self.labels)

    @property
    def dropout_prob(self) -> float:
        p = self.classifier_dropout
        return self.bert.hidden_dropout_prob if p is None else p

    def to_dict(self) -> dict[str, Any]:
        """transformers' ``config.json`` for this head."""
        return {
            **self.bert.to_dict(),
            "architectures": [self.architecture],
            "classifier_dropout": self.classifier_dropout,
            "id2label": {str(i): label for i, label in enumerate(self.labels)},
            "label2id": {label: i for i, label in enumerate(self.labels)},
        }

    def to_json(self, path: str | os.PathLike) -> None:
        """Write ``config.json`` atomically (temp file, then rename)."""
        write_text_atomic(path, json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")


@dataclass
class ClassifierOutput:
    """``logits``: (B, num_labels) for sequences, (B, T, num_labels) for tokens; fp32 loss."""

    loss: torch.Tensor | None
    logits: torch.Tensor


@dataclass
class QuestionAnsweringOutput:
    """``start_logits`` / ``end_logits``: (B, T); ``loss`` the mean of the two CEs."""

    loss: torch.Tensor | None
    start_logits: torch.Tensor
    end_logits: torch.Tensor


class _BertWithHead(nn.Module):
    """Shared construction, initialisation and I/O of the heads."""

    architecture: ClassVar[str]
    add_pooling_layer: ClassVar[bool] = False
    # Run the encoder on real tokens only (model/unpad.py); see BertForQuestionAnswering.
    unpad: ClassVar[bool] = True

    def __init__(self, config: HeadConfig):
        super().__init__()
        if config.architecture != self.architecture:
            raise ValueError(f"{type(self).__name__} needs a {self.architecture} HeadConfig")
        self.config = config
        self.bert = BertModel(
            config.bert, add_pooling_layer=self.add_pooling_layer, unpad=self.unpad
        )
        self._build_head(config)
        self.apply(lambda m: init_weights(m, config.bert.initializer_range))

    def _build_head(self, config: HeadConfig) -> None:
        raise NotImplementedError

    def _encode(self, input_ids, segment_ids, attention_mask):
        validate_inputs(self.config.bert, input_ids, segment_ids, attention_mask)
        return self.bert(input_ids, segment_ids, attention_mask)

    def save_hf(self, directory: str | os.PathLike) -> Path:
        """Write ``config.json`` (with the head's keys) and ``model.safetensors``."""
        return hf.save_hf(self, directory)

    @classmethod
    def from_hf(cls, directory: str | os.PathLike, *, labels: tuple[str, ...] | None = None):
        """Load this head from ``directory``, or a new head on its encoder (see the module doc)."""
        return load_head_model(cls, directory, labels=labels)


class BertForSequenceClassification(_BertWithHead):
    """pooled ``[CLS]`` -> dropout -> ``classifier`` (H -> num_labels)."""

    architecture = "BertForSequenceClassification"
    add_pooling_layer = True

    def _build_head(self, config: HeadConfig) -> None:
        self.dropout = nn.Dropout(config.dropout_prob)
        self.classifier = nn.Linear(config.bert.hidden_size, config.num_labels)

    def forward(self, input_ids, segment_ids, attention_mask, labels=None) -> ClassifierOutput:
        """Args as ``BertForPreTraining.forward``; ``labels`` (B,): integer class ids, or
        float targets for regression (one label) / multi-label (float (B, num_labels)).

        Raises:
            ValueError: a bad input tensor (named).
        """
        _, pooled_output = self._encode(input_ids, segment_ids, attention_mask)
        logits = self.classifier(self.dropout(pooled_output))  # (B, num_labels)
        loss = None
        if labels is not None:
            loss = _sequence_loss(logits.float(), labels)
        return ClassifierOutput(loss, logits)


class BertForTokenClassification(_BertWithHead):
    """every position -> dropout -> ``classifier`` (H -> num_labels); no pooler."""

    architecture = "BertForTokenClassification"

    def _build_head(self, config: HeadConfig) -> None:
        self.dropout = nn.Dropout(config.dropout_prob)
        self.classifier = nn.Linear(config.bert.hidden_size, config.num_labels)

    def forward(self, input_ids, segment_ids, attention_mask, labels=None) -> ClassifierOutput:
        """``labels``: integer (B, T), -100 where no prediction is scored (padding,
        special tokens, word-piece continuations).

        Raises:
            ValueError: a bad input tensor (named).
        """
        sequence_output, _ = self._encode(input_ids, segment_ids, attention_mask)
        logits = self.classifier(self.dropout(sequence_output))  # (B, T, num_labels)
        loss = None
        if labels is not None:
            if labels.shape != input_ids.shape:
                raise ValueError(f"labels must have shape {tuple(input_ids.shape)}")
            loss = F.cross_entropy(
                logits.float().flatten(0, 1), labels.long().flatten(), ignore_index=IGNORE_INDEX
            )
        return ClassifierOutput(loss, logits)


class BertForQuestionAnswering(_BertWithHead):
    """every position -> ``qa_outputs`` (H -> 2): start and end logits; no dropout, no pooler."""

    architecture = "BertForQuestionAnswering"
    # The reference's span loss is a softmax over all T positions, padding included, so
    # its value depends on the padded encoder's outputs at padding positions: this head
    # keeps the padded path to stay numerically the reference (``self.bert.unpad = True``
    # trades that for speed; padding logits are then the bias alone).
    unpad = False

    def _build_head(self, config: HeadConfig) -> None:
        self.qa_outputs = nn.Linear(config.bert.hidden_size, config.num_labels)

    def forward(
        self, input_ids, segment_ids, attention_mask, start_positions=None, end_positions=None
    ) -> QuestionAnsweringOutput:
        """``start_positions`` / ``end_positions``: integer (B,), token indices of the answer
        span (0, ``[CLS]``, for "no answer"). Positions outside [0, T) are ignored in the
        loss, as in transformers (they are clamped to T, the ignore index).

        Raises:
            ValueError: a bad input tensor (named), or only one of the positions given.
        """
        sequence_output, _ = self._encode(input_ids, segment_ids, attention_mask)
        logits = self.qa_outputs(sequence_output)  # (B, T, 2)
        start_logits, end_logits = (x.squeeze(-1).contiguous() for x in logits.split(1, dim=-1))
        loss = None
        if (start_positions is None) != (end_positions is None):
            raise ValueError("pass both start_positions and end_positions, or neither")
        if start_positions is not None:
            ignored = start_logits.shape[1]
            losses = [
                F.cross_entropy(
                    x.float(), pos.long().clamp(0, ignored).view(-1), ignore_index=ignored
                )
                for x, pos in ((start_logits, start_positions), (end_logits, end_positions))
            ]
            loss = (losses[0] + losses[1]) / 2
        return QuestionAnsweringOutput(loss, start_logits, end_logits)


HEADS: dict[str, type[_BertWithHead]] = {
    cls.architecture: cls
    for cls in (BertForSequenceClassification, BertForTokenClassification, BertForQuestionAnswering)
}


def _sequence_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """transformers' rule: one label -> MSE; integer labels -> CE; float labels -> BCE."""
    if logits.shape[-1] == 1:
        return F.mse_loss(logits.squeeze(-1), labels.float().view(-1))
    if not labels.dtype.is_floating_point:
        return F.cross_entropy(logits, labels.long().view(-1))
    if labels.shape != logits.shape:
        raise ValueError(f"multi-label targets must have shape {tuple(logits.shape)}")
    return F.binary_cross_entropy_with_logits(logits, labels)


def labels_in(head: dict[str, Any], path: Path) -> tuple[str, ...] | None:
    """The label names a head's config.json (``head``: its own keys) records, or None."""
    id2label = head.get("id2label")
    if id2label:
        try:
            pairs = sorted((int(i), str(label)) for i, label in id2label.items())
        except (AttributeError, ValueError) as e:
            raise ValueError(f"{path}: id2label must map integer strings to names") from e
        if [i for i, _ in pairs] != list(range(len(pairs))):
            raise ValueError(f"{path}: id2label ids must be 0..{len(pairs) - 1}")
        return tuple(label for _, label in pairs)
    if "num_labels" in head:
        return tuple(f"LABEL_{i}" for i in range(int(head["num_labels"])))
    return None


def load_head_model(cls, directory, *, labels: tuple[str, ...] | None = None):
    """Load ``cls`` (a head class) from a Hugging Face directory; see the module doc.

    Args:
        labels: names of the new head's labels in id order. Required when the
            directory holds no ``cls`` head (except for question answering); when it
            does, must be None or equal to the labels saved there.

    Raises:
        FileNotFoundError: not a Hugging Face directory (see :func:`check_hf_directory`).
        ValueError: bad config, missing encoder weights, shapes that do not fit the
            config (key and both shapes named), or labels that contradict the saved head.
    """
    directory = Path(directory)
    bert, architecture, head = read_hf_config(directory)
    same = architecture == cls.architecture
    saved = labels_in(head, directory / CONFIG_NAME) if same else None
    if same and saved and labels is not None and tuple(labels) != saved:
        raise ValueError(
            f"{directory} holds a {cls.architecture} head with labels {list(saved)}, "
            f"not {list(labels)}"
        )
    labels = tuple(labels) if labels is not None else saved
    if labels is None:
        if cls is not BertForQuestionAnswering:
            raise ValueError(
                f"{directory} has no {cls.architecture} head ({architecture}); pass labels "
                f"for the new head"
            )
        labels = QA_LABELS
    dropout = head.get("classifier_dropout") if same else None
    model = cls(HeadConfig(bert, cls.architecture, labels, dropout))
    # The encoder always; the head only when the directory holds this head (else it is
    # new, and the file's other tensors, e.g. a pretraining export's MLM/NSP heads, are
    # dropped). A save without a pooler (token classification, QA) leaves it fresh.
    encoder = {k for k in model.state_dict() if k.startswith("bert.")}
    hf.load_weights(
        model,
        directory / hf.WEIGHTS_NAME,
        keys=None if same else encoder,
        drop_unused=True,
        optional=("bert.pooler.",),
    )
    if not same:
        new = sorted(set(model.state_dict()) - encoder)
        logger.info("new head initialised (normal(0, initializer_range), zero bias): %s", new)
    return model
