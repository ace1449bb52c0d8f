"""Plain PyTorch over our shards, with only the reader module `pipeline.shards.shard_format`.

    python examples/torch_dataloader.py --shards runs/quickstart/shards --steps 20

A map-style Dataset over the memory-mapped shards (nothing is loaded into RAM
up front), a DataLoader that pads each batch, and a few training steps of our
BERT to show the batch layout end to end.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import sys

import numpy as np
import torch

from pipeline.shards.shard_format import open_shard, read_manifest, row_to_numpy


class ShardDataset(torch.utils.data.Dataset):
    """Row ``i`` of the concatenated shards, as int64 numpy arrays."""

    def __init__(self, directory: str):
        manifest = read_manifest(directory)
        self.tables = [open_shard(os.path.join(directory, e["name"])) for e in manifest["shards"]]
        self.starts = np.cumsum([0] + [t.num_rows for t in self.tables]).tolist()
        self.max_predictions = manifest["params"]["max_predictions_per_seq"]

    def __len__(self) -> int:
        return self.starts[-1]

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        shard = bisect.bisect_right(self.starts, i) - 1
        return row_to_numpy(self.tables[shard], i - self.starts[shard])


def pad_batch(rows: list[dict], max_predictions: int) -> dict[str, torch.Tensor]:
    """Pad to the longest row; masked positions padded with 0 (ignored by the loss)."""
    width = max(len(r["input_ids"]) for r in rows)
    out = {
        name: torch.zeros(len(rows), width, dtype=torch.long)
        for name in ("input_ids", "segment_ids", "attention_mask")
    }
    positions = torch.zeros(len(rows), max_predictions, dtype=torch.long)
    ids = torch.zeros(len(rows), max_predictions, dtype=torch.long)
    for i, r in enumerate(rows):
        n, k = len(r["input_ids"]), len(r["masked_lm_positions"])
        out["input_ids"][i, :n] = torch.from_numpy(r["input_ids"])
        out["segment_ids"][i, :n] = torch.from_numpy(r["segment_ids"])
        out["attention_mask"][i, :n] = 1
        positions[i, :k] = torch.from_numpy(r["masked_lm_positions"])
        ids[i, :k] = torch.from_numpy(r["masked_lm_ids"])
    out["masked_lm_positions"], out["masked_lm_ids"] = positions, ids
    out["next_sentence_label"] = torch.tensor([int(r["next_sentence_label"]) for r in rows])
    return out


def main(argv: list[str] | None = None) -> int:
    from model import BertConfig, BertForPreTraining

    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--shards", required=True)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=16)
    args = p.parse_args(argv)

    data = ShardDataset(args.shards)
    loader = torch.utils.data.DataLoader(
        data,
        batch_size=args.batch_size,
        shuffle=True,
        collate_fn=lambda rows: pad_batch(rows, data.max_predictions),
        generator=torch.Generator().manual_seed(0),
    )
    torch.manual_seed(0)
    vocab_size = read_manifest(args.shards)["vocab"]["size"]
    model = BertForPreTraining(BertConfig.preset("tiny", vocab_size=vocab_size))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for step, batch in enumerate(loader):
        if step == args.steps:
            break
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    print(json.dumps({"rows": len(data), "first_loss": losses[0], "last_loss": losses[-1]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
