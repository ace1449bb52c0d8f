"""DeepSpeed checkpoints with the trainer's state: data position, RNG states, configs.

Layout under ``OUTPUT_DIR/checkpoints``::

    latest                      the tag of the newest complete checkpoint
    step00001000/               one DeepSpeed checkpoint (ZeRO-partitioned files), plus
        config.json             the model config (Hugging Face names; export reads it)
        train_config.json       the resolved trainer options
        ds_config.json          the resolved DeepSpeed JSON
        trainer_state.json      step, stream position, epoch, per-rank offsets (readable copy)

Resuming on a different number of ranks: ``--resume`` converts the checkpoint to DeepSpeed's
universal format once, beside it (``stepN_universal``), and loads that
(trainer/universal.py). The data position is global (a stream position), so the new ranks
continue the same stream.

The trainer state also goes into DeepSpeed's client state (key ``trainer_state``), with
every rank's RNG states, gathered to rank 0. ``latest`` is written by the trainer, after
every rank has finished writing (DeepSpeed's own ``latest`` is written by rank 0 before the
final barrier, so a kill could leave it pointing at an incomplete checkpoint); a checkpoint
without ``latest`` pointing at it is never resumed by ``--resume auto``, and rank 0 writes its
``trainer_state.json`` only after every rank's files: a checkpoint directory without one (a
save cut short by a failure) is refused when named by path.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from model.config import write_text_atomic

from . import distributed
from .universal import universal_tag

logger = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
LATEST = "latest"
STATE_KEY = "trainer_state"
STATE_FILE = "trainer_state.json"  # written after every rank's files: a complete checkpoint
STATE_VERSION = 1
_MODEL_FILES = ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt")
# Lets deepspeed/checkpoint/ds_to_universal.py convert our checkpoints without extra flags.
_UNIVERSAL_INFO = {"universal_checkpoint_info": {"universal_checkpoint_version": 0.4}}


class NonFiniteError(RuntimeError):
    """A loss or weight is NaN or infinite; training stops and nothing is saved."""


def tag_for(step: int) -> str:
    """``tag_for(1000) -> "step00001000"``."""
    return f"step{step:08d}"


def is_checkpoint(path: Path) -> bool:
    return any((path / name).is_file() for name in _MODEL_FILES)


def resolve(path: str | os.PathLike) -> tuple[str, str]:
    """(checkpoints dir, tag) of a run's output directory, a checkpoints dir or one checkpoint.

    Raises:
        FileNotFoundError: nothing that looks like a checkpoint at ``path``.
    """
    path = Path(path)
    for directory in (path, path / CHECKPOINTS):
        latest = directory / LATEST
        if latest.is_file():
            tag = latest.read_text().strip()
            if not is_checkpoint(directory / tag):
                raise FileNotFoundError(f"{latest} names {tag!r}, which is not a checkpoint")
            return str(directory), tag
    if is_checkpoint(path):
        if not (path / STATE_FILE).is_file():
            raise FileNotFoundError(
                f"{path} is incomplete: it has no {STATE_FILE}, which is written once every "
                f"rank has finished the checkpoint (a save cut short); resume from the one "
                f"'{LATEST}' names"
            )
        return str(path.parent), path.name
    raise FileNotFoundError(
        f"{path}: no checkpoint (expected a run's output directory, its checkpoints/ "
        f"directory with a '{LATEST}' file, or one checkpoint directory)"
    )


def find_resume(resume: str | None, output_dir: str) -> tuple[str, str] | None:
    """What ``--resume`` means: None (start fresh), or (checkpoints dir, tag).

    ``auto`` resumes from ``output_dir`` when it has a checkpoint and starts fresh otherwise.

    Raises:
        FileNotFoundError: an explicit path without a checkpoint.
    """
    if resume is None:
        return None
    if resume == "auto":
        try:
            return resolve(output_dir)
        except FileNotFoundError:
            return None
    return resolve(resume)


def read_state(directory: str, tag: str) -> dict[str, Any] | None:
    """The readable copy of a checkpoint's trainer state (trainer_state.json), or None."""
    path = Path(directory, tag, STATE_FILE)
    return json.loads(path.read_text()) if path.is_file() else None


def _all_finite(engine, device: torch.device) -> bool:
    bad = False
    for p in engine.module.parameters():
        local = getattr(p, "ds_tensor", p)  # ZeRO-3 keeps only a partition on each rank
        if local.numel() and not bool(torch.isfinite(local).all()):
            bad = True
            break
    return not distributed.any_rank(bad, device)


