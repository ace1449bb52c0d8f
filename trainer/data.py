"""Streaming training batches: a torch IterableDataset over a shard directory.

Each rank reads only its slices of the stream (trainer/order.py explains the order and
why no row is lost or repeated within an epoch). DataLoader workers build the rank's
micro-batches in groups of 8 consecutive ones (worker ``w`` of ``W`` the groups ``w, w + W,
...``), each group put in one tensor, and the DataLoader hands the groups out
round-robin, so the batches arrive in the same order for any number of workers. Rows are
memory-mapped views (trainer/shards.py); only the batch being built is copied.

    loader = make_loader(PretrainingStream(ShardSet("shards/"), StreamSpec(
        micro=64, world_size=8, rank=3, seed=42, start=saved_position)), num_workers=2)
    for batch in loader: ...

A batch (:func:`collate`) holds int64 tensors with BERT's names:

    input_ids, segment_ids, attention_mask   (B, T)  T = longest row rounded up to 8
    masked_lm_positions, masked_lm_ids       (B, P)  P = max_predictions_per_seq, or the
                                                     masker's slots; pad 0
    next_sentence_label                      (B,)    -100 on an evaluation filler row and
                                                     on MLM-only rows (no NSP loss)
    row_ids                                  (B,)    row's index in manifest order; -1 filler

Row kinds (pipeline/shards/FORMAT.md): NSP rows as written; MLM rows (``mlm``, ``mlm_masked``)
get segment ids 0 and next_sentence_label -100, so the model computes no NSP loss for them.

Masking: ``static`` uses the shards' masks. ``dynamic`` (RoBERTa-style), and always on
unmasked ``mlm`` rows, re-masks with Google's rules at a rate (trainer/masking.py
DynamicMasker) using ``numpy_rng(seed, "dynamic", p, B)``, where ``p`` is the stream position
of the micro-batch's first row (the stream position fixes the epoch, so every epoch gets
fresh masks). The masks are the same for any number of workers and on resume; they change
if the micro-batch boundaries change (another world size x micro batch), which still leaves
one valid random masking per row per epoch. Held-out MLM rows are masked by an
EvalMasker instead: per row, the same in every run.

Evaluation (``finite=True``): one pass in manifest order; the last global micro-batch is
filled up with filler rows that carry no MLM or NSP target.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from pipeline.shards.shard_format import ShardFormatError
from pipeline.shards.validate import check_predictions, check_values

from .masking import DynamicMasker, EvalMasker
from .order import StreamOrder, rank_positions
from .shards import NSP_IGNORE, ShardSet
from .signals import ignore_in_worker

PAD_MULTIPLE = 8


@dataclass(frozen=True)
class StreamSpec:
    """Which part of the stream one rank reads, and how batches are built."""

    micro: int  # rows per micro-batch of this rank
    world_size: int
    rank: int
    seed: int
    start: int = 0  # stream position to start from (rows consumed by all ranks before)
    window: int = 65536  # rows shuffled together
    masking: str = "static"  # or "dynamic"
    finite: bool = False  # evaluation: one unshuffled pass, then stop
    max_width: int = 512  # cap on the padded length (the model's max_position_embeddings)

    def __post_init__(self) -> None:
        """Raises ValueError naming the field of an invalid value."""
        if self.micro < 1 or self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(
                f"invalid micro/world_size/rank {self.micro}/{self.world_size}/{self.rank}"
            )
        if self.start < 0:
            raise ValueError(f"start must be >= 0, got {self.start}")
        if self.masking not in ("static", "dynamic"):
            raise ValueError(f"masking must be static or dynamic, got {self.masking!r}")


def collate(
    rows: Sequence[tuple[dict[str, np.ndarray], int]],
    *,
    max_predictions: int,
    pad_id: int = 0,
    max_width: int = 512,
    vocab_size: int | None = None,
) -> dict[str, torch.Tensor]:
    """Pad unpadded rows into one batch (see the module docstring for the keys).

    The values are checked here, on the host, so that the model need not check them on the
    device (model/bert.py), by the format's own rule (pipeline/shards/validate.py
    ``check_values``, ``check_predictions``): ids in [0, vocab_size), segment ids 0/1,
    masked positions inside their row and at most ``max_predictions``, next_sentence_label
    0/1 (or -100: an MLM-only row).

    Args:
        rows: B rows, each ({input_ids, segment_ids, masked_lm_positions, masked_lm_ids:
            1-D integer arrays}, next_sentence_label); an MLM row has no segment_ids (0s)
            and the label -100.
        max_predictions: P, the manifest's max_predictions_per_seq.
        pad_id: the [PAD] id.
        max_width: the padded length never exceeds max(this, the longest row).
        vocab_size: the model's (= the shards') vocab size; None skips the id checks.

    Raises:
        ValueError: a row has more than ``max_predictions`` masked positions, or a value out
            of range (naming the tensor and the row of the batch).
    """
    lengths = [len(row["input_ids"]) for row, _ in rows]
    counts = [len(row["masked_lm_positions"]) for row, _ in rows]
    check_predictions(counts, max_predictions, rows_of="the batch")
    longest = max(lengths)
    width = max(longest, min(max_width, math.ceil(longest / PAD_MULTIPLE) * PAD_MULTIPLE))
    b = len(rows)
    input_ids = np.full((b, width), pad_id, dtype=np.int64)
    segment_ids = np.zeros((b, width), dtype=np.int64)
    attention_mask = np.zeros((b, width), dtype=np.int64)
    positions = np.zeros((b, max_predictions), dtype=np.int64)
    ids = np.zeros((b, max_predictions), dtype=np.int64)
    for i, ((row, _), n, k) in enumerate(zip(rows, lengths, counts, strict=True)):
        input_ids[i, :n] = row["input_ids"]
        if "segment_ids" in row:  # MLM rows have none: all 0
            segment_ids[i, :n] = row["segment_ids"]
        attention_mask[i, :n] = 1
        positions[i, :k] = row["masked_lm_positions"]
        ids[i, :k] = row["masked_lm_ids"]
    labels = np.fromiter((label for _, label in rows), dtype=np.int64, count=b)
    tensors = {
        "input_ids": input_ids,
        "segment_ids": segment_ids,
        "attention_mask": attention_mask,
        "masked_lm_positions": positions,
        "masked_lm_ids": ids,
        "next_sentence_label": labels,
    }
    # The format's value rule, on the padded batch: padding is pad_id (an id) and 0 (a
    # segment id, and a position inside every row: rows hold at least [CLS]).
    check_values(
        {**tensors, "next_sentence_label": labels[labels != NSP_IGNORE]},
        vocab_size=vocab_size,
        row_length=np.asarray(lengths, dtype=np.int64)[:, None],
        rows_of="the batch",
    )
    return {k: torch.from_numpy(v) for k, v in tensors.items()}


_SQUARE = ("input_ids", "segment_ids", "attention_mask")  # (B, T)
_PREDICTIONS = ("masked_lm_positions", "masked_lm_ids")  # (B, P)
_PER_ROW = ("next_sentence_label", "row_ids")  # (B,)


def to_transfer(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """One int64 tensor ``[B, T, P, values...]`` holding a whole batch.

    A DataLoader worker sends each tensor through its own shared-memory segment; one
    tensor instead of seven makes the transfer faster (bench/loader_speed.py measures it).
    """
    b, t = batch["input_ids"].shape
    p = batch["masked_lm_positions"].shape[1]
    parts = [torch.tensor([b, t, p])] + [
        batch[k].reshape(-1) for k in _SQUARE + _PREDICTIONS + _PER_ROW
    ]
    return torch.cat(parts)


def group_to_transfer(batches: list[dict[str, torch.Tensor]]) -> torch.Tensor:
    """Several batches in one tensor ``[n, len_1 .. len_n, transfer_1 .. transfer_n]``."""
    transfers = [to_transfer(b) for b in batches]
    return torch.cat([torch.tensor([len(transfers)] + [len(t) for t in transfers]), *transfers])


def group_from_transfer(transfer: torch.Tensor) -> list[dict[str, torch.Tensor]]:
    """The batches :func:`group_to_transfer` put in one tensor, as views into ``transfer``."""
    n = int(transfer[0])
    lengths = transfer[1 : 1 + n].tolist()
    return [from_transfer(t) for t in torch.split(transfer[1 + n :], lengths)]


def from_transfer(transfer: torch.Tensor) -> dict[str, torch.Tensor]:
    """The batch :func:`to_transfer` put in one tensor, as views into ``transfer``."""
    b, t, p = transfer[:3].tolist()
    sizes = [(b, t)] * len(_SQUARE) + [(b, p)] * len(_PREDICTIONS) + [(b,)] * len(_PER_ROW)
    out, start = {}, 3
    for key, shape in zip(_SQUARE + _PREDICTIONS + _PER_ROW, sizes, strict=True):
        n = math.prod(shape)
        out[key] = transfer[start : start + n].view(shape)
        start += n
    return out


class PretrainingStream(IterableDataset):
    """One rank's micro-batches, endless (training) or one pass (``spec.finite``).

    Args:
        shards: the shard set (checked already; see ShardSet.check).
        spec: which slices, and how to build batches.
        masker: required when ``spec.masking == "dynamic"`` and for unmasked MLM rows
            (trainer/masking.py: a DynamicMasker, or an EvalMasker for held-out rows).

    Raises:
        ValueError: dynamic masking or unmasked rows without a masker.
    """

    def __init__(
        self,
        shards: ShardSet,
        spec: StreamSpec,
        masker: DynamicMasker | EvalMasker | None = None,
    ):
        super().__init__()
        if masker is None and (spec.masking == "dynamic" or shards.kind == "mlm"):
            raise ValueError(
                f"{'dynamic masking' if spec.masking == 'dynamic' else 'unmasked MLM rows'} "
                "need a masker (trainer/masking.py)"
            )
        self.shards, self.spec, self.masker = shards, spec, masker
        self.order = StreamOrder(shards.rows_per_shard, spec.seed, spec.window, not spec.finite)
        if masker is not None:
            self.max_predictions = masker.max_predictions
        else:
            self.max_predictions = int(shards.params["max_predictions_per_seq"])
        self.pad_id = int(shards.manifest["vocab"]["special_ids"]["pad"])
        self.vocab_size = int(shards.manifest["vocab"]["size"])
        manifest_rows = [entry["rows"] for entry in shards.manifest["shards"]]
        self.group = 1  # micro-batches per DataLoader transfer (BatchLoader sets it)
        self.first_row_id = np.concatenate([[0], np.cumsum(manifest_rows)[:-1]]).astype(np.int64)

    def num_batches(self) -> int | None:
        """Micro-batches per rank of a finite pass; None for an endless stream."""
        if not self.spec.finite:
            return None
        return math.ceil(self.order.num_rows / (self.spec.micro * self.spec.world_size))

    def _collate(self, rows) -> dict[str, torch.Tensor]:
        return collate(
            rows,
            max_predictions=self.max_predictions,
            pad_id=self.pad_id,
            max_width=self.spec.max_width,
            vocab_size=self.vocab_size,
        )

    def _bad_row(self, rows, shard: np.ndarray, row: np.ndarray) -> str:
        """Which row of a batch that failed its check is the bad one: 'row R of FILE' (each
        row checked alone, on this error path only)."""
        for i, one in enumerate(rows):
            try:
                self._collate([one])
            except ValueError:
                return f"row {int(row[i])} of {self.shards.path(int(shard[i]))}"
        names = sorted({self.shards.path(int(i)) for i in np.unique(shard)})
        return f"the batch's rows come from {', '.join(names)}"

    def batch(self, k: int) -> dict[str, torch.Tensor]:
        """This rank's ``k``-th micro-batch after ``spec.start``."""
        s = self.spec
        positions = rank_positions(s.start, k, s.micro, s.world_size, s.rank)
        filler = positions >= self.order.num_rows if s.finite else np.zeros(len(positions), bool)
        _, shard, row = self.order.locate(positions)
        rows = self.shards.rows(shard, row)
        row_ids = self.first_row_id[shard] + row
        if self.masker is not None:
            rows = self.masker.mask_batch(
                rows, seed=s.seed, position=int(positions[0]), micro=s.micro, row_ids=row_ids
            )
        try:
            batch = self._collate(rows)
        except ValueError as err:  # the writer checks every value: a shard changed since
            where = self._bad_row(rows, shard, row)
            raise ShardFormatError(
                f"{err}; {where}: check the shards with python -m pipeline validate "
                f"{self.shards.directory}"
            ) from None
        if filler.any():
            at = torch.from_numpy(filler)
            batch["masked_lm_positions"][at] = 0
            batch["masked_lm_ids"][at] = 0
            batch["next_sentence_label"][at] = NSP_IGNORE
            row_ids[filler] = -1
        batch["row_ids"] = torch.from_numpy(row_ids)
        return batch

    def __iter__(self) -> Iterator[torch.Tensor]:
        """Groups of ``self.group`` consecutive micro-batches, each group one tensor
        (:func:`group_to_transfer`).

        Worker ``w`` of ``W`` builds groups ``w, w + W, ...``; iterate a :func:`make_loader`
        to get the batches as dicts, in order.
        """
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        total = self.num_batches()
        j = worker
        while True:
            first, end = j * self.group, (j + 1) * self.group
            ks = range(first, end if total is None else min(end, total))
            if not ks:
                return
            yield group_to_transfer([self.batch(k) for k in ks])
            j += workers


