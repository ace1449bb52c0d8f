"""The host work of one optimizer step: the trainer's against the bare model step's, on the
trainer's own batches, in one process.

    python bench/step_overhead.py                                  # deploy/gpu.json
    python bench/step_overhead.py --ds-config deploy/zero2.json deploy/zero3.json deploy/cpu.json
    python bench/step_overhead.py --preset tiny --batch 8          # a real model

The default model is a micro-BERT with Base's structure (12 layers, 207 parameter tensors) at
hidden size 8, where compute is about nothing: its step time is host time, what a GPU step
pays while its kernels run. Per arm it prints one JSON line:

- ``ops_per_step``: aten ops dispatched in one optimizer step (a TorchDispatchMode). It does
  not drift with load, so it is the number to compare across machines and commits;
- ``reads_per_step`` and ``read_sites``: calls that read a tensor's value on the host
  (``Tensor.item/tolist/__bool__/__float__/__int__/cpu/numpy/nonzero``, a tensor built from
  Python values onto a device, DeepSpeed's ``accelerator.synchronize``), by call site. On a
  GPU each such call on a device tensor stops the host until the device catches up; on a
  CPU the bench cannot tell a host tensor from a device one, so it names every site;
- ``step_ms``: host time per step, median and range over ``--steps`` steps, the arms
  alternated step by step, with the threads and the load average. On CUDA each timed step
  ends with a device synchronize, so it is the step's own time (``sequences_per_s`` too),
  and ``cuda_syncs_per_step`` counts what ``torch.cuda.set_sync_debug_mode("warn")`` reports
  in the counted steps: the syncs that stop the host, wherever they come from;
- ``log_step_read_sites`` (trainer arm): the read sites of one step that logs, its update
  and its record: the counts, gradient norm and non-finite check come back in one read.

On a GPU (``deploy/gpu_bench.sh``'s overhead stage)::

    python bench/step_overhead.py --preset base --batch 128 --steps 20

The bare arm is a forward, backward and torch AdamW step of the same model (in the DeepSpeed
config's precision) on batches taken from the trainer's loader, moved to the device first.
The trainer arm is ``Trainer._optimizer_step`` on non-log steps, the trainer built as
trainer/run.py builds it, on one rank, padded (``--unpad false``, the GPU's default path).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import json
import logging
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")
import torch
from torch.utils._python_dispatch import TorchDispatchMode

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.loader_speed import write_synthetic  # noqa: E402
from model import BertConfig, BertForPreTraining  # noqa: E402
from trainer import distributed  # noqa: E402
from trainer.config import parse_args  # noqa: E402
from trainer.loop import MODEL_INPUTS, Trainer  # noqa: E402
from trainer.metrics import MetricsWriter  # noqa: E402

READERS = ("item", "tolist", "__bool__", "__float__", "__int__", "cpu", "numpy", "nonzero")


class OpCounter(TorchDispatchMode):
    """Counts the aten ops dispatched while it is active."""

    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def _call_site() -> str:
    """Where a read was asked for: the first frame outside torch and this file, else (a read
    inside torch, e.g. its optimizers) the first outside this file."""
    frame, inside_torch = sys._getframe(2), None
    while frame is not None:
        name = frame.f_code.co_filename
        if name != __file__:
            if "/torch/" not in name:
                break
            inside_torch = inside_torch or frame
        frame = frame.f_back
    frame = frame or inside_torch
    if frame is None:
        return "?"
    short = frame.f_code.co_filename.split("site-packages/")[-1].replace(f"{REPO}/", "")
    return f"{short}:{frame.f_lineno} {frame.f_code.co_name}"


@contextlib.contextmanager
def counting_reads(sites: collections.Counter):
    """Counts host reads of tensor values into ``sites`` (call site -> calls) while active."""
    from deepspeed.accelerator import get_accelerator

    saved = {name: getattr(torch.Tensor, name) for name in READERS}
    accelerator = get_accelerator()
    make_tensor, synchronize = torch.tensor, accelerator.synchronize

    def reader(name):
        original = saved[name]

        def read(self, *args, **kwargs):
            sites[f"Tensor.{name} @ {_call_site()}"] += 1
            return original(self, *args, **kwargs)

        return read

    def tensor(*args, **kwargs):
        if kwargs.get("device") is not None:
            sites[f"torch.tensor(device=) @ {_call_site()}"] += 1
        return make_tensor(*args, **kwargs)

    def synchronize_counted(*args, **kwargs):
        sites[f"accelerator.synchronize @ {_call_site()}"] += 1
        return synchronize(*args, **kwargs)

    try:
        for name in READERS:
            setattr(torch.Tensor, name, reader(name))
        torch.tensor, accelerator.synchronize = tensor, synchronize_counted
        yield
    finally:
        for name, original in saved.items():
            setattr(torch.Tensor, name, original)
        torch.tensor, accelerator.synchronize = make_tensor, synchronize


@contextlib.contextmanager
def counting_cuda_syncs(found: list[str]):
    """Appends to ``found`` each device sync CUDA reports while active (none without CUDA)."""
    if not torch.cuda.is_available():
        yield
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode(0)
            found.extend(str(w.message) for w in caught if "synchroniz" in str(w.message))


def micro_config(args) -> BertConfig:
    if args.preset:
        return BertConfig.preset(args.preset)
    return BertConfig.from_dict(
        {
            "num_hidden_layers": 12,
            "hidden_size": 8,
            "num_attention_heads": 1,
            "intermediate_size": 32,
            "vocab_size": 1024,
            "pad_token_id": 0,
        }
    )


def make_trainer(
    tmp: Path, ds_config: Path, cfg: BertConfig, args, accum: int
) -> tuple[Trainer, object]:
    """A Trainer on one rank with ``ds_config`` at micro-batch ``--batch`` and ``accum``
    micro-steps a step: (trainer, loader)."""
    ds = json.loads(ds_config.read_text())
    ds.pop("train_batch_size", None)
    ds.update(train_micro_batch_size_per_gpu=args.batch, gradient_accumulation_steps=accum)
    if args.torch_adam:  # torch's AdamW, not DeepSpeed's FusedAdam (a CUDA op to compile)
        ds["optimizer"].setdefault("params", {})["torch_adam"] = True
    work = tmp / f"{ds_config.stem}-accum{accum}"
    work.mkdir()
    (work / "ds.json").write_text(json.dumps(ds))
    (work / "model.json").write_text(json.dumps(cfg.to_dict()))
    config = parse_args(
        [
            *("--ds-config", str(work / "ds.json"), "--data", str(tmp / "shards")),
            *("--model", str(work / "model.json"), "--output-dir", str(work / "out")),
            *("--num-workers", "0", "--unpad", "false", "--save-every", "0"),
            *("--log-every", str(10**9), "--dropout", "0", "--engine", args.engine),
        ]
    )
    trainer = Trainer(config, distributed.init_distributed())
    trainer.build_engine()
    return trainer, trainer._loader()


def bare_step(
    cfg: BertConfig, dtype: torch.dtype, device: torch.device, batches: list[dict], unpad=False
):
    """Forward, backward and AdamW of the model alone (its encoder unpadded or not, as the
    trainer's ``--unpad`` resolved), cycling through ``batches``."""
    torch.manual_seed(0)
    model = BertForPreTraining(cfg, unpad=unpad).to(device=device, dtype=dtype).train()
    model.set_unpadded(unpad, every_batch=True)  # as trainer/prepare.py sets it
    try:  # fused where torch has the kernel (CUDA, CPU): the fastest plain step
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    except RuntimeError:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    cycle = iter(batches * 1000)

    def step():
        model(**next(cycle)).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def forward_backward(cfg: BertConfig, dtype: torch.dtype, device: torch.device, batches: list):
    """A plain forward and backward of the model, no optimizer: what an accumulation
    micro-step must cost."""
    torch.manual_seed(0)
    model = BertForPreTraining(cfg, unpad=False).to(device=device, dtype=dtype).train()
    cycle = iter(batches * 1000)

    def step():
        model(**next(cycle)).loss.backward()

    return step


def count_ops(step, count_steps: int) -> float:
    """Aten ops per call of ``step``, after 3 warm-up calls."""
    for _ in range(3):
        step()
    counter = OpCounter()
    with counter:
        for _ in range(count_steps):
            step()
    return counter.ops / count_steps


def measure(steps: dict, count_steps: int, timed_steps: int) -> dict[str, dict]:
    """Per arm: ops and reads per step (counted alone), then host times, arms alternated."""
    result: dict[str, dict] = {}
    for name, step in steps.items():
        for _ in range(3):  # warm-up: lazy state, allocator
            step()
        counter, sites, syncs = OpCounter(), collections.Counter(), []
        with counter, counting_reads(sites), counting_cuda_syncs(syncs):
            for _ in range(count_steps):
                step()
        result[name] = {
            "ops_per_step": counter.ops / count_steps,
            "reads_per_step": sum(sites.values()) / count_steps,
            "read_sites": {site: n / count_steps for site, n in sorted(sites.items())},
        }
        if torch.cuda.is_available():
            result[name]["cuda_syncs_per_step"] = len(syncs) / count_steps
    cuda = torch.cuda.is_available()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(timed_steps):
        for name, step in steps.items():
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            step()
            if cuda:
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - start)
    for name, seconds in times.items():
        ms = [1e3 * s for s in seconds]
        result[name]["step_ms"] = {
            "median": round(statistics.median(ms), 3),
            "min": round(min(ms), 3),
            "max": round(max(ms), 3),
        }
    return result


