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
import csv
import dataclasses
import json
import logging
import math
import re
import shutil
import string
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from model.config import write_text_atomic
from model.heads import (
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    read_hf_config,
)
from pipeline.vocab import build_tokenizer, read_vocab

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
IGNORE_INDEX = -100
MAX_ANSWER_TOKENS = 30  # longest span considered when decoding QA predictions
OUTSIDE_TAG = "O"


class DataError(ValueError):
    """A bad input file; the message names the file, the line and the field."""


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


# ---------------------------------------------------------------- reading files


def read_records(path: str | Path) -> list[tuple[str, dict[str, Any]]]:
    """``(where, record)`` pairs of a JSONL or CSV file; ``where`` is ``"file:line"``.

    Raises:
        DataError: missing file, unknown extension, bad JSON/CSV/UTF-8, or no records.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    suffix = path.suffix.lower()
    if suffix not in (".jsonl", ".json", ".csv"):
        raise DataError(f"{path}: unknown extension {suffix!r}; use .jsonl, .json or .csv")
    records = []
    try:
        with path.open(encoding="utf-8", newline="") as f:
            if suffix == ".csv":
                reader = csv.DictReader(f)
                records = [(f"{path}:{reader.line_num}", dict(row)) for row in reader]
            else:
                for n, line in enumerate(f, 1):
                    if line.strip():
                        record = json.loads(line)
                        if not isinstance(record, dict):
                            raise DataError(f"{path}:{n}: expected a JSON object per line")
                        records.append((f"{path}:{n}", record))
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{n}: not JSON ({e.msg}); expected one object per line") from e
    except (UnicodeDecodeError, csv.Error) as e:
        raise DataError(f"{path}: cannot parse: {e}") from e
    if not records:
        raise DataError(f"{path}: no examples")
    return records


def _field(record: dict, name: str, where: str, optional: bool = False) -> Any:
    value = record.get(name)
    if value is None or value == "":
        if optional:
            return None
        raise DataError(f"{where}: missing field {name!r} (have {sorted(record)})")
    return value


def _str_list(value: Any, name: str, where: str) -> list[str]:
    if isinstance(value, str):  # a CSV cell
        value = value.split()
    if not isinstance(value, list) or not value or not all(isinstance(x, str) for x in value):
        raise DataError(f"{where}: {name!r} must be a non-empty list of strings")
    return value


def _answers(record: dict, where: str) -> list[tuple[str, int]]:
    value = _field(record, "answers", where)
    try:
        value = json.loads(value) if isinstance(value, str) else value
        if isinstance(value, dict):
            pairs = zip(value["text"], value["answer_start"], strict=True)
            value = [{"text": t, "answer_start": a} for t, a in pairs]
        answers = [_strip_answer(str(v["text"]), int(v["answer_start"])) for v in value]
    except (ValueError, TypeError, KeyError) as e:
        raise DataError(
            f"{where}: 'answers' must be {{'text': [...], 'answer_start': [...]}}"
        ) from e
    context = _field(record, "context", where)
    for text, start in answers:
        if not text or context[start : start + len(text)] != text:
            raise DataError(f"{where}: answer {text!r} is not at context[{start}:]")
    if not answers:
        raise DataError(f"{where}: no answers (SQuAD v1.1 style: every question has one)")
    return answers


def _strip_answer(text: str, start: int) -> tuple[str, int]:
    """Surrounding whitespace off an answer (SQuAD has some): ``(" cat", 4) -> ("cat", 5)``."""
    stripped = text.lstrip()
    return stripped.rstrip(), start + len(text) - len(stripped)


def parse_example(task: str, record: dict, where: str) -> dict[str, Any]:
    """One record as the task's fields (see the module doc). Raises DataError."""
    if task == "classification":
        return {
            "text": str(_field(record, "text", where)),
            "text_pair": _field(record, "text_pair", where, optional=True),
            "label": str(_field(record, "label", where)),
        }
    if task == "token":
        tokens = _str_list(_field(record, "tokens", where), "tokens", where)
        tags = _str_list(_field(record, "tags", where), "tags", where)
        if len(tokens) != len(tags):
            raise DataError(f"{where}: {len(tokens)} tokens but {len(tags)} tags")
        return {"tokens": tokens, "tags": tags}
    question = str(_field(record, "question", where))
    return {"question": question, "context": record["context"], "answers": _answers(record, where)}