def save(engine, output_dir: str, step: int, state: dict[str, Any], files: dict[str, Any]) -> str:
    """Save a checkpoint on every rank, then commit it by writing ``latest``; returns the tag.

    Args:
        engine: the DeepSpeed engine (all ranks call this).
        state: the trainer state (JSON-able); every rank's RNG states are added to it.
        files: {file name: JSON-able object} written into the checkpoint by rank 0.

    Raises:
        NonFiniteError: some weight is not finite (nothing is written).
    """
    device = next(engine.module.parameters()).device
    if not _all_finite(engine, device):
        raise NonFiniteError(f"weights are not finite at step {step}: checkpoint not saved")
    directory = os.path.join(output_dir, CHECKPOINTS)
    tag = tag_for(step)
    if engine.global_rank == 0:  # a conversion of an earlier checkpoint of this tag is stale
        shutil.rmtree(Path(directory, universal_tag(tag)), ignore_errors=True)
    rngs = distributed.gather_objects(distributed.rng_state(), engine.world_size)
    client = {STATE_KEY: {**state, "version": STATE_VERSION, "rng": rngs}, **_UNIVERSAL_INFO}
    try:
        engine.save_checkpoint(directory, tag=tag, client_state=client, save_latest=False)
    except BaseException:
        # A save cut short is never resumed ('latest' still names the one before it): leave
        # no partial directory on what is likely a full disk.
        shutil.rmtree(Path(directory, tag), ignore_errors=True)
        raise
    distributed.barrier()  # every rank's files are written
    if engine.global_rank == 0:  # trainer_state.json last: it marks the checkpoint complete
        for name, obj in {**files, STATE_FILE: state}.items():
            write_text_atomic(Path(directory, tag, name), json.dumps(obj, indent=2) + "\n")
        write_text_atomic(Path(directory, LATEST), tag)
    distributed.barrier()
    logger.info("saved checkpoint %s/%s", directory, tag)
    return tag


def remove_incomplete(output_dir: str) -> list[str]:
    """Remove the checkpoint directories under ``output_dir`` that a save cut short left:
    those without a trainer_state.json (written last) that ``latest`` does not name. They are
    never resumed (:func:`resolve` refuses them) and hold disk a resume needs. Rank 0 calls
    it before a resume; returns the names removed.
    """
    directory = Path(output_dir, CHECKPOINTS)
    latest = directory / LATEST
    keep = latest.read_text().strip() if latest.is_file() else None
    removed = []
    for path in sorted(directory.glob("step*")):
        partial = path.is_dir() and not (path / STATE_FILE).is_file()
        if partial and path.name != keep and not path.name.endswith(universal_tag("")):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path.name)
    if removed:
        logger.info(
            "removed incomplete checkpoint(s) %s (saves cut short) from %s",
            ", ".join(removed),
            directory,
        )
    return removed


def kept(output_dir: str) -> dict[int, Path]:
    """The complete checkpoints under ``output_dir``: {step: directory}, by step."""
    found = {}
    for path in Path(output_dir, CHECKPOINTS).glob("step*"):
        match = re.fullmatch(r"step(\d+)", path.name)
        if match and (path / STATE_FILE).is_file():
            found[int(match.group(1))] = path
    return dict(sorted(found.items()))


# What a run writes beside its checkpoints; --overwrite removes them with the checkpoints when
# it starts over (its logs/ stay: each process's log appends).
RUN_OUTPUTS = ("metrics.jsonl", "tensorboard", "hf", "plots", "samples-rank*.txt")


