"""Fine-tune a BERT directory on sentence classification, token classification or QA.

    python -m trainer.finetune --task classification --init hf/base \\
        --train sst2/train.jsonl --eval sst2/dev.jsonl --output-dir runs/sst2
    python -m trainer.finetune --task token --init hf/base --train ner/train.jsonl \\
        --eval ner/dev.jsonl --epochs 3 --lr 5e-5
    python -m trainer.finetune --task qa --init hf/base --train squad/train.jsonl \\
        --eval squad/dev.jsonl --max-seq-length 384 --batch-size 12

--init is a Hugging Face directory (``save_hf`` or transformers') with a tokenizer:
``tokenizer.json``, or ``vocab.txt`` (lower-cased unless its ``tokenizer_config.json``
says ``"do_lower_case": false``). A DeepSpeed checkpoint of trainer/run.py is turned
into one by ``python -m trainer.export CKPT HF_DIR``. The head is the one saved in
--init if it is there, else a new one (model/heads.py).

Files are JSONL (``.jsonl``/``.json``, one object per line) or CSV (``.csv``, header):
- classification: ``text``, optional ``text_pair``, ``label`` (str or int);
- token: ``tokens`` and ``tags``, lists of equal length (CSV: space-separated);
- qa (SQuAD v1.1 style, every example answerable): ``question``, ``context``,
  ``answers`` = ``{"text": [...], "answer_start": [...]}`` or a list of such
  objects (CSV: JSON in the cell); ``context[answer_start:]`` must begin with the text.

The loop is plain PyTorch: AdamW (weight decay 0.01, none on biases and LayerNorm),
linear warmup then linear decay, gradient clipping at 1.0, dynamic padding, one
evaluation per epoch. Defaults are BERT's fine-tuning recipe (lr 3e-5 in 2e-5..5e-5,
3 epochs, batch 32, warmup 10%). Sequences are truncated to --max-seq-length
(QA: the context; no document stride, so an answer cut off is trained as "no
answer" at [CLS] and scored as a miss).

Metrics: classification accuracy; token accuracy and micro F1 over
words whose tag is not ``O`` (a per-word F1, not seqeval's per-entity one; words
cut by truncation are not scored); QA exact match and token F1 (SQuAD's script).

Writes to --output-dir: the model (``save_hf``), the tokenizer files of --init,
``finetune_config.json`` and ``eval_results.json``. Exit codes: 0 done, 2 a bad
file, directory or setting (the message names it).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from model.config import write_text_atomic
from model.heads import (
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    read_hf_config,
)
from trainer.finetune_data import DataError as DataError  # re-exported: run() raises it
from trainer.finetune_data import (
    check_features,
    collate,
    encode,
    label_names,
    load_examples,
    load_tokenizer,
)
from trainer.finetune_metrics import evaluate

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


@dataclass(frozen=True)
class FinetuneConfig:
    """One run's settings: defaults < ``--config`` JSON < flags; saved beside the model."""

    task: str  # classification | token | qa
    init: str  # Hugging Face directory with a tokenizer
    train: str
    eval: str
    output_dir: str | None = None  # None: nothing written
    epochs: int = 3
    lr: float = 3e-5  # peak learning rate, after warmup
    batch_size: int = 32
    max_seq_length: int = 128
    warmup_ratio: float = 0.1  # fraction of all steps spent warming up linearly
    weight_decay: float = 0.01
    seed: int = 42  # head initialisation, dropout and shuffling

    def __post_init__(self) -> None:
        if self.task not in MODELS:
            raise ValueError(f"task must be one of {sorted(MODELS)}, got {self.task!r}")
        for name in ("epochs", "batch_size", "max_seq_length", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative int, got {value!r}")
        checks = {
            "epochs": (self.epochs > 0, "> 0"),
            "batch_size": (self.batch_size > 0, "> 0"),
            "max_seq_length": (self.max_seq_length >= 8, ">= 8"),
            "lr": (self.lr > 0, "> 0"),
            "weight_decay": (self.weight_decay >= 0, ">= 0"),
            "warmup_ratio": (0 <= self.warmup_ratio < 1, "in [0, 1)"),
        }
        for name, (ok, rule) in checks.items():
            if not ok:
                raise ValueError(f"{name} must be {rule}, got {getattr(self, name)!r}")


# ---------------------------------------------------------------- training


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


# ---------------------------------------------------------------- entry point


def parse_config(argv: Sequence[str] | None) -> FinetuneConfig:
    """Flags over ``--config`` JSON over defaults. Raises ValueError naming a bad key."""
    parser = argparse.ArgumentParser(
        prog="python -m trainer.finetune", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--config", help="JSON file with any of the settings below")
    parser.add_argument("--task", choices=sorted(MODELS))
    for name in ("init", "train", "eval", "output_dir"):
        parser.add_argument("--" + name.replace("_", "-"), dest=name)
    for field in dataclasses.fields(FinetuneConfig):
        if field.name not in ("task", "init", "train", "eval", "output_dir"):
            kind = int if field.type == "int" else float
            parser.add_argument("--" + field.name.replace("_", "-"), dest=field.name, type=kind)
    args = vars(parser.parse_args(argv))
    values: dict[str, Any] = {}
    config_path = args.pop("config")
    if config_path:
        try:
            values = json.loads(Path(config_path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"cannot read {config_path}: {e}") from e
        known = {f.name for f in dataclasses.fields(FinetuneConfig)}
        if not isinstance(values, dict) or set(values) - known:
            raise ValueError(f"{config_path}: unknown key(s) {sorted(set(values) - known)}")
    values.update({k: v for k, v in args.items() if v is not None})
    missing = [k for k in ("task", "init", "train", "eval") if k not in values]
    if missing:
        raise ValueError(f"missing setting(s) {missing} (flags --task --init --train --eval)")
    return FinetuneConfig(**values)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        run(parse_config(argv))
    except (ValueError, FileNotFoundError) as e:  # DataError is a ValueError
        logger.error("%s", e)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