def load_examples(task: str, path: str | Path) -> list[dict[str, Any]]:
    """Parsed examples of ``path``; each keeps ``where`` for error messages."""
    return [{**parse_example(task, r, where), "where": where} for where, r in read_records(path)]


def load_tokenizer(directory: str | Path) -> Tokenizer:
    """``tokenizer.json``, else ``vocab.txt`` built like ``BertTokenizerFast``.

    Raises:
        FileNotFoundError: neither file is in ``directory``.
    """
    directory = Path(directory)
    if (directory / "tokenizer.json").is_file():
        tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    elif (directory / "vocab.txt").is_file():
        settings = directory / "tokenizer_config.json"
        lower = (
            json.loads(settings.read_text()).get("do_lower_case", True)
            if settings.is_file()
            else True
        )
        tokenizer = build_tokenizer(read_vocab(directory / "vocab.txt"), do_lower_case=bool(lower))
    else:
        raise FileNotFoundError(
            f"{directory}: no tokenizer.json or vocab.txt; copy there the vocab.txt of the "
            f"shards the model was pretrained on"
        )
    tokenizer.no_padding()
    return tokenizer


def label_names(task: str, examples: list[dict], saved: tuple[str, ...] | None, path: str):
    """Label names in id order: ``saved`` (checked to cover the data) or the data's, sorted
    (numerically when all are integers). None for QA."""
    if task == "qa":
        return None
    seen = {e["label"] for e in examples} if task == "classification" else set()
    for e in examples if task == "token" else []:
        seen.update(e["tags"])
    if saved is not None:
        unknown = sorted(seen - set(saved))
        if unknown:
            raise DataError(f"{path}: labels {unknown[:5]} are not among the model's {list(saved)}")
        return saved
    numeric = all(re.fullmatch(r"-?\d+", s) for s in seen)
    return tuple(sorted(seen, key=(lambda s: (int(s), s)) if numeric else None))


# ---------------------------------------------------------------- features


def encode(task: str, tokenizer: Tokenizer, examples: list[dict], labels, max_len: int):
    """Features: dicts of ``input_ids``, ``segment_ids`` (lists of int) and the targets
    (``labels``: int or per-token list with -100; QA ``start_positions``/``end_positions``
    plus ``offsets`` and ``context`` for decoding)."""
    label_id = {name: i for i, name in enumerate(labels or ())}
    strategy = "only_second" if task == "qa" else "longest_first"
    tokenizer.enable_truncation(max_len, strategy=strategy)
    try:
        if task == "classification":
            inputs = [
                (e["text"], e["text_pair"]) if e["text_pair"] else e["text"] for e in examples
            ]
            encodings = tokenizer.encode_batch(inputs)
        elif task == "token":
            encodings = tokenizer.encode_batch(
                [e["tokens"] for e in examples], is_pretokenized=True
            )
        else:
            encodings = tokenizer.encode_batch([(e["question"], e["context"]) for e in examples])
    except Exception as e:  # tokenizers raises a bare Exception on impossible truncation
        raise DataError(
            f"{examples[0]['where'].rsplit(':', 1)[0]}: {e}; raise --max-seq-length"
        ) from e
    features = []
    for e, enc in zip(examples, encodings, strict=True):
        f = {"input_ids": enc.ids, "segment_ids": enc.type_ids}
        if task == "classification":
            f["labels"] = label_id[e["label"]]
        elif task == "token":
            words = enc.word_ids
            f["labels"] = [
                label_id[e["tags"][w]]
                if w is not None and (i == 0 or words[i - 1] != w)
                else IGNORE_INDEX
                for i, w in enumerate(words)
            ]
        else:
            text, start = e["answers"][0]
            first, last = enc.char_to_token(start, 1), enc.char_to_token(start + len(text) - 1, 1)
            cut = first is None or last is None  # the answer was truncated away: [CLS]
            f["start_positions"], f["end_positions"] = (0, 0) if cut else (first, last)
            context_mask = [int(s == 1) for s in enc.sequence_ids]  # no question, no specials
            f.update(offsets=enc.offsets, context_mask=context_mask, example=e)
        features.append(f)
    return features


