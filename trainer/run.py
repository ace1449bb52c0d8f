"""Pretrain BERT (MLM + NSP) on the pipeline's shards with DeepSpeed ZeRO.

One process (CPU, or one GPU)::

    python trainer/run.py --ds-config deploy/cpu.json --data shards/ --model tiny \\
        --output-dir runs/tiny --max-steps 200          # also: python -m trainer.run ...

One node, 8 GPUs; several nodes (hostfile: deploy/hostfile.example; SLURM: deploy/slurm.sbatch)::

    deepspeed --num_gpus 8 trainer/run.py --ds-config deploy/zero2.json --data shards/ \\
        --model large --output-dir runs/large --max-steps 100000 --save-every 1000
    deepspeed --hostfile deploy/hostfile trainer/run.py --ds-config deploy/zero2.json ...

Two CPU ranks: ``DS_ACCELERATOR=cpu deepspeed --num_gpus 2 trainer/run.py ...``. Resume:
``--resume auto`` (the latest checkpoint of --output-dir, if any). Export at any time:
``python -m trainer.export runs/large hf/large``. Every option: ``--help``.

Exit codes: 0 done, 2 bad arguments, configuration or data, 3 non-finite loss or weights.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):  # run as a file (deepspeed trainer/run.py): make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.format import ShardFormatError
from trainer.checkpoint import NonFiniteError
from trainer.config import parse_args

logger = logging.getLogger("trainer")


def main(argv: Sequence[str] | None = None) -> int:
    """Parse flags, train, checkpoint and export; returns the exit code."""
    from trainer import distributed
    from trainer.loop import Trainer

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        config = parse_args(argv)
    except ValueError as err:
        _setup_logging(0)
        logger.error("%s", err)
        return 2
    info = distributed.init_distributed()
    _setup_logging(info.rank)
    try:
        try:
            trainer = Trainer(config, info)
            trainer.build_engine()
        except (ValueError, FileNotFoundError, ShardFormatError) as err:
            logger.error("%s", err)
            return 2
        trainer.train()
        trainer.export()
        if info.is_main:
            _plot(config.output_dir)
    except NonFiniteError as err:
        logger.error("%s", err)
        return 3
    finally:
        distributed.shutdown()
    return 0


def _plot(output_dir) -> None:
    """PNGs of the run's metrics (python -m trainer.plot); a failure here only warns."""
    from trainer.plot import plot_run

    try:
        paths = plot_run(output_dir)
        logger.info("plots: %s", ", ".join(str(p) for p in paths))
    except (OSError, ValueError) as err:
        logger.warning("no plots: %s", err)


def _setup_logging(rank: int) -> None:
    """INFO on rank 0, warnings only on the other ranks (each would repeat rank 0's lines)."""
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format=f"%(asctime)s %(levelname)s [rank {rank}] %(name)s: %(message)s",
    )


if __name__ == "__main__":
    sys.exit(main())
