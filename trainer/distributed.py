"""torch.distributed for the trainer: launched by ``deepspeed`` (or torchrun, SLURM) or not at all.

Launchers set RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT. A plain
``python trainer/run.py`` sets none of them; :func:`init_distributed` then makes a world
of one process on a free local port, so the same code path (DeepSpeed engine, collectives)
runs everywhere. The backend is NCCL with CUDA and gloo without.

RNG states (torch CPU and CUDA, numpy's and Python's global generators) are captured per
rank for the checkpoint and restored on resume; see :func:`rng_state`.
"""

from __future__ import annotations

import datetime
import logging
import os
import random
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)
_OWN_ENV: list[str] = []  # environment variables set by init_distributed, not a launcher
# A gloo group over every rank for host numbers (host_max) where the world's is NCCL's;
# None: the world group is gloo already, or there is one rank.
_HOST_GROUP: Any = None


@dataclass(frozen=True)
class DistInfo:
    rank: int  # global: rank 0 alone writes shared files, logs metrics and exports
    world_size: int
    local_rank: int  # on this node: picks the GPU only (every node has a local rank 0)
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(timeout_s: float = 600.0) -> DistInfo:
    """Initialise torch.distributed through DeepSpeed; a one-process world when not launched.

    Args:
        timeout_s: how long a collective waits for a rank that does not come
            (``--collective-timeout``, trainer/config.py).

    Raises:
        RuntimeError: from torch.distributed when the launcher's rendezvous fails.
    """
    if "RANK" not in os.environ and "OMPI_COMM_WORLD_RANK" not in os.environ:
        own = dict(
            RANK="0",
            WORLD_SIZE="1",
            LOCAL_RANK="0",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(_free_port()),
        )
        os.environ.update(own)
        _OWN_ENV.extend(own)
    cuda = torch.cuda.is_available()
    if not cuda:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        if not cuda:  # DeepSpeed's CPU backend builds its shared-memory all-reduce op first
            from .ops import announce

            announce("ShareMemCommBuilder", "shared-memory all-reduce")
        deepspeed.init_distributed(
            dist_backend="nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=timeout_s)
        )
        if not cuda:
            _unlink_cpu_allreduce_buffer()
    global _HOST_GROUP
    if cuda and dist.get_world_size() > 1 and _HOST_GROUP is None:  # every rank, in step
        _HOST_GROUP = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if not cuda:
        _share_cpu_threads()
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank, device)


def cpu_allreduce_buffer(rank: int) -> Path:
    """The /dev/shm file of ``rank``'s buffer for DeepSpeed's shared-memory CPU all-reduce
    (named as deepspeed/ops/csrc/cpu/comm/shm.cpp names it, from MASTER_ADDR and _PORT)."""
    addr, port = os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
    return Path("/dev/shm", f"deepspeed_allreduce_buffer_{os.getuid()}_{addr}_{port}_{rank}")


def _unlink_cpu_allreduce_buffer() -> None:
    """Remove this rank's all-reduce buffer file from /dev/shm once every rank has mapped it.

    DeepSpeed's CPU backend creates one 66 MiB file per rank in /dev/shm (memory, not disk)
    and never removes it: every CPU run, clean or killed, left its files behind, until a
    day of test runs filled a test machine's memory and the kernel killed a process. Each
    rank maps every rank's file while DeepSpeed initialises and opens none
    by name afterwards, so after a barrier each rank unlinks its own name; the memory is
    freed when the last process mapping it exits, however the run ends.
    """
    from deepspeed.comm import comm

    dist.barrier()  # every rank is past DeepSpeed's initialisation: all files are mapped
    path = cpu_allreduce_buffer(dist.get_rank())
    # DeepSpeed makes the files when its op loaded and every rank is on this node.
    made = getattr(comm.cdb, "shm_comm_op", None) is not None and os.environ.get(
        "LOCAL_SIZE"
    ) == str(dist.get_world_size())
    try:
        path.unlink()
    except FileNotFoundError:
        if made:
            logger.warning(
                "DeepSpeed's shared-memory all-reduce buffer is not at %s: if this DeepSpeed "
                "names it otherwise, it stays in /dev/shm (memory) after the run",
                path,
            )


def _share_cpu_threads() -> None:
    """On CPU, split the cores between the ranks of this node (unless OMP_NUM_THREADS says).

    Two ranks with torch's default of one thread per core each oversubscribe the machine:
    their threads wait on each other at every op. One rank keeps whatever the process has
    (torch's default of one thread per core, or a bench's own ``--threads``).
    """
    if "OMP_NUM_THREADS" in os.environ:
        return
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("LOCAL_SIZE", "1")))
    if local_ranks <= 1:
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = max(1, (cores or 1) // max(local_ranks, 1))
    torch.set_num_threads(threads)
    logger.info("CPU: %d thread(s) per rank for %d local rank(s)", threads, local_ranks)


def shutdown() -> None:
    """Tear the process group down and drop the variables init_distributed set.

    Lets one process (a test) run the trainer several times.
    """
    global _HOST_GROUP
    _HOST_GROUP = None
    if dist.is_initialized():
        dist.destroy_process_group()
        # DeepSpeed caches groups derived from the world group; drop them with it.
        from deepspeed.utils import groups

        for name in ("_WORLD_GROUP", "_ZERO_PARAM_INTRA_PARALLEL_GROUP"):
            if hasattr(groups, name):
                setattr(groups, name, None)
    while _OWN_ENV:
        os.environ.pop(_OWN_ENV.pop(), None)


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """In-place sum over ranks; returns the tensor."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def all_reduce_max(tensor: torch.Tensor) -> torch.Tensor:
    """In-place maximum over ranks; returns the tensor."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor


def host_max(values: list[float]) -> list[float]:
    """The maximum over ranks of each of a few host numbers, through a CPU (gloo) group:
    nothing is copied to or read back from a device, so a GPU's queue keeps running.

    ``host_max([12.5, 0.0])`` on two ranks whose values are [12.5, 0] and [12.7, 15] is
    [12.7, 15.0] on both.
    """
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [float(v) for v in values]
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=_HOST_GROUP)
    return t.tolist()


def any_rank(flag: bool, device: torch.device) -> bool:
    """True on every rank when ``flag`` is True on any rank."""
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    return bool(all_reduce_sum(t).item() > 0)


def barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def rng_state() -> dict[str, Any]:
    """This rank's RNG states (torch CPU, CUDA if present, numpy global, Python global)."""
    state = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` captured."""
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def gather_objects(obj: Any, world_size: int) -> list[Any]:
    """Every rank's ``obj``, in rank order, on every rank."""
    if world_size == 1:
        return [obj]
    out: list[Any] = [None] * world_size
    dist.all_gather_object(out, obj)
    return out
