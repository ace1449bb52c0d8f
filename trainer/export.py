"""Export a DeepSpeed checkpoint of trainer/run.py as a Hugging Face directory.

    python -m trainer.export runs/base hf/base                     # the run's latest checkpoint
    python -m trainer.export runs/base/checkpoints/step00001000 hf/base-1k

ZeRO partitions (stage 1, 2 or 3, any number of ranks) are consolidated into fp32 weights
with DeepSpeed's ``get_fp32_state_dict_from_zero_checkpoint`` (a stage-0 checkpoint holds
the full weights already). The result is ``config.json`` + ``model.safetensors`` that
``transformers.BertForPreTraining.from_pretrained`` loads (model/hf.py). Runs on CPU,
in one process, no GPU or launcher needed.

Exit codes: 0 written, 2 no checkpoint or a bad one.
"""

from __future__ import annotations

import argparse
import glob
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from model import BertConfig, BertForPreTraining, save_hf

from . import checkpoint

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
        module = torch.load(
            os.path.join(path, "mp_rank_00_model_states.pt"), map_location="cpu", weights_only=False
        )["module"]
        state = dict(module)
    return {k: v.float() for k, v in state.items()}


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


def export(path: str | os.PathLike, hf_dir: str | os.PathLike) -> Path:
    """Consolidate the checkpoint at ``path`` and write a Hugging Face directory; returns it."""
    model = load_model(path)
    out = save_hf(model, hf_dir)
    logger.info("exported %s to %s", path, out)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    parser = argparse.ArgumentParser(
        prog="python -m trainer.export",
        description="Consolidate a trainer checkpoint into a Hugging Face directory.",
    )
    parser.add_argument(
        "checkpoint", help="a run's output dir, its checkpoints/ dir, or one checkpoint"
    )
    parser.add_argument("hf_dir", help="output directory (config.json + model.safetensors)")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        export(args.checkpoint, args.hf_dir)
    except (FileNotFoundError, ValueError) as err:
        logger.error("%s", err)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