def log_step_reads(trainer: Trainer, batches) -> dict[str, float]:
    """The read sites of one optimizer step that logs (its update, then the record), with
    the trainer's log interval set to 1 for it."""
    config = trainer.config
    trainer.config = dataclasses.replace(config, log_every=1)
    writer = MetricsWriter(config.output_dir, enabled=False, max_steps=None, start_step=0)
    sites: collections.Counter = collections.Counter()
    try:
        with counting_reads(sites):
            trainer._optimizer_step(batches, None)
            trainer._log(writer)
    finally:
        trainer.config = config
    return dict(sorted(sites.items()))


def _sequences_per_s(arm: dict, batch: int) -> float:
    return round(1e3 * batch / arm["step_ms"]["median"], 1)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--ds-config", nargs="+", default=[str(REPO / "deploy" / "gpu.json")])
    p.add_argument("--preset", help="a model preset instead of the micro-BERT (e.g. tiny)")
    p.add_argument("--batch", type=int, default=2, help="micro-batch rows (default 2)")
    p.add_argument(
        "--accum",
        type=int,
        default=1,
        help="micro-steps per optimizer step; above 1 the row adds extra_micro_ops, what "
        "each micro-step past the first adds, counted against a one-micro-step trainer",
    )
    p.add_argument(
        "--engine", default="auto", choices=("auto", "torch", "deepspeed"), help="--engine"
    )
    p.add_argument("--steps", type=int, default=30, help="timed steps per arm (default 30)")
    p.add_argument("--count-steps", type=int, default=2, help="counted steps (default 2)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument(
        "--torch-adam",
        action="store_true",
        help="the configs' AdamW as torch's (deploy/gpu_bench.sh: TORCH_ADAM=1, its default)",
    )
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    from trainer.ops import use_environment_cache

    use_environment_cache()  # the trainer's op cache, as trainer/run.py (no second build)
    cfg = micro_config(args)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        write_synthetic(
            tmp / "shards",
            rows=64 * args.batch,
            shards=2,
            seq=128,
            max_pred=20,
            vocab_size=cfg.vocab_size,
        )
        for ds_config in map(Path, args.ds_config):
            single = None  # ops of one micro-step a step, beside --accum's
            if args.accum > 1:
                trainer, loader = make_trainer(tmp, ds_config, cfg, args, 1)
                batches = iter(loader)
                single = count_ops(lambda t=trainer, b=batches: t._optimizer_step(b, None), 2)
                loader.close()
                distributed.shutdown()
            trainer, loader = make_trainer(tmp, ds_config, cfg, args, args.accum)
            torch.set_num_threads(args.threads)  # after init_distributed, which may set them
            device = trainer.info.device
            batches = iter(loader)
            taken = [next(batches) for _ in range(8)]
            own = [{k: b[k].to(device) for k in MODEL_INPUTS} for b in taken]
            dtype = torch.bfloat16 if trainer.engine.bfloat16_enabled() else torch.float32
            steps = {
                "bare": bare_step(cfg, dtype, device, own),
                "trainer": lambda t=trainer, b=batches: t._optimizer_step(b, None),
            }
            result = measure(steps, args.count_steps, args.steps)
            result["trainer"]["log_step_read_sites"] = log_step_reads(trainer, batches)
            fwd_bwd = count_ops(forward_backward(cfg, dtype, device, own), args.count_steps)
            loader.close()
            distributed.shutdown()
            bare, ours = result["bare"], result["trainer"]
            row = {
                "ds_config": str(ds_config),
                "model": args.preset or "micro (12 layers, hidden 8)",
                "batch": args.batch,
                "accum": args.accum,
                "dtype": str(dtype).removeprefix("torch."),
                "threads": torch.get_num_threads(),
                "load_average": [round(x, 2) for x in os.getloadavg()],
                "engine": trainer.engine_name,
                "ops_ratio": round(ours["ops_per_step"] / bare["ops_per_step"], 3),
                "fwd_bwd_ops": fwd_bwd,
                "time_ratio": round(ours["step_ms"]["median"] / bare["step_ms"]["median"], 3),
                "sequences_per_s": {
                    "bare": _sequences_per_s(bare, args.batch),  # one micro-batch a step
                    "trainer": _sequences_per_s(ours, args.batch * args.accum),
                },
                "bare": bare,
                "trainer": ours,
            }
            if single is not None:  # what each micro-step past the first adds
                extra = (ours["ops_per_step"] - single) / (args.accum - 1)
                row["extra_micro_ops"] = extra
                row["extra_micro_ratio"] = round(extra / fwd_bwd, 3)
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
