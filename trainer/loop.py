"""The training run: build the engine, resume, step, log, evaluate, checkpoint, export.

Order of a run (every rank): check paths, the DeepSpeed JSON's keys (trainer/dskeys.py) and
its batch sizes against the world size, open and check the shards, resolve the model config
against the manifest (and the checkpoint's, with ``--resume``: model and data must be
the same), build the model and its engine (trainer/engine.py: torch's, or
``deepspeed.initialize``), load the checkpoint named by
``--resume`` (saved on another number of ranks: its universal conversion, made once by
rank 0, trainer/universal.py), then train until
``--max-steps`` optimizer steps, and finally save a checkpoint and (rank 0) export it to
``OUTPUT_DIR/hf``.

A time budget (``--max-minutes``, trainer/schedule.py) also ends the run: the training
clock (this loop's wall time plus that of the runs it resumes) is agreed by all ranks in
the per-step all-reduce below, so every rank stops after the same step, and the
learning rate follows it. That all-reduce is of host numbers, over a CPU (gloo) group
(:func:`distributed.host_max`): a step reads nothing back from the device for it, so the
host runs ahead of a GPU.

Non-finite loss: training stops. Each step's flag stays on the device, gathered with the
first step that raised it; it is read (one small all-reduce) before the update of every
step that reads the device anyway: a log, save or evaluation step, and the last. A NaN or
infinite loss there stops the run before that update; one between two such steps is found
at the next, named by its own step. The steps in between may carry it into the weights,
which no checkpoint holds: the save step reads the flag first, and the save checks the
weights. A :class:`checkpoint.NonFiniteError` ends the run with exit code 3 and the last
checkpoint stays the one to resume from (lower the learning rate, or check the data around
the logged stream position). Skipping the step instead would hide a diverging run. With
fp16 DeepSpeed's loss scaler still skips steps whose *gradients* overflow, as usual.

Distillation (``--teacher``, trainer/distillation.py): the same run with a frozen teacher
beside the engine; its forward and the distillation loss replace the engine's loss, its
identity is saved in the trainer state and checked on resume.

SIGINT / SIGTERM (trainer/signals.py): a rank's "stop requested" flag rides in the same
all-reduce, so every rank finishes the same step, skips evaluation, saves a checkpoint
(position and RNG states: the resumed run is the uninterrupted one) and exits 130 / 143.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from pipeline.core.rng import derive_seed

from . import checkpoint, compiling, distributed, masking, metrics, ops, prepare, universal
from .config import TrainConfig
from .data import PretrainingStream, StreamSpec, make_loader
from .distillation import Distiller, check_resumed_teacher
from .dsconfig import (
    load_ds_config,
    precision,
    resolve_ds_config,
    warmup_warning,
    with_precision,
)
from .dskeys import check_keys
from .engine import TorchEngine, check_resumed_engine, choose_engine
from .evaluate import baselines
from .schedule import time_budget_scheduler
from .signals import StopRequest, grace_warning

logger = logging.getLogger(__name__)

MODEL_INPUTS = (
    "input_ids",
    "segment_ids",
    "attention_mask",
    "masked_lm_positions",
    "masked_lm_ids",
    "next_sentence_label",
)

# Above any step count, and exact in float64 (the log's packed read): the non-finite key.
NEVER = 1 << 50

# DeepSpeed's WarmupLR, WarmupDecayLR and WarmupCosineLR (and our TimeBudgetLR) set the first
# rate in their __init__ by calling their own get_lr() at iteration -1, which logs this
# warning on every run: DeepSpeed's own start-up, nothing wrong with the run.
SCHEDULER_START_WARNING = "Attempting to get learning rate from scheduler before it has started"


@contextlib.contextmanager
def _without_scheduler_start_warning() -> Iterator[None]:
    """Drop exactly that warning while the engine (and its scheduler) is built; one logged
    later would say something and is kept."""
    from deepspeed.utils import logger as ds_logger

    def keep(record: logging.LogRecord) -> bool:
        return record.getMessage() != SCHEDULER_START_WARNING

    ds_logger.addFilter(keep)
    try:
        yield
    finally:
        ds_logger.removeFilter(keep)


def split_log_read(
    read: torch.Tensor, targets: int, extra: int
) -> tuple[torch.Tensor, torch.Tensor, list[float]]:
    """The log's one read (a host tensor): the summed counts, the target histogram and
    the ``extra`` values after them (the gradient norm, the non-finite key) as floats."""
    totals, histogram, tail = read.split([len(metrics.COUNTS), targets, extra])
    return totals, histogram, tail.tolist()


@dataclass
class RunState:
    """Where the run is: optimizer steps done and the stream position of the next row."""

    step: int = 0
    position: int = 0
    last_saved: int = -1
    train_s: float = 0.0  # training clock, the same on every rank (see the module docstring)
    clock_base: float = 0.0  # training seconds of the runs this one resumes
    clock_start: float = field(default_factory=time.perf_counter)
    out_of_time: bool = False
    stopped_by: int | None = None  # the signal all ranks agreed to stop on (trainer/signals.py)
    grad_norm: torch.Tensor | None = None  # computed here only where DeepSpeed reports none
    # The non-finite check of a log-only step left to the log's read (Trainer._before_update).
    check_at_log: bool = False
    # The run's id in every metrics record (report/records.py): new on a fresh start, the
    # checkpoint's on a resume (None for a checkpoint from before run ids were saved).
    run_id: str | None = None
    first_step_s: float | None = None  # this run's first step, compiling included
    counts: torch.Tensor | None = None  # device counts since the last log
    host: list[float] = field(default_factory=lambda: [0.0] * len(metrics.HOST_COUNTS))
    targets: torch.Tensor | None = None  # metrics.target_histogram since the last log
    window_start: float = field(default_factory=time.perf_counter)


class Trainer:
    """One run of trainer/run.py on this rank (see the module docstring)."""

    def __init__(
        self, config: TrainConfig, info: distributed.DistInfo, stop: StopRequest | None = None
    ):
        config = prepare.check_paths(config)  # --data shards/manifest.json: its directory
        self.config, self.info = config, info
        # What this rank is doing, for a failure's one line (trainer/failure.py).
        self.activity = "start-up"
        # Not installed by default: only trainer/run.py owns the process's signals.
        self.stop = stop or StopRequest(resume="", output_dir=config.output_dir)
        ds = load_ds_config(config.ds_config)
        where = f"--ds-config {config.ds_config}"
        check_keys(ds, where=where)
        ds = with_precision(ds, config.precision, info.device)
        self.ds, self.sizes = resolve_ds_config(
            ds, info.world_size, config.step_limit or 0, where=where
        )
        compiling.check_zero(self.ds, config.compile, where=where)
        warning = warmup_warning(self.ds, config.step_limit)
        if warning and info.is_main:
            logger.warning("%s", warning)
        self.engine_name, self.engine_why = choose_engine(config.engine, self.ds, where=where)
        self.scheduler_factory = (  # None: DeepSpeed builds the JSON's scheduler
            time_budget_scheduler(self.ds, config.budget_s, where=where)
            if config.budget_s is not None
            else None
        )
        self.shards = prepare.open_shards(config.data, config, flag="--data")
        self.eval_shards = (
            prepare.open_shards(config.eval_data, config, flag="--eval-data")
            if config.eval_data
            else None
        )
        self.model_config = prepare.model_config(config, self.shards.manifest)
        self.distiller = None  # --teacher: trainer/distillation.py
        if config.teacher is not None:
            self.distiller = Distiller(config, self.model_config, self.shards)
        if self.eval_shards is not None:
            prepare.check_eval_data(
                config.data, self.shards.manifest, config.eval_data, self.eval_shards.manifest
            )
            prepare.check_fit(self.model_config, self.eval_shards.manifest)
        self.fingerprint = prepare.data_fingerprint(self.shards)
        self.resume = checkpoint.find_resume(config.resume, config.output_dir)
        replaced = checkpoint.check_start(
            config.output_dir,
            self.resume,
            overwrite=config.overwrite,
            resume_command=self.stop.resume,
            overwrite_command=self.stop.overwrite,
        )
        if replaced:  # --overwrite: gone before anything is written (and before a resume)
            if info.is_main:
                checkpoint.start_over(config.output_dir, replaced, self.resume)
            distributed.barrier()
        if self.resume is not None:
            self._check_resume(*self.resume)
        self.masker = masking.masker_for(self.shards, config)  # MLM shards: always one
        # The rate its training rows are masked at, in every train record (the held-out
        # rows' is fixed, --eval-mask-rate): the plots name both beside the accuracies.
        params = self.shards.manifest.get("params", {})
        self.train_mask_rate = (
            self.masker.rate if self.masker is not None else params.get("masked_lm_prob")
        )
        self.eval_masker = self.eval_shards and masking.eval_masker_for(self.eval_shards, config)
        self.precision = precision(self.ds)
        self.peak = metrics.peak_tflops(config.peak_tflops, self.precision)
        self._log_config()

    def _check_resume(self, directory: str, tag: str) -> None:
        """Refuse another model or other data before anything is converted or built; on
        another world size, resume from the checkpoint's universal conversion
        (trainer/universal.py)."""
        prepare.check_resumed_model(self.config, self.model_config, directory, tag)
        prepare.check_resumed_precision(self.config, self.ds, directory, tag)
        if self.info.local_rank == 0:  # one process per node: its disk, shared or its own
            # Removed first, then measured: a partial save may be what filled the disk.
            checkpoint.remove_incomplete(self.config.output_dir)
            checkpoint.check_free_space(directory, tag, self.config.output_dir)
        saved = checkpoint.read_state(directory, tag)
        if saved is not None:  # trainer_state.json: engine, data and batch, before loading
            check_resumed_engine(saved, self.engine_name, self.engine_why, f"{directory}/{tag}")
            prepare.check_resumed_data(self.config, self.fingerprint, saved, f"{directory}/{tag}")
            change = prepare.batch_change(saved, self.sizes)
            if change and self.info.is_main:
                logger.warning("%s", change)
        change = prepare.schedule_change(directory, tag, self.ds, self.config)
        if change and self.info.is_main:
            logger.warning("%s", change)
        self.resume = universal.for_world_size(
            directory,
            tag,
            self.info.world_size,
            is_main=self.info.is_main,
            device=self.info.device,
        )
        if universal.is_universal(*self.resume):
            self.ds.setdefault("checkpoint", {})["load_universal"] = True

    def _log_config(self) -> None:
        if self.info.is_main:
            logger.info("trainer config: %s", json.dumps(self.config.to_dict(), sort_keys=True))
            logger.info("deepspeed config (resolved): %s", json.dumps(self.ds, sort_keys=True))
            logger.info("model config: %s", json.dumps(self.model_config.to_dict(), sort_keys=True))
            logger.info("batch: %s, world size %d", self.sizes, self.info.world_size)
            logger.info("precision: %s (--precision %s)", self.precision, self.config.precision)
            ranks = "one rank" if self.info.world_size == 1 else f"{self.info.world_size} ranks"
            how = "DDP over " + ranks if self.info.world_size > 1 else ranks
            if self.engine_name == "deepspeed":
                stage = (self.ds.get("zero_optimization") or {}).get("stage", 0)
                how = f"ZeRO stage {stage}, {ranks}"
            logger.info("engine: %s (%s; %s)", self.engine_name, how, self.engine_why)

    def build_engine(self) -> None:
        model = prepare.build_model(self.config, self.model_config, self.info.device.type)
        if self.distiller is not None:  # outside the engine: no optimizer, checkpoint, ZeRO
            self.distiller.prepare(model, self.info.device, fresh=self.resume is None)
        self.own_grad_norm = False
        # Whether a non-finite step leaves the weights as they were (trainer/engine.py), so
        # a step that only logs may check it after its update, in the log's one read.
        self.skips_non_finite_updates = False
        if self.engine_name == "torch":  # trainer/engine.py
            with _without_scheduler_start_warning():
                self.engine = TorchEngine(
                    model,
                    prepare.param_groups(model),
                    self.ds,
                    device=self.info.device,
                    world_size=self.info.world_size,
                    rank=self.info.rank,
                    accumulation=self.sizes.accumulation,
                    scheduler_factory=self.scheduler_factory,
                )
            self.skips_non_finite_updates = self.engine.skips_non_finite_updates
        else:
            self._deepspeed_engine(model)
        compiling.apply(self.engine, self.config)  # --compile: in place (trainer/compiling.py)
        self.state = RunState()
        self._first_bad: torch.Tensor | None = None  # _note_non_finite's, on the device
        resume = self.resume
        if resume is None:
            torch.manual_seed(derive_seed(self.config.seed, "dropout", self.info.rank))
            ids = distributed.gather_objects(uuid.uuid4().hex, self.info.world_size)
            self.state.run_id = ids[0]  # rank 0's, on every rank
            return
        saved = checkpoint.load(self.engine, *resume)
        prepare.check_resumed_data(self.config, self.fingerprint, saved, "/".join(resume))
        teacher = None if self.distiller is None else self.distiller.identity
        check_resumed_teacher(saved.get("teacher"), teacher, f"{resume[0]}/{resume[1]}")
        self.state.step, self.state.position = saved["step"], saved["position"]
        self.state.last_saved = saved["step"]
        self.state.run_id = saved.get("run_id")
        self.state.clock_base = self.state.train_s = float(saved.get("train_seconds", 0.0))
        checkpoint.restore_rng(
            saved,
            self.info.rank,
            self.info.world_size,
            derive_seed(self.config.seed, "dropout", self.info.rank, saved["step"]),
        )

    def _deepspeed_engine(self, model: torch.nn.Module) -> None:
        import deepspeed

        ops.announce_optimizer(self.ds)  # its op may be compiled first: say so
        with _without_scheduler_start_warning():
            self.engine, *_ = deepspeed.initialize(
                model=model,
                model_parameters=prepare.param_groups(model),
                config=self.ds,
                lr_scheduler=self.scheduler_factory,
            )
        # DeepSpeed reports no gradient norm for fp32 without ZeRO (it clips, then drops it).
        self.own_grad_norm = self.engine.zero_optimization_stage() == 0 and self.precision == "fp32"
        if self.own_grad_norm and self.info.world_size == 1:
            # Averaging gradients over one process is the identity, but DeepSpeed still
            # flattens, all-reduces and copies them back (bench/train_speed.py times the
            # trainer's step against the bare one; give it a ZeRO-0 fp32 --ds-config).
            self.engine.enable_backward_allreduce = False

    def _loader(self):
        spec = StreamSpec(
            micro=self.sizes.micro,
            world_size=self.info.world_size,
            rank=self.info.rank,
            seed=self.config.seed,
            start=self.state.position,
            window=self.config.shuffle_window,
            masking=self.config.masking,
            max_width=self.model_config.max_position_embeddings,
        )
        stream = PretrainingStream(self.shards, spec, self.masker)
        return make_loader(stream, self.config.num_workers)

    def done(self) -> bool:
        """The step limit is reached, the time budget spent or a stop signal agreed on."""
        limit = self.config.step_limit
        s = self.state
        return (limit is not None and s.step >= limit) or s.out_of_time or s.stopped_by is not None

    def train(self) -> dict:
        """Train to the step limit or the end of the time budget; returns the last record."""
        c, s = self.config, self.state
        writer = metrics.MetricsWriter(
            c.output_dir,
            enabled=self.info.is_main,
            max_steps=c.step_limit,
            start_step=s.step,
            budget_s=c.budget_s,
            run_id=s.run_id,
        )
        samples = self._samples_file()
        last: dict = {}
        loader = self._loader()
        try:
            batches = iter(loader)
            s.window_start = s.clock_start = time.perf_counter()
            s.out_of_time = c.budget_s is not None and s.clock_base >= c.budget_s
            self.stop.training = True  # from now on a first signal stops after the step
            check_grace = bool(c.signal_grace)  # at the first checkpoint only; 0: no check
            while not self.done():
                start = time.perf_counter()
                self.activity = f"step {s.step + 1}"
                self._optimizer_step(batches, samples)
                step_s = time.perf_counter() - start
                s.first_step_s = step_s if s.first_step_s is None else s.first_step_s
                if s.step % c.log_every == 0 or self.done():
                    last = self._log(writer)
                evaluate = c.eval_every and self.eval_shards and s.step % c.eval_every == 0
                if evaluate and s.stopped_by is None:
                    writer.write(self.evaluate())
                if c.save_every and s.step % c.save_every == 0:
                    self._save()
                    if check_grace:
                        self._warn_grace(step_s)
                        check_grace = False
            if s.last_saved != s.step:
                self._save()
            evaluated = c.eval_every and s.step % c.eval_every == 0
            if self.eval_shards is not None and not evaluated and s.stopped_by is None:
                writer.write(self.evaluate())
        finally:
            self.stop.training = False
            loader.close()  # its workers would keep a failed run's exit waiting (data.py)
            writer.close()
            if samples is not None:
                samples.close()
        return last

    def _optimizer_step(self, batches, samples) -> None:
        s, engine = self.state, self.engine
        bad = torch.zeros((), dtype=torch.bool, device=self.info.device)
        for micro in range(self.sizes.accumulation):
            batch = next(batches)
            row_ids = batch.pop("row_ids")
            if samples is not None:
                samples.write(f"{s.step + 1} {' '.join(map(str, row_ids.tolist()))}\n")
            host = metrics.host_counts(batch, self.model_config)
            if self.distiller is not None:
                host[metrics.HOST_COUNTS.index("flops")] += self.distiller.forward_flops(batch)
            s.host = [a + b for a, b in zip(s.host, host, strict=True)]
            seen = metrics.target_histogram(batch, self.model_config.vocab_size)
            s.targets = seen if s.targets is None else s.targets + seen
            batch = {k: batch[k].to(self.info.device, non_blocking=True) for k in MODEL_INPUTS}
            out = engine(**batch) if self.distiller is None else self.distiller(engine, batch)
            bad |= ~torch.isfinite(out.loss.detach())
            engine.backward(out.loss)
            if micro == self.sizes.accumulation - 1:
                self._before_update(bad)
            engine.step()
            counts = metrics.batch_counts(out, batch)
            s.counts = counts if s.counts is None else s.counts + counts
            s.position += self.sizes.global_micro
        if samples is not None:
            samples.flush()
        s.step += 1

    def _before_update(self, bad: torch.Tensor) -> None:
        """At the accumulation boundary, before the optimizer step: training clock and stop
        signal (agreed on the host), time budget; on a step that reads the device anyway,
        the non-finite flags since the last such step; the grad norm to log.

        Args:
            bad: bool, shape (), on the device: this step's loss was not finite.
        """
        s, c = self.state, self.config
        local_s = s.clock_base + time.perf_counter() - s.clock_start
        stop = float(self.stop.signum or 0)  # the signal this rank got, if any
        s.train_s, stop_anywhere = distributed.host_max([local_s, stop])
        if stop_anywhere > 0:
            s.stopped_by = int(stop_anywhere)
            self.stop.agree(s.stopped_by)
        if self.scheduler_factory is not None:
            self.engine.lr_scheduler.elapsed_s = s.train_s  # the rate after this update
            s.out_of_time = s.train_s >= c.budget_s
        step = s.step + 1
        last = s.out_of_time or s.stopped_by or (c.step_limit is not None and step >= c.step_limit)
        self._note_non_finite(bad, step)
        saving = c.save_every and step % c.save_every == 0
        evaluating = c.eval_every and self.eval_shards is not None and step % c.eval_every == 0
        logging = step % c.log_every == 0
        # An engine that skips a non-finite update on the device (trainer/engine.py) lets a
        # step that only logs check in the log's one read; a save, an evaluation or the last
        # step checks before its update, as every step of an engine that would apply it.
        skips = self.skips_non_finite_updates
        s.check_at_log = logging and skips and not (last or saving or evaluating)
        if (last or logging or saving or evaluating) and not s.check_at_log:
            self._stop_if_non_finite(step)
        if self.own_grad_norm and (logging or last):
            s.grad_norm = metrics.grad_norm(self.engine.module)  # gradients are reduced by now

    def _note_non_finite(self, bad: torch.Tensor, step: int) -> None:
        """Keep, on the device, the first step since the last read whose loss was not
        finite (0: none): a few ops, no read."""
        if self._first_bad is None:
            self._first_bad = torch.zeros((), dtype=torch.int64, device=self.info.device)
        first = self._first_bad
        self._first_bad = torch.where(bad & (first == 0), step, first)

    def _non_finite_key(self) -> torch.Tensor:
        """The flags kept by :meth:`_note_non_finite`, every rank's, on the device (no read):
        shape (1,), NEVER minus the earliest step whose loss was not finite, 0 for none."""
        if self._first_bad is None:
            return torch.zeros(1, dtype=torch.int64, device=self.info.device)
        key = torch.where(self._first_bad > 0, NEVER - self._first_bad, 0)
        return distributed.all_reduce_max(key.reshape(1))

    def _stop_if_non_finite(self, step: int, found: int | None = None) -> None:
        """Read the flags kept by :meth:`_note_non_finite` (every rank's: the earliest step
        wins) before ``step``'s update; ``found``: the key :meth:`_non_finite_key` gave,
        read with the log's counts after the update, which the engine skipped on the device.

        Raises:
            checkpoint.NonFiniteError: some rank's loss was not finite since the last read.
        """
        read_now = found is None
        if read_now:
            if self._first_bad is None:
                return
            found = int(self._non_finite_key().item())
        if found:
            first, s = NEVER - found, self.state
            if read_now:
                where = "" if first == step else f"; found before the update of step {step}"
                stopped = "stopped before the update"
            else:  # the engine skipped that step's update; later steps' updates were made
                where = "" if first == step else f"; found at the log of step {step}"
                stopped = f"step {first}'s update skipped on the device"
            raise checkpoint.NonFiniteError(
                f"non-finite loss at step {first}{where} (stream position {s.position}); "
                f"{stopped}, resume from the last checkpoint"
            )

    def _log(self, writer: metrics.MetricsWriter) -> dict:
        """The window's record, from one read of the device: the counts summed over ranks,
        the gradient norm and, on a step that left it here, the non-finite check."""
        s = self.state
        host = torch.cat([torch.tensor(s.host, dtype=torch.float64), s.targets])
        device = self.info.device
        summed = torch.cat([s.counts.double(), host.to(device, non_blocking=True)])
        norm = s.grad_norm if self.own_grad_norm else self.engine.get_global_grad_norm()
        if isinstance(norm, torch.Tensor):
            extra = [norm.detach().double().reshape(1).to(device)]
        else:
            extra = []
        if s.check_at_log:  # exact in float64: a step count is far below 2**53
            extra.append(self._non_finite_key().double())
        read = torch.cat([distributed.all_reduce_sum(summed), *extra]).cpu()  # the one read
        totals, targets, extra_values = split_log_read(read, len(s.targets), len(extra))
        if s.check_at_log:
            s.check_at_log = False
            self._stop_if_non_finite(s.step, found=int(extra_values[-1]))
        if isinstance(norm, torch.Tensor):
            norm = extra_values[0]
        seconds = time.perf_counter() - s.window_start
        record = {"step": s.step, "split": "train"}
        distill = self.distiller is not None
        record.update(
            metrics.summarize(totals, seconds, self.info.world_size, self.peak, distill=distill)
        )
        trivial = baselines(targets[:-2], targets[-2:])  # the same rows' trivial baselines
        record.update({k: trivial[k] for k in ("mlm_baseline_accuracy", "nsp_baseline_accuracy")})
        lr = self.engine.get_lr()
        record.update(
            mask_rate=self.train_mask_rate,
            lr=float(lr[0]) if lr else None,
            grad_norm=float(norm) if norm is not None else None,
            epoch=s.position / self.shards.num_rows,
            samples=s.position,
            train_seconds=s.train_s,
            first_step_s=s.first_step_s,
            compiled_graphs=compiling.graph_count() if self.config.compile != "off" else None,
        )
        writer.write(record)
        s.counts, s.host, s.targets = None, [0.0] * len(metrics.HOST_COUNTS), None
        s.window_start = time.perf_counter()
        return record

    def evaluate(self) -> dict:
        """Held-out MLM/NSP loss and accuracy over one pass of --eval-data."""
        from .evaluate import evaluate

        self.activity = f"evaluation at step {self.state.step}"
        start = time.perf_counter()
        spec = StreamSpec(
            micro=self.sizes.micro,
            world_size=self.info.world_size,
            rank=self.info.rank,
            seed=self.config.seed,
            finite=True,
            max_width=self.model_config.max_position_embeddings,
        )
        stream = PretrainingStream(self.eval_shards, spec, self.eval_masker)
        loader = make_loader(stream, self.config.num_workers)
        try:
            record = evaluate(self.engine, loader, self.info.device, self.shards.trains_nsp)
        finally:
            loader.close()
        record["eval_mask_rate"] = self.eval_masker.rate if self.eval_masker else None
        record.update(step=self.state.step, split="eval", seconds=time.perf_counter() - start)
        self.state.window_start += time.perf_counter() - start  # not counted as training time
        return record

    def _save(self) -> None:
        s, c = self.state, self.config
        epoch, offset = divmod(s.position, self.shards.num_rows)
        state = {
            "step": s.step,
            "position": s.position,
            "epoch": epoch,
            "epoch_offset": offset,
            # Stream position of each rank's next row (trainer/order.py: rank r reads
            # micro rows at position + r * micro of every global micro-batch).
            "rank_positions": [
                s.position + r * self.sizes.micro for r in range(self.info.world_size)
            ],
            "world_size": self.info.world_size,
            "micro_batch": self.sizes.micro,
            "gradient_accumulation_steps": self.sizes.accumulation,
            "data_fingerprint": self.fingerprint,
            "train_seconds": s.train_s,
            "skipped_shards": self.shards.skipped,
            "teacher": None if self.distiller is None else self.distiller.identity,
            "engine": self.engine_name,
            "run_id": s.run_id,
        }
        files = {
            "config.json": self.model_config.to_dict(),
            "train_config.json": c.to_dict(),
            "ds_config.json": self.ds,
        }
        start = time.perf_counter()
        self.activity = f"saving checkpoint {checkpoint.tag_for(s.step)}"
        try:
            checkpoint.save(self.engine, c.output_dir, s.step, state, files)
        except (OSError, RuntimeError) as err:  # torch.save on a full disk: "unexpected pos"
            _note_free_space(err, Path(c.output_dir, checkpoint.CHECKPOINTS))
            raise
        s.last_saved = s.step
        self.save_s = time.perf_counter() - start

    def _warn_grace(self, step_s: float) -> None:
        """Warn (rank 0) when a step and a save would not fit in --signal-grace."""
        warning = grace_warning(step_s, self.save_s, self.config.signal_grace)
        if warning and self.info.is_main:
            logger.warning("%s", warning)

    def last_checkpoint(self) -> str | None:
        """The directory of this run's last checkpoint, or None."""
        if self.state.last_saved < 0:
            return None
        tag = checkpoint.tag_for(self.state.last_saved)
        return str(Path(self.config.output_dir, checkpoint.CHECKPOINTS, tag))

    def export(self) -> Path | None:
        """Rank 0 writes OUTPUT_DIR/hf from the last checkpoint (after every rank saved it),
        unless the ranks agreed to stop on a signal (one that reached a rank after the last
        step's all-reduce does not stop a finished run). The other ranks wait for it: a
        failed export fails the run on every rank (trainer/failure.py)."""
        self.activity = "export"
        distributed.barrier()
        out = None
        if self.info.is_main and self.config.export_hf and self.state.stopped_by is None:
            from .export import export

            out = export(self.config.output_dir, Path(self.config.output_dir, "hf"))
        distributed.barrier()
        return out

    def _samples_file(self):
        if not self.config.record_samples:
            return None
        Path(self.config.output_dir).mkdir(parents=True, exist_ok=True)
        path = Path(self.config.output_dir, f"samples-rank{self.info.rank}.txt")
        return open(path, "a", encoding="utf-8")


def _note_free_space(err: BaseException, directory: Path) -> None:
    """Add the free space of ``directory``'s disk to ``err`` (a full disk does not always
    say so: torch.save then fails with "unexpected pos")."""
    import shutil

    try:
        free = shutil.disk_usage(directory).free
    except OSError:
        return
    err.add_note(f"{directory} has {free / 2**20:.1f} MiB free")
