"""Trainer step time in fp32 against bf16 on CPU, the two alternating in one process.

    python bench/precision_speed.py                              # tiny, synthetic rows
    python bench/precision_speed.py --data runs/quickstart/shards --batch 16   # the main job
    python bench/precision_speed.py --precisions fp32,bf16,bf16-autocast --pairs 40

Each precision gets a Trainer of its own, built as trainer/run.py builds it, from
``--ds-config`` (default deploy/cpu.json: ZeRO-0, torch AdamW, fp32 master weights):

- ``fp32``: the JSON as it is;
- ``bf16``: the JSON with ``"bf16": {"enabled": true}``: bf16 weights and activations,
  fp32 master weights and optimizer in DeepSpeed's BF16_Optimizer;
- ``bf16-autocast``: the fp32 JSON with the forward under ``torch.autocast("cpu",
  torch.bfloat16)``: fp32 weights cast per step, matmuls in bf16.

After ``--warmup`` steps each (oneDNN builds its bf16 kernels for each new shape:
model/unpad.py's row buckets keep those few), the precisions alternate step by step for
``--pairs`` rounds, so that load from other processes hits them alike. A step is
trainer/loop.py's optimizer step: loading, forward, backward, the update, the counts.

Prints one JSON line: per precision the median and min step (wall and this thread's CPU
time, which other processes' load disturbs less), real tokens/s, and the ratio of each
precision's speed to the first one's, as the median and range of the per-pair ratios;
with the load average before and after.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.loader_speed import write_synthetic  # noqa: E402
from trainer import distributed  # noqa: E402
from trainer.config import parse_args  # noqa: E402
from trainer.loop import Trainer  # noqa: E402

PRECISIONS = ("fp32", "bf16", "bf16-autocast")


def ds_json(base: dict, precision: str) -> dict:
    """``base`` in ``precision``: bf16 enabled for "bf16", disabled otherwise."""
    ds = json.loads(json.dumps(base))
    ds.pop("fp16", None)
    ds["bf16"] = {"enabled": precision == "bf16"}
    return ds


def build(precision: str, args, data: Path, tmp: Path):
    """A Trainer in ``precision`` and a function doing one optimizer step -> real tokens."""
    ds = ds_json(json.loads(Path(args.ds_config).read_text()), precision)
    ds.update(train_micro_batch_size_per_gpu=args.batch, gradient_accumulation_steps=1)
    ds.pop("train_batch_size", None)
    path = tmp / f"{precision}.json"
    path.write_text(json.dumps(ds))
    config = parse_args(
        [
            "--ds-config",
            str(path),
            "--data",
            str(data),
            "--model",
            args.preset,
            "--output-dir",
            str(tmp / precision),
            "--num-workers",
            str(args.workers),
            "--dropout",
            str(args.dropout),
        ]
    )
    trainer = Trainer(config, distributed.init_distributed())
    trainer.build_engine()
    batches = iter(trainer._loader())
    autocast = precision == "bf16-autocast"

    def step() -> float:
        host = trainer.state.host[1]
        context = torch.autocast("cpu", torch.bfloat16) if autocast else contextlib.nullcontext()
        with context:
            trainer._optimizer_step(batches, None)
        return trainer.state.host[1] - host  # real tokens of the step (metrics.HOST_COUNTS)

    return step


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--data", help="shards (default: synthetic Google-like seq-128 rows)")
    p.add_argument("--preset", default="tiny")
    p.add_argument("--batch", type=int, default=16, help="micro-batch (default 16: cpu.json's)")
    p.add_argument("--dropout", type=float, default=0.0, help="as the main job (default 0)")
    p.add_argument("--precisions", default="fp32,bf16", help=f"from {PRECISIONS}; first: the peer")
    p.add_argument("--pairs", type=int, default=30, help="alternated rounds (default 30)")
    p.add_argument("--warmup", type=int, default=30, help="steps each first (default 30)")
    p.add_argument("--workers", type=int, default=0, help="DataLoader workers (default 0)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1: a rank's)")
    p.add_argument("--ds-config", default=str(REPO / "deploy" / "cpu.json"))
    args = p.parse_args(argv)
    precisions = args.precisions.split(",")
    if unknown := set(precisions) - set(PRECISIONS):
        p.error(f"unknown precision(s) {sorted(unknown)}; choose from {PRECISIONS}")
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(args.data) if args.data else Path(tmp, "shards")
        if not args.data:
            data.mkdir()
            write_synthetic(data, rows=64 * args.batch, shards=2, seq=128, max_pred=20)
        steps = {name: build(name, args, data, Path(tmp)) for name in precisions}
        for step in steps.values():
            for _ in range(args.warmup):
                step()
        wall: dict[str, list[float]] = {k: [] for k in steps}
        cpu: dict[str, list[float]] = {k: [] for k in steps}
        tokens: dict[str, list[float]] = {k: [] for k in steps}
        for _ in range(args.pairs):
            for name, step in steps.items():
                w, c = time.perf_counter(), time.thread_time()
                tokens[name].append(step())
                cpu[name].append(time.thread_time() - c)
                wall[name].append(time.perf_counter() - w)
        distributed.shutdown()
    peer = precisions[0]
    row: dict = {
        "preset": args.preset,
        "batch": args.batch,
        "data": args.data or "synthetic",
        "threads": args.threads,
        "pairs": args.pairs,
        "warmup": args.warmup,
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }
    for name in precisions:
        # Speed relative to the peer, pair by pair: the peer's time over this one's, per
        # token, since the two precisions read the same rows in the same order.
        ratios = sorted(
            (wall[peer][i] / tokens[peer][i]) / (wall[name][i] / tokens[name][i])
            for i in range(args.pairs)
        )
        cpu_ratios = sorted(
            (cpu[peer][i] / tokens[peer][i]) / (cpu[name][i] / tokens[name][i])
            for i in range(args.pairs)
        )
        row[name] = {
            "step_ms": round(1000 * statistics.median(wall[name]), 1),
            "min_step_ms": round(1000 * min(wall[name]), 1),
            "cpu_step_ms": round(1000 * statistics.median(cpu[name]), 1),
            "min_cpu_step_ms": round(1000 * min(cpu[name]), 1),
            "tokens_per_s": round(sum(tokens[name]) / sum(wall[name])),
            f"speed_vs_{peer}": round(statistics.median(ratios), 3),
            f"speed_vs_{peer}_range": [round(ratios[0], 3), round(ratios[-1], 3)],
            f"cpu_speed_vs_{peer}": round(statistics.median(cpu_ratios), 3),
            f"cpu_speed_vs_{peer}_range": [round(cpu_ratios[0], 3), round(cpu_ratios[-1], 3)],
        }
    print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
