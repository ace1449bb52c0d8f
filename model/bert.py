"""BERT with masked-LM and next-sentence-prediction heads, in PyTorch.

Numerically equivalent to the reference (Google's BERT, as ported by Hugging Face's
``BertForPreTraining``): post-LN encoder, learned absolute positions, exact-erf GELU,
tanh pooler over ``[CLS]``, MLM transform + decoder tied to the word embeddings.
Module and parameter names are Hugging Face's, so the state dicts map one to one.

Differences that do not change the numbers:
- the encoder runs unpadded (model/unpad.py): the batch's real tokens are packed
  into one (N, H) tensor for embeddings, every Linear, GELU and LayerNorm, and
  attention runs within each row (FlashAttention's variable-length kernel on GPU);
  ``unpad=False`` (constructor) or ``set_unpadded(False)`` keeps the padded path,
  attention through ``scaled_dot_product_attention`` with an additive key-padding mask;
- the MLM head runs only at the masked positions: hidden states are gathered
  before the vocab projection, so most positions are never projected.

Inputs: ``forward`` checks shapes and dtypes only. Value ranges (ids < vocab_size, ...)
are checked where the data enters, on the host: the trainer's ``collate``
(trainer/data.py), the fine-tuning reader (finetune/data.py) and
``python -m pipeline validate``. Checking them here would cost a device-to-host sync per
tensor and step (and graph breaks under ``torch.compile``); ``BERT_DEBUG_CHECKS=1`` in the
environment (or ``model.bert.DEBUG_CHECKS = True``) checks them here too, for code that
feeds the model from elsewhere. An id out of range otherwise fails in the embedding
(an ``IndexError`` on CPU, a device-side assert on CUDA).

Masked-LM targets come as ``masked_lm_positions`` / ``masked_lm_ids`` (B, P), as in
the shards. An entry is padding when its position is 0 (``[CLS]``, never a
prediction) or its id is -100; padding is excluded from the loss. Callers with
Hugging Face style dense ``labels`` (B, T) using -100 may pass those instead.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from . import hf
from .config import BertConfig
from .unpad import (
    PATHS,
    Packing,
    attention,
    attention_path,
    packed_attention,
    pad_rows,
    pad_to_bucket,
)

IGNORE_INDEX = -100
# Value-range checks of the inputs in forward: one host sync per tensor (module docstring).
DEBUG_CHECKS = os.environ.get("BERT_DEBUG_CHECKS", "0") not in ("", "0")


def _activation(name: str):
    if name == "gelu":
        return F.gelu  # exact erf form
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return lambda x: F.gelu(x, approximate="tanh")
    return F.relu


@dataclass
class BertPreTrainingOutput:
    """Outputs of :class:`BertForPreTraining`; losses are None without targets.

    The MLM head ran on ``prediction_logits`` (R, V): row r holds the logits of flat
    slot ``prediction_index[r]`` of the (B, P) ``masked_lm_positions``. Unpadded, the R
    rows are the real predictions only (padding slots cost nothing); padded, they are
    all B * P slots. ``mlm_logits`` (B, P, V) lays them out by slot when read (zeros at
    unpadded padding slots, which no loss counts); :meth:`prediction_targets` gives the
    matching ids. ``nsp_logits`` (B, 2); ``sequence_output`` (B, T, H);
    ``pooled_output`` (B, H). ``hidden`` is the encoder's output as it ran: packed
    (N, H) with its ``packing``, or (B, T, H) with ``packing`` None;
    ``sequence_output`` scatters it back to (B, T, H) only when read (training never
    reads it, nor ``mlm_logits``).
    """

    loss: torch.Tensor | None
    mlm_loss: torch.Tensor | None
    nsp_loss: torch.Tensor | None
    prediction_logits: torch.Tensor | None
    nsp_logits: torch.Tensor
    hidden: torch.Tensor
    pooled_output: torch.Tensor
    packing: Packing | None = None
    prediction_index: torch.Tensor | None = None  # (R,) flat slots of (B, P)
    prediction_shape: tuple[int, int] | None = None  # (B, P)

    @property
    def sequence_output(self) -> torch.Tensor:
        return self.packing.unpack(self.hidden) if self.packing is not None else self.hidden

    @functools.cached_property
    def mlm_logits(self) -> torch.Tensor | None:
        """(B, P, V) logits by prediction slot (zeros where the head did not run); built
        on first read (a B x P x V tensor), then kept."""
        if self.prediction_logits is None:
            return None
        logits, (b, p) = self.prediction_logits, self.prediction_shape
        if logits.shape[0] == b * p:  # every slot ran, in order
            return logits.unflatten(0, (b, p))
        out = logits.new_zeros((b * p, logits.shape[-1]))
        return out.index_copy(0, self.prediction_index, logits).unflatten(0, (b, p))

    def prediction_targets(
        self, masked_lm_positions: torch.Tensor, masked_lm_ids: torch.Tensor
    ) -> torch.Tensor:
        """(R,) the target id of each row of ``prediction_logits``; -100 at padding slots."""
        ids = masked_lm_ids.long().masked_fill(masked_lm_positions == 0, IGNORE_INDEX)
        return ids.flatten().index_select(0, self.prediction_index)


class BertEmbeddings(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(
            config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id
        )
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self, input_ids: torch.Tensor, segment_ids: torch.Tensor, packing: Packing | None = None
    ) -> torch.Tensor:
        """(B, T) ids -> (B, T, H); with ``packing``, the real tokens only -> (N, H)."""
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        if packing is not None:
            positions = packing.index % packing.width  # (N,) original positions
            input_ids, segment_ids = packing.pack(input_ids), packing.pack(segment_ids)
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(segment_ids)
        x = x + self.position_embeddings(positions)  # broadcast over the batch when padded
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout_p = config.attention_probs_dropout_prob
        self.attention_path = "auto"  # packed input only: see model/unpad.py

    def forward(self, x: torch.Tensor, mask: torch.Tensor | Packing) -> torch.Tensor:
        """(B, T, H) with an additive (B, 1, 1, T) mask, or packed (N, H) with its Packing;
        packed rows past N (a row bucket, model/unpad.py) come out zero."""
        # One (H -> 3H) matmul instead of three: the parameters stay separate (and
        # named as in the reference); only this step's weights are concatenated.
        weight = torch.cat([self.query.weight, self.key.weight, self.value.weight])
        bias = torch.cat([self.query.bias, self.key.bias, self.value.bias])
        qkv = F.linear(x, weight, bias)
        dropout_p = self.dropout_p if self.training else 0.0
        if isinstance(mask, Packing):
            n = mask.num_tokens  # the real tokens; any rows after them are a bucket's zeros
            path = attention_path(qkv, dropout_p, self.attention_path)
            y = packed_attention(qkv[:n], mask, self.num_heads, dropout_p, path)
            return pad_rows(y, qkv.shape[0])
        b, t, h = x.shape
        qkv = qkv.view(b, t, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (B, A, T, D)
        y = attention(q, k, v, mask, dropout_p)  # mask: (B, 1, 1, T) additive
        return y.transpose(1, 2).reshape(b, t, h)


class BertSelfOutput(nn.Module):
    """Dense + dropout + residual + LayerNorm (post-LN); used after attention and FFN."""

    def __init__(self, config: BertConfig, in_features: int):
        super().__init__()
        self.dense = nn.Linear(in_features, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(x)) + residual)


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config, config.hidden_size)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | Packing) -> torch.Tensor:
        return self.output(self.self(x, mask), x)


class BertIntermediate(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = _activation(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(x))


class BertLayer(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertSelfOutput(config, config.intermediate_size)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | Packing) -> torch.Tensor:
        x = self.attention(x, mask)
        return self.output(self.intermediate(x), x)


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))
        self.gradient_checkpointing = False

    def forward(self, x: torch.Tensor, mask: torch.Tensor | Packing) -> torch.Tensor:
        for layer in self.layer:
            if self.gradient_checkpointing and self.training:
                x = checkpoint(layer, x, mask, use_reentrant=False)
            else:
                x = layer(x, mask)
        return x


class BertPooler(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, sequence_output: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(sequence_output[:, 0]))


class BertModel(nn.Module):
    """The encoder: embeddings, L post-LN layers, pooler.

    ``add_pooling_layer=False`` leaves the pooler out (no ``bert.pooler.*`` weights),
    as transformers' token-classification and question-answering models do.
    ``unpad`` runs the encoder on the real tokens only (model/unpad.py; the same numbers,
    less work); False keeps the padded reference path.
    """

    def __init__(self, config: BertConfig, *, add_pooling_layer: bool = True, unpad: bool = True):
        super().__init__()
        self.config = config
        self.unpad = unpad
        # Unpadded, a batch without padding runs the padded path too, unless this is set
        # (set_unpadded's ``every_batch``: what the trainer's data-parallel ranks need).
        self.unpad_every_batch = False
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None

    def forward(
        self, input_ids: torch.Tensor, segment_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Returns (sequence_output (B, T, H), pooled_output (B, H) or None without a pooler).

        Unpadded, sequence_output is 0 at padding positions (padded, it holds values
        that no real token depends on).
        """
        hidden, packing = self.encode(input_ids, segment_ids, attention_mask)
        pooled = self.pool(hidden, packing)
        return (packing.unpack(hidden) if packing is not None else hidden), pooled

    def encode(
        self,
        input_ids: torch.Tensor,
        segment_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        predicted: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, Packing | None]:
        """Hidden states: packed (N, H) with their Packing, or (B, T, H) and None.

        ``predicted`` (B, P) bool marks real MLM predictions: the Packing then indexes
        them too (``prediction_index``). The padded path runs when ``unpad`` is off,
        when the batch has no padding (unless ``unpad_every_batch``), and when a row has
        no real token at all. Any padding is worth removing, a little of it too: the
        Linears, the GELU and the LayerNorms then run on real tokens only
        (bench/model_speed.py prints unpadded against padded: ``--lengths google`` for
        nearly full rows, ``--lengths docstrings`` for the main job's); on CUDA the varlen
        and jagged kernels need no grid at all.
        """
        if self.unpad:
            packing = Packing.from_mask(attention_mask, predicted)
            padding = packing.num_tokens < packing.batch * packing.width
            if (padding or self.unpad_every_batch) and packing.min_seqlen > 0:
                x = self.embeddings(input_ids, segment_ids, packing)  # (N, H)
                x = self.encoder(pad_to_bucket(x, x), packing)
                return x[: packing.num_tokens], packing
        x = self.embeddings(input_ids, segment_ids)
        # Additive key-padding mask (B, 1, 1, T): 0 where attended, the dtype's
        # minimum where padding, as the reference does (a fully padded row stays finite).
        keep = attention_mask[:, None, None, :].to(x.dtype)
        mask = (1.0 - keep) * torch.finfo(x.dtype).min
        return self.encoder(x, mask), None

    def pool(self, hidden: torch.Tensor, packing: Packing | None) -> torch.Tensor | None:
        """The pooler over each row's [CLS] (its first real token when packed)."""
        if self.pooler is None:
            return None
        if packing is None:
            return self.pooler(hidden)
        return torch.tanh(self.pooler.dense(hidden[packing.cu_seqlens[:-1].long()]))


