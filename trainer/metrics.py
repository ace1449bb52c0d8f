"""Training metrics: per-batch counts, model FLOPs and MFU, and where they are written.

Every ``--log-every`` steps rank 0 writes one record to ``OUTPUT_DIR/metrics.jsonl``, to
TensorBoard (``OUTPUT_DIR/tensorboard``) and to the console (a tqdm bar on a terminal, a
compact line with the ETA otherwise; evaluations as a line beside their baselines). Counts are summed over ranks with one all-reduce per log step.

Record keys: ``step``, ``loss``, ``mlm_loss``, ``mlm_accuracy``, ``nsp_loss``,
``nsp_accuracy``, ``mlm_baseline_accuracy`` and ``nsp_baseline_accuracy`` (the most
frequent target's and the majority label's share among the same rows), ``lr``, ``grad_norm``, ``sequences_per_s``, ``tokens_per_s`` (real,
non-padding tokens), ``tflops_per_s``, ``mfu`` (null without a known peak), ``epoch``,
``samples`` (stream position), ``objective`` (``mlm+nsp``, or ``mlm`` when no row had an NSP
label: MLM-only shards, whose ``nsp_*`` values are then null: NSP was not trained);
evaluation records have ``split: "eval"`` (and ``eval_mask_rate``: the fixed rate of
held-out MLM rows, trainer/masking.py; null for NSP rows' static masks). Distillation runs
(trainer/distillation.py) add ``kl_loss`` and ``cos_loss``; their ``loss`` is the
distillation objective, ``mlm_loss`` / ``nsp_loss`` the hard losses, and FLOPs include the
teacher's forward pass.

Model FLOPs (:func:`model_flops`) count the matmuls BERT must do for the real tokens of a
batch, times 3 for forward + backward: per row of n tokens, L x (2n(4H² + 2HI) + 4n²H)
for the encoder, 2(H² + HV) per masked prediction for the MLM head (it runs only there),
and the pooler. Padding is not counted, so MFU is what the hardware did usefully.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import torch

from model import BertConfig

logger = logging.getLogger(__name__)

# Dense bf16/fp16 tensor-core peaks (TFLOP/s) by device-name substring, most specific first.
PEAK_TFLOPS = (
    ("H200", 989.0),
    ("H100 PCIe", 756.0),
    ("H100", 989.0),
    ("A100", 312.0),
    ("A10G", 70.0),
    ("L4", 121.0),
    ("V100", 125.0),
)
# Counts summed across ranks: the first ones come from the model's outputs (device
# tensors, read once per log step), the others from the batch on the host.
DEVICE_COUNTS = (
    "loss",
    "mlm_loss",
    "nsp_loss",
    "mlm_correct",
    "mlm_total",
    "nsp_correct",
    "nsp_total",
    "kl_loss",
    "cos_loss",  # distillation only (trainer/distillation.py); 0 otherwise
)
HOST_COUNTS = ("sequences", "tokens", "flops", "micro_steps")
COUNTS = DEVICE_COUNTS + HOST_COUNTS


def model_flops(config: BertConfig, attention_mask: torch.Tensor, num_predictions: int) -> float:
    """Training FLOPs (forward + backward) of one batch; see the module docstring.

    Args:
        attention_mask: (B, T), 1 on real tokens.
        num_predictions: masked positions of the batch that carry a target.
    """
    lengths = attention_mask.sum(1).double()
    tokens, squares = float(lengths.sum()), float((lengths**2).sum())
    return config.training_flops(tokens, squares, num_predictions, attention_mask.shape[0])


def grad_norm(module: torch.nn.Module) -> torch.Tensor:
    """L2 norm of all gradients of ``module`` (before clipping, as DeepSpeed reports it), on
    their device (read with the log's counts); 0 without gradients."""
    norms = [p.grad.detach().float().norm() for p in module.parameters() if p.grad is not None]
    return torch.linalg.vector_norm(torch.stack(norms)) if norms else torch.zeros(())


def peak_tflops(override: float | None, dtype: str) -> float | None:
    """The device's peak for MFU: the flag, else a known GPU (bf16/fp16 only), else None."""
    if override:
        return override
    if not torch.cuda.is_available() or dtype == "fp32":
        return None
    name = torch.cuda.get_device_name()
    return next((peak for key, peak in PEAK_TFLOPS if key in name), None)


def batch_counts(out, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """float64 (len(DEVICE_COUNTS),) counts of one micro-batch, on the model's device."""
    with torch.no_grad():
        # The rows the MLM head ran on (the real predictions when unpadded); -100 at padding.
        ids = out.prediction_targets(batch["masked_lm_positions"], batch["masked_lm_ids"])
        targets = ids != -100
        mlm_correct = (out.prediction_logits.argmax(-1) == ids).sum()
        nsp_valid = batch["next_sentence_label"] >= 0
        nsp_correct = (
            (out.nsp_logits.argmax(-1) == batch["next_sentence_label"]) & nsp_valid
        ).sum()
        values = [
            out.loss.detach().double(),
            out.mlm_loss.detach().double(),
            out.nsp_loss.detach().double(),
            mlm_correct.double(),
            targets.sum().double(),
            nsp_correct.double(),
            nsp_valid.sum().double(),
        ]
        for name in ("kl_loss", "cos_loss"):
            value = getattr(out, name, None)
            values.append(out.loss.new_zeros(()) if value is None else value.detach())
        values = [v.double() for v in values]
        return torch.stack(values)


def host_counts(batch: dict[str, torch.Tensor], config: BertConfig) -> list[float]:
    """HOST_COUNTS of one micro-batch still on the host: sequences, real tokens, FLOPs, 1."""
    mask = batch["attention_mask"]
    predictions = int((batch["masked_lm_positions"] != 0).sum())
    flops = model_flops(config, mask, predictions)
    return [float(mask.shape[0]), float(mask.sum()), flops, 1.0]


def target_histogram(batch: dict[str, torch.Tensor], vocab_size: int) -> torch.Tensor:
    """float64 (V + 2,): how often each token id is a real MLM target in one micro-batch
    still on the host, then the rows with next_sentence_label 0 and 1 (the counts the
    trivial baselines of a window's rows come from, see trainer/evaluate.py baselines)."""
    ids = batch["masked_lm_ids"]
    real = (batch["masked_lm_positions"] != 0) & (ids >= 0)  # as the losses count targets
    targets = ids[real].long()
    labels = batch["next_sentence_label"]
    counts = torch.bincount(targets, minlength=vocab_size)[:vocab_size]
    nsp = torch.bincount(labels[labels >= 0].long(), minlength=2)[:2]
    return torch.cat([counts, nsp]).double()


def summarize(
    totals: torch.Tensor,
    seconds: float,
    world_size: int,
    peak: float | None,
    *,
    distill: bool = False,
) -> dict:
    """Metrics from counts summed over ranks and micro-steps; losses are means per micro-step.

    ``distill``: add kl_loss and cos_loss (trainer/distillation.py; cos_loss 0 when unused).
    """
    c = dict(zip(COUNTS, totals.tolist(), strict=True))
    steps = max(c["micro_steps"], 1.0)
    tflops = c["flops"] / seconds / 1e12 if seconds > 0 else 0.0
    extra = {k: c[k] / steps for k in ("kl_loss", "cos_loss")} if distill else {}
    return {
        **extra,
        "loss": c["loss"] / steps,
        "mlm_loss": c["mlm_loss"] / steps,
        "mlm_accuracy": c["mlm_correct"] / max(c["mlm_total"], 1.0),
        "nsp_loss": c["nsp_loss"] / steps if c["nsp_total"] else None,
        "nsp_accuracy": c["nsp_correct"] / c["nsp_total"] if c["nsp_total"] else None,
        "objective": "mlm+nsp" if c["nsp_total"] else "mlm",
        "sequences_per_s": c["sequences"] / seconds if seconds > 0 else 0.0,
        "tokens_per_s": c["tokens"] / seconds if seconds > 0 else 0.0,
        "tflops_per_s": tflops,
        "mfu": tflops / (peak * world_size) if peak else None,
    }


class MetricsWriter:
    """Rank 0's sinks: metrics.jsonl, TensorBoard, console. Other ranks get a no-op writer.

    The console: on a terminal a tqdm bar (log lines print above it); otherwise one line per
    record, :func:`progress_line` or :func:`eval_line`.
    """

    def __init__(
        self,
        output_dir: str,
        *,
        enabled: bool,
        max_steps: int | None,
        start_step: int,
        budget_s: float | None = None,
        run_id: str | None = None,
    ):
        self.enabled = enabled
        self._jsonl = self._tb = self._bar = None
        self._exit = contextlib.ExitStack()
        # In every record: which run and which process wrote it (report/records.py keeps the
        # run as its checkpoints hold it from a file that holds more).
        self._stamp = {"run_id": run_id, "segment": uuid.uuid4().hex[:12], "start_step": start_step}
        if not enabled:
            return
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        self._jsonl = open(Path(output_dir, "metrics.jsonl"), "a", encoding="utf-8")  # noqa: SIM115
        try:
            from torch.utils.tensorboard import SummaryWriter

            # A resume drops the events a killed run logged past its checkpoint.
            purge = start_step + 1 if start_step else None
            self._tb = SummaryWriter(str(Path(output_dir, "tensorboard")), purge_step=purge)
        except ImportError:  # tensorboard is a dependency, but a missing one must not stop a run
            logger.warning("tensorboard is not installed: no TensorBoard logs")
        if sys.stderr.isatty():
            from tqdm import tqdm
            from tqdm.contrib.logging import logging_redirect_tqdm

            self._bar = tqdm(total=max_steps, initial=start_step, unit="step", dynamic_ncols=True)
            self._exit.enter_context(logging_redirect_tqdm())  # log lines above the bar
        self._max_steps, self._start_step, self._start = max_steps, start_step, time.time()
        self._budget_s = budget_s

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        record = {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in record.items()
        }
        self._jsonl.write(json.dumps({**record, **self._stamp}) + "\n")
        self._jsonl.flush()
        split, step = record.get("split", "train"), record["step"]
        if self._tb is not None:
            for key, value in record.items():
                if isinstance(value, (int, float)) and key not in ("step",):
                    self._tb.add_scalar(f"{split}/{key}", value, step)
            self._tb.flush()
        if split == "eval":
            logger.info("%s", eval_line(record))
        elif self._bar is not None:
            self._bar.update(step - self._bar.n)
            self._bar.set_postfix_str(_bar_postfix(record), refresh=True)
        else:
            logger.info("%s", progress_line(record, self._max_steps, self._eta(record)))

    def _eta(self, record: dict[str, Any]) -> float | None:
        """Seconds to the step limit at the pace since this writer opened (evaluations
        included), or to the end of the time budget, whichever is sooner."""
        step = record["step"]
        done, elapsed = step - self._start_step, time.time() - self._start
        etas = []
        if self._max_steps is not None and done > 0:
            etas.append((self._max_steps - step) * elapsed / done)
        if self._budget_s is not None and record.get("train_seconds") is not None:
            etas.append(max(0.0, self._budget_s - record["train_seconds"]))
        return min(etas) if etas else None

    def close(self) -> None:
        self._exit.close()
        for sink in (self._bar, self._tb, self._jsonl):
            if sink is not None:
                sink.close()


def format_duration(seconds: float | None) -> str:
    """``42 -> "42s"``, ``252 -> "4m12s"``, ``3720 -> "1h02m"``, ``None -> "?"``."""
    if seconds is None or not math.isfinite(seconds):
        return "?"
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def progress_line(r: dict[str, Any], max_steps: int | None, eta_s: float | None) -> str:
    """One training record as a console line, each accuracy beside the trivial baseline of
    the same rows, e.g. ``step 300/1500  loss 6.1234  MLM acc 0.123 (baseline 0.061)  NSP acc
    0.654 (baseline 0.512)  lr 9.00e-04  46.2 seq/s  3512 tok/s  ETA 4m12s`` (MFU on a known
    GPU)."""
    parts = [f"step {r['step']}/{max_steps}" if max_steps is not None else f"step {r['step']}"]
    if r.get("loss") is not None:
        parts.append(f"loss {r['loss']:.4f}")
    mlm = _beside(r["mlm_accuracy"], r.get("mlm_baseline_accuracy"), "baseline")
    parts.append(f"MLM acc {mlm}  {_nsp(r, 'baseline')}")
    if r.get("lr") is not None:
        parts.append(f"lr {r['lr']:.2e}")
    if r.get("sequences_per_s"):
        parts.append(f"{r['sequences_per_s']:.1f} seq/s  {r['tokens_per_s']:.0f} tok/s")
    if r.get("mfu") is not None:
        parts.append(f"MFU {100 * r['mfu']:.1f}%")
    parts.append(f"ETA {format_duration(eta_s)}")
    return "  ".join(parts)


def eval_line(r: dict[str, Any]) -> str:
    """A held-out record, each number beside its trivial baseline when the record has them:
    ``eval at step 500: MLM acc 0.312 (most-frequent-token 0.061)  NSP acc 0.700 (majority
    0.512)  MLM loss 5.102 (unigram 6.310)``; MLM-only: ``eval at step 500 (masked at 15%):
    MLM acc 0.312 (most-frequent-token 0.061)  NSP not trained  MLM loss ...``."""
    mlm = _beside(r["mlm_accuracy"], r.get("mlm_baseline_accuracy"), "most-frequent-token")
    parts = [f"MLM acc {mlm}", _nsp(r, "majority")]
    if r.get("mlm_loss") is not None:
        parts.append(f"MLM loss {_beside(r['mlm_loss'], r.get('mlm_unigram_loss'), 'unigram')}")
    rate = r.get("eval_mask_rate")
    masked = f" (masked at {100 * rate:g}%)" if rate is not None else ""
    return f"eval at step {r['step']}{masked}: " + "  ".join(parts)


def _nsp(r: dict[str, Any], name: str) -> str:
    """``NSP acc 0.700 (majority 0.512)``, or ``NSP not trained`` (MLM-only shards)."""
    if r.get("objective") == "mlm":
        return "NSP not trained"
    if r.get("nsp_accuracy") is None:  # NSP trained, these held-out rows have no label
        return "NSP not evaluated"
    return f"NSP acc {_beside(r['nsp_accuracy'], r.get('nsp_baseline_accuracy'), name)}"


def _beside(value: float, baseline: float | None, name: str) -> str:
    """``(0.3124, 0.061, "x") -> "0.312 (x 0.061)"``; just the value without a baseline."""
    return f"{value:.3f}" + ("" if baseline is None else f" ({name} {baseline:.3f})")


def _bar_postfix(r: dict[str, Any]) -> str:
    """The tqdm bar's text (the bar shows step/max, rate and ETA itself)."""
    parts = [
        f"loss {r['loss']:.4f}" if r.get("loss") is not None else None,
        f"mlm {_beside(r['mlm_accuracy'], r.get('mlm_baseline_accuracy'), 'base')}",
        _nsp(r, "base").replace("NSP acc", "nsp"),
        f"lr {r['lr']:.1e}" if r.get("lr") is not None else None,
        f"{r['sequences_per_s']:.1f} seq/s" if r.get("sequences_per_s") else None,
        f"MFU {100 * r['mfu']:.1f}%" if r.get("mfu") is not None else None,
    ]
    return ", ".join(p for p in parts if p)