def check_start(
    output_dir: str,
    resume: tuple[str, str] | None,
    *,
    overwrite: bool,
    resume_command: str,
    overwrite_command: str,
) -> list[Path]:
    """Refuse a start that would leave ``latest`` below a kept checkpoint, or say what
    ``--overwrite`` removes so it does not.

    A fresh start (``resume`` None) in an ``output_dir`` that holds checkpoints would train
    from step 0 beside them and repoint ``latest`` at its own: the natural mistake of running
    a stopped run's command again without ``--resume auto``. A resume from an earlier
    checkpoint than ``output_dir`` keeps would do the same from that step. Either is refused
    with the two commands that say what the user meant, unless ``overwrite``.

    Returns:
        What rank 0 removes (:func:`start_over`) before anything is written: the later
        checkpoints (and their universal conversions); on a fresh start, the run's other
        outputs too (:data:`RUN_OUTPUTS`). Empty when the start conflicts with nothing.

    Raises:
        ValueError: a conflict without ``overwrite``; its message names both commands.
    """
    steps = kept(output_dir)
    start = 0 if resume is None else _step_of(*resume)
    later = [path for step, path in steps.items() if step > start]
    if not later:
        return []
    if not overwrite:
        resume_command = resume_command or "the same command with --resume auto"
        overwrite_command = overwrite_command or "the same command with --overwrite"
        where = Path(output_dir, CHECKPOINTS)
        names = ", ".join(path.name for path in later[-3:])
        if len(later) > 3:
            names = f"{len(later)} checkpoints, the last {names}"
        if resume is None:
            problem = (
                f"{where} holds an earlier run's checkpoints ({names}): a fresh run would "
                f"train from step 0 beside them and repoint '{LATEST}' at its own"
            )
            choice = "start over, deleting them and that run's metrics, TensorBoard logs, plots and export"
        else:
            problem = (
                f"{where} holds checkpoints past step {start}, the one --resume names "
                f"({names}): resuming it there would repoint '{LATEST}' below them"
            )
            choice = f"resume step {start} as asked, deleting them"
        raise ValueError(
            f"{problem}. Nothing was changed. To continue from the latest:\n"
            f"  {resume_command}\nor, to {choice}:\n  {overwrite_command}"
        )
    gone = [*later, *(path.with_name(universal_tag(path.name)) for path in later)]
    if resume is None:
        gone += [p for pattern in RUN_OUTPUTS for p in sorted(Path(output_dir).glob(pattern))]
    return [path for path in gone if path.exists()]


def start_over(output_dir: str, paths: list[Path], resume: tuple[str, str] | None) -> None:
    """Remove ``paths`` (from :func:`check_start`; rank 0, before anything is written) and
    point ``latest`` at the checkpoint resumed from when it is one of ``output_dir``'s, or
    remove it."""
    if not paths:
        return
    latest = Path(output_dir, CHECKPOINTS, LATEST)
    ours = resume is not None and Path(resume[0]).resolve() == latest.parent.resolve()
    if ours:  # first: a kill from here on leaves 'latest' naming a checkpoint
        write_text_atomic(latest, resume[1])
    else:
        latest.unlink(missing_ok=True)
    for path in paths:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    logger.warning("--overwrite: removed %s from %s", ", ".join(p.name for p in paths), output_dir)


def _step_of(directory: str, tag: str) -> int:
    state = read_state(directory, tag)
    if state is not None:
        return int(state["step"])
    match = re.match(r"step(\d+)", tag)
    return int(match.group(1)) if match else 0


def check_free_space(directory: str, tag: str, output_dir: str) -> None:
    """Before a resume: refuse to start when the disk of ``output_dir``'s checkpoints has less
    room than checkpoint ``directory/tag`` takes, since the run's first save would fail.

    Raises:
        OSError: ENOSPC, naming the directory, its free space and the checkpoint's size.
    """
    size = sum(f.stat().st_size for f in Path(directory, tag).rglob("*") if f.is_file())
    where = Path(output_dir, CHECKPOINTS)
    existing = where if where.is_dir() else Path(output_dir)
    while not existing.exists():
        existing = existing.parent
    free = shutil.disk_usage(existing).free
    if free < size:
        raise OSError(
            errno.ENOSPC,
            f"{where} has {free / 2**20:.1f} MiB free, less than the {size / 2**20:.1f} MiB of "
            f"the checkpoint {tag} this run resumes from, so its next checkpoint would not "
            f"fit: free some space (older checkpoints under {where} can go), then resume",
        )


def load(engine, directory: str, tag: str) -> dict[str, Any]:
    """Load weights, optimizer and scheduler; return the trainer state (with "rng").

    Raises:
        ValueError: the checkpoint has no trainer state of a known version.
    """
    path, client = engine.load_checkpoint(directory, tag=tag)
    if path is None:
        raise ValueError(f"DeepSpeed could not load the checkpoint {directory}/{tag}")
    state = (client or {}).get(STATE_KEY)
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        raise ValueError(
            f"{directory}/{tag} has no trainer state of version {STATE_VERSION}; "
            "was it written by trainer/run.py?"
        )
    logger.info("resumed from %s/%s at step %d", directory, tag, state["step"])
    return state


def restore_rng(state: dict[str, Any], rank: int, world_size: int, fallback_seed: int) -> None:
    """Restore this rank's RNG states, or seed fresh ones when the world size changed."""
    rngs = state.get("rng") or []
    if len(rngs) == world_size:
        distributed.set_rng_state(rngs[rank])
        return
    if rank == 0:  # the same on every rank: said once
        logger.warning(
            "checkpoint has RNG states of %d ranks, this run has %d: dropout RNGs are reseeded",
            len(rngs),
            world_size,
        )
    torch.manual_seed(fallback_seed)
