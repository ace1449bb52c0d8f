"""Input side of ``python -m finetune``: read, validate, encode and collate.

JSONL/CSV records become parsed examples (``load_examples``), examples become
features, token ids and targets (``encode``; QA's windows: ``finetune.qa.encode_qa``),
whose ids are checked against the model once (``check_features``), and lists of
features become padded int64 batches (``collate``).
The file formats are described in the module doc of ``finetune/__main__.py``; every
bad record raises ``DataError`` naming the file, the line and the field.
"""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from pipeline.core.vocab import build_tokenizer, read_vocab

IGNORE_INDEX = -100
SIMILARITY_LABELS = ("score",)  # the one output of the similarity head


class DataError(ValueError):
    """A bad input file; the message names the file, the line and the field."""


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
    """``[(text, answer_start), ...]``; ``[]`` for a SQuAD 2.0 unanswerable question
    (``is_impossible`` true, or empty ``answers``)."""
    impossible = _flag(record.get("is_impossible", False), "is_impossible", where)
    value = _field(record, "answers", where, optional=impossible) or []
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
    if impossible and answers:
        raise DataError(f"{where}: is_impossible is true but 'answers' has {len(answers)}")
    return answers


def _flag(value: Any, name: str, where: str) -> bool:
    """A JSON bool or a CSV cell: ``"true" -> True``, ``"" -> False``."""
    flags = {"true": True, "1": True, "false": False, "0": False, "": False}
    if isinstance(value, bool):
        return value
    if isinstance(value, (str, int)) and str(value).strip().lower() in flags:
        return flags[str(value).strip().lower()]
    raise DataError(f"{where}: {name!r} must be true or false, got {value!r}")


def _strip_answer(text: str, start: int) -> tuple[str, int]:
    """Surrounding whitespace off an answer (SQuAD has some): ``(" cat", 4) -> ("cat", 5)``."""
    stripped = text.lstrip()
    return stripped.rstrip(), start + len(text) - len(stripped)


def _score(value: Any, where: str) -> float:
    """A finite float (a CSV cell is a str): ``"3.8" -> 3.8``."""
    try:
        score = float(value)
    except (TypeError, ValueError):
        score = math.nan
    if isinstance(value, bool) or not math.isfinite(score):
        raise DataError(f"{where}: 'score' must be a finite number, got {value!r}")
    return score


def parse_example(task: str, record: dict, where: str) -> dict[str, Any]:
    """One record as the task's fields (see ``finetune/__main__.py``). Raises DataError."""
    if task == "classification":
        return {
            "text": str(_field(record, "text", where)),
            "text_pair": _field(record, "text_pair", where, optional=True),
            "label": str(_field(record, "label", where)),
        }
    if task == "similarity":
        return {
            "text": str(_field(record, "text", where)),
            "text_pair": str(_field(record, "text_pair", where)),
            "score": _score(_field(record, "score", where), where),
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
    (numerically when all are integers). None for QA; ``("score",)`` for similarity."""
    if task == "qa":
        return None
    if task == "similarity":
        return SIMILARITY_LABELS
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
    """Features of a classification, similarity or token task (QA: ``finetune.qa.encode_qa``):
    dicts of ``input_ids``, ``segment_ids`` (lists of int) and ``labels`` (int, float or a
    per-token list with -100), inputs truncated to ``max_len`` tokens."""
    if task not in ("classification", "similarity", "token"):
        raise ValueError(f"encode takes no {task!r} task (qa: finetune.qa.encode_qa)")
    label_id = {name: i for i, name in enumerate(labels or ())}
    tokenizer.enable_truncation(max_len, strategy="longest_first")
    try:
        if task in ("classification", "similarity"):
            inputs = [
                (e["text"], e["text_pair"]) if e["text_pair"] else e["text"] for e in examples
            ]
            encodings = tokenizer.encode_batch(inputs)
        else:
            encodings = tokenizer.encode_batch(
                [e["tokens"] for e in examples], is_pretokenized=True
            )
    except Exception as e:  # tokenizers raises a bare Exception on impossible truncation
        raise DataError(
            f"{examples[0]['where'].rsplit(':', 1)[0]}: {e}; raise --max-seq-length"
        ) from e
    features = []
    for e, enc in zip(examples, encodings, strict=True):
        f = {"input_ids": enc.ids, "segment_ids": enc.type_ids}
        if task == "classification":
            f["labels"] = label_id[e["label"]]
        elif task == "similarity":
            f["labels"] = e["score"]  # float: the head's MSE target
        else:
            words = enc.word_ids
            f["labels"] = [
                label_id[e["tags"][w]]
                if w is not None and (i == 0 or words[i - 1] != w)
                else IGNORE_INDEX
                for i, w in enumerate(words)
            ]
        features.append(f)
    return features


def check_features(
    features: list[dict], examples: list[dict], vocab_size: int, type_vocab_size: int
) -> None:
    """The features' ids within the model's tables, checked once where the data enters (the
    model checks only shapes and dtypes in forward: model/bert.py). Feature i is of example
    i (as :func:`encode` returns them) or of ``examples[feature["example_index"]]`` (QA).

    Raises:
        DataError: names the example's file and line, the field and the bad value.
    """
    limits = (
        ("input_ids", vocab_size, "the tokenizer's ids exceed the model's vocab_size"),
        ("segment_ids", type_vocab_size, "the model's type_vocab_size"),
    )
    for i, feature in enumerate(features):
        example = examples[feature.get("example_index", i)]
        for name, upper, why in limits:
            values = feature[name]
            if values and (min(values) < 0 or max(values) >= upper):
                bad = next(v for v in values if not 0 <= v < upper)
                raise DataError(
                    f"{example['where']}: {name} values must be in [0, {upper}), got {bad} ({why})"
                )


def collate(features: list[dict], pad_id: int) -> dict[str, torch.Tensor]:
    """Pad to the batch's longest row: int64 (B, T) tensors and (B,) / (B, T) targets
    (int64; similarity's (B,) scores fp32)."""
    width = max(len(f["input_ids"]) for f in features)

    def pad(key: str, value: int) -> torch.Tensor:
        return torch.tensor([f[key] + [value] * (width - len(f[key])) for f in features])

    batch = {"input_ids": pad("input_ids", pad_id), "segment_ids": pad("segment_ids", 0)}
    batch["attention_mask"] = (
        torch.arange(width) < torch.tensor([len(f["input_ids"]) for f in features])[:, None]
    ).long()
    for key in ("labels", "start_positions", "end_positions"):
        if key in features[0]:
            scalar = isinstance(features[0][key], (int, float))
            batch[key] = (
                torch.tensor([f[key] for f in features]) if scalar else pad(key, IGNORE_INDEX)
            )
    return batch
