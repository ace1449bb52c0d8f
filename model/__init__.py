"""BERT in PyTorch, equivalent to the reference, with Hugging Face import/export."""

from .bert import BertForPreTraining, BertModel, BertPreTrainingOutput, num_parameters
from .config import PRESETS, BertConfig
from .heads import (
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    HeadConfig,
)
from .hf import load_hf, save_hf

__all__ = [
    "PRESETS",
    "BertConfig",
    "BertForPreTraining",
    "BertForQuestionAnswering",
    "BertForSequenceClassification",
    "BertForTokenClassification",
    "BertModel",
    "BertPreTrainingOutput",
    "HeadConfig",
    "load_hf",
    "num_parameters",
    "save_hf",
]
