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
from finetune.params import (
    check_against_model,
    lowest_trainable_depth,
    num_layers,
    param_groups,
    set_trainable,
)
from finetune.qa import encode_qa
from finetune.squad import Decoding
from model.config import write_text_atomic
from model.heads import (
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    labels_in,
)
from model.hf import CONFIG_NAME, read_hf_config

logger = logging.getLogger(__name__)

MODELS = {
    "classification": BertForSequenceClassification,
    "token": BertForTokenClassification,
    "qa": BertForQuestionAnswering,
    "similarity": BertForSequenceClassification,  # one output, MSE (model/heads.py)
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


def train_step(model, optimizer, features: list[dict], micro_batch: int, pad_id: int) -> float:
    """One optimizer step on ``features``, run ``micro_batch`` at a time (gradient
    accumulation); returns the loss of the whole batch.

    Each micro batch's mean loss is weighted by its share of the examples, so the
    gradient is that of one batch of all ``features`` (exactly so for a per-example
    mean loss: classification, QA; token tasks average over tokens per micro batch).
    Gradients are clipped to norm 1.0 over the trainable parameters.
    """
    total = 0.0
    device = next(model.parameters()).device
    for i in range(0, len(features), micro_batch):
        chunk = features[i : i + micro_batch]
        batch = {k: v.to(device) for k, v in collate(chunk, pad_id).items()}
        loss = model(**batch).loss * (len(chunk) / len(features))
        loss.backward()
        total += loss.item()
    trainable = [p for p in model.parameters() if p.requires_grad]
    torch.nn.utils.clip_grad_norm_(trainable, 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total


def train(cfg: FinetuneConfig, model, features: list[dict], evaluate_fn, pad_id: int) -> dict:
    """AdamW with warmup and linear decay over ``cfg.epochs`` or ``cfg.max_steps`` optimizer
    steps of ``batch_size * grad_accum`` examples; the parameter controls of
    finetune/params.py. Evaluates after every epoch and at the last step; returns the last
    evaluation's metrics."""
    optimizer = torch.optim.AdamW(param_groups(model, cfg), lr=cfg.lr)
    batch = cfg.batch_size * cfg.grad_accum
    steps_per_epoch = math.ceil(len(features) / batch)
    total = cfg.max_steps or cfg.epochs * steps_per_epoch
    warmup = cfg.warmup_steps or round(cfg.warmup_ratio * total)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, linear_schedule(warmup, total))
    generator = torch.Generator().manual_seed(cfg.seed)
    epochs, step, metrics = math.ceil(total / steps_per_epoch), 0, {}
    model.train()
    for epoch in range(1, epochs + 1):
        lowest = lowest_trainable_depth(cfg, num_layers(model), epoch)
        trainable, params = set_trainable(model, lowest)
        start, losses = time.perf_counter(), []
        order = torch.randperm(len(features), generator=generator).tolist()
        for i in range(0, len(order), batch):
            chunk = [features[j] for j in order[i : i + batch]]
            losses.append(train_step(model, optimizer, chunk, cfg.batch_size, pad_id))
            scheduler.step()
            step += 1
            if step == total:
                break
        seconds = time.perf_counter() - start
        metrics = evaluate_fn(model)
        logger.info(
            "epoch %d/%d (step %d/%d, %d of %d parameters trained): loss %.4f, "
            "%.1f examples/s, eval %s",
            epoch,
            epochs,
            step,
            total,
            trainable,
            params,
            sum(losses) / len(losses),
            len(losses) * batch / seconds,
            ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()),
        )
    return metrics


def _encode(cfg: FinetuneConfig, tokenizer, examples: list[dict], labels) -> list[dict]:
    """Features of ``examples``: QA's windows (finetune/qa.py) or one per example."""
    if cfg.task == "qa":
        return encode_qa(tokenizer, examples, cfg)
    return encode(cfg.task, tokenizer, examples, labels, cfg.max_seq_length)


def _decoding(cfg: FinetuneConfig, train_examples: list[dict]) -> Decoding | None:
    """QA's decoding: "" may be predicted when training had unanswerable questions."""
    if cfg.task != "qa":
        return None
    unanswerable = sum(not e["answers"] for e in train_examples)
    logger.info(
        "qa: %d of %d training questions unanswerable: null answers %s",
        unanswerable,
        len(train_examples),
        "predicted (SQuAD 2.0)" if unanswerable else "not predicted (SQuAD 1.1)",
    )
    return Decoding(
        n_best_size=cfg.n_best_size,
        max_answer_length=cfg.max_answer_length,
        null_score_diff_threshold=cfg.null_score_diff_threshold,
        predict_null=unanswerable > 0,
    )


