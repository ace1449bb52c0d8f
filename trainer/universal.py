"""Resume on another number of ranks: a ZeRO checkpoint becomes a universal one, once.

A ZeRO (stage 1-3) checkpoint holds one optimizer partition per rank
(``zero_pp_rank_{r}_mp_rank_00_optim_states.pt``), cut for the world size it was saved on.
When ``--resume`` (``auto`` included) finds one saved on M ranks and the run has N != M,
global rank 0 converts it with DeepSpeed's ``deepspeed.checkpoint.ds_to_universal``
(one ``zero/PARAM/{fp32,exp_avg,exp_avg_sq}.pt`` per parameter, world-size free), the other
ranks wait, and every rank loads the result with ``checkpoint.load_universal`` set::

    checkpoints/step00001000/                 as saved on M ranks (left as it is)
    checkpoints/step00001000_universal/       the conversion, beside it, with our JSON files
    checkpoints/.step00001000_universal.partial/   only while converting

The converter writes into the ``.partial`` directory, which is renamed into place when it is
complete (atomic on POSIX file systems), so a run killed while converting leaves no
half-written universal checkpoint, and the next resume converts again. A later resume from
the same checkpoint, on any number of ranks, loads the existing conversion. A checkpoint
saved again under the same tag removes its stale conversion first (trainer/checkpoint.py).

The converter runs as a child process of rank 0 (its memory is freed when it ends; no
fork of a process holding a process group), its output goes to rank 0's log file. It reads
the whole optimizer state: BERT-Large's (4 GB) takes minutes, during which the other ranks
wait in an all-reduce, bounded by DeepSpeed's collective timeout (``DEEPSPEED_TIMEOUT``,
minutes, default 30).

Not converted: a checkpoint without ZeRO partitions (stage 0 saves the whole optimizer in
``mp_rank_00_model_states.pt``, which loads on any number of ranks), one saved on this
world size, and one that is universal already.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from . import distributed

logger = logging.getLogger(__name__)

SUFFIX = "_universal"
PARTIAL = ".partial"
# Our files, copied into the conversion: the resume checks and the export read them.
TRAINER_FILES = ("config.json", "train_config.json", "ds_config.json", "trainer_state.json")
# The converter's output is logged with this format (kept off the console: trainer/run.py).
OUTPUT_LOG = "ds_to_universal output:\n%s%s"


class ConversionError(RuntimeError):
    """DeepSpeed's converter failed; the message ends with the tail of its output."""


def is_universal(directory: str, tag: str) -> bool:
    """A universal checkpoint (ds_to_universal's output) has a ``zero/`` folder."""
    return Path(directory, tag, "zero").is_dir()


def saved_world_size(directory: str, tag: str) -> int | None:
    """The world size a ZeRO-partitioned checkpoint was saved on; None when it has no
    partitions (stage 0), is universal, or has no trainer_state.json to say."""
    path = Path(directory, tag)
    state = path / "trainer_state.json"
    if is_universal(directory, tag) or not state.is_file():
        return None
    if not any(path.glob("*zero_pp_rank_*_optim_states.pt")):
        return None
    return int(json.loads(state.read_text())["world_size"])


def universal_tag(tag: str) -> str:
    """``universal_tag("step00001000") -> "step00001000_universal"``."""
    return tag + SUFFIX


def for_world_size(
    directory: str, tag: str, world_size: int, *, is_main: bool, device: torch.device
) -> tuple[str, str]:
    """The checkpoint to load on ``world_size`` ranks: ``(directory, tag)`` itself, or its
    universal conversion (made by rank 0 when there is none yet). Every rank calls this.

    Raises:
        ValueError: the conversion failed (on every rank; rank 0's names the converter's
            last lines, the log file and the command to run by hand).
    """
    saved = saved_world_size(directory, tag)
    if saved is None or saved == world_size:
        return directory, tag
    target = universal_tag(tag)
    error = None
    if is_main:
        what = f"{directory}/{tag} (saved on {_ranks(saved)}) on {_ranks(world_size)}"
        if Path(directory, target).is_dir():
            logger.info("resuming %s from its universal conversion %s", what, target)
        else:
            logger.info("resuming %s: converting it to a universal checkpoint, %s", what, target)
            try:
                convert(directory, tag)
            except (ConversionError, OSError) as err:
                error = str(err)
    if distributed.any_rank(error is not None, device):  # also the other ranks' wait
        manual = (
            f"python -m deepspeed.checkpoint.ds_to_universal --input_folder {directory}/{tag} "
            f"--output_folder {directory}/{target}"
        )
        raise ValueError(
            f"--resume: {directory}/{tag} was saved on {_ranks(saved)} and this run has "
            f"{_ranks(world_size)}; converting it to a universal checkpoint failed"
            + (f": {error}" if error else " on rank 0 (its log says why)")
            + f". Resume on {_ranks(saved)}, or convert it by hand (`{manual}`) to see why"
        )
    return directory, target


def convert(directory: str, tag: str) -> Path:
    """Convert ``directory/tag`` into ``directory/tag_universal`` (atomically); returns it.

    Raises:
        ConversionError: the converter failed (nothing is left behind).
        OSError: from the file system.
    """
    target = Path(directory, universal_tag(tag))
    partial = Path(directory, "." + target.name + PARTIAL)
    shutil.rmtree(partial, ignore_errors=True)  # a conversion killed earlier
    # The converter writes 'latest_universal' beside its output folder: inside `partial`.
    staged = partial / target.name
    staged.parent.mkdir(parents=True)
    try:
        _run_converter(Path(directory, tag), staged)
        for name in TRAINER_FILES:
            if Path(directory, tag, name).is_file():
                shutil.copy2(Path(directory, tag, name), staged / name)
        os.rename(staged, target)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return target


def converter_command(source: Path, output: Path) -> list[str]:
    """DeepSpeed's converter, with as many worker processes as this rank has cores (<= 4)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    workers = str(max(1, min(4, cores or 1)))
    return [
        sys.executable,
        "-m",
        "deepspeed.checkpoint.ds_to_universal",
        "--input_folder",
        str(source),
        "--output_folder",
        str(output),
        "--num_extract_workers",
        workers,
        "--num_merge_workers",
        workers,
    ]


def _run_converter(source: Path, output: Path) -> None:
    done = subprocess.run(converter_command(source, output), capture_output=True, text=True)
    logger.info(OUTPUT_LOG, done.stdout, done.stderr)
    if done.returncode != 0:
        lines = [x for x in (done.stderr or done.stdout).splitlines() if x.strip()]
        tail = " | ".join(lines[-3:]) or f"exit code {done.returncode}"
        raise ConversionError(f"DeepSpeed's ds_to_universal failed: {tail}")


def _ranks(n: int) -> str:
    return f"{n} rank" + ("" if n == 1 else "s")
