"""Would length-bucketed micro-batches train faster? Our model on the same rows, two groupings.

    python bench/length_bucketing.py                      # small, batch 32, 6 batches
    python bench/length_bucketing.py --preset tiny --batch 16 --batches 12

``--batches`` x ``--batch`` row lengths are drawn from the main job's distribution
(bench/model_speed.py ``--lengths docstrings``) and grouped two ways: ``random`` (as
the loader's seeded window gives them) and ``bucketed`` (sorted by length, then cut into
batches, as a length-bucketing loader would). Each batch is padded to its longest row,
as the trainer's collate does. Both groupings hold the same rows, so real tokens/s
compare directly. Our model runs each grouping unpadded (the default) and padded,
alternating the groupings, median of ``--repeats`` passes over all batches.

The unpadded encoder already drops padding from every Linear, and on CPU its attention
groups rows of similar length inside the batch (model/unpad.py AttentionGroups), which is
what bucketing would otherwise do for it. On CUDA the varlen path computes no padding at
all. Measured (small, 6 x 32, 2 threads): unpadded 0.99x, padded 1.42x; before the
in-model grouping unpadded gained 1.06x. So the loader does not bucket.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import model_speed
from model import BertConfig


def groupings(lengths: list[int], batch: int) -> dict[str, list[list[int]]]:
    """The same lengths as consecutive batches, in drawn order and sorted."""
    ordered = sorted(lengths)
    cut = range(0, len(lengths), batch)
    return {
        "random": [lengths[i : i + batch] for i in cut],
        "bucketed": [ordered[i : i + batch] for i in cut],
    }


def batch_of(cfg: BertConfig, lengths: list[int], seq: int, seed: int) -> dict:
    """bench/model_speed.py's batch with the given row lengths."""
    draw = model_speed.row_lengths
    model_speed.row_lengths = lambda *_: list(lengths)
    try:
        return model_speed.make_batch(cfg, len(lengths), seq, "cpu", "given", seed=seed)
    finally:
        model_speed.row_lengths = draw


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--preset", default="small", help="model preset (default: small)")
    p.add_argument("--batch", type=int, default=32, help="rows per batch (default: 32)")
    p.add_argument("--batches", type=int, default=6, help="batches per grouping (default: 6)")
    p.add_argument("--seq", type=int, default=128, help="max_seq_length (default: 128)")
    p.add_argument("--repeats", type=int, default=3, help="timed passes (default: 3)")
    args = p.parse_args(argv)
    cfg = BertConfig.preset(args.preset)
    g = torch.Generator().manual_seed(1)
    lengths = model_speed.row_lengths("docstrings", args.batch * args.batches, args.seq, g)
    data = {
        name: [batch_of(cfg, rows, args.seq, i) for i, rows in enumerate(groups)]
        for name, groups in groupings(lengths, args.batch).items()
    }
    tokens = sum(lengths)
    print(
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, {args.preset}, "
        f"{args.batches} batches of {args.batch}, mean length {tokens / len(lengths):.1f}"
    )
    for kind in ("ours", "padded"):
        model, opt = model_speed.build(kind, cfg, "cpu", torch.float32)
        steps = {
            name: [model_speed.step_fn(kind, model, opt, b) for b in bs]
            for name, bs in data.items()
        }
        for step in steps["random"][:2]:  # warm-up
            step()
        times = {name: [] for name in steps}
        for _ in range(args.repeats):
            for name, group in steps.items():
                t0 = time.perf_counter()
                for step in group:
                    step()
                times[name].append(time.perf_counter() - t0)
        med = {name: statistics.median(v) for name, v in times.items()}
        label = "unpadded" if kind == "ours" else "padded"
        print(
            f"{label}: real tok/s random {tokens / med['random']:.0f}, bucketed "
            f"{tokens / med['bucketed']:.0f}; bucketing {med['random'] / med['bucketed']:.2f}x",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
