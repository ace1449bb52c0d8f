"""Export a DeepSpeed checkpoint of trainer/run.py as a Hugging Face directory.

    python -m trainer.export runs/base hf/base                     # the run's latest checkpoint
    python -m trainer.export runs/base/checkpoints/step00001000 hf/base-1k

ZeRO partitions (stage 1, 2 or 3, any number of ranks) are consolidated into fp32 weights
with DeepSpeed's ``get_fp32_state_dict_from_zero_checkpoint`` (a stage-0 checkpoint holds
the full weights already; in bf16 or fp16 the export takes its optimizer's fp32 master
weights, not the module's 16-bit copies of them). The result is ``config.json`` + ``model.safetensors`` that
``transformers.BertForPreTraining.from_pretrained`` loads (model/hf.py), plus the tokenizer
files of the shards the run trained on (trainer/hf_tokenizer.py: vocab.txt, tokenizer.json,
tokenizer_config.json, special_tokens_map.json), so ``transformers.pipeline("fill-mask",
model=HF_DIR)`` works as is. The shard directory is the ``data`` of the checkpoint's
train_config.json, or ``--vocab SHARD_DIR``; when it cannot be read (deleted, moved, a
relative path from another working directory) the model is exported without the tokenizer
and a warning says why. Runs on CPU, in one process, no GPU or launcher needed.

    python -m trainer.export runs/base hf/base --vocab gs://bucket/shards   # tokenizer from there

Exit codes: 0 written, 2 no checkpoint or a bad one, or a --vocab that cannot be used.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from model import BertConfig, BertForPreTraining, save_hf
from pipeline.options import CommandParser

from . import checkpoint, prepare
from .hf_tokenizer import TOKENIZER_FILES, Vocab, read_shard_vocab, save_tokenizer, shard_dir_of

logger = logging.getLogger(__name__)


def consolidated_state_dict(directory: str, tag: str) -> dict[str, torch.Tensor]:
    """fp32 weights of checkpoint ``directory/tag``, ZeRO partitions merged, on the CPU.

    Raises:
        FileNotFoundError: the checkpoint's files are missing.
    """
    path = os.path.join(directory, tag)
    if glob.glob(os.path.join(path, "*zero_pp_rank_*optim_states.pt")):
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        state = get_fp32_state_dict_from_zero_checkpoint(directory, tag=tag)
    else:  # ZeRO stage 0: the model states file holds every weight
        states = torch.load(
            os.path.join(path, "mp_rank_00_model_states.pt"), map_location="cpu", weights_only=False
        )
        state = {**states["module"], **master_weights(states, where=path)}
    return {k: v.float() for k, v in state.items()}


def master_weights(states: dict, *, where: str) -> dict[str, torch.Tensor]:
    """The fp32 master weights, by name, of a ZeRO stage-0 bf16/fp16 checkpoint's model
    states; {} in fp32. DeepSpeed's 16-bit optimizers keep them per parameter group, in the
    order of trainer/prepare.py's ``param_groups``: ``fp32_groups`` (one tensor per
    parameter, FP16_UnfusedOptimizer, torch's optimizers) or ``fp32_groups_flat`` (one flat
    tensor per group, FP16_Optimizer, DeepSpeed's fused ones).

    Raises:
        ValueError: the groups do not fit the module's parameters (names ``where``).
    """
    optimizer = states.get("optimizer")
    if not isinstance(optimizer, dict):
        return {}
    groups = optimizer.get("fp32_groups") or optimizer.get("fp32_groups_flat")
    if groups is None:
        return {}
    module = states["module"]
    names = [g for g in prepare.param_group_names(list(module)) if g]  # DeepSpeed drops empty ones
    if len(names) != len(groups):
        raise ValueError(f"{where}: {len(groups)} fp32 groups for {len(names)} parameter groups")
    out = {}
    for group_names, group in zip(names, groups, strict=True):
        if isinstance(group, torch.Tensor):  # flat: split by the module's shapes
            sizes = [module[n].numel() for n in group_names]
            group = group[: sum(sizes)].split(sizes)
        for name, tensor in zip(group_names, group, strict=True):
            if tensor.numel() != module[name].numel():
                raise ValueError(
                    f"{where}: fp32 master weight of {name} has {tensor.numel()} values, "
                    f"the module's {tuple(module[name].shape)}"
                )
            out[name] = tensor.detach().view(module[name].shape)
    return out


def load_model(path: str | os.PathLike) -> BertForPreTraining:
    """Our model with the weights of a checkpoint (see :func:`checkpoint.resolve` for ``path``).

    Raises:
        FileNotFoundError: no checkpoint at ``path``.
        ValueError: the checkpoint lacks config.json or its weights do not fit it.
    """
    directory, tag = checkpoint.resolve(path)
    config_path = Path(directory, tag, "config.json")
    if not config_path.is_file():
        raise ValueError(f"{config_path} is missing: not a checkpoint of trainer/run.py")
    model = BertForPreTraining(BertConfig.from_json(config_path))
    state = consolidated_state_dict(directory, tag)
    # DeepSpeed may list the tied decoder weight under its own name; ours has no such key.
    state = {k: v for k, v in state.items() if not k.startswith("cls.predictions.decoder.")}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(
            f"{directory}/{tag}: weights do not fit config.json "
            f"(missing {missing[:5]}, unexpected {unexpected[:5]})"
        )
    return model


def training_data(directory: str, tag: str) -> str:
    """The shard directory checkpoint ``directory/tag`` trained on (its train_config.json).

    Raises:
        FileNotFoundError: the checkpoint has no train_config.json.
        ValueError: train_config.json has no "data".
    """
    path = Path(directory, tag, "train_config.json")
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing, so the training data is unknown")
    data = json.loads(path.read_text(encoding="utf-8")).get("data")
    if not isinstance(data, str):
        raise ValueError(f"{path} has no 'data' entry naming the shard directory")
    return data


def _training_vocab(directory: str, tag: str) -> Vocab:
    data = training_data(directory, tag)
    try:
        return read_shard_vocab(data)
    except (OSError, ValueError) as err:  # ShardFormatError is a ValueError
        raise ValueError(f"cannot read the vocab of the training data {data}: {err}") from err


def _check_vocab_size(vocab: Vocab, vocab_size: int) -> None:
    if len(vocab.tokens) != vocab_size:
        raise ValueError(
            f"the vocab of {vocab.source} has {len(vocab.tokens)} tokens, "
            f"the model's vocab_size is {vocab_size}"
        )


def find_vocab(path: str | os.PathLike, vocab_size: int) -> Vocab | None:
    """The vocab of the shards checkpoint ``path`` trained on, or None with a warning saying why.

    Raises:
        FileNotFoundError: no checkpoint at ``path``.
    """
    directory, tag = checkpoint.resolve(path)
    try:
        vocab = _training_vocab(directory, tag)
        _check_vocab_size(vocab, vocab_size)
    except (OSError, ValueError) as err:
        logger.warning(
            "the export gets no tokenizer files (%s): %s; pass --vocab SHARD_DIR to add them",
            ", ".join(TOKENIZER_FILES),
            err,
        )
        return None
    return vocab


def export(
    path: str | os.PathLike, hf_dir: str | os.PathLike, *, vocab: str | os.PathLike | None = None
) -> Path:
    """Consolidate the checkpoint at ``path`` and write a Hugging Face directory; returns it.

    Args:
        path: a run's output dir, its checkpoints/ dir or one checkpoint (checkpoint.resolve).
        hf_dir: the local output directory.
        vocab: a shard directory (local or URI), or its vocab.txt, whose tokenizer goes into
            the export. None: the training data of the checkpoint's train_config.json, and if
            that cannot be read, no tokenizer files (logged as a warning).

    Raises:
        FileNotFoundError: no checkpoint at ``path``.
        ValueError: a bad checkpoint; or an explicit ``vocab`` that is not a readable shard
            vocab (ShardFormatError) or whose size is not the model's vocab_size.
        OSError: an explicit ``vocab`` cannot be read.
    """
    model = load_model(path)
    vocab_size = model.config.vocab_size
    if vocab is None:
        found = find_vocab(path, vocab_size)
    else:
        found = read_shard_vocab(shard_dir_of(os.fspath(vocab)))
        _check_vocab_size(found, vocab_size)
    out = save_hf(model, hf_dir)
    if found is not None:
        save_tokenizer(out, found, model_max_length=model.config.max_position_embeddings)
    logger.info(
        "exported %s to %s (%s)",
        path,
        out,
        f"tokenizer of {found.source}" if found else "no tokenizer",
    )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    parser = CommandParser(
        prog="python -m trainer.export",
        description="Consolidate a trainer checkpoint into a Hugging Face directory.",
    )
    parser.add_argument(
        "checkpoint", help="a run's output dir, its checkpoints/ dir, or one checkpoint"
    )
    parser.add_argument(
        "hf_dir", help="output directory (config.json, model.safetensors, tokenizer files)"
    )
    parser.add_argument(
        "--vocab",
        metavar="PATH",
        help="shard directory (or its vocab.txt; local or gs://, s3://) whose tokenizer to "
        "export (default: the training data in the checkpoint's train_config.json)",
    )
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        export(args.checkpoint, args.hf_dir, vocab=args.vocab)
    except (OSError, ValueError) as err:
        logger.error("%s", err)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
