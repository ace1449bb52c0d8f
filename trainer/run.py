"""Pretrain BERT (MLM + NSP) on the pipeline's shards: torch's engine (DDP) or DeepSpeed ZeRO.

One process (CPU, or one GPU)::

    python trainer/run.py --ds-config deploy/cpu.json --data shards/ --model tiny \\
        --output-dir runs/tiny --max-steps 200          # also: python -m trainer.run ...

One node, 8 GPUs; several nodes, one launcher per node (hostfile: deploy/hostfile.example;
SLURM: deploy/slurm.sbatch; with ssh between the nodes, the first one starts them all)::

    deepspeed --num_gpus 8 trainer/run.py --ds-config deploy/gpu.json --data shards/ \\
        --model large --output-dir runs/large --max-steps 100000 --save-every 1000
    deepspeed --hostfile deploy/hostfile --no_ssh --node_rank 0 --master_addr node-01 \\
        --master_port 29500 trainer/run.py --ds-config deploy/gpu.json ...   # node 1: --node_rank 1
    deepspeed --hostfile deploy/hostfile trainer/run.py --ds-config deploy/gpu.json ...

Two CPU ranks: ``DS_ACCELERATOR=cpu deepspeed --num_gpus 2 trainer/run.py ...``. Resume:
``--resume auto`` (the latest checkpoint of --output-dir, if any; on another number of
ranks it is converted to a universal checkpoint first, trainer/universal.py). Knowledge
distillation into the --model from a frozen teacher: ``--teacher HF_DIR``
(trainer/distillation.py). Export at any time:
``python -m trainer.export runs/large hf/large``. Every option: ``--help``.

Console: our lines only (stages, one progress line per ``--log-every``, evaluations; warnings
from every rank). Everything, DeepSpeed's INFO lines and stray prints included, goes to
``OUTPUT_DIR/logs/train-rank{RANK}.log``. ``--verbose`` or ``BERT_VERBOSE=1`` puts every record
on the console as well (pipeline/console.py).

Ctrl-C or SIGTERM (a cluster's, before preemption): every rank finishes the step in progress
and saves a checkpoint; rank 0 prints the command that resumes the run. A second signal exits
at once. Details, launchers and ``--signal-grace``: trainer/signals.py.

A failure on any rank (an exception, a dead DataLoader worker or rank) ends every rank and
the launcher within seconds, with one line on the console: trainer/failure.py.

Exit codes: 0 done, 1 a failure during the run, 2 bad arguments, configuration or data (a
corrupt shard mid-run too), 3 non-finite loss or weights, 130 stopped by SIGINT (Ctrl-C), 143
stopped by SIGTERM (128 + the signal's number; resume with ``--resume auto``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):  # run as a file (deepspeed trainer/run.py): make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline import console
from trainer.config import parse_args

logger = logging.getLogger("trainer")
# Our INFO records kept off the console (one-line JSON dumps; the log file has them).
FILE_ONLY = (
    "trainer config:",
    "deepspeed config (resolved):",
    "model config:",
    "ds_to_universal output:",
    "stopping:",
)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse flags, train, checkpoint and export; returns the exit code (a failure during
    the run leaves at once with its own: trainer/failure.py)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    from trainer.ops import use_environment_cache

    use_environment_cache()  # before DeepSpeed loads (and maybe compiles) an op
    try:
        config = parse_args(argv)
    except ValueError as err:
        if _launcher_rank() == 0:  # every rank got the same flags: one line says it
            handlers = _setup_logging(0)
            logger.error("%s", err)
            console.uninstall(handlers)
        return 2
    rank = _launcher_rank()
    fresh = not Path(config.output_dir).exists()
    try:
        handlers = _setup_logging(rank, config.output_dir, verbose=config.verbose)
    except OSError as err:  # the log file cannot be made or written (a full disk)
        handlers = _setup_logging(rank)
        logger.error("%s", err)
        console.uninstall(handlers)
        return 1
    code = 1
    try:
        with _prints_to(handlers, config.verbose), _stop_request(argv, config) as stop:
            code = _run(config, stop, _log_path(rank, config.output_dir))
            return code
    finally:
        console.uninstall(handlers)
        if code == 2 and fresh:
            _remove_if_only_logs(config.output_dir, _log_path(rank, config.output_dir))


def _remove_if_only_logs(output_dir: str, log_path: Path) -> None:
    """A run refused at start-up (exit 2) in an --output-dir it created leaves nothing: its
    log (the console had the error) and the directories, once empty. Each rank removes its
    own log; the last one out removes the directories."""
    with contextlib.suppress(OSError):
        if any(path.name != log_path.parent.name for path in Path(output_dir).iterdir()):
            return  # it got further: a corrupt shard met mid-run keeps its log
        log_path.unlink()
        log_path.parent.rmdir()  # fails while another rank's log or anything else is there
        Path(output_dir).rmdir()


def _run(config, stop, log_path: Path) -> int:
    from trainer import distributed
    from trainer.failure import RunWatch

    info = distributed.init_distributed(timeout_s=config.collective_timeout)
    _route_deepspeed_logs()
    watch = RunWatch(rank=info.rank, world_size=info.world_size, stop=stop, log_path=str(log_path))
    try:
        with watch:
            return _train(config, info, stop, watch)
    finally:
        distributed.shutdown()


def _train(config, info, stop, watch) -> int:
    """Train, export and plot; a failure on any rank ends every rank (trainer/failure.py:
    with several ranks it leaves at once, with one it returns the exit code)."""
    from trainer.loop import Trainer

    try:
        trainer = Trainer(config, info, stop)
        trainer.build_engine()
    except (ValueError, FileNotFoundError) as err:  # ShardFormatError is a ValueError
        return watch.fail(err, usage=True)
    except Exception as err:
        return watch.fail(err)
    watch.activity = lambda: trainer.activity
    try:
        trainer.train()
        trainer.export()
    except Exception as err:
        return watch.fail(err)
    if trainer.state.stopped_by is not None:  # agreed by all ranks, not this rank's alone
        return stop.finish(trainer.last_checkpoint())
    if info.is_main and config.plots:
        _plot(config.output_dir)
    return 0


def _plot(output_dir) -> None:
    """PNGs of the run's metrics (python -m report.plot); a failure here only warns."""
    from report.plot import plot_run

    try:
        paths = plot_run(output_dir)
        logger.info("plots: %s/ (%s)", paths[0].parent, ", ".join(p.name for p in paths))
    except (OSError, ValueError) as err:
        logger.warning("no plots: %s", err)


