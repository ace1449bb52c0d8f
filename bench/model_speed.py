"""Training-step speed of our BERT (unpadded and padded) against transformers' BertForPreTraining.

One step = forward, backward and an AdamW step, same config, weights, batch and
threads. Three models alternate (ours unpadded, ours padded, transformers with sdpa)
after 3 warm-ups each, and the median of ``--steps`` steps is reported, so machine
noise hits all alike::

    python bench/model_speed.py                      # small (batch 32) and base (batch 8), CPU fp32
    python bench/model_speed.py --preset small --lengths docstrings
    python bench/model_speed.py --preset small --seq 512 --batch 8 --lengths google
    python bench/model_speed.py --lengths runs/quickstart/shards   # a shard directory's lengths
    python bench/model_speed.py --device cuda --dtype bf16 --preset base large --seq 128 512

Row lengths (``--lengths``): ``google`` is Google-like data, 90% of rows full length and
10% a random shorter length; ``docstrings`` is the length distribution of the main job's
shards (scripts/quickstart.sh: mean 73 of 128, 79% of rows shorter than 128; the
quantiles below were read off them); a shard directory gives its own rows' lengths. 15%
of tokens are masked, up to 20 (or 80 at seq 512) per row. Tokens/s count real tokens.
Peak memory is CUDA's max allocated on GPU; on CPU it is the peak resident size of a
separate process that runs the same steps for one model alone.

Beside each time ratio the bench prints the ratio of the two peers' matmul FLOPs on the
same batch (``matmul_flops``): what the time ratio would be if all that differed were
the work. A measured ratio near it has nothing left to gain but faster kernels; a
target above it cannot be reached by computing on fewer positions.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from model import BertConfig, BertForPreTraining, num_parameters
from model.unpad import Packing

BATCH = {"tiny": 64, "mini": 64, "small": 32, "medium": 16, "base": 8, "large": 4}
KINDS = ("ours", "padded", "hf")  # ours = unpadded encoder (the default)
INPUTS = ("input_ids", "segment_ids", "attention_mask", "masked_lm_positions")
# Row lengths of the main job's shards at max_seq_length 128, at quantiles 0, 5, ..., 100%.
DOCSTRING_QUANTILES = (
    8,
    23,
    28,
    32,
    36,
    40,
    44,
    48,
    53,
    58,
    64,
    70,
    78,
    86,
    98,
    112,
    128,
    128,
    128,
    128,
    128,
)


def row_lengths(spec: str, batch: int, seq: int, g: torch.Generator) -> list[int]:
    """``batch`` real lengths <= ``seq`` drawn as ``--lengths`` says (see the module docstring).

    Raises:
        ValueError: ``spec`` is neither a known name nor a shard directory.
    """
    if spec == "google":
        full = torch.rand(batch, generator=g) < 0.9
        short = torch.randint(8, seq, (batch,), generator=g)
        return [seq if f else int(n) for f, n in zip(full, short, strict=True)]
    if spec == "docstrings":
        q = torch.tensor(DOCSTRING_QUANTILES, dtype=torch.float64) * seq / 128
        u = torch.rand(batch, generator=g, dtype=torch.float64) * (len(q) - 1)
        lo = u.floor().long()
        hi = (lo + 1).clamp(max=len(q) - 1)
        x = q[lo] + (q[hi] - q[lo]) * (u - lo)
        return [max(3, min(seq, round(float(v)))) for v in x]
    if not Path(spec).is_dir():
        raise ValueError(f"--lengths must be google, docstrings or a shard directory, got {spec!r}")
    from pipeline.shards.shard_format import join_path, open_shard, read_manifest

    manifest = read_manifest(spec)
    table = open_shard(join_path(spec, manifest["shards"][0]["name"]))
    offsets = table.column("input_ids").combine_chunks().offsets.to_numpy()
    lengths = torch.from_numpy(offsets[1:] - offsets[:-1])
    pick = torch.randint(0, len(lengths), (batch,), generator=g)
    return [max(3, min(seq, int(lengths[i]))) for i in pick]


def make_batch(
    cfg: BertConfig, batch: int, seq: int, device: str, lengths: str = "google", seed: int = 0
) -> dict:
    """A padded batch: positions/ids (B, P) for us, dense labels (B, T) for transformers.

    Padded to the longest row, as the trainer's collate does.
    """
    g = torch.Generator().manual_seed(seed)
    real = row_lengths(lengths, batch, seq, g)
    seq = max(real)
    max_pred = 20 if seq <= 128 else 80
    input_ids = torch.zeros(batch, seq, dtype=torch.long)
    attention_mask = torch.zeros(batch, seq, dtype=torch.long)
    segment_ids = torch.zeros(batch, seq, dtype=torch.long)
    positions = torch.zeros(batch, max_pred, dtype=torch.long)
    ids = torch.zeros(batch, max_pred, dtype=torch.long)
    labels = torch.full((batch, seq), -100, dtype=torch.long)
    for r, n in enumerate(real):
        input_ids[r, :n] = torch.randint(5, cfg.vocab_size, (n,), generator=g)
        attention_mask[r, :n] = 1
        segment_ids[r, n // 2 : n] = 1
        k = min(max_pred, max(1, round(n * 0.15)))
        pos = (torch.randperm(n - 2, generator=g)[:k] + 1).sort().values
        positions[r, :k] = pos
        ids[r, :k] = input_ids[r, pos]
        labels[r, pos] = input_ids[r, pos]
    nsl = torch.randint(0, 2, (batch,), generator=g)
    tensors = dict(
        input_ids=input_ids,
        segment_ids=segment_ids,
        attention_mask=attention_mask,
        masked_lm_positions=positions,
        masked_lm_ids=ids,
        next_sentence_label=nsl,
        labels=labels,
    )
    return {k: v.to(device) for k, v in tensors.items()}


def build(kind: str, cfg: BertConfig, device: str, dtype: torch.dtype):
    """Both models from the same seed; the reference gets our weights."""
    torch.manual_seed(0)
    ours = BertForPreTraining(cfg, unpad=kind == "ours")
    if kind in ("ours", "padded"):
        model = ours
    else:
        import transformers

        hf_cfg = transformers.BertConfig(
            **{k: v for k, v in cfg.to_dict().items() if k != "architectures"}
        )
        hf_cfg._attn_implementation = "sdpa"
        model = transformers.BertForPreTraining(hf_cfg)
        model.load_state_dict(ours.state_dict(), strict=False)
        model.tie_weights()
    model = model.to(device=device, dtype=dtype).train()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def step_fn(kind: str, model, opt, b: dict):
    def step() -> None:
        if kind != "hf":
            loss = model(
                b["input_ids"],
                b["segment_ids"],
                b["attention_mask"],
                b["masked_lm_positions"],
                b["masked_lm_ids"],
                b["next_sentence_label"],
            ).loss
        else:
            loss = model(
                input_ids=b["input_ids"],
                token_type_ids=b["segment_ids"],
                attention_mask=b["attention_mask"],
                labels=b["labels"],
                next_sentence_label=b["next_sentence_label"],
            ).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def flops_per_step(cfg: BertConfig, batch: int, seq: int, n_params: int) -> float:
    """6 x parameters x tokens + attention (12 x L x H x T^2 per row), as in the MFU literature."""
    return (
        6 * n_params * batch * seq
        + 12 * cfg.num_hidden_layers * cfg.hidden_size * seq * seq * batch
    )


def matmul_flops(cfg: BertConfig, b: dict, kind: str, unpadded: bool, device: str) -> float:
    """FLOPs of one training step's matmuls (forward + backward = 3 x forward) as ``kind`` runs them.

    The ceiling on a speed ratio from work alone: if both peers ran their matmuls equally
    fast, their time ratio would be this one's. Counted: every Linear of the encoder, the
    attention products, pooler, NSP and the MLM head (transform and decoder). Rows each
    runs on: transformers and the padded path every position and, for the MLM head,
    transformers every position, the padded path every prediction slot (B x P); unpadded,
    the real tokens and real predictions, with attention on CPU over the grids of rows of
    similar length that the ``padded`` attention path builds, and per row on CUDA (varlen).
    """
    mask, positions = b["attention_mask"], b["masked_lm_positions"]
    batch, width = mask.shape
    lengths = mask.sum(1).double()
    unpadded = unpadded and kind == "ours"
    tokens = float(lengths.sum()) if unpadded else batch * width
    attended = batch * width**2
    if unpadded and device == "cuda":
        attended = float((lengths**2).sum())
    elif unpadded:  # grids of rows of similar length (model/unpad.py AttentionGroups)
        groups = Packing.from_mask(mask).attention_groups()
        attended = sum(r * w * w for r, w in zip(groups.rows, groups.width, strict=True))
    if kind == "hf":
        head_rows = batch * width
    else:
        head_rows = float((positions != 0).sum()) if unpadded else positions.numel()
    return cfg.training_flops(tokens, attended, head_rows, batch)


def peak_rss_subprocess(args, preset: str, seq: int, kind: str) -> float:
    """Peak RSS in MiB of a process that runs a few steps of one model alone."""
    cmd = [
        sys.executable,
        __file__,
        "--memory-of",
        kind,
        "--preset",
        preset,
        "--seq",
        str(seq),
        "--dtype",
        args.dtype,
        "--batch",
        str(args.batch or BATCH[preset]),
        "--lengths",
        args.lengths,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_mib"]


def run_memory_probe(args) -> None:
    cfg = BertConfig.preset(args.preset[0])
    dtype = getattr(torch, {"fp32": "float32", "bf16": "bfloat16"}[args.dtype])
    model, opt = build(args.memory_of, cfg, "cpu", dtype)
    b = make_batch(cfg, args.batch, args.seq[0], "cpu", args.lengths)
    step = step_fn(args.memory_of, model, opt, b)
    for _ in range(2):
        step()
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the parent across exec.
    hwm_kib = next(
        int(line.split()[1])
        for line in Path("/proc/self/status").read_text().splitlines()
        if line.startswith("VmHWM:")
    )
    print(json.dumps({"peak_mib": hwm_kib / 1024}))


def bench(args, preset: str, seq: int) -> dict:
    cfg = BertConfig.preset(preset)
    dtype = getattr(torch, {"fp32": "float32", "bf16": "bfloat16"}[args.dtype])
    batch = args.batch or BATCH[preset]
    b = make_batch(cfg, batch, seq, args.device, args.lengths)
    tokens = int(b["attention_mask"].sum())
    kinds = list(KINDS)
    steps, times = {}, {k: [] for k in kinds}
    models = {}
    for k in kinds:
        models[k], opt = build(k, cfg, args.device, dtype)
        steps[k] = step_fn(k, models[k], opt, b)
    n_params = num_parameters(models["ours"])
    for k in kinds:
        for _ in range(3):
            steps[k]()
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for _ in range(args.steps):
        for k in kinds:
            sync(args.device)
            t0 = time.perf_counter()
            steps[k]()
            sync(args.device)
            times[k].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    row = {
        "preset": preset,
        "seq": seq,
        "batch": batch,
        "dtype": args.dtype,
        "lengths": args.lengths,
        "mean_length": round(tokens / batch, 1),
        "device": args.device,
        "params": n_params,
    }
    for k in kinds:
        row[f"{k}_tokens_per_s"] = round(tokens / med[k], 1)
        row[f"{k}_step_s"] = round(med[k], 4)
    row["ratio"] = round(med["hf"] / med["ours"], 3)  # unpadded over transformers
    row["padded_ratio"] = round(med["hf"] / med["padded"], 3)
    row["unpad_gain"] = round(med["padded"] / med["ours"], 3)
    # Work ratios of the same pairs: the ceilings the time ratios would reach if every
    # matmul ran equally fast and nothing else took time (see matmul_flops).
    with torch.no_grad():  # did the unpadded model unpad this batch? (not without padding)
        unpadded = models["ours"](*(b[k] for k in INPUTS)).packing is not None
    work = {k: matmul_flops(cfg, b, k, unpadded, args.device) for k in kinds}
    row["unpadded_ran"] = unpadded
    row["flop_ratio"] = round(work["hf"] / work["ours"], 3)
    row["flop_unpad_gain"] = round(work["padded"] / work["ours"], 3)
    flops = flops_per_step(cfg, batch, int(b["attention_mask"].shape[1]), n_params)
    if args.peak_tflops:
        for k in kinds:
            row[f"{k}_mfu"] = round(flops / med[k] / (args.peak_tflops * 1e12), 4)
    if args.device == "cpu" and not args.no_memory:
        for k in kinds:
            row[f"{k}_peak_rss_mib"] = round(peak_rss_subprocess(args, preset, seq, k), 1)
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--preset",
        nargs="+",
        default=["small", "base"],
        help="presets to run (default: small base)",
    )
    p.add_argument(
        "--seq", nargs="+", type=int, default=[128], help="sequence lengths (default: 128)"
    )
    p.add_argument(
        "--batch", type=int, default=0, help="batch size (default: small 32, base 8, large 4, ...)"
    )
    p.add_argument("--steps", type=int, default=10, help="timed steps per model (default: 10)")
    p.add_argument(
        "--lengths",
        default="google",
        help="row lengths: google, docstrings or a shard directory (default: google)",
    )
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    p.add_argument(
        "--peak-tflops",
        type=float,
        default=0.0,
        help="peak TFLOP/s of the device for MFU (default: 989 for cuda bf16 = H100/H200 dense)",
    )
    p.add_argument("--no-memory", action="store_true", help="skip the CPU peak-memory subprocesses")
    p.add_argument("--memory-of", choices=KINDS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.memory_of:
        run_memory_probe(args)
        return 0
    if args.device == "cuda" and not args.peak_tflops:
        args.peak_tflops = 989.0 if args.dtype == "bf16" else 67.0
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}", flush=True)
    for preset in args.preset:
        for seq in args.seq:
            row = bench(args, preset, seq)
            print(json.dumps(row), flush=True)
            memory = (
                ", peak RSS MiB " + "/".join(f"{row[f'{k}_peak_rss_mib']:.0f}" for k in KINDS)
                if f"{KINDS[0]}_peak_rss_mib" in row
                else ""
            )
            print(
                f"{preset} seq {seq} batch {row['batch']} ({args.lengths}, mean {row['mean_length']}"
                f"): real tok/s unpadded {row['ours_tokens_per_s']:.0f}, padded "
                f"{row['padded_tokens_per_s']:.0f}, transformers {row['hf_tokens_per_s']:.0f}; "
                f"vs transformers {row['ratio']:.2f}x (padded {row['padded_ratio']:.2f}x; "
                f"matmul FLOP ratio {row['flop_ratio']:.2f}x), unpadding "
                f"{row['unpad_gain']:.2f}x (FLOP ratio {row['flop_unpad_gain']:.2f}x"
                f"{'' if row['unpadded_ran'] else ', the batch ran padded'}){memory}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
