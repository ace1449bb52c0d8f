"""Step time of the trainer against the bare model step on the trainer's own batches, on CPU.

    python bench/train_speed.py                          # small, batch 32, seq 128, fp32
    python bench/train_speed.py --preset base --batch 8 --steps 10 --threads 2

Same model config, batch size and sequence length, fp32, in one process, the two
alternating step by step (after 3 warm-ups each) so that machine noise hits both alike;
medians of ``--steps`` steps:

- trainer: one optimizer step of trainer/loop.py's Trainer, built by the code
  ``trainer/run.py`` runs, with deploy/cpu.json (ZeRO stage 0, so the torch engine of
  trainer/engine.py: AdamW, gradient clipping) on synthetic seq-128 shards
  (bench/loader_speed.py): data loading, the engine's forward/backward/step, the non-finite
  check and the metric counts;
- bare: forward, backward and a torch AdamW step of the same model, padded or unpadded as
  the trainer's ``--unpad`` resolves, fed 8 batches the trainer's loader made (so both
  arms see the same rows and lengths: bench/step_overhead.py's bare step).

Threads: ``--threads`` is applied after the trainer's ``init_distributed()``, which sets
torch's threads when ``OMP_NUM_THREADS`` is unset, and both arms run with it; the row
prints it and the load average before and after.

Target: trainer overhead under 10%. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench import step_overhead  # noqa: E402
from bench.loader_speed import write_synthetic  # noqa: E402
from trainer import distributed  # noqa: E402
from trainer.config import parse_args, resolve_unpad  # noqa: E402
from trainer.loop import MODEL_INPUTS, Trainer  # noqa: E402

os.environ.setdefault("DS_ACCELERATOR", "cpu")


def bare_step(trainer: Trainer, batches) -> Callable[[], None]:
    """The bare arm: the trainer's model config and encoder path, fed 8 of ``batches``."""
    device = trainer.info.device
    own = [{k: b[k].to(device) for k in MODEL_INPUTS} for b in itertools.islice(batches, 8)]
    unpad = resolve_unpad(trainer.config.unpad, device.type)
    return step_overhead.bare_step(trainer.model_config, torch.float32, device, own, unpad)


def trainer_step(preset: str, batch: int, workers: int, tmp: Path, ds_config: Path, *extra: str):
    """A Trainer on one rank (as trainer/run.py builds it, with more trainer flags ``extra``):
    the trainer, a function doing one step, its batches, and its loader (close it when
    done: its workers)."""
    data = tmp / "shards"
    data.mkdir()
    write_synthetic(data, rows=20 * batch, shards=2, seq=128, max_pred=20)
    ds = json.loads(ds_config.read_text())
    ds.update(train_micro_batch_size_per_gpu=batch, gradient_accumulation_steps=1)
    (tmp / "ds.json").write_text(json.dumps(ds))
    config = parse_args(
        [
            "--ds-config",
            str(tmp / "ds.json"),
            "--data",
            str(data),
            "--model",
            preset,
            "--output-dir",
            str(tmp / "out"),
            "--num-workers",
            str(workers),
            *extra,
        ]
    )
    trainer = Trainer(config, distributed.init_distributed())
    trainer.build_engine()
    loader = trainer._loader()
    batches = iter(loader)  # the step takes an iterator, as Trainer.train hands it
    return trainer, lambda: trainer._optimizer_step(batches, None), batches, loader


def timed(step) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--preset", default="small")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=10, help="timed steps (default 10)")
    p.add_argument("--workers", type=int, default=1, help="trainer DataLoader workers (default 1)")
    p.add_argument("--ds-config", default=str(REPO / "deploy" / "cpu.json"))
    p.add_argument(
        "--threads", type=int, default=0, help="torch threads of both arms (default: as set up)"
    )
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        trainer, step, batches, loader = trainer_step(
            args.preset, args.batch, args.workers, Path(tmp), Path(args.ds_config)
        )
        if args.threads:  # after init_distributed, which may set them
            torch.set_num_threads(args.threads)
        steps = {"bare": bare_step(trainer, batches), "trainer": step}
        times: dict[str, list[float]] = {k: [] for k in steps}
        for k in steps:
            for _ in range(3):
                steps[k]()
        for _ in range(args.steps):
            for k, step in steps.items():
                times[k].append(timed(step))
        loader.close()
        distributed.shutdown()
    bare, trainer = (statistics.median(times[k]) for k in ("bare", "trainer"))
    row = {
        "preset": args.preset,
        "batch": args.batch,
        "seq": 128,
        "threads": torch.get_num_threads(),
        "load": [round(load, 1), round(os.getloadavg()[0], 1)],
        "bare_step_s": round(bare, 4),
        "trainer_step_s": round(trainer, 4),
        "overhead": round(trainer / bare - 1, 4),
        "ds_config": args.ds_config,
    }
    print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
