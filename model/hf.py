"""Hugging Face directories as state dicts: the one place that reads and writes them.

A directory holds ``config.json`` and ``model.safetensors`` with transformers' parameter
names (``bert.*``, ``cls.*``, ``classifier.*``, ``qa_outputs.*``); since our module
trees use the same names, export and import are a copy of the state dict. This module
deals in state dicts, configs and files and imports no model class: the classes call
in (``BertForPreTraining.save_hf`` / ``from_hf`` in model/bert.py, the heads' in
model/heads.py), passing themselves as an ``nn.Module``::

    save_hf(model, "export/")              # any of our models; model.config.to_json
    config, architecture, head = read_hf_config("export/")
    load_weights(model, "export/model.safetensors")   # checked, then copied in

What :func:`read_weights` accepts besides our own files (transformers' variants):
the decoder weight and bias, tied to the word embeddings and to
``cls.predictions.bias`` and so not stored by us (nor by transformers); buffers some
transformers versions store (``position_ids``, ``token_type_ids``: no learned state);
and a bare ``BertModel`` save, whose keys lack the ``bert.`` prefix.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from pipeline.shards.shard_writer import atomic_output

from .config import BertConfig

logger = logging.getLogger(__name__)

WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"
# config.json keys that belong to a fine-tuning head, not to BertConfig.
HEAD_KEYS = ("num_labels", "id2label", "label2id", "classifier_dropout", "problem_type")
# Tied in transformers' BertForPreTraining; we store neither and accept both.
_TIED_KEYS = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")
# Buffers some transformers versions store; they carry no learned state.
_BUFFER_SUFFIXES = ("embeddings.position_ids", "embeddings.token_type_ids")
# A bare BertModel save: these keys get the "bert." prefix.
_ENCODER_PREFIXES = ("embeddings.", "encoder.", "pooler.")


def save_hf(model: nn.Module, directory: str | os.PathLike) -> Path:
    """Write ``config.json`` (``model.config.to_json``) and ``model.safetensors`` (fp32).

    Each file is written to a temporary name and renamed into place (``atomic_output``),
    with the usual permissions (0644 under umask 022). The tied decoder weight is not
    a separate entry of our state dicts, so it is not stored.

    Args:
        model: one of our models; its ``config`` (``BertConfig`` or ``HeadConfig``)
            writes ``config.json``.
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


def check_hf_directory(directory: str | os.PathLike) -> Path:
    """``directory`` as a Path, if it has config.json and model.safetensors.

    Raises:
        FileNotFoundError: either file missing; for a DeepSpeed checkpoint directory,
            the message says how to convert it.
    """
    directory = Path(directory)
    missing = [n for n in (CONFIG_NAME, WEIGHTS_NAME) if not (directory / n).is_file()]
    if not missing:
        return directory
    deepspeed = (directory / "latest").is_file() or any(
        directory.glob("**/mp_rank_*_model_states.pt")
    )
    if deepspeed:
        raise FileNotFoundError(
            f"{directory} is a DeepSpeed checkpoint, not a Hugging Face directory; convert it "
            f"with `python -m trainer.export {directory} HF_DIR` and pass HF_DIR"
        )
    raise FileNotFoundError(
        f"{directory}: no {' or '.join(missing)} (expected a Hugging Face directory with "
        f"{CONFIG_NAME} and {WEIGHTS_NAME}, e.g. from save_hf or `python -m trainer.export`)"
    )


