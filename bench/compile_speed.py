"""What to compile, measured: one training step of our BERT, eager against torch.compile.

    python bench/compile_speed.py                          # tiny and small, batch 16, all modes
    python bench/compile_speed.py --preset small --modes eager model --repeats 5
    python bench/compile_speed.py --explain                # graph breaks of the model's forward
    python bench/compile_speed.py --trainer --preset tiny  # trainer/loop.py's step instead
    python bench/compile_speed.py --preset tiny --batches probe --threads 1 --steps 40 \
        --dynamic auto --modes eager model       # issue 35's probe, as it was written

One step = forward, backward, gradient clipping and a torch AdamW step on a batch of
``--lengths`` rows (bench/model_speed.py's; seq 128, a new draw per batch, so the unpadded
shapes change every step as in training), dropout 0 as in the main job. ``--batches probe``
draws issue 35's probe batches instead: real lengths uniform in 40-128 and 20 predictions
in every row (the main job's rows are shorter and have fewer: docstrings' mean is 73,
15% of it masked). Modes, compiled as trainer/compiling.py's ``--compile`` compiles them
(``--dynamic`` and ``--compile-mode`` change torch.compile's options, to measure them):

- ``eager``: no compiling;
- ``model``: ``model.compile(dynamic=True)`` in place: the encoder, both heads, the loss;
- ``step``: ``model`` plus ``torch.compile`` of the optimizer's step.

Each mode is built from seed 0 and first runs every batch once, untimed (compiling; the
first step's time is printed as ``first_s``). Then, ``--repeats`` times, the modes alternate
step by step over the batches, so machine noise hits all alike, and each repeat gives the
ratio of medians eager/mode (``gain``, above 1: the mode is faster); the range over repeats
is printed. Also: the largest loss difference from eager (same weights, same batches) and
the distinct graphs dynamo compiled over the whole run, and the machine's load average
(1 minute) before and after, since the machine may be shared. One JSON line per preset.

``--trainer`` times one optimizer step of trainer/loop.py's Trainer instead, built with
``--compile MODE --dropout 0`` as trainer/run.py builds it (bench/train_speed.py's: one
rank, deploy/cpu.json, synthetic seq-128 shards of Google-like rows, so most batches have
no padding), each mode on its own stream of batches.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import train_speed
from bench.model_speed import INPUTS, make_batch
from model import BertConfig, BertForPreTraining
from trainer.compiling import COMPILE_KWARGS, graph_count

MODES = ("eager", "model", "step")
CPU_JSON = Path(__file__).resolve().parents[1] / "deploy" / "cpu.json"
ARGS = (*INPUTS, "masked_lm_ids", "next_sentence_label")


def compile_kwargs(args) -> dict:
    """trainer/compiling.py's torch.compile options, with ``--dynamic``/``--compile-mode``."""
    kwargs = dict(COMPILE_KWARGS)
    if args.dynamic != "default":
        kwargs["dynamic"] = {"true": True, "false": False, "auto": None}[args.dynamic]
    if args.compile_mode:
        kwargs["mode"] = args.compile_mode
    return kwargs


