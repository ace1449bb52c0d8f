"""Fault injection for the trainer's launch tests, outside the production code.

Python imports ``sitecustomize`` at start-up from its path, and this folder's imports this
module; tests/helpers.py's ``rank_env`` puts the folder on PYTHONPATH with ``BERT_TEST_FAULT=KIND@STEP[:RANK]`` (no RANK: every
rank) for the processes of one run. When ``trainer.loop`` is imported, this patches it:

- ``raise@N``: the rank raises ``RuntimeError("injected fault")`` in optimizer step N;
- ``sigkill@N``: the rank SIGKILLs itself after step N and its checkpoint, if any (at the
  start of step N + 1);
- ``enospc@N``: the rank's ``torch.save`` into checkpoint N raises ``OSError(ENOSPC)``, as
  a full disk does;
- ``workerkill@P``: a DataLoader worker of the rank SIGKILLs itself when it builds a batch at
  stream position ``P`` or later (workers build ahead of the steps: the rank sees it dead at
  once, a few steps before it would train on that batch);
- ``slowplot@S``: the rank sleeps S seconds before its plots, after the run's last barrier,
  while the other ranks end and exit.

When it injects, it appends ``KIND RANK TIME`` (``time.time()``) to ``$BERT_TEST_FAULT_LOG``
if that is set, for the tests' time-to-exit bound.
"""

import errno
import importlib.machinery
import os
import signal
import sys
import time

_SPEC = os.environ.get("BERT_TEST_FAULT", "")


def _parse(spec: str):
    kind, _, where = spec.partition("@")
    step, _, rank = where.partition(":")
    return kind, int(step), None if rank == "" else int(rank)


def _mine(rank) -> bool:
    return rank is None or os.environ.get("RANK", "0") == str(rank)


def _record(kind: str) -> None:
    log = os.environ.get("BERT_TEST_FAULT_LOG")
    if log:
        with open(log, "a") as f:
            f.write(f"{kind} {os.environ.get('RANK', '0')} {time.time()}\n")


def _patch_loop(module) -> None:
    kind, step, rank = _parse(_SPEC)
    if not _mine(rank):
        return
    trainer = module.Trainer
    optimizer_step = trainer._optimizer_step

    def faulty_step(self, batches, samples):
        if kind == "raise" and self.state.step + 1 == step:
            _record(kind)
            raise RuntimeError("injected fault")
        if kind == "sigkill" and self.state.step == step:
            _record(kind)
            os.kill(os.getpid(), signal.SIGKILL)
        return optimizer_step(self, batches, samples)

    trainer._optimizer_step = faulty_step
    if kind == "enospc":
        import torch

        # trainer.loop (``module``) has loaded trainer.checkpoint: nothing is imported here.
        # Not imported at the top of this file: sitecustomize loads it into every process of
        # a run at start-up (the launcher too), and trainer.checkpoint imports torch there.
        save, tag = torch.save, module.checkpoint.tag_for(step)

        def full_disk_save(obj, f, *args, **kwargs):
            if isinstance(f, (str, os.PathLike)) and tag in os.fspath(f):
                _record(kind)
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(f))
            return save(obj, f, *args, **kwargs)

        torch.save = full_disk_save


def _patch_data(module) -> None:
    kind, position, rank = _parse(_SPEC)
    if kind != "workerkill" or not _mine(rank):
        return
    stream = module.PretrainingStream
    batch = stream.batch

    def faulty_batch(self, k):
        s = self.spec
        first = s.start + k * s.micro * s.world_size  # this rank's first row is further on
        if module.get_worker_info() is not None and first >= position:
            _record(kind)
            os.kill(os.getpid(), signal.SIGKILL)
        return batch(self, k)

    stream.batch = faulty_batch


def _patch_plot(module) -> None:
    kind, seconds, rank = _parse(_SPEC)
    if kind != "slowplot" or not _mine(rank):
        return
    plot_run = module.plot_run

    def slow_plot_run(*args, **kwargs):
        time.sleep(seconds)  # the other ranks have ended well and exited meanwhile
        return plot_run(*args, **kwargs)

    module.plot_run = slow_plot_run


_PATCHES = {"trainer.loop": _patch_loop, "trainer.data": _patch_data, "report.plot": _patch_plot}


class _PatchOnImport:
    """A meta-path finder that patches the modules of :data:`_PATCHES` once executed."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in _PATCHES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            _PATCHES[fullname](module)

        spec.loader.exec_module = exec_module
        return spec


if _SPEC:
    sys.meta_path.insert(0, _PatchOnImport())
