"""DeepSpeed's compiled ops: one line on the console before DeepSpeed JIT-compiles one.

A pip-installed DeepSpeed compiles its C++/CUDA ops on first use and caches them under
``$TORCH_EXTENSIONS_DIR``, by default one directory per Python environment under
``~/.cache/torch_extensions`` (:func:`use_environment_cache`): on CPU the shared-memory
all-reduce at ``deepspeed.init_distributed`` and, without ``torch_adam``, the Adam op at
``deepspeed.initialize``; on GPU ``FusedAdam``'s kernel. Each takes a minute or two and
prints nothing, so the trainer says what is happening, but only when the build will
actually run: the op is not pre-built into the DeepSpeed install, and the cached library is
missing or older than its sources (torch's ninja build then rebuilds it; a change of
compiler flags alone also rebuilds, unannounced).
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)
CACHE_ENV = "TORCH_EXTENSIONS_DIR"

# Optimizer class DeepSpeed builds (trainer.dskeys.optimizer_class) -> the op builder it loads.
OPTIMIZER_BUILDERS = {
    "FusedAdam": "FusedAdamBuilder",
    "DeepSpeedCPUAdam": "CPUAdamBuilder",
    "FusedLamb": "FusedLambBuilder",
    "DeepSpeedCPUAdagrad": "CPUAdagradBuilder",
    "FusedLion": "FusedLionBuilder",
    "DeepSpeedCPULion": "CPULionBuilder",
}


def use_environment_cache(environ=os.environ, prefix: str = sys.prefix) -> str:
    """Give this Python environment its own torch extensions cache, unless the user named one
    (``$TORCH_EXTENSIONS_DIR``); returns the directory.

    torch's default, ``~/.cache/torch_extensions/py311_cpu``, is shared by every environment
    of the same Python: another venv's DeepSpeed or torch builds its own op there, and the
    next launch here finds a library built from other sources or flags and compiles it again.
    One directory per environment (``sys.prefix``) keeps each build. Called at start-up,
    before DeepSpeed loads an op; the deepspeed launcher's ranks inherit it.

    Example: ``use_environment_cache({}, "/work/.venv")`` ->
    ``"~/.cache/torch_extensions/venv-<8 hex digits of the prefix's sha256>"`` (expanded).
    """
    if environ.get(CACHE_ENV):
        return environ[CACHE_ENV]
    key = hashlib.sha256(os.path.realpath(prefix).encode()).hexdigest()[:8]
    name = f"{Path(prefix).name.lstrip('.') or 'python'}-{key}"
    environ[CACHE_ENV] = str(Path.home() / ".cache" / "torch_extensions" / name)
    return environ[CACHE_ENV]


def compile_directory(builder_name: str) -> Path | None:
    """Where DeepSpeed will JIT-compile the op of ``builder_name`` on its next load, or None
    when it will not compile it (pre-built, cached and up to date, or not on this
    accelerator).

    Example: ``compile_directory("ShareMemCommBuilder")`` on a fresh CPU machine ->
    ``~/.cache/torch_extensions/venv-1a2b3c4d/py311_cpu/deepspeed_shm_comm``; None once built.
    """
    from deepspeed.accelerator import get_accelerator
    from deepspeed.git_version_info import installed_ops
    from torch.utils.cpp_extension import _get_build_directory  # torch's own rule, env included

    builder = get_accelerator().create_op_builder(builder_name)
    # No sources: DeepSpeed's stand-in for an op this accelerator lacks (it raises on load).
    if builder is None or not builder.sources() or installed_ops.get(builder.name, False):
        return None
    directory = Path(_get_build_directory(builder.name, verbose=False))
    library = directory / f"{builder.name}.so"
    if library.is_file():
        sources = [Path(builder.deepspeed_src_path(p)) for p in builder.sources()]
        built = library.stat().st_mtime
        if all(not s.is_file() or s.stat().st_mtime <= built for s in sources):
            return None
    return directory


def announce(builder_name: str, what: str) -> None:
    """Log (INFO, on the console of rank 0) that the op is about to be compiled, if it is."""
    directory = compile_directory(builder_name)
    if directory is not None:
        logger.info(
            "compiling DeepSpeed's %s op (first run only, a minute or two; cached in %s)",
            what,
            directory,
        )


def optimizer_builder(ds: dict[str, Any]) -> str | None:
    """The op builder of the optimizer DeepSpeed will build from ``ds``; None without one."""
    from .dskeys import optimizer_class

    cls = optimizer_class(ds)
    return OPTIMIZER_BUILDERS.get(cls.__name__) if cls is not None else None


def announce_optimizer(ds: dict[str, Any]) -> None:
    """:func:`announce` the op of the optimizer DeepSpeed will build from ``ds``, if any."""
    builder = optimizer_builder(ds)
    if builder is not None:
        from .dskeys import optimizer_class

        announce(builder, f"{optimizer_class(ds).__name__} optimizer")


def build(ds: dict[str, Any]) -> list[str]:
    """Compile now, once, the ops a run of DeepSpeed config ``ds`` will load (on CPU the
    shared-memory all-reduce; the optimizer's, if DeepSpeed's engine runs ``ds`` under
    ``--engine auto``: trainer/engine.py), so that a launch later pays
    only their import: the quickstart builds them before training's budget is set, the
    tests before any launch they time. Returns the builders' names; an op already built
    costs nothing.
    """
    import torch
    from deepspeed.accelerator import get_accelerator

    use_environment_cache()  # where the trainer will look for them
    names = [] if torch.cuda.is_available() else ["ShareMemCommBuilder"]
    from .engine import deepspeed_only

    if deepspeed_only(ds) is not None:  # else --engine auto runs torch's own AdamW
        names += [b for b in [optimizer_builder(ds)] if b is not None]
    for name in names:
        if compile_directory(name) is not None:
            print(f"building DeepSpeed op {name} (once; cached)", flush=True)
            get_accelerator().create_op_builder(name).load()
    return names


if __name__ == "__main__":  # python -m trainer.ops DS_CONFIG.json: what build() does
    import argparse
    import json

    parser = argparse.ArgumentParser(description="Build the DeepSpeed ops a run will load.")
    parser.add_argument("ds_config", help="the run's DeepSpeed JSON, e.g. deploy/cpu.json")
    path = parser.parse_args().ds_config
    try:
        with open(path, encoding="utf-8") as f:
            ds = json.load(f)
    except (OSError, ValueError) as err:
        parser.exit(2, f"python -m trainer.ops: cannot read {path}: {err}\n")
    print(f"DeepSpeed ops ready: {build(ds)}")