def probe_batch(cfg: BertConfig, batch: int, seed: int) -> dict:
    """Issue 35's probe batch: real lengths uniform in 40-128, 20 predictions in every row,
    padded to its longest row; the tensors of bench/model_speed.py's make_batch."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(40, 129, (batch,), generator=g).tolist()
    width = max(lengths)
    b = {k: torch.zeros(batch, width, dtype=torch.long) for k in INPUTS[:3]}
    b["masked_lm_positions"] = torch.zeros(batch, 20, dtype=torch.long)
    b["masked_lm_ids"] = torch.zeros(batch, 20, dtype=torch.long)
    for r, n in enumerate(lengths):
        b["input_ids"][r, :n] = torch.randint(5, cfg.vocab_size, (n,), generator=g)
        b["attention_mask"][r, :n] = 1
        b["segment_ids"][r, n // 2 : n] = 1
        pos = (torch.randperm(n - 2, generator=g)[:20] + 1).sort().values
        b["masked_lm_positions"][r], b["masked_lm_ids"][r] = pos, b["input_ids"][r, pos]
    b["next_sentence_label"] = torch.randint(0, 2, (batch,), generator=g)
    return b


def build(mode: str, cfg: BertConfig, kwargs: dict):
    """A model (from seed 0) and a function doing one training step on a batch dict."""
    torch.manual_seed(0)
    model = BertForPreTraining(cfg).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    if mode != "eager":
        model.compile(**kwargs)
    update = torch.compile(opt.step, **kwargs) if mode == "step" else opt.step

    def step(b: dict) -> float:
        loss = model(*(b[k] for k in ARGS)).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        update()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step


def trainer_steps(args, preset: str, tmp: Path) -> dict:
    """Per mode, a function doing one trainer step (it takes, and ignores, a batch)."""
    steps = {}
    for mode in args.modes:
        (tmp / mode).mkdir()
        flags = ("--compile", "off" if mode == "eager" else mode, "--dropout", "0")
        # No loader workers (nothing to close): the step reads its batches in this process.
        _, step, _, _ = train_speed.trainer_step(
            preset, args.batch, 0, tmp / mode, CPU_JSON, *flags
        )
        steps[mode] = lambda _b, step=step: step()
    if args.threads:  # again: each trainer's init_distributed may have set them
        torch.set_num_threads(args.threads)
    return steps


def explain(cfg: BertConfig, batches: list[dict]) -> dict:
    """torch._dynamo.explain of the forward on a batch with padding: graphs, breaks, reasons."""
    torch.manual_seed(0)
    model = BertForPreTraining(cfg).train()
    b = next((b for b in batches if not b["attention_mask"].all()), batches[0])
    out = torch._dynamo.explain(model)(*(b[k] for k in ARGS))
    reasons = [f"{r.reason.strip().splitlines()[0]} @ {_where(r)}" for r in out.break_reasons]
    return {"graphs": out.graph_count, "graph_breaks": out.graph_break_count, "reasons": reasons}


def _where(reason) -> str:
    frames = [f for f in reason.user_stack if "/model/" in f.filename] or reason.user_stack
    f = frames[-1] if frames else None
    return f"{Path(f.filename).name}:{f.lineno}" if f is not None else "?"


def bench(args, preset: str) -> dict:
    cfg = BertConfig.preset(preset)
    d = args.dropout
    cfg = dataclasses.replace(cfg, hidden_dropout_prob=d, attention_probs_dropout_prob=d)
    if args.batches == "probe":
        batches = [probe_batch(cfg, args.batch, seed=i) for i in range(args.steps)]
    else:
        batches = [
            make_batch(cfg, args.batch, 128, "cpu", args.lengths, seed=i) for i in range(args.steps)
        ]
    load = os.getloadavg()[0]
    if args.explain:
        return {"preset": preset, **explain(cfg, batches)}
    first, losses = {}, {}
    if args.trainer:
        (args.tmp / preset).mkdir()
        steps = trainer_steps(args, preset, args.tmp / preset)
    else:
        steps = {mode: build(mode, cfg, compile_kwargs(args)) for mode in args.modes}
    for mode in args.modes:
        t0 = time.perf_counter()
        losses[mode] = [steps[mode](batches[0])]
        first[mode] = time.perf_counter() - t0
        losses[mode] += [steps[mode](b) for b in batches[1:]]
    gains: dict[str, list[float]] = {m: [] for m in args.modes}
    step_ms: dict[str, list[float]] = {m: [] for m in args.modes}
    for _ in range(args.repeats):
        times: dict[str, list[float]] = {m: [] for m in args.modes}
        for b in batches:
            for mode in args.modes:
                t0 = time.perf_counter()
                steps[mode](b)
                times[mode].append(time.perf_counter() - t0)
        med = {m: statistics.median(v) for m, v in times.items()}
        for m in args.modes:
            step_ms[m].append(round(1e3 * med[m], 1))
            gains[m].append(round(med[args.modes[0]] / med[m], 3))
    base = losses[args.modes[0]]
    return {
        "preset": preset,
        "step": "trainer" if args.trainer else "bare",
        "batch": args.batch,
        "lengths": "probe" if args.batches == "probe" else args.lengths,
        "threads": torch.get_num_threads(),
        "compile": compile_kwargs(args),
        "dropout": d,
        "step_ms": step_ms,
        "gain": gains,
        "gain_range": {m: [min(v), max(v)] for m, v in gains.items()},
        "first_s": {m: round(v, 1) for m, v in first.items()},
        # The same weights and batches, before any timed step: the first pass's losses
        # (the trainer's step returns none).
        "max_loss_diff": {
            m: max(abs(a - b) for a, b in zip(base, v[: len(base)], strict=True))
            for m, v in losses.items()
        }
        if not args.trainer
        else None,
        "graphs": graph_count(),
        "load": [round(load, 1), round(os.getloadavg()[0], 1)],
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--preset", nargs="+", default=["tiny", "small"])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lengths", default="docstrings", help="bench/model_speed.py --lengths")
    p.add_argument("--batches", choices=("lengths", "probe"), default="lengths")
    p.add_argument(
        "--dynamic",
        choices=("default", "true", "false", "auto"),
        default="default",
        help="torch.compile dynamic= (default: trainer/compiling.py's; auto: torch's None)",
    )
    p.add_argument("--compile-mode", help="torch.compile mode=, e.g. max-autotune-no-cudagraphs")
    p.add_argument("--steps", type=int, default=8, help="batches, each timed once per repeat")
    p.add_argument("--repeats", type=int, default=3, help="timed passes (default 3)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    p.add_argument("--dropout", type=float, default=0.0, help="(default 0, as the main job)")
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--explain", action="store_true", help="print the graph breaks only")
    p.add_argument("--trainer", action="store_true", help="time the trainer's step (docstring)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.modes[0] != "eager":
        p.error("the first of --modes is the baseline: give eager first")
    with tempfile.TemporaryDirectory() as tmp:
        args.tmp = Path(tmp)  # --trainer: each run's shards and output
        for preset in args.preset:
            print(json.dumps(bench(args, preset)), flush=True)
    if args.trainer:
        from trainer import distributed

        distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
