"""Pretrain transformers' BertForPreTraining on our shards with the Hugging Face Trainer.

Uses only `datasets`, `transformers`, `torch` and the shard directory's
`manifest.json` (format: pipeline/shards/FORMAT.md) — no code from this project:

    python examples/hf_trainer.py --shards runs/quickstart/shards --output-dir runs/hf --max-steps 50

The collator turns unpadded rows into what `BertForPreTraining` takes: padded
`input_ids`, `token_type_ids`, `attention_mask`, dense MLM `labels` (-100
except at `masked_lm_positions`, where they hold `masked_lm_ids`) and
`next_sentence_label`.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys

import torch


def collate(rows: list[dict], pad_id: int = 0) -> dict[str, torch.Tensor]:
    """Rows of the shard (lists of ints) -> a padded batch for BertForPreTraining."""
    width = max(len(r["input_ids"]) for r in rows)
    width += -width % 8  # multiples of 8 suit tensor cores
    batch = {
        "input_ids": torch.full((len(rows), width), pad_id, dtype=torch.long),
        "token_type_ids": torch.zeros(len(rows), width, dtype=torch.long),
        "attention_mask": torch.zeros(len(rows), width, dtype=torch.long),
        "labels": torch.full((len(rows), width), -100, dtype=torch.long),
        "next_sentence_label": torch.tensor([r["next_sentence_label"] for r in rows]),
    }
    for i, r in enumerate(rows):
        n = len(r["input_ids"])
        batch["input_ids"][i, :n] = torch.tensor(r["input_ids"])
        batch["token_type_ids"][i, :n] = torch.tensor(r["segment_ids"])
        batch["attention_mask"][i, :n] = 1
        batch["labels"][i, r["masked_lm_positions"]] = torch.tensor(r["masked_lm_ids"])
    return batch


def main(argv: list[str] | None = None) -> int:
    import datasets
    import transformers

    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--shards", required=True, help="a shard directory (manifest.json, shard-*.arrow)"
    )
    p.add_argument("--output-dir", required=True)
    p.add_argument("--max-steps", type=int, default=50)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--hidden-size", type=int, default=128, help="a small BERT by default")
    p.add_argument("--layers", type=int, default=2)
    args = p.parse_args(argv)

    with open(os.path.join(args.shards, "manifest.json")) as f:
        manifest = json.load(f)
    files = sorted(glob.glob(os.path.join(args.shards, "shard-*.arrow")))
    train = datasets.load_dataset(
        "arrow",
        data_files=files,
        split="train",
        cache_dir=os.path.join(args.output_dir, "hf-cache"),
    )
    config = transformers.BertConfig(
        vocab_size=manifest["vocab"]["size"],
        hidden_size=args.hidden_size,
        num_hidden_layers=args.layers,
        num_attention_heads=max(1, args.hidden_size // 64),
        intermediate_size=4 * args.hidden_size,
        max_position_embeddings=max(512, manifest["schema"]["max_seq_length"]),
        pad_token_id=manifest["vocab"]["special_ids"]["pad"],
    )
    model = transformers.BertForPreTraining(config)
    training = transformers.TrainingArguments(
        output_dir=args.output_dir,
        max_steps=args.max_steps,
        per_device_train_batch_size=args.batch_size,
        learning_rate=5e-4,
        warmup_steps=max(1, args.max_steps // 10),
        logging_steps=max(1, args.max_steps // 5),
        save_strategy="no",
        report_to=[],
        use_cpu=not torch.cuda.is_available(),
        remove_unused_columns=False,  # the collator needs the shard's own columns
        seed=0,
    )
    pad_id = manifest["vocab"]["special_ids"]["pad"]
    trainer = transformers.Trainer(
        model=model,
        args=training,
        train_dataset=train,
        data_collator=lambda rows: collate(rows, pad_id),
    )
    result = trainer.train()
    trainer.save_model(args.output_dir)
    print(json.dumps({"train_loss": result.training_loss, "steps": result.global_step}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
