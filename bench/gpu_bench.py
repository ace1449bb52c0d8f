"""The Python steps of deploy/gpu_bench.sh: synthetic shards, the DeepSpeed JSON, results.

    python bench/gpu_bench.py shards DIR --seq 512 --rows 16384
    python bench/gpu_bench.py ds-config deploy/zero2.json OUT.json --micro 32 --gpus 1
    python bench/gpu_bench.py model-config large OUT.json --attention-dropout 0
    python bench/gpu_bench.py summarize RUN/metrics.jsonl --preset base --seq 512 --unpad true \\
        --micro 32 --gpus 1 --wall-s 41.5          # one JSON line
    python bench/gpu_bench.py summarize RUN/metrics.jsonl ... --compile model   # a compiled run
    python bench/gpu_bench.py table results.jsonl  # padded against unpadded, per preset x seq
    python bench/gpu_bench.py compare A/metrics.jsonl B/metrics.jsonl --tolerance 2e-3 \
        --what "fp32 padded: cuda vs cpu"      # one JSON line; exit 1 when the curves part

Shards come from bench/loader_speed.py's ``write_synthetic``: Google-like lengths, 90% of
rows full length and 10% a uniformly random shorter one (8 .. seq - 1 tokens), 15% of
tokens masked up to 20 per row at seq 128 and 80 at seq 512 (Google's settings).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.loader_speed import write_synthetic
from model import BertConfig
from pipeline.options import parse_bool

WARMUP_STEPS = 10  # of WarmupDecayLR: short runs still reach the peak lr and decay


def max_predictions(seq: int) -> int:
    """Google's max_predictions_per_seq: 20 at seq 128, 80 at seq 512."""
    return 20 if seq <= 128 else 80


def write_shards(directory: Path, seq: int, rows: int) -> bool:
    """Synthetic shards of ``rows`` rows at ``seq`` in ``directory``; False if already there.

    A directory kept from an earlier run must hold the same rows at the same seq: the
    speed runs once trained on the smoke stage's 512 rows this way (an epoch every 4
    steps of BERT-Base on an H200), so a mismatch is an error, not a silent reuse.

    Raises:
        ValueError: ``rows`` is not a positive multiple of 4 (the number of shards), or
            ``directory`` holds shards of other rows or another seq.
    """
    if rows < 4 or rows % 4:
        raise ValueError(f"rows must be a positive multiple of 4 (4 shards), got {rows}")
    if (directory / "manifest.json").exists():
        from pipeline.shards.shard_format import read_manifest

        manifest = read_manifest(directory)
        held = sum(entry["rows"] for entry in manifest["shards"])
        held_seq = manifest["params"]["max_seq_length"]
        if (held, held_seq) != (rows, seq):
            raise ValueError(
                f"{directory} holds {held} rows at seq {held_seq}, not {rows} at seq {seq}: "
                "name another directory"
            )
        return False
    directory.mkdir(parents=True, exist_ok=True)
    write_synthetic(directory, rows=rows, shards=4, seq=seq, max_pred=max_predictions(seq))
    return True


def ds_config(
    base: dict[str, Any],
    *,
    micro: int,
    gpus: int,
    torch_adam: bool = True,
    precision: str = "bf16",
) -> dict[str, Any]:
    """``base`` (a deploy/ JSON) in ``precision`` (bf16, or fp32 for the correctness runs),
    one micro-batch per step and a short warmup.

    Example: zero2.json, micro 32, 1 GPU -> train_batch_size 32, no accumulation, so
    every logged step is one forward, backward and optimizer step of 32 rows.
    ``torch_adam`` takes torch's AdamW instead of DeepSpeed's FusedAdam, whose CUDA
    extension is compiled at first use (a minute, and it needs nvcc).
    """
    ds = json.loads(json.dumps(base))  # a deep copy
    ds.pop("fp16", None)
    ds["bf16"] = {**ds.get("bf16", {}), "enabled": precision == "bf16"}
    ds.pop("gradient_accumulation_steps", None)
    ds.update(train_micro_batch_size_per_gpu=micro, train_batch_size=micro * gpus)
    ds["scheduler"]["params"]["warmup_num_steps"] = WARMUP_STEPS
    if torch_adam:
        ds["optimizer"]["params"]["torch_adam"] = True
    return ds


def model_config(preset: str, attention_dropout: float) -> BertConfig:
    """A preset (vocab 30522, [PAD] 0: the synthetic shards') with this attention dropout.

    Attention dropout 0 lets CUDA bf16 training take the ``varlen`` FlashAttention path;
    with the presets' 0.1 it takes ``nested`` (model/unpad.py).
    """
    return BertConfig.preset(preset, attention_probs_dropout_prob=attention_dropout)


def summarize(metrics: Path, **meta: Any) -> dict[str, Any]:
    """One result line: medians over the logged training windows after the first.

    The first window holds the start-up (kernel selection, allocator growth, the
    data loader filling up), so it is left out when there are others.

    Raises:
        ValueError: the file has no training record.
    """
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    rows = [r for r in records if r.get("split", "train") == "train" and "sequences_per_s" in r]
    if not rows:
        raise ValueError(f"{metrics}: no training records")
    windows = rows[1:] or rows

    def median(key: str) -> float | None:
        values = [r[key] for r in windows if r.get(key) is not None]
        return statistics.median(values) if values else None

    mfu = median("mfu")
    return {
        "compile": "off",
        **meta,
        "sequences_per_s": round(median("sequences_per_s"), 1),
        "tokens_per_s": round(median("tokens_per_s")),
        "tflops_per_s": round(median("tflops_per_s"), 1),
        "mfu": None if mfu is None else round(mfu, 4),
        "windows": len(windows),
        "final_loss": rows[-1]["loss"],
        # trainer/compiling.py: the first step, compiling included; graphs over the run.
        "first_step_s": rows[0].get("first_step_s"),
        "compiled_graphs": rows[-1].get("compiled_graphs"),
    }