def _stop_request(argv: list[str], config):
    """SIGINT / SIGTERM handling for the run (trainer/signals.py), with its resume command."""
    from trainer.signals import StopRequest, how_to_resume

    launched = any(name in os.environ for name in _RANK_ENV)
    resume = how_to_resume(argv, sys.argv[0], launched)
    overwrite = how_to_resume(argv, sys.argv[0], launched, overwrite=True)
    return StopRequest(
        resume=resume,
        overwrite=overwrite,
        output_dir=config.output_dir,
        is_main=_launcher_rank() == 0,
    )


_RANK_ENV = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")


def _launcher_rank() -> int:
    """This process's rank as the launcher set it (deepspeed, torchrun, SLURM, MPI), else 0:
    logging starts before torch.distributed, which would confirm it."""
    for name in _RANK_ENV:
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 0


def _setup_logging(
    rank: int, output_dir: str | None = None, *, verbose: bool = False
) -> list[logging.Handler]:
    """Rank 0's console: our INFO lines; other ranks': warnings. Every rank's file:
    everything, in ``OUTPUT_DIR/logs/train-rank{rank}.log``. --verbose or BERT_VERBOSE=1: every
    record on the console (INFO on rank 0, WARNING on the others), as the file has them.

    Returns the handlers, for :func:`pipeline.console.uninstall`.
    """
    log_path = None
    if output_dir is not None:
        log_path = _log_path(rank, output_dir)
        log_path.parent.mkdir(parents=True, exist_ok=True)
    verbose = console.verbose_requested(verbose)
    handlers = console.install(
        ("trainer", "model", "pipeline"),
        verbose=verbose,
        log_path=log_path and str(log_path),
        main=rank == 0,
        tag=f"[rank {rank}] " if rank or verbose else "",
        file_only=FILE_ONLY,
    )
    if log_path is not None and rank == 0:
        hint = "" if verbose else " (--verbose shows it here)"
        try:
            logger.info("full log: %s%s", log_path, hint)
        except console.LogFileError:
            console.uninstall(handlers)
            raise
    return handlers


def _log_path(rank: int, output_dir: str) -> Path:
    return Path(output_dir, "logs", f"train-rank{rank}.log")


def _route_deepspeed_logs() -> None:
    """DeepSpeed's logger prints to stdout past the root logger; send its records (INFO
    included: the config it resolved, its communication set-up) through our handlers."""
    from deepspeed.utils import logger as ds_logger

    for handler in list(ds_logger.handlers):
        ds_logger.removeHandler(handler)
    ds_logger.setLevel(logging.INFO)
    ds_logger.propagate = True


def _prints_to(handlers: list[logging.Handler], verbose: bool):
    """Libraries' print() calls ("DeepSpeed ... built successfully") go to the log file,
    unless --verbose or BERT_VERBOSE=1."""
    files = [h for h in handlers if isinstance(h, logging.FileHandler)]
    if console.verbose_requested(verbose) or not files:
        return contextlib.nullcontext()
    return contextlib.redirect_stdout(files[0].stream)


if __name__ == "__main__":
    sys.exit(main())