def resolve_device(name: str) -> torch.device:
    """``--device``: auto is the first GPU when torch sees one, else the CPU.

    Raises:
        ValueError: a GPU asked for that torch does not see.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        count = torch.cuda.device_count()
        if count == 0 or (device.index or 0) >= count:
            raise ValueError(
                f"--device {name}: torch sees {count} GPU(s) on this machine; "
                "use --device cpu, or auto"
            )
    return device


# What a finished fine-tune leaves in --output-dir (with the model's own files).
RESULT_FILES = ("eval_results.json", "finetune_config.json")


def check_output_dir(cfg: FinetuneConfig) -> None:
    """Refuse, before any work, an --output-dir that holds an earlier fine-tune's result
    (its model would be replaced at the end) unless --overwrite.

    Raises:
        ValueError: naming the file found and the flag.
    """
    if cfg.output_dir is None or cfg.overwrite:
        return
    for name in RESULT_FILES:
        if Path(cfg.output_dir, name).is_file():
            raise ValueError(
                f"{Path(cfg.output_dir, name)}: --output-dir holds an earlier fine-tune's "
                f"result, which this run would replace; nothing was changed. Give another "
                f"--output-dir, or add --overwrite to replace it"
            )


def run(cfg: FinetuneConfig) -> dict:
    """Load, fine-tune, evaluate and save; returns the final eval metrics.

    Raises:
        DataError: a bad train/eval file. FileNotFoundError / ValueError: a bad --init.
    """
    check_output_dir(cfg)
    cls = MODELS[cfg.task]
    bert, architecture, head = read_hf_config(cfg.init)
    tokenizer = load_tokenizer(cfg.init)
    check_init(cfg, bert, tokenizer)
    train_examples, eval_examples = (
        load_examples(cfg.task, cfg.train),
        load_examples(cfg.task, cfg.eval),
    )
    same = architecture == cls.architecture  # a head of this task: its labels, without its weights
    saved = labels_in(head, Path(cfg.init) / CONFIG_NAME) if same else None
    labels = label_names(cfg.task, train_examples, saved, cfg.train)
    label_names(cfg.task, eval_examples, labels, cfg.eval)  # eval labels must be known
    device = resolve_device(cfg.device)
    torch.manual_seed(cfg.seed)
    model = cls.from_hf(cfg.init, labels=labels).to(device)
    check_against_model(cfg, model)
    train_features = _encode(cfg, tokenizer, train_examples, labels)
    eval_features = _encode(cfg, tokenizer, eval_examples, labels)
    for features, examples in ((train_features, train_examples), (eval_features, eval_examples)):
        check_features(features, examples, bert.vocab_size, bert.type_vocab_size)
    logger.info(
        "%s: %d train / %d eval examples (%d / %d features), labels %s, on %s",
        cfg.task,
        len(train_examples),
        len(eval_examples),
        len(train_features),
        len(eval_features),
        labels,
        device,
    )
    decoding = _decoding(cfg, train_examples)

    def evaluate_fn(m):
        return evaluate(
            cfg.task, m, eval_features, labels, cfg.batch_size, bert.pad_token_id, decoding
        )

    metrics = train(cfg, model, train_features, evaluate_fn, bert.pad_token_id)
    if cfg.output_dir is None:
        logger.info("no --output-dir: the fine-tuned model is not saved")
    else:
        save(cfg, model, metrics)
    return metrics


def check_init(cfg: FinetuneConfig, bert, tokenizer) -> None:
    """Refuse an --init whose tokenizer or positions do not fit the model or the settings."""
    if tokenizer.get_vocab_size() > bert.vocab_size:
        raise ValueError(
            f"{cfg.init}: tokenizer has {tokenizer.get_vocab_size()} tokens, the model {bert.vocab_size}"
        )
    if cfg.max_seq_length > bert.max_position_embeddings:
        raise ValueError(
            f"max_seq_length {cfg.max_seq_length} > the model's max_position_embeddings {bert.max_position_embeddings}"
        )


def save(cfg: FinetuneConfig, model, metrics: dict) -> None:
    """The fine-tuned model in --output-dir, Hugging Face's layout, with the tokenizer files
    of --init, the settings and the eval results (each file atomically)."""
    out = Path(cfg.output_dir)
    model.cpu().save_hf(out)
    for name in TOKENIZER_FILES:
        if (Path(cfg.init) / name).is_file():
            shutil.copyfile(Path(cfg.init) / name, out / name)
    write_text_atomic(
        out / "finetune_config.json", json.dumps(dataclasses.asdict(cfg), indent=2) + "\n"
    )
    write_text_atomic(out / "eval_results.json", json.dumps(metrics, indent=2) + "\n")
    logger.info("wrote %s", out)
