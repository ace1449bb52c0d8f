"""Step time of the trainer against the bare model step of bench/model_speed.py, on CPU.

    python bench/train_speed.py                          # small, batch 32, seq 128, fp32
    python bench/train_speed.py --preset base --batch 8 --steps 10

Same model config, batch size and sequence length, fp32, this machine's threads, in one
process, the two alternating step by step (after 3 warm-ups each) so that machine noise
hits both alike; medians of ``--steps`` steps:

- bare: bench/model_speed.py's step (forward, backward, torch AdamW step) on its batch;
- trainer: one optimizer step of trainer/loop.py's Trainer, built by the code
  ``trainer/run.py`` runs, with deploy/cpu.json (DeepSpeed ZeRO-2 on one rank, torch
  AdamW, gradient clipping) on synthetic seq-128 shards (bench/loader_speed.py): data
  loading, DeepSpeed's forward/backward/step, the non-finite check and the metric counts.

Target: trainer overhead under 10%. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench import model_speed  # noqa: E402
from bench.loader_speed import write_synthetic  # noqa: E402
from model import BertConfig  # noqa: E402
from trainer import distributed  # noqa: E402
from trainer.config import parse_args  # noqa: E402
from trainer.loop import Trainer  # noqa: E402

os.environ.setdefault("DS_ACCELERATOR", "cpu")


def bare_step(preset: str, batch: int, seq: int):
    cfg = BertConfig.preset(preset)
    net, opt = model_speed.build("ours", cfg, "cpu", torch.float32)
    return model_speed.step_fn("ours", net, opt, model_speed.make_batch(cfg, batch, seq, "cpu"))


def trainer_step(preset: str, batch: int, workers: int, tmp: Path, ds_config: Path, *extra: str):
    """A Trainer on one rank (as trainer/run.py builds it, with more trainer flags ``extra``):
    a function doing one step, and its loader (close it when done: its workers)."""
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
    return lambda: trainer._optimizer_step(batches, None), loader


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
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        steps = {"bare": bare_step(args.preset, args.batch, 128)}
        steps["trainer"], loader = trainer_step(
            args.preset, args.batch, args.workers, Path(tmp), Path(args.ds_config)
        )
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
        "bare_step_s": round(bare, 4),
        "trainer_step_s": round(trainer, 4),
        "overhead": round(trainer / bare - 1, 4),
        "ds_config": args.ds_config,
    }
    print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
