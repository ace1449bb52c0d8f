"""Encoder inference speed: PyTorch fp32 vs ONNX Runtime fp32 vs ONNX Runtime INT8.

    python bench/inference_speed.py                          # base, batch 8, seq 128
    python bench/inference_speed.py --preset small --batch 32 --rounds 20 --threads 2

Speed: a random-weight encoder of the preset (``BertModel``: sequence and pooled
outputs) on full-length rows of ``--seq`` tokens; the three runtimes use the same
number of intra-op threads and alternate (A B C A B C ...) after warm-ups, and the
median round gives sequences/s, so machine noise hits all three alike.

Accuracy: a tiny BERT is fine-tuned (``python -m finetune``) on a synthetic
sentence-pair task (does either segment contain a digit token; rows of 20-120 words)
and exported (model/export_onnx.py); the eval set is scored by PyTorch, ORT fp32 and
ORT INT8 (dynamic quantization), with the prediction agreement against PyTorch.
Results are logged and, with ``--json``, written to a file.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from finetune.config import FinetuneConfig
from finetune.data import collate, encode, load_examples, load_tokenizer
from finetune.train import run
from model import BertConfig, BertForPreTraining, BertForSequenceClassification, BertModel
from model.export_onnx import INPUT_NAMES, OnnxExportable, export_onnx, quantize, session
from pipeline.core.vocab import SPECIAL_TOKENS, write_vocab

logger = logging.getLogger("bench.inference_speed")
WORDS = [f"w{i}" for i in range(50)]
DIGITS = [str(i) for i in range(10)]


def speed(preset: str, batch: int, seq: int, rounds: int, threads: int, tmp: Path) -> dict:
    """Sequences/s of the three runtimes (median over ``rounds`` alternating rounds)."""
    torch.manual_seed(0)
    model = BertModel(BertConfig.preset(preset)).eval()
    fp32 = export_onnx(model, tmp / "encoder.onnx")
    int8 = quantize(fp32, tmp / "encoder.int8.onnx")
    g = torch.Generator().manual_seed(0)
    inputs = (
        torch.randint(5, model.config.vocab_size, (batch, seq), generator=g),
        torch.zeros(batch, seq, dtype=torch.long),
        torch.ones(batch, seq, dtype=torch.long),
    )
    feed = {n: t.numpy() for n, t in zip(INPUT_NAMES, inputs, strict=True)}
    torch.set_num_threads(threads)
    wrapper = OnnxExportable(model).eval()
    sessions = {
        "onnxruntime_fp32": session(fp32, threads),
        "onnxruntime_int8": session(int8, threads),
    }

    def run_torch():
        with torch.inference_mode():
            wrapper(*inputs)

    runners = {"pytorch_fp32": run_torch}
    runners.update({k: (lambda s=s: s.run(None, feed)) for k, s in sessions.items()})
    times: dict[str, list[float]] = {k: [] for k in runners}
    for _ in range(2):  # warm-up
        for fn in runners.values():
            fn()
    for _ in range(rounds):
        for name, fn in runners.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    result = {name: batch / statistics.median(t) for name, t in times.items()}
    result["size_mb"] = {p.name: round(p.stat().st_size / 1e6, 1) for p in (fp32, int8)}
    return result


def has_digit(rng: random.Random, n: int) -> list[dict]:
    """Balanced pairs of 10-60 words each; label: a digit token in either segment."""
    rows = []
    for i in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(20, 120))]
        if i % 2:
            words[rng.randrange(len(words))] = rng.choice(DIGITS)
        half = len(words) // 2
        text, pair = " ".join(words[:half]), " ".join(words[half:])
        rows.append({"text": text, "text_pair": pair, "label": "yes" if i % 2 else "no"})
    return rows


def accuracy(tmp: Path, threads: int) -> dict:
    """Fine-tune a tiny model, then score the eval set in the three runtimes."""
    init = tmp / "init"
    torch.manual_seed(0)
    vocab = [*SPECIAL_TOKENS, *WORDS, *DIGITS]
    cfg = BertConfig.preset("tiny", vocab_size=len(vocab), max_position_embeddings=128)
    BertForPreTraining(cfg).save_hf(init)
    write_vocab(init / "vocab.txt", vocab)
    for name, n, seed in (("train", 2000, 1), ("eval", 500, 2)):
        rows = has_digit(random.Random(seed), n)
        (tmp / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = FinetuneConfig(
        task="classification",
        init=str(init),
        train=str(tmp / "train.jsonl"),
        eval=str(tmp / "eval.jsonl"),
        output_dir=str(tmp / "finetuned"),
        epochs=3,
        lr=5e-4,
    )
    run(config)
    model = BertForSequenceClassification.from_hf(tmp / "finetuned").eval()
    fp32 = export_onnx(model, tmp / "classifier.onnx")
    int8 = quantize(fp32, tmp / "classifier.int8.onnx")
    examples = load_examples("classification", tmp / "eval.jsonl")
    labels = model.config.labels
    features = encode("classification", load_tokenizer(init), examples, labels, 128)
    gold = np.array([f["labels"] for f in features])
    logits = {"pytorch_fp32": [], "onnxruntime_fp32": [], "onnxruntime_int8": []}
    sessions = {
        "onnxruntime_fp32": session(fp32, threads),
        "onnxruntime_int8": session(int8, threads),
    }
    for i in range(0, len(features), 64):
        batch = collate(features[i : i + 64], 0)
        # finetune's batch names, in the order of the graph's INPUT_NAMES
        inputs = [batch[n] for n in ("input_ids", "segment_ids", "attention_mask")]
        with torch.inference_mode():
            logits["pytorch_fp32"].append(model(*inputs).logits.numpy())
        feed = {n: t.numpy() for n, t in zip(INPUT_NAMES, inputs, strict=True)}
        for name, s in sessions.items():
            logits[name].append(s.run(None, feed)[0])
    probs = {k: torch.tensor(np.concatenate(v)).softmax(-1).numpy() for k, v in logits.items()}
    ref = probs["pytorch_fp32"]
    return {
        name: {
            "accuracy": float((p.argmax(-1) == gold).mean()),
            "agreement_with_pytorch": float((p.argmax(-1) == ref.argmax(-1)).mean()),
            "max_abs_prob_diff_vs_pytorch": float(np.abs(p - ref).max()),
        }
        for name, p in probs.items()
    }


def main(argv: list[str] | None = None) -> int:
    # onnxruntime's quantizer logs every tensor at INFO on the root logger: keep root quiet.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logger.setLevel(logging.INFO)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="base")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--skip-accuracy", action="store_true")
    parser.add_argument("--json", help="write the results to this file")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        results = {"settings": vars(args)}
        results["sequences_per_s"] = speed(
            args.preset, args.batch, args.seq, args.rounds, args.threads, Path(tmp)
        )
        if not args.skip_accuracy:
            results["synthetic_task"] = accuracy(Path(tmp), args.threads)
    logger.info("results:\n%s", json.dumps(results, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