class BertPredictionHeadTransform(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = _activation(config.hidden_act)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.act(self.dense(x)))


class BertLMPredictionHead(nn.Module):
    """Transform, then the decoder tied to the word embeddings, plus its own bias."""

    def __init__(self, config: BertConfig, word_embeddings: nn.Embedding):
        super().__init__()
        self.transform = BertPredictionHeadTransform(config)
        self.word_embeddings = [word_embeddings]  # a list, so it is not registered twice
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.transform(x), self.word_embeddings[0].weight, self.bias)


class BertPreTrainingHeads(nn.Module):
    def __init__(self, config: BertConfig, word_embeddings: nn.Embedding):
        super().__init__()
        self.predictions = BertLMPredictionHead(config, word_embeddings)
        self.seq_relationship = nn.Linear(config.hidden_size, 2)


class BertForPreTraining(nn.Module):
    """BERT with the MLM and NSP pretraining heads.

    Example::

        model = BertForPreTraining(BertConfig.preset("tiny"))
        out = model(input_ids, segment_ids, attention_mask,
                    masked_lm_positions, masked_lm_ids, next_sentence_label)
        out.loss.backward()
    """

    def __init__(self, config: BertConfig, *, unpad: bool = True):
        super().__init__()
        self.config = config
        self.bert = BertModel(config, unpad=unpad)
        self.cls = BertPreTrainingHeads(config, self.bert.embeddings.word_embeddings)
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        init_weights(module, self.config.initializer_range)

    def save_hf(self, directory: str | os.PathLike) -> Path:
        """Write ``config.json`` and ``model.safetensors`` (see :func:`model.hf.save_hf`).

        ``transformers.BertForPreTraining.from_pretrained(directory)`` loads it with no
        missing keys (the tied decoder weight is not stored, as transformers does).
        """
        return hf.save_hf(self, directory)

    @classmethod
    def from_hf(cls, directory: str | os.PathLike, *, strict: bool = True) -> BertForPreTraining:
        """Load a Hugging Face ``BertForPreTraining`` directory (ours or transformers').

        Args:
            strict: when False, weights missing from the file (e.g. the pretraining
                heads of a ``BertModel`` save) keep their fresh initialisation.

        Raises:
            FileNotFoundError: no config.json or model.safetensors in the directory
                (see :func:`model.hf.check_hf_directory`).
            ValueError: unknown or missing keys, or tensors whose shapes do not match
                the config (the message names the key and both shapes).
        """
        config, _, _ = hf.read_hf_config(directory)
        model = cls(config)
        hf.load_weights(model, Path(directory, hf.WEIGHTS_NAME), optional=() if strict else ("",))
        return model

    def set_gradient_checkpointing(self, enabled: bool = True) -> None:
        """Recompute each layer's activations in backward (less memory; each layer's
        forward runs twice)."""
        self.bert.encoder.gradient_checkpointing = enabled

    def set_unpadded(
        self, enabled: bool = True, *, attention_path: str = "auto", every_batch: bool = False
    ) -> None:
        """Run the encoder on real tokens only (default) or padded (see model/unpad.py);
        ``every_batch``: see :func:`set_unpadded`."""
        set_unpadded(self.bert, enabled, attention_path=attention_path, every_batch=every_batch)

    def forward(
        self,
        input_ids: torch.Tensor,
        segment_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        masked_lm_positions: torch.Tensor | None = None,
        masked_lm_ids: torch.Tensor | None = None,
        next_sentence_label: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
    ) -> BertPreTrainingOutput:
        """Run the encoder and both heads.

        Args:
            input_ids: integer (B, T), ids < vocab_size, T <= max_position_embeddings.
            segment_ids: integer (B, T), ids < type_vocab_size.
            attention_mask: (B, T), 1 for real tokens and 0 for padding.
            masked_lm_positions: integer (B, P), indices into T; 0 marks padding.
            masked_lm_ids: integer (B, P), original ids at those positions; -100 marks padding.
            next_sentence_label: integer (B,), 1 when segment B is random; -100: no NSP target
                (an MLM-only row), left out of the NSP loss (0 when no row has one).
            labels: integer (B, T), HF style: the original id at masked positions, -100
                elsewhere. An alternative to masked_lm_positions / masked_lm_ids.

        Raises:
            ValueError: names the tensor with a bad shape or dtype (or value range, with
                ``DEBUG_CHECKS``; see the module docstring).
        """
        self._validate(input_ids, segment_ids, attention_mask)
        if labels is not None:
            if masked_lm_positions is not None:
                raise ValueError("pass either labels or masked_lm_positions/masked_lm_ids")
            _check_same_shape("labels", labels, input_ids)
            masked_lm_positions, masked_lm_ids = dense_labels_to_positions(labels)
        predicted = None if masked_lm_positions is None else masked_lm_positions != 0
        hidden, packing = self.bert.encode(input_ids, segment_ids, attention_mask, predicted)
        pooled_output = self.bert.pool(hidden, packing)
        nsp_logits = self.cls.seq_relationship(pooled_output)

        prediction_logits = index = shape = mlm_loss = nsp_loss = loss = None
        if masked_lm_positions is not None:
            self._validate_positions(
                masked_lm_positions, masked_lm_ids, input_ids.shape[1], self.config.vocab_size
            )
            shape = tuple(masked_lm_positions.shape)
            if packing is not None:  # the real predictions only, straight from the packed rows
                index = packing.prediction_index
                rows = packing.rows_of(masked_lm_positions).flatten()[index]  # (M,)
                # A row bucket on CPU in bf16 (model/unpad.py): extra rows read token 0
                # and their logits are dropped below.
                rows = pad_to_bucket(rows, hidden, floor=16)
                gathered = hidden[rows]  # (M, H)
            else:
                index = torch.arange(shape[0] * shape[1], device=masked_lm_positions.device)
                positions = masked_lm_positions.long()[..., None].expand(-1, -1, hidden.shape[-1])
                gathered = hidden.gather(1, positions).flatten(0, 1)  # (B * P, H)
            prediction_logits = self.cls.predictions(gathered)  # (R, V)
            if packing is not None:
                prediction_logits = prediction_logits[: index.shape[0]]
            if masked_lm_ids is not None:
                targets = masked_lm_ids.long().masked_fill(masked_lm_positions == 0, IGNORE_INDEX)
                mlm_loss = F.cross_entropy(
                    prediction_logits.float(),
                    targets.flatten().index_select(0, index),
                    ignore_index=IGNORE_INDEX,
                )
        if next_sentence_label is not None:
            if next_sentence_label.shape != input_ids.shape[:1]:
                raise ValueError(
                    f"next_sentence_label must have shape {tuple(input_ids.shape[:1])}, "
                    f"got {tuple(next_sentence_label.shape)}"
                )
            # The mean over labelled rows (-100: none, as on MLM-only shards), 0 without any:
            # torch's mean would be 0/0. With every row labelled it is torch's mean (bitwise on CPU).
            labelled = (next_sentence_label != IGNORE_INDEX).sum().clamp(min=1)
            nsp_loss = (
                F.cross_entropy(nsp_logits.float(), next_sentence_label.long(), reduction="sum")
                / labelled
            )
        if mlm_loss is not None or nsp_loss is not None:
            loss = sum(x for x in (mlm_loss, nsp_loss) if x is not None)
        return BertPreTrainingOutput(
            loss,
            mlm_loss,
            nsp_loss,
            prediction_logits,
            nsp_logits,
            hidden,
            pooled_output,
            packing,
            index,
            shape,
        )

    def _validate(self, input_ids, segment_ids, attention_mask) -> None:
        validate_inputs(self.config, input_ids, segment_ids, attention_mask)

    @staticmethod
    def _validate_positions(positions, ids, seq_len: int, vocab_size: int) -> None:
        if positions.dtype.is_floating_point or positions.dim() != 2:
            raise ValueError(
                f"masked_lm_positions must be an integer (batch, P) tensor, "
                f"got {positions.dtype} {tuple(positions.shape)}"
            )
        if ids is not None:
            _check_same_shape("masked_lm_ids", ids, positions)
        if DEBUG_CHECKS:
            _check_range("masked_lm_positions", positions, seq_len)
            if ids is not None:
                _check_range("masked_lm_ids", ids.masked_fill(ids == IGNORE_INDEX, 0), vocab_size)


