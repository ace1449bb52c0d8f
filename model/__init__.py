"""BERT in PyTorch, equivalent to the reference, with Hugging Face import/export.

Modules: config (``BertConfig``, presets, ``config.json``), bert (the encoder and the
pretraining heads, ``load_hf``), unpad (the packed, variable-length attention path bert
runs on real tokens only), heads (fine-tuning heads), hf (Hugging Face directories as
state dicts), embed (sentence embeddings), export_onnx (a Hugging Face directory to ONNX:
``python -m model.export_onnx``). It imports nothing of trainer/.
"""

import importlib.util

if importlib.util.find_spec("torch") is None:  # the base install is the pipeline's only
    raise ModuleNotFoundError(
        "model/ needs torch, which the base install (the data pipeline's) leaves out: "
        "pip install 'bert-pipeline[train]' (in a clone: pip install -e '.[train]')",
        name="torch",
    )

from .bert import BertForPreTraining, BertModel, BertPreTrainingOutput, load_hf, num_parameters
from .config import PRESETS, BertConfig
from .heads import (
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    HeadConfig,
)
from .hf import save_hf

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