def collate(features: list[dict], pad_id: int) -> dict[str, torch.Tensor]:
    """Pad to the batch's longest row: int64 (B, T) tensors and (B,) / (B, T) targets."""
    width = max(len(f["input_ids"]) for f in features)

    def pad(key: str, value: int) -> torch.Tensor:
        return torch.tensor([f[key] + [value] * (width - len(f[key])) for f in features])

    batch = {"input_ids": pad("input_ids", pad_id), "segment_ids": pad("segment_ids", 0)}
    batch["attention_mask"] = (
        torch.arange(width) < torch.tensor([len(f["input_ids"]) for f in features])[:, None]
    ).long()
    for key in ("labels", "start_positions", "end_positions"):
        if key in features[0]:
            scalar = isinstance(features[0][key], int)
            batch[key] = (
                torch.tensor([f[key] for f in features]) if scalar else pad(key, IGNORE_INDEX)
            )
    return batch


# ---------------------------------------------------------------- metrics


def f1_score(tp: int, n_pred: int, n_gold: int) -> float:
    """Harmonic mean of precision tp/n_pred and recall tp/n_gold; 0 when either is 0."""
    return 2 * tp / (n_pred + n_gold) if tp else 0.0


def squad_normalize(text: str) -> str:
    """SQuAD's answer normalisation: ``"The  Cat!"`` -> ``"cat"``."""
    text = "".join(c for c in text.lower() if c not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def squad_scores(prediction: str, answers: Sequence[str]) -> tuple[float, float]:
    """(exact match, token F1), each the best over the gold ``answers``."""
    pred = squad_normalize(prediction).split()
    best = (0.0, 0.0)
    for answer in answers:
        gold = squad_normalize(answer).split()
        common = sum((Counter(pred) & Counter(gold)).values())
        best = max(best, (float(pred == gold), f1_score(common, len(pred), len(gold))))
    return best


def best_span(start: torch.Tensor, end: torch.Tensor, allowed: torch.Tensor) -> tuple[int, int]:
    """argmax of start[s] + end[e] over allowed s <= e < s + MAX_ANSWER_TOKENS; all (T,)."""
    scores = start[:, None] + end[None, :]  # (T, T)
    s, e = torch.meshgrid(torch.arange(len(start)), torch.arange(len(end)), indexing="ij")
    ok = (e >= s) & (e - s < MAX_ANSWER_TOKENS) & allowed[:, None] & allowed[None, :]
    flat = int(scores.masked_fill(~ok, -math.inf).argmax())
    return divmod(flat, len(end))


@torch.no_grad()
def _outputs(model, features: list[dict], batch_size: int, pad_id: int):
    """Yields (features of a batch, their padded batch, the model's output) in eval mode."""
    model.eval()
    try:
        for i in range(0, len(features), batch_size):
            chunk = features[i : i + batch_size]
            batch = collate(chunk, pad_id)
            inputs = {k: batch[k] for k in ("input_ids", "segment_ids", "attention_mask")}
            yield chunk, batch, model(**inputs)
    finally:
        model.train()


def evaluate(task: str, model, features: list[dict], labels, batch_size: int, pad_id: int) -> dict:
    """The task's metrics on ``features`` (see the module doc), as fractions in [0, 1]."""
    if task == "qa":
        em = f1 = 0.0
        for chunk, batch, out in _outputs(model, features, batch_size, pad_id):
            width = batch["input_ids"].shape[1]
            for j, f in enumerate(chunk):
                mask = f["context_mask"] + [0] * (width - len(f["context_mask"]))
                s, e = best_span(out.start_logits[j], out.end_logits[j], torch.tensor(mask).bool())
                text = f["example"]["context"][f["offsets"][s][0] : f["offsets"][e][1]]
                scores = squad_scores(text, [a for a, _ in f["example"]["answers"]])
                em, f1 = em + scores[0], f1 + scores[1]
        return {"exact_match": em / len(features), "f1": f1 / len(features)}
    preds, golds = [], []
    for _, batch, out in _outputs(model, features, batch_size, pad_id):
        scored = batch["labels"] != IGNORE_INDEX  # (B,) or (B, T)
        preds.append(out.logits.argmax(-1)[scored])
        golds.append(batch["labels"][scored])
    pred, gold = torch.cat(preds), torch.cat(golds)
    metrics = {"accuracy": (pred == gold).float().mean().item()}
    if task == "token":
        outside = labels.index(OUTSIDE_TAG) if OUTSIDE_TAG in labels else -1
        tp = int(((pred == gold) & (gold != outside)).sum())
        metrics["f1"] = f1_score(tp, int((pred != outside).sum()), int((gold != outside).sum()))
    return metrics


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
