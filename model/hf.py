"""Hugging Face format: ``save_hf`` / ``load_hf`` for :class:`BertForPreTraining`.

A directory holds ``config.json`` and ``model.safetensors`` with
``transformers.BertForPreTraining``'s parameter names; since our module tree uses
the same names, export and import are a copy of the state dict. The decoder
weight and bias are tied to the word embeddings and to ``cls.predictions.bias``,
so they are not stored (as transformers itself does)::

    save_hf(model, "export/")
    transformers.BertForPreTraining.from_pretrained("export/")   # no missing keys
    model = load_hf("export/")
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .bert import BertForPreTraining
from .config import BertConfig, atomic_output

WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"
# Tied in transformers' BertForPreTraining; we store neither and accept both.
_TIED_KEYS = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")
# Buffers some transformers versions store; they carry no learned state.
_BUFFER_KEYS = ("bert.embeddings.position_ids", "bert.embeddings.token_type_ids")


def save_hf(model: BertForPreTraining, directory: str | os.PathLike) -> Path:
    """Write ``config.json`` and ``model.safetensors`` (fp32) into ``directory``.

    Each file is written to a temporary name and renamed into place (``atomic_output``),
    with the usual permissions (0644 under umask 022).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {
        k: v.detach().to("cpu", torch.float32).contiguous() for k, v in model.state_dict().items()
    }
    with atomic_output(directory / WEIGHTS_NAME) as temp:
        save_file(state, temp, metadata={"format": "pt"})
    model.config.to_json(directory / CONFIG_NAME)
    return directory


def load_hf(directory: str | os.PathLike, *, strict: bool = True) -> BertForPreTraining:
    """Load a Hugging Face ``BertForPreTraining`` directory (ours or transformers').

    Args:
        strict: when False, missing pretraining-head weights (e.g. from a
            ``BertModel`` export) keep their fresh initialisation.

    Raises:
        FileNotFoundError: no config.json or model.safetensors in the directory.
        ValueError: unknown keys, or tensors whose shapes do not match the config
            (the message names the key and both shapes).
    """
    directory = Path(directory)
    for name in (CONFIG_NAME, WEIGHTS_NAME):
        if not (directory / name).is_file():
            raise FileNotFoundError(f"{directory}: no {name} (expected a Hugging Face directory)")
    config = BertConfig.from_json(directory / CONFIG_NAME)
    model = BertForPreTraining(config)
    state = load_file(directory / WEIGHTS_NAME)
    state = {_strip_prefix(k): v for k, v in state.items() if k not in _BUFFER_KEYS}
    if "cls.predictions.decoder.bias" in state and "cls.predictions.bias" not in state:
        state["cls.predictions.bias"] = state["cls.predictions.decoder.bias"]
    if "cls.predictions.decoder.weight" in state and (
        "bert.embeddings.word_embeddings.weight" not in state
    ):
        state["bert.embeddings.word_embeddings.weight"] = state["cls.predictions.decoder.weight"]
    for key in _TIED_KEYS:
        state.pop(key, None)

    expected = model.state_dict()
    unexpected = sorted(set(state) - set(expected))
    if unexpected:
        raise ValueError(f"{directory / WEIGHTS_NAME}: unexpected keys {unexpected[:5]}")
    missing = sorted(set(expected) - set(state))
    if missing and strict:
        raise ValueError(f"{directory / WEIGHTS_NAME}: missing keys {missing[:5]}")
    for key, value in state.items():
        if value.shape != expected[key].shape:
            raise ValueError(
                f"{directory / WEIGHTS_NAME}: {key} has shape {tuple(value.shape)}, "
                f"config.json implies {tuple(expected[key].shape)}"
            )
    model.load_state_dict(state, strict=False)
    return model


def _strip_prefix(key: str) -> str:
    # A bare BertModel export has no "bert." prefix.
    if key.startswith(("embeddings.", "encoder.", "pooler.")):
        return "bert." + key
    return key
