"""Which parameters fine-tuning trains, epoch by epoch, and at which learning rate.

A parameter's *depth*: 0 the embeddings, ``l + 1`` encoder layer ``l`` (0 the lowest,
L - 1 the top, L = ``num_hidden_layers``), L + 1 the head (the pooler counts as the head:
only the head reads it). Each control is a rule on depths:

- ``--freeze-layers N``: depths 0..N (the embeddings and encoder layers 0..N-1) never
  train; their values after training are bit-identical to --init's.
- ``--gradual-unfreeze`` (ULMFiT): epoch e (1, 2, ...) trains depths >= L + 2 - e: epoch 1
  the head only, epoch 2 also the top layer, ..., epoch L + 1 every layer and epoch L + 2
  the embeddings too. With --freeze-layers N, depths <= N stay frozen all the same.
- ``--layer-lr-decay D`` (ELECTRA's layer-wise decay): depth d learns at lr * D^(L + 1 - d):
  the head at lr, encoder layer l at lr * D^(L - l), the embeddings at lr * D^(L + 1).

A frozen parameter has ``requires_grad = False``; AdamW skips parameters without a gradient,
so neither its update nor its weight decay touches it.
"""

from __future__ import annotations

import re

from torch import nn

from finetune.config import FinetuneConfig

_LAYER = re.compile(r"(?:^|\.)encoder\.layer\.(\d+)\.")


def depth_of(name: str, num_layers: int) -> int:
    """Depth of a parameter name: ``"bert.embeddings.word_embeddings.weight" -> 0``,
    ``"bert.encoder.layer.3.output.dense.bias" -> 4``, ``"classifier.weight" -> L + 1``."""
    if name.startswith("embeddings.") or ".embeddings." in name:
        return 0
    layer = _LAYER.search(name)
    return int(layer[1]) + 1 if layer else num_layers + 1


def num_layers(model: nn.Module) -> int:
    """L, the encoder layers of a head model (model/heads.py)."""
    return model.config.bert.num_hidden_layers


def check_against_model(cfg: FinetuneConfig, model: nn.Module) -> None:
    """Raises ValueError when --freeze-layers asks for more layers than the model has."""
    if cfg.freeze_layers > num_layers(model):
        raise ValueError(
            f"--freeze-layers {cfg.freeze_layers} > the model's {num_layers(model)} encoder layers"
        )


def lowest_trainable_depth(cfg: FinetuneConfig, layers: int, epoch: int) -> int:
    """Depths >= this train in ``epoch`` (1-based); see the module doc.

    ``freeze_layers=1, layers=4``: 2; with ``gradual_unfreeze``, epoch 1: 5, epoch 2: 4.
    """
    lowest = cfg.freeze_layers + 1 if cfg.freeze_layers else 0
    if cfg.gradual_unfreeze:
        lowest = max(lowest, layers + 2 - epoch)
    return lowest


def set_trainable(model: nn.Module, lowest_depth: int) -> tuple[int, int]:
    """``requires_grad`` on the parameters of depth >= ``lowest_depth``, off on the rest.

    Returns:
        (trainable, total) parameter counts.
    """
    layers, trainable, total = num_layers(model), 0, 0
    for name, p in model.named_parameters():
        p.requires_grad_(depth_of(name, layers) >= lowest_depth)
        trainable += p.numel() if p.requires_grad else 0
        total += p.numel()
    return trainable, total


def param_groups(model: nn.Module, cfg: FinetuneConfig) -> list[dict]:
    """AdamW groups, one per (depth, decay or not), each with its ``lr`` and ``depth``.

    Weight decay ``cfg.weight_decay`` on weights, none on biases and LayerNorm (BERT's
    recipe); ``lr = cfg.lr * cfg.layer_lr_decay ** (L + 1 - depth)``. Frozen parameters
    are in their group too, so that unfreezing one needs no new optimizer.
    """
    layers, groups = num_layers(model), {}
    for name, p in model.named_parameters():
        depth = depth_of(name, layers)
        no_decay = name.endswith("bias") or "LayerNorm" in name
        group = groups.setdefault(
            (depth, no_decay),
            {
                "params": [],
                "depth": depth,
                "lr": cfg.lr * cfg.layer_lr_decay ** (layers + 1 - depth),
                "weight_decay": 0.0 if no_decay else cfg.weight_decay,
            },
        )
        group["params"].append(p)
    return [groups[key] for key in sorted(groups)]
