"""BERT in PyTorch, equivalent to the reference, with Hugging Face import/export."""

from .bert import BertForPreTraining, BertModel, BertPreTrainingOutput, num_parameters
from .config import PRESETS, BertConfig
from .hf import load_hf, save_hf

__all__ = [
    "PRESETS",
    "BertConfig",
    "BertForPreTraining",
    "BertModel",
    "BertPreTrainingOutput",
    "load_hf",
    "num_parameters",
    "save_hf",
]
