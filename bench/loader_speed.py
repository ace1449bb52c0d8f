"""Rows/s and real tokens/s the trainer's data loader delivers, with 0 and 2 DataLoader workers.

    python bench/loader_speed.py                       # synthetic seq-128 shards, 200k rows
    python bench/loader_speed.py --data shards/ --micro 64 --seconds 10
    python bench/loader_speed.py --masking static dynamic --workers 0 2

Measures what one rank's process gets: trainer.data.PretrainingStream through a
torch DataLoader, i.e. the shuffled stream order, memory-mapped row reads, dynamic padding
to int64 tensors (and re-masking with ``--masking dynamic``). Without ``--data`` it writes
synthetic shards shaped like the pipeline's (90% of rows 128 tokens, the rest shorter,
round(0.15 n) masks up to 20) to a temporary directory with pipeline.shards.shard_writer. Target:
50,000 rows/s per process, enough for one core to feed eight GPUs training BERT-Large at
seq 128. Prints one JSON line per configuration.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pipeline.shards import shard_format, shard_writer
from trainer.data import DynamicMasker, PretrainingStream, StreamSpec, make_loader
from trainer.shards import ShardSet

VOCAB = 30522
SPECIAL = {"pad": 0, "unk": 100, "cls": 101, "sep": 102, "mask": 103}


def synthetic_rows(
    n: int, seq: int, max_pred: int, gen: np.random.Generator, vocab: int = VOCAB
) -> dict[str, list]:
    """Rows shaped like the pipeline's: [CLS] A [SEP] B [SEP], static masks, NSP labels."""
    columns: dict[str, list] = {name: [] for name in shard_format.COLUMNS}
    lengths = np.where(gen.random(n) < 0.9, seq, gen.integers(8, seq, n))
    for length in lengths.tolist():
        ids = gen.integers(1000, vocab, length).astype(np.int64)
        split = int(gen.integers(2, length - 2))
        ids[0], ids[split], ids[-1] = SPECIAL["cls"], SPECIAL["sep"], SPECIAL["sep"]
        segments = np.zeros(length, np.int64)
        segments[split + 1 :] = 1
        candidates = np.setdiff1d(np.arange(1, length - 1), [split])
        k = min(max_pred, max(1, round(length * 0.15)), len(candidates))
        positions = np.sort(gen.choice(candidates, k, replace=False))
        columns["masked_lm_ids"].append(ids[positions].copy())
        ids[positions] = SPECIAL["mask"]
        columns["input_ids"].append(ids)
        columns["segment_ids"].append(segments)
        columns["masked_lm_positions"].append(positions)
    columns["next_sentence_label"] = gen.integers(0, 2, n).tolist()
    return columns


def write_synthetic(
    directory: Path, rows: int, shards: int, seq: int, max_pred: int, vocab_size: int = VOCAB
) -> None:
    """A complete shard directory (shards, vocab.txt, manifest.json) of synthetic rows."""
    gen = np.random.default_rng(0)
    schema = shard_format.shard_schema(vocab_size, seq)
    entries = []
    for index in range(shards):
        rows_of_shard = synthetic_rows(rows // shards, seq, max_pred, gen, vocab_size)
        data = shard_writer.encode_shard(rows_of_shard, schema)
        name = shard_format.shard_name(index, shards)
        shard_writer.atomic_write_bytes(directory / name, data)
        entries.append(
            {
                "name": name,
                "rows": rows // shards,
                "bytes": len(data),
                "sha256": __import__("hashlib").sha256(data).hexdigest(),
            }
        )
    (directory / "vocab.txt").write_text("".join(f"t{i}\n" for i in range(vocab_size)))
    vocab = {
        "file": "vocab.txt",
        "sha256": shard_format.sha256_file(directory / "vocab.txt"),
        "size": vocab_size,
        "do_lower_case": True,
        "special_ids": SPECIAL,
    }
    params = {
        "max_seq_length": seq,
        "max_predictions_per_seq": max_pred,
        "masked_lm_prob": 0.15,
        "random_seed": 0,
        "do_whole_word_mask": False,
    }
    manifest = shard_writer.build_manifest(
        shards=entries, vocab=vocab, params=params, stats={}, skipped={}
    )
    shard_writer.atomic_write_bytes(
        directory / shard_format.MANIFEST_NAME, shard_writer.encode_manifest(manifest)
    )


def measure(data: str, masking: str, workers: int, micro: int, seconds: float) -> dict:
    shards = ShardSet(data)
    shards.check()
    spec = StreamSpec(micro=micro, world_size=1, rank=0, seed=0, masking=masking)
    masker = DynamicMasker(shards.manifest) if masking == "dynamic" else None
    loader = iter(make_loader(PretrainingStream(shards, spec, masker), workers))
    for _ in range(3 + 2 * workers):  # start the workers, fill their queues
        next(loader)
    rows = tokens = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        batch = next(loader)
        rows += batch["input_ids"].shape[0]
        tokens += int(batch["attention_mask"].sum())
    elapsed = time.perf_counter() - start
    return {
        "masking": masking,
        "workers": workers,
        "micro": micro,
        "rows_per_s": round(rows / elapsed),
        "tokens_per_s": round(tokens / elapsed),
    }


def main(argv=None) -> int:
    logging.basicConfig(level=logging.WARNING)
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--data", help="a shard directory (default: synthetic seq-128 shards)")
    p.add_argument("--rows", type=int, default=200_000, help="synthetic rows (default 200000)")
    p.add_argument("--micro", type=int, default=64, help="rows per batch (default 64)")
    p.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    p.add_argument("--masking", nargs="+", default=["static", "dynamic"])
    p.add_argument("--seconds", type=float, default=5.0, help="measured time per configuration")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        data = args.data
        if data is None:
            t0 = time.perf_counter()
            write_synthetic(Path(tmp), args.rows, 4, 128, 20)
            print(
                f"wrote {args.rows} synthetic rows in {time.perf_counter() - t0:.1f} s", flush=True
            )
            data = tmp
        for masking in args.masking:
            for workers in args.workers:
                print(
                    json.dumps(measure(data, masking, workers, args.micro, args.seconds)),
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