def load_hf(directory: str | os.PathLike, *, strict: bool = True) -> BertForPreTraining:
    """:meth:`BertForPreTraining.from_hf` as a function (``from model import load_hf``)."""
    return BertForPreTraining.from_hf(directory, strict=strict)


def set_unpadded(
    bert: BertModel, enabled: bool, *, attention_path: str = "auto", every_batch: bool = False
) -> None:
    """Switch ``bert`` between the unpadded and the padded encoder; pick the attention path.

    ``every_batch``: unpadded, a batch without padding runs the unpadded path too, instead
    of the padded one. Then every batch runs the same code, which data-parallel training
    needs: ranks whose batches take different paths give DeepSpeed's ZeRO hooks another
    order of parameters. Seen on two CPU ranks: compiled, ZeRO-2 summed one
    parameter's gradient with another's (its buckets follow each rank's backward order);
    eager, ZeRO-3 waited forever on its parameter gathers. With ``every_batch`` both
    train as one rank does (docs/results.md).

    Raises:
        ValueError: an unknown attention path.
    """
    if attention_path not in PATHS:
        raise ValueError(f"attention_path must be one of {PATHS}, got {attention_path!r}")
    bert.unpad = enabled
    bert.unpad_every_batch = every_batch
    for layer in bert.encoder.layer:
        layer.attention.self.attention_path = attention_path


