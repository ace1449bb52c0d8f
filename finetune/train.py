"""The fine-tuning loop of ``python -m finetune``: load, train, evaluate, save.

``run(cfg)`` reads --init (model, tokenizer) and the data files, trains with AdamW,
evaluates after every epoch and writes the model; see ``finetune/__main__.py`` for the
recipe and the files it writes.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import torch

from finetune.config import FinetuneConfig
from finetune.data import DataError as DataError  # re-exported: run() raises it
from finetune.data import (
    check_features,
    collate,
    encode,
    label_names,
    load_examples,
    load_tokenizer,
)
from finetune.metrics import evaluate
from model.config import write_text_atomic
from model.heads import (
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    read_hf_config,
)

logger = logging.getLogger(__name__)

MODELS = {
    "classification": BertForSequenceClassification,
    "token": BertForTokenClassification,
    "qa": BertForQuestionAnswering,
}
TOKENIZER_FILES = (
    "tokenizer.json",
    "vocab.txt",
    "tokenizer_config.json",
    "special_tokens_map.json",
)


def linear_schedule(warmup: int, total: int) -> Callable[[int], float]:
    """LR multiplier: 0 -> 1 over ``warmup`` steps, then 1 -> 0 at ``total`` (transformers')."""
    return lambda step: (
        step / max(1, warmup)
        if step < warmup
        else max(0.0, (total - step) / max(1, total - warmup))
    )


def train(cfg: FinetuneConfig, model, features: list[dict], evaluate_fn, pad_id: int) -> dict:
    """AdamW with warmup/decay over ``cfg.epochs``; returns the last evaluation's metrics."""
    decay = [
        p for n, p in model.named_parameters() if not n.endswith("bias") and "LayerNorm" not in n
    ]
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias") or "LayerNorm" in n]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=cfg.lr)
    steps_per_epoch = math.ceil(len(features) / cfg.batch_size)
    total = cfg.epochs * steps_per_epoch
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, linear_schedule(round(cfg.warmup_ratio * total), total)
    )
    generator = torch.Generator().manual_seed(cfg.seed)
    model.train()
    metrics: dict = {}
    for epoch in range(1, cfg.epochs + 1):
        start, losses = time.perf_counter(), []
        order = torch.randperm(len(features), generator=generator).tolist()
        for i in range(0, len(order), cfg.batch_size):
            batch = collate([features[j] for j in order[i : i + cfg.batch_size]], pad_id)
            loss = model(**batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())
        seconds = time.perf_counter() - start
        metrics = evaluate_fn(model)
        logger.info(
            "epoch %d/%d: loss %.4f, %.1f examples/s, eval %s",
            epoch,
            cfg.epochs,
            sum(losses) / len(losses),
            len(features) / seconds,
            ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()),
        )
    return metrics


def run(cfg: FinetuneConfig) -> dict:
    """Load, fine-tune, evaluate and save; returns the final eval metrics.

    Raises:
        DataError: a bad train/eval file. FileNotFoundError / ValueError: a bad --init.
    """
    cls = MODELS[cfg.task]
    bert, architecture, _ = read_hf_config(cfg.init)
    tokenizer = load_tokenizer(cfg.init)
    if tokenizer.get_vocab_size() > bert.vocab_size:
        raise ValueError(
            f"{cfg.init}: tokenizer has {tokenizer.get_vocab_size()} tokens, the model {bert.vocab_size}"
        )
    if cfg.max_seq_length > bert.max_position_embeddings:
        raise ValueError(
            f"max_seq_length {cfg.max_seq_length} > the model's max_position_embeddings {bert.max_position_embeddings}"
        )
    train_examples, eval_examples = (
        load_examples(cfg.task, cfg.train),
        load_examples(cfg.task, cfg.eval),
    )
    saved = cls.from_hf(cfg.init).config.labels if architecture == cls.architecture else None
    labels = label_names(cfg.task, train_examples, saved, cfg.train)
    label_names(cfg.task, eval_examples, labels, cfg.eval)  # eval labels must be known
    torch.manual_seed(cfg.seed)
    model = cls.from_hf(cfg.init, labels=labels)
    train_features = encode(cfg.task, tokenizer, train_examples, labels, cfg.max_seq_length)
    eval_features = encode(cfg.task, tokenizer, eval_examples, labels, cfg.max_seq_length)
    for features, examples in ((train_features, train_examples), (eval_features, eval_examples)):
        check_features(features, examples, bert.vocab_size, bert.type_vocab_size)
    logger.info(
        "%s: %d train / %d eval examples, labels %s",
        cfg.task,
        len(train_features),
        len(eval_features),
        labels,
    )

    def evaluate_fn(m):
        return evaluate(cfg.task, m, eval_features, labels, cfg.batch_size, bert.pad_token_id)

    metrics = train(cfg, model, train_features, evaluate_fn, bert.pad_token_id)
    if cfg.output_dir is None:
        logger.info("no --output-dir: the fine-tuned model is not saved")
        return metrics
    out = Path(cfg.output_dir)
    model.save_hf(out)
    for name in TOKENIZER_FILES:
        if (Path(cfg.init) / name).is_file():
            shutil.copyfile(Path(cfg.init) / name, out / name)
    write_text_atomic(
        out / "finetune_config.json", json.dumps(dataclasses.asdict(cfg), indent=2) + "\n"
    )
    write_text_atomic(out / "eval_results.json", json.dumps(metrics, indent=2) + "\n")
    logger.info("wrote %s", out)
    return metrics