class BatchLoader:
    """Iterates a stream's batches through a DataLoader; each batch a dict (module docstring).

    With workers, each transfer carries ``group`` micro-batches in one tensor: a
    transfer costs about a millisecond whatever its size, which would otherwise cap a
    64-row micro-batch at some 45,000 rows/s (bench/loader_speed.py).
    """

    def __init__(self, stream: PretrainingStream, num_workers: int, group: int = 8):
        stream.group = group if num_workers else 1
        # Its own torch.Generator: a DataLoader otherwise draws its workers' base seed from
        # the global RNG, which would shift the dropout masks after a resume.
        self.loader = DataLoader(
            stream,
            batch_size=None,
            num_workers=num_workers,
            pin_memory=torch.cuda.is_available(),
            prefetch_factor=2 if num_workers else None,
            generator=torch.Generator().manual_seed(stream.spec.seed),
            worker_init_fn=ignore_in_worker,  # the main process owns Ctrl-C and SIGTERM
        )

        self._iterators: list = []  # the DataLoader's, each with its own worker processes

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        iterator = iter(self.loader)
        self._iterators.append(iterator)
        for transfer in iterator:
            yield from group_from_transfer(transfer)

    def close(self) -> None:
        """End the worker processes now.

        They ignore SIGTERM (trainer/signals.py), which is how the DataLoader's shutdown ends a
        worker that does not stop when asked, and the interpreter's exit would then wait for
        them forever: after a failure, close the loader before leaving. The DataLoader's
        shutdown asks each worker to stop (a worker busy with a batch gets up to 5 s, torch's
        MP_STATUS_CHECK_INTERVAL); what is still alive then is SIGKILLed: a worker's only state
        is the batch it was building.
        """
        while self._iterators:
            iterator = self._iterators.pop()
            # Private, as the DataLoader has no public way to end its workers at once; both
            # date from its first multi-process version.
            shutdown = getattr(iterator, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()  # also stops torch from reporting the kills below as failures
            for worker in getattr(iterator, "_workers", ()):
                if worker.is_alive():
                    worker.kill()
                    worker.join()


def make_loader(stream: PretrainingStream, num_workers: int) -> BatchLoader:
    """Batches of ``stream`` built by ``num_workers`` DataLoader processes (0: in this one)."""
    return BatchLoader(stream, num_workers)
