"""Sentence embeddings from a BERT encoder: mean-pooled or ``[CLS]``, L2-normalized.

    emb = SentenceEmbedding(load_encoder("runs/stsb"), pooling="mean")
    emb(input_ids, segment_ids, attention_mask)   # (B, H) fp32, each row of norm 1

``finetune.embed.SentenceEncoder`` adds the directory's tokenizer (``encode(texts)``);
``python -m model.export_onnx DIR OUT --pooling mean`` exports this module, output
``sentence_embedding``. Cosine similarity of two sentences is then a dot product.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from .bert import BertForPreTraining, BertModel
from .heads import HEADS, load_head_model
from .hf import read_hf_config

POOLINGS = ("mean", "cls")


def load_encoder(directory: str | os.PathLike) -> BertModel:
    """The encoder (``bert``) of any Hugging Face BERT directory: a head or a pretraining export.

    Raises:
        FileNotFoundError: not a Hugging Face directory. ValueError: bad config or weights.
    """
    _, architecture, _ = read_hf_config(directory)
    if architecture in HEADS:
        return load_head_model(HEADS[architecture], directory).bert
    return BertForPreTraining.from_hf(directory, strict=False).bert


class SentenceEmbedding(nn.Module):
    """A ``BertModel`` and a pooling: ``"mean"`` averages the real tokens' vectors (the
    attention mask decides which), ``"cls"`` takes position 0's; then L2-normalization."""

    def __init__(self, bert: BertModel, pooling: str = "mean"):
        super().__init__()
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {list(POOLINGS)}, got {pooling!r}")
        self.bert, self.pooling, self.config = bert, pooling, bert.config

    def forward(self, input_ids, segment_ids, attention_mask) -> torch.Tensor:
        """int64 (B, T) inputs -> fp32 (B, H) unit vectors."""
        sequence_output, _ = self.bert(input_ids, segment_ids, attention_mask)  # (B, T, H)
        hidden = sequence_output.float()
        if self.pooling == "cls":
            pooled = hidden[:, 0]
        else:
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
            # where(): padding positions of the unpadded encoder hold no defined value.
            summed = torch.where(mask.bool(), hidden, 0.0).sum(1)  # (B, H)
            pooled = summed / mask.sum(1).clamp(min=1.0)
        return F.normalize(pooled, dim=-1)
