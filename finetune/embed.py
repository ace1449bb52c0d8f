"""Sentence embeddings for search from a fine-tuned (or pretrained) BERT directory.

    encoder = SentenceEncoder.from_hf("runs/stsb", pooling="mean")
    vectors = encoder.encode(["a query", "a document"])   # fp32 (2, H), rows of norm 1
    scores = vectors[0] @ vectors.T                       # cosine similarities

The texts are tokenized with the directory's own tokenizer (as fine-tuning did) and
embedded by ``model.embed.SentenceEmbedding``; ``python -m model.export_onnx DIR OUT
--pooling mean`` writes the same computation as ONNX (output ``sentence_embedding``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from finetune.data import collate, load_tokenizer
from model.embed import SentenceEmbedding, load_encoder


class SentenceEncoder:
    """A directory's tokenizer and its encoder with a pooling; see the module doc."""

    def __init__(self, embedding: SentenceEmbedding, tokenizer, max_seq_length: int = 128):
        self.embedding, self.tokenizer = embedding.eval(), tokenizer
        self.max_seq_length = min(max_seq_length, embedding.config.max_position_embeddings)

    @classmethod
    def from_hf(cls, directory: str | os.PathLike, *, pooling: str = "mean", max_seq_length=128):
        """Load the encoder and tokenizer of ``directory`` (any head, or a pretraining export).

        Raises:
            FileNotFoundError: no model or no tokenizer there. ValueError: a bad pooling.
        """
        embedding = SentenceEmbedding(load_encoder(directory), pooling)
        return cls(embedding, load_tokenizer(directory), max_seq_length)

    @torch.no_grad()
    def encode(self, texts: Sequence[str], batch_size: int = 32) -> torch.Tensor:
        """fp32 (len(texts), H) unit vectors, one per text (truncated to max_seq_length)."""
        if isinstance(texts, str):
            raise TypeError("encode takes a list of texts, not one str")
        self.tokenizer.enable_truncation(self.max_seq_length)
        pad_id = self.embedding.config.pad_token_id
        out = []
        for i in range(0, len(texts), batch_size):
            encodings = self.tokenizer.encode_batch(list(texts[i : i + batch_size]))
            features = [{"input_ids": e.ids, "segment_ids": e.type_ids} for e in encodings]
            batch = collate(features, pad_id)
            out.append(self.embedding(**batch))
        hidden = self.embedding.config.hidden_size
        return torch.cat(out) if out else torch.empty(0, hidden)