def init_weights(module: nn.Module, std: float) -> None:
    """The reference's initialisation of one module (use with ``model.apply``).

    Linear and embedding weights normal(0, ``std``), biases zero, the padding
    embedding row zero, LayerNorm weight one and bias zero, MLM output bias zero.
    """
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, 0.0, std)
        nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, 0.0, std)
        if module.padding_idx is not None:
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)
    elif isinstance(module, BertLMPredictionHead):
        nn.init.zeros_(module.bias)


def validate_inputs(
    cfg: BertConfig,
    input_ids: torch.Tensor,
    segment_ids: torch.Tensor,
    attention_mask: torch.Tensor,
) -> None:
    """Check the encoder's inputs against ``cfg`` (shapes as in ``BertForPreTraining.forward``):
    shapes and dtypes, and value ranges only with ``DEBUG_CHECKS`` (no host sync otherwise).

    Raises:
        ValueError: names the tensor with a bad shape, dtype or (DEBUG_CHECKS) value range.
    """
    for name, t in (("input_ids", input_ids), ("segment_ids", segment_ids)):
        if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
            raise ValueError(f"{name} must be an integer tensor, got {t.dtype}")
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be 2-D (batch, seq), got shape {tuple(input_ids.shape)}")
    _check_same_shape("segment_ids", segment_ids, input_ids)
    _check_same_shape("attention_mask", attention_mask, input_ids)
    if input_ids.shape[1] > cfg.max_position_embeddings:
        raise ValueError(
            f"input_ids has sequence length {input_ids.shape[1]} > "
            f"max_position_embeddings={cfg.max_position_embeddings}"
        )
    if DEBUG_CHECKS:
        _check_range("input_ids", input_ids, cfg.vocab_size)
        _check_range("segment_ids", segment_ids, cfg.type_vocab_size)