def read_hf_config(directory: str | os.PathLike) -> tuple[BertConfig, str | None, dict[str, Any]]:
    """Split a ``config.json`` into the encoder's config, the architecture and the head's keys.

    Returns:
        ``(bert, architecture, head)``: ``architecture`` is the first of
        ``architectures`` (e.g. "BertForPreTraining"), None when absent; ``head`` holds
        the :data:`HEAD_KEYS` present (``id2label``, ``classifier_dropout``, ...).

    Raises:
        FileNotFoundError: not a Hugging Face directory (see :func:`check_hf_directory`).
        ValueError: unreadable JSON or an invalid encoder field (the file is named).
    """
    path = check_hf_directory(directory) / CONFIG_NAME
    try:
        values = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read model config {path}: {e}") from e
    if not isinstance(values, dict):
        raise ValueError(f"{path}: expected a JSON object")
    head = {k: values.pop(k) for k in HEAD_KEYS if k in values}
    architectures = values.get("architectures") or [None]
    bert = BertConfig.from_dict(values, source=str(path), complete=True)
    return bert, architectures[0], head


def read_weights(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The tensors of a ``model.safetensors``, with transformers' variants normalised.

    Buffers are dropped, ``bert.`` is prepended to a bare ``BertModel``'s keys, and a
    stored decoder weight / bias stands in for a missing word embedding /
    ``cls.predictions.bias`` (then both decoder keys are dropped)::

        {"embeddings.word_embeddings.weight": w, "embeddings.position_ids": p}
        -> {"bert.embeddings.word_embeddings.weight": w}
    """
    state = {}
    for key, value in load_file(path).items():
        if key.endswith(_BUFFER_SUFFIXES):
            continue
        state["bert." + key if key.startswith(_ENCODER_PREFIXES) else key] = value
    tied = {
        "cls.predictions.bias": "cls.predictions.decoder.bias",
        "bert.embeddings.word_embeddings.weight": "cls.predictions.decoder.weight",
    }
    for key, decoder_key in tied.items():
        if decoder_key in state and key not in state:
            state[key] = state[decoder_key]
    for key in _TIED_KEYS:
        state.pop(key, None)
    return state


def load_weights(
    model: nn.Module,
    path: str | os.PathLike,
    *,
    keys: set[str] | None = None,
    drop_unused: bool = False,
    optional: tuple[str, ...] = (),
) -> None:
    """Check the tensors of ``path`` (see :func:`read_weights`) against ``model``; load them.

    Args:
        model: a module with transformers' state-dict names (one of ours).
        keys: the model's keys to load (default: all of them); the others keep
            their initialisation.
        drop_unused: tensors of the file outside ``keys`` are dropped (logged)
            instead of refused, e.g. the MLM/NSP heads of a pretraining export
            under a fine-tuning head.
        optional: key prefixes whose tensors may be missing from the file; those
            keep their fresh initialisation (logged). ``("",)`` makes every key
            optional.

    Raises:
        ValueError: tensors the model does not take (unless ``drop_unused``),
            missing ones (not ``optional``), or a shape that does not fit the model
            (the message names the file, the key and both shapes).
    """
    state = read_weights(path)
    expected = model.state_dict()
    wanted = set(expected) if keys is None else set(keys)
    unused = sorted(set(state) - wanted)
    if unused and not drop_unused:
        raise ValueError(f"{path}: unexpected keys {unused[:5]}")
    if unused:
        logger.info("%s: not used by %s: %s", path, type(model).__name__, _summary(unused))
    state = {k: v for k, v in state.items() if k in wanted}
    missing = sorted(wanted - set(state))
    required = [k for k in missing if not k.startswith(optional)]
    if required:
        raise ValueError(f"{path}: missing keys {required[:5]}")
    if missing:
        logger.warning("%s: no %s; freshly initialised", path, _summary(missing))
    for key, value in state.items():
        if value.shape != expected[key].shape:
            raise ValueError(
                f"{path}: {key} has shape {tuple(value.shape)}, "
                f"config.json implies {tuple(expected[key].shape)}"
            )
    model.load_state_dict(state, strict=False)


def _summary(keys: list[str]) -> str:
    """``["bert.pooler.dense.weight", "bert.pooler.dense.bias"]`` -> "2 tensors (bert.pooler.*)"."""
    prefixes = sorted({".".join(k.split(".")[:2]) + ".*" for k in keys})
    return f"{len(keys)} tensors ({', '.join(prefixes)})"
