"""Where one training step's time goes: the top kernels, the phases, and host syncs.

The model step of ``bench/model_speed.py`` (our BERT, unpadded or padded, the same batch
maker, weights in ``--dtype``, torch's AdamW), run ``--warmup`` times, then:

- **phases**: forward, backward and optimizer times from CUDA events (medians of
  ``--steps`` steps; on CPU, wall-clock between synchronizations);
- **host syncs**: the number of times one step waits on the device, counted by CUDA's sync
  debug mode (``torch.cuda.set_sync_debug_mode("warn")``: one warning per synchronizing
  call); a step that syncs stalls the launch queue;
- **kernels**: ``torch.profiler`` over ``--profile-steps`` steps, the ``--top`` device
  kernels by total time, each with its share of the profiled kernel time and calls per
  step, and ``kernel_ms_per_step``, the GPU's busy time: a step much longer than that is
  bound by the host (launches, dispatch), not by the GPU.

::

    python bench/gpu_profile.py --device cuda --preset large --batch 64 --seq 128
    python bench/gpu_profile.py --device cpu --preset tiny --batch 8    # that it runs

One JSON line per preset, then a readable table of the kernels. ``--json PATH`` also writes
the lines to PATH (one per preset; deploy/gpu_bench.sh's profile stage keeps them).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.model_speed import INPUTS, build, make_batch
from model import BertConfig


def _timer(device: str):
    """A function that returns a mark, and one that gives seconds between two marks."""
    if device == "cuda":

        def mark():
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event

        def seconds(a, b) -> float:
            b.synchronize()
            return a.elapsed_time(b) / 1e3

        return mark, seconds

    def mark_cpu():
        return time.perf_counter()

    return mark_cpu, lambda a, b: b - a


def forward(model, b: dict) -> torch.Tensor:
    """The pretraining loss of batch ``b``."""
    return model(*(b[k] for k in INPUTS), b["masked_lm_ids"], b["next_sentence_label"]).loss


def train_step(model, opt, b: dict) -> None:
    forward(model, b).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def phases(model, opt, b: dict, device: str, steps: int) -> dict[str, float]:
    """Median forward, backward and optimizer seconds over ``steps`` steps."""
    mark, seconds = _timer(device)
    times: dict[str, list[float]] = {"forward": [], "backward": [], "optimizer": [], "step": []}
    for _ in range(steps):
        t0 = mark()
        loss = forward(model, b)
        t1 = mark()
        loss.backward()
        t2 = mark()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t3 = mark()
        for name, a, z in (("forward", t0, t1), ("backward", t1, t2), ("optimizer", t2, t3)):
            times[name].append(seconds(a, z))
        times["step"].append(seconds(t0, t3))
    return {k: round(statistics.median(v), 5) for k, v in times.items()}


def host_syncs(model, opt, b: dict, device: str) -> int | None:
    """Synchronizing calls in one step (CUDA only: the sync debug mode's warnings)."""
    if device != "cuda":
        return None
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            train_step(model, opt, b)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    return sum("synchroniz" in str(w.message) for w in caught)


def kernels(model, opt, b: dict, device: str, steps: int, top: int) -> tuple[float, list[dict]]:
    """Milliseconds of kernels (self time of CPU ops on CPU) per step, and the ``top`` of
    them by total time over ``steps`` profiled steps."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            train_step(model, opt, b)
        if device == "cuda":
            torch.cuda.synchronize()
    if device == "cuda":
        # Device kernels: events that ran on the GPU (not the CPU-side op wrappers), less
        # the ranges user annotations draw on the GPU's timeline (``Optimizer.step#AdamW.step``
        # spans the optimizer's own kernels, which are counted as kernels).
        totals: dict[str, list[float]] = {}
        for e in prof.events():
            on_gpu = e.device_type == torch.autograd.DeviceType.CUDA
            if on_gpu and not getattr(e, "is_user_annotation", False):
                entry = totals.setdefault(e.name, [0.0, 0])
                entry[0] += e.device_time
                entry[1] += 1
    else:
        totals = {
            e.key: [e.self_cpu_time_total, e.count]
            for e in prof.key_averages()
            if e.self_cpu_time_total > 0
        }
    whole = sum(t for t, _ in totals.values()) or 1.0
    ranked = sorted(totals.items(), key=lambda kv: -kv[1][0])[:top]
    return round(whole / 1e3 / steps, 3), [
        {
            "kernel": name[:120],
            "ms_per_step": round(t / 1e3 / steps, 3),
            "share": round(t / whole, 4),
            "calls_per_step": round(n / steps, 1),
        }
        for name, (t, n) in ranked
    ]


def profile_preset(args, preset: str) -> dict:
    cfg = BertConfig.preset(preset)
    dtype = getattr(torch, {"fp32": "float32", "bf16": "bfloat16"}[args.dtype])
    kind = "padded" if args.padded else "ours"
    model, opt = build(kind, cfg, args.device, dtype)
    b = make_batch(cfg, args.batch, args.seq, args.device, args.lengths)
    for _ in range(args.warmup):
        train_step(model, opt, b)
    times = phases(model, opt, b, args.device, args.steps)
    row = {
        "preset": preset,
        "path": "padded" if args.padded else "unpadded",
        "device": args.device,
        "dtype": args.dtype,
        "batch": args.batch,
        "seq": args.seq,
        "lengths": args.lengths,
        "real_tokens": int(b["attention_mask"].sum()),
        "sequences_per_s": round(args.batch / times["step"], 1),
        "phases_s": times,
        "host_syncs_per_step": host_syncs(model, opt, b, args.device),
    }
    row["kernel_ms_per_step"], row["top_kernels"] = kernels(
        model, opt, b, args.device, args.profile_steps, args.top
    )
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--preset", nargs="+", default=["base"])
    p.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default="bf16", choices=["fp32", "bf16"])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--lengths", default="google", help="as bench/model_speed.py's --lengths")
    p.add_argument("--padded", action="store_true", help="the padded path (default: unpadded)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=10, help="steps timed by phase")
    p.add_argument("--profile-steps", type=int, default=3, help="steps under the profiler")
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--json", type=Path, help="also append the JSON lines to this file")
    args = p.parse_args(argv)
    for preset in args.preset:
        row = profile_preset(args, preset)
        line = json.dumps(row)
        print(line, flush=True)
        if args.json:
            with args.json.open("a") as f:
                f.write(line + "\n")
        ph = row["phases_s"]
        print(
            f"{preset} {row['path']} batch {args.batch} seq {args.seq}: "
            f"{row['sequences_per_s']} seq/s; step {ph['step'] * 1e3:.1f} ms = forward "
            f"{ph['forward'] * 1e3:.1f} + backward {ph['backward'] * 1e3:.1f} + optimizer "
            f"{ph['optimizer'] * 1e3:.1f} ms; kernels {row['kernel_ms_per_step']:.1f} ms; host syncs "
            f"per step: {row['host_syncs_per_step']}"
        )
        for k in row["top_kernels"]:
            print(
                f"  {k['share']:6.1%} {k['ms_per_step']:8.3f} ms/step "
                f"{k['calls_per_step']:6.1f}x  {k['kernel']}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