def dense_labels_to_positions(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """HF-style labels (B, T) with -100 -> (positions, ids), each (B, P).

    P is the largest number of labelled positions in a row; shorter rows are
    padded with position 0 and id -100. Example: ``[[-100, 7, -100, 9]]`` ->
    ``([[1, 3]], [[7, 9]])``.
    """
    labelled = labels != IGNORE_INDEX
    width = max(int(labelled.sum(1).max()), 1) if labels.numel() else 1
    # Stable sort puts labelled positions first, each row in increasing order.
    order = torch.argsort((~labelled).to(torch.int8), dim=1, stable=True)[:, :width]
    keep = labelled.gather(1, order)
    positions = order.masked_fill(~keep, 0)
    ids = labels.gather(1, order).masked_fill(~keep, IGNORE_INDEX)
    return positions, ids


def _check_same_shape(name: str, t: torch.Tensor, ref: torch.Tensor) -> None:
    if t.shape != ref.shape:
        raise ValueError(f"{name} must have shape {tuple(ref.shape)}, got {tuple(t.shape)}")


def _check_range(name: str, t: torch.Tensor, upper: int) -> None:
    """Values in [0, upper): two host syncs (only with DEBUG_CHECKS)."""
    if t.numel() and (int(t.min()) < 0 or int(t.max()) >= upper):
        raise ValueError(
            f"{name} values must be in [0, {upper}), got min {int(t.min())} max {int(t.max())}"
        )


def num_parameters(model: nn.Module) -> int:
    """Distinct parameters (the tied decoder weight counted once)."""
    return sum(p.numel() for p in model.parameters())