def loss_curve(metrics: Path) -> dict[int, float]:
    """{step: loss} of a run's training records."""
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return {r["step"]: r["loss"] for r in records if r.get("split") == "train"}


def compare(a: Path, b: Path, tolerance: float, what: str) -> dict[str, Any]:
    """The largest relative difference of two runs' losses over the steps both logged.

    Raises:
        ValueError: the runs share no logged step.
    """
    left, right = loss_curve(a), loss_curve(b)
    steps = sorted(set(left) & set(right))
    if not steps:
        raise ValueError(f"{a} and {b} share no logged step")
    worst = max(abs(left[s] - right[s]) / max(abs(right[s]), 1e-8) for s in steps)
    return {
        "what": what,
        "steps": len(steps),
        "last_step": steps[-1],
        "max_rel_diff": float(f"{worst:.3g}"),
        "tolerance": tolerance,
        "ok": worst <= tolerance,
    }


def table(results: list[dict[str, Any]]) -> str:
    """Padded against unpadded sequences/s and MFU, one line per preset, seq and --compile.

    ``unpad/padded`` is the unpadded run's sequences/s over the padded run's.
    """
    cells = {(r["preset"], r["seq"], r.get("compile", "off"), r["unpad"]): r for r in results}
    lines = [
        f"{'preset':<7}{'seq':>5}{'compile':>8}{'micro':>7}{'padded seq/s':>14}"
        f"{'unpadded seq/s':>16}{'unpad/padded':>14}{'MFU padded':>12}{'MFU unpadded':>14}"
    ]

    def mfu(r: dict | None) -> str:
        return "-" if r is None or r["mfu"] is None else f"{r['mfu']:.1%}"

    for preset, seq, compiled in dict.fromkeys(key[:3] for key in cells):
        padded = cells.get((preset, seq, compiled, False))
        unpadded = cells.get((preset, seq, compiled, True))
        either = padded or unpadded
        speeds = [f"{r['sequences_per_s']:.1f}" if r else "-" for r in (padded, unpadded)]
        ratio = (
            f"{unpadded['sequences_per_s'] / padded['sequences_per_s']:.3f}"
            if padded and unpadded and padded["sequences_per_s"]
            else "-"
        )
        lines.append(
            f"{preset:<7}{seq:>5}{compiled:>8}{either['micro']:>7}{speeds[0]:>14}{speeds[1]:>16}"
            f"{ratio:>14}{mfu(padded):>12}{mfu(unpadded):>14}"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("shards", help="write synthetic shards (skipped if already there)")
    s.add_argument("directory", type=Path)
    s.add_argument("--seq", type=int, required=True)
    s.add_argument("--rows", type=int, default=16384)
    d = sub.add_parser("ds-config", help="the DeepSpeed JSON of one run")
    d.add_argument("base", type=Path)
    d.add_argument("out", type=Path)
    d.add_argument("--micro", type=int, required=True)
    d.add_argument("--gpus", type=int, required=True)
    d.add_argument("--torch-adam", type=parse_bool, default=True)
    d.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    c = sub.add_parser("model-config", help="a preset's config.json with another attention dropout")
    c.add_argument("preset")
    c.add_argument("out", type=Path)
    c.add_argument("--attention-dropout", type=float, required=True)
    m = sub.add_parser("summarize", help="one JSON line of a run's metrics.jsonl")
    m.add_argument("metrics", type=Path)
    m.add_argument("--preset", required=True)
    m.add_argument("--seq", type=int, required=True)
    m.add_argument("--unpad", type=parse_bool, required=True)
    m.add_argument("--micro", type=int, required=True)
    m.add_argument("--gpus", type=int, required=True)
    m.add_argument(
        "--wall-s", type=float, required=True, help="the run's wall time, start-up included"
    )
    m.add_argument("--compile", choices=("off", "model", "step"), default="off")
    t = sub.add_parser("table", help="the final table of a results.jsonl")
    t.add_argument("results", type=Path)
    k = sub.add_parser("compare", help="two runs' loss curves: one JSON line, exit 1 if apart")
    k.add_argument("a", type=Path)
    k.add_argument("b", type=Path)
    k.add_argument("--tolerance", type=float, required=True, help="largest relative difference")
    k.add_argument("--what", required=True)
    args = p.parse_args(argv)
    if args.command == "shards":
        wrote = write_shards(args.directory, args.seq, args.rows)
        print(
            f"{'wrote' if wrote else 'kept'} seq-{args.seq} shards in {args.directory}", flush=True
        )
    elif args.command == "ds-config":
        ds = ds_config(
            json.loads(args.base.read_text()),
            micro=args.micro,
            gpus=args.gpus,
            torch_adam=args.torch_adam,
            precision=args.precision,
        )
        args.out.write_text(json.dumps(ds, indent=2) + "\n")
    elif args.command == "model-config":
        model_config(args.preset, args.attention_dropout).to_json(args.out)
    elif args.command == "summarize":
        keys = ("preset", "seq", "unpad", "micro", "gpus", "wall_s", "compile")
        meta = {k: getattr(args, k) for k in keys}
        print(json.dumps(summarize(args.metrics, **meta)), flush=True)
    elif args.command == "compare":
        result = compare(args.a, args.b, args.tolerance, args.what)
        print(json.dumps(result), flush=True)
        return 0 if result["ok"] else 1
    else:
        results = [json.loads(x) for x in args.results.read_text().splitlines() if x.strip()]
        print(table(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
