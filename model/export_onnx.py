"""Export a Hugging Face BERT directory to ONNX, optionally quantized to INT8.

    python -m model.export_onnx hf/base base.onnx                 # encoder
    python -m model.export_onnx runs/sst2/final sst2.onnx         # encoder + classifier
    python -m model.export_onnx runs/sst2/final sst2.int8.onnx --quantize
    python -m model.export_onnx runs/stsb embed.onnx --pooling mean  # sentence embeddings

DIR is a directory written by ``save_hf`` (ours or transformers'); a DeepSpeed
checkpoint is converted first with ``python -m trainer.export CKPT DIR``. The graph
is captured with ``torch.onnx.export(dynamo=True)``; batch and sequence axes are
dynamic (sequence up to ``max_position_embeddings``).

Graph inputs, all int64 (batch, sequence), named as a Hugging Face tokenizer's output so
that its dict feeds the graph as it is (``session.run(None, dict(tokenizer(texts,
padding=True, return_tensors="np")))``): ``input_ids``, ``token_type_ids`` (BERT's
``segment_ids``: 0 sentence A, 1 sentence B), ``attention_mask`` (1 real, 0 padding).
Outputs, fp32, by the directory's ``architectures``:

- a fine-tuning head (model/heads.py): ``logits`` (batch, num_labels) or
  (batch, sequence, num_labels); for question answering ``start_logits`` and
  ``end_logits`` (batch, sequence);
- anything else (pretraining export, ``BertModel``): the encoder only,
  ``sequence_output`` (batch, sequence, hidden) and ``pooled_output`` (batch, hidden);
  the MLM/NSP heads are training-time only and are not exported;
- with ``--pooling mean|cls``, any directory: ``sentence_embedding`` (batch, hidden), the
  encoder's mean-pooled (over the attention mask) or ``[CLS]`` vector, L2-normalized
  (model/embed.py), for search by dot product.

``--quantize`` applies onnxruntime's dynamic quantization (int8 weights, activations
quantized per batch at run time) to the exported graph and writes that to OUT; it
is a CPU inference format. After writing, the model is run by onnxruntime on random
batches and compared with PyTorch; fp32 must agree within 1e-4 (max abs error
relative to the largest output), INT8's error is logged. ``bench/inference_speed.py``
measures speed and the accuracy change.

Exit codes: 0 written, 2 bad input directory, 3 fp32 outputs disagree with PyTorch.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from pipeline.options import CommandParser

from .bert import BertForPreTraining
from .config import BertConfig
from .embed import POOLINGS, SentenceEmbedding, load_encoder
from .heads import HEADS, HeadConfig, load_head_model
from .hf import read_hf_config

logger = logging.getLogger(__name__)

# transformers' names (a tokenizer's output keys), not ours (segment_ids): the graph is
# fed by HF tokenizers.
INPUT_NAMES = ("input_ids", "token_type_ids", "attention_mask")
ENCODER_OUTPUTS = ("sequence_output", "pooled_output")
FP32_TOLERANCE = 1e-4
# ONNX files are protobufs, limited to 2 GiB; bigger weights go to a side file.
_INLINE_LIMIT_BYTES = 1_500_000_000


class OnnxExportable(nn.Module):
    """Tensors in, a tuple of tensors out, no input validation (it reads values, which
    a traced graph cannot); wraps a head model or the bare encoder."""

    def __init__(self, model: nn.Module):
        super().__init__()
        # The traced graph is the padded encoder: packing takes data-dependent shapes
        # (nonzero, per-row lengths) that a dynamic-axes ONNX graph cannot keep fast.
        (model.bert if hasattr(model, "bert") else model).unpad = False
        self.model = model
        self.output_names = output_names(model)

    def forward(self, input_ids, token_type_ids, attention_mask) -> tuple[torch.Tensor, ...]:
        args = input_ids, token_type_ids, attention_mask  # token_type_ids: our segment_ids
        if isinstance(self.model, tuple(HEADS.values())):
            sequence_output, pooled_output = self.model.bert(*args)
            if hasattr(self.model, "qa_outputs"):
                logits = self.model.qa_outputs(sequence_output)  # (B, T, 2)
                return logits[..., 0], logits[..., 1]
            features = pooled_output if pooled_output is not None else sequence_output
            return (self.model.classifier(features),)  # dropout is the identity at inference
        out = self.model(*args)
        return out if isinstance(out, tuple) else (out,)  # SentenceEmbedding: one tensor


def output_names(model: nn.Module) -> tuple[str, ...]:
    """ONNX output names of a head model or an encoder (see the module doc)."""
    if isinstance(model, SentenceEmbedding):
        return ("sentence_embedding",)
    if hasattr(model, "qa_outputs"):
        return ("start_logits", "end_logits")
    if hasattr(model, "classifier"):
        return ("logits",)
    return ENCODER_OUTPUTS


def bert_config(model: nn.Module) -> BertConfig:
    """The encoder's config of a head model (``HeadConfig.bert``), a ``BertModel`` or a
    ``SentenceEmbedding``."""
    return model.config.bert if isinstance(model.config, HeadConfig) else model.config


def _needs_external_data(model: nn.Module) -> bool:
    return sum(p.numel() * p.element_size() for p in model.parameters()) > _INLINE_LIMIT_BYTES


def load_for_export(directory: str | os.PathLike, pooling: str | None = None) -> nn.Module:
    """The head model the directory holds, else its encoder (a ``BertModel``), in eval mode;
    with ``pooling`` ("mean" or "cls"), its encoder as a ``SentenceEmbedding``.

    Raises:
        FileNotFoundError: not a Hugging Face directory (a DeepSpeed checkpoint is named).
        ValueError: bad config or weights (file and key named).
    """
    if pooling is not None:
        return SentenceEmbedding(load_encoder(directory), pooling).eval()
    _, architecture, _ = read_hf_config(directory)
    if architecture in HEADS:
        return load_head_model(HEADS[architecture], directory).eval()
    return BertForPreTraining.from_hf(directory, strict=False).bert.eval()


def example_inputs(
    vocab_size: int, batch: int, seq_len: int, seed: int
) -> tuple[torch.Tensor, ...]:
    """Random int64 (batch, seq_len) inputs: ids in [5, vocab), two segments, and rows
    after the first padded to varying lengths."""
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(min(5, vocab_size - 1), vocab_size, (batch, seq_len), generator=g)
    segment_ids = torch.zeros_like(input_ids)
    segment_ids[:, seq_len // 2 :] = 1
    attention_mask = torch.ones_like(input_ids)
    for row in range(1, batch):
        length = int(torch.randint(1, seq_len + 1, (1,), generator=g))
        attention_mask[row, length:] = 0
        input_ids[row, length:] = 0
    return input_ids, segment_ids, attention_mask


def export_onnx(model: nn.Module, path: str | os.PathLike, *, opset: int = 18) -> Path:
    """Write ``model`` (a head model or ``BertModel``) as ONNX with dynamic batch/sequence.

    Raises:
        RuntimeError: torch.onnx could not capture the graph.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    wrapper = OnnxExportable(model.eval()).eval()
    config = bert_config(model)
    batch = torch.export.Dim("batch")
    sequence = torch.export.Dim("sequence", max=config.max_position_embeddings)
    axes = {0: batch, 1: sequence}
    with torch.no_grad(), warnings.catch_warnings():
        # One Dim object shared by the three inputs is the intent, not a problem.
        warnings.filterwarnings("ignore", message=r"# The axis name: .* will not be used")
        torch.onnx.export(
            wrapper,
            example_inputs(config.vocab_size, 2, min(16, config.max_position_embeddings), 0),
            path,
            input_names=list(INPUT_NAMES),
            output_names=list(wrapper.output_names),
            dynamic_shapes=(axes, axes, axes),
            opset_version=opset,
            dynamo=True,
            external_data=_needs_external_data(model),
            verbose=False,
        )
    return path


def quantize(
    fp32_path: str | os.PathLike, int8_path: str | os.PathLike, *, external_data: bool = False
) -> Path:
    """Dynamic INT8 quantization (weights int8 per tensor, activations at run time)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(
        Path(fp32_path),
        Path(int8_path),
        weight_type=QuantType.QInt8,
        use_external_data_format=external_data,
    )
    return Path(int8_path)


def session(path: str | os.PathLike, threads: int | None = None):
    """An onnxruntime CPU session; ``threads`` sets intra-op threads (None: ORT's default)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def max_rel_error(
    model: nn.Module, path: str | os.PathLike, shapes: Sequence[tuple[int, int]], seed: int = 0
) -> float:
    """Largest over ``shapes`` (batch, seq) and outputs of max |ORT - torch| / max |torch|."""
    wrapper = OnnxExportable(model.eval()).eval()
    config = bert_config(model)
    sess = session(path)
    worst = 0.0
    for i, (batch, seq_len) in enumerate(shapes):
        inputs = example_inputs(config.vocab_size, batch, seq_len, seed + i)
        with torch.no_grad():
            expected = wrapper(*inputs)
        feed = {name: t.numpy() for name, t in zip(INPUT_NAMES, inputs, strict=True)}
        got = sess.run(list(wrapper.output_names), feed)
        for want, have in zip(expected, got, strict=True):
            want = want.numpy()
            worst = max(worst, float(np.abs(have - want).max() / max(np.abs(want).max(), 1e-12)))
    return worst


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = CommandParser(prog="python -m model.export_onnx", description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", help="Hugging Face directory (save_hf or transformers)")
    parser.add_argument("output", help="the .onnx file to write")
    parser.add_argument("--quantize", action="store_true", help="write dynamic INT8 to OUTPUT")
    parser.add_argument(
        "--pooling",
        choices=POOLINGS,
        help="export sentence embeddings instead: the encoder, mean or [CLS] pooling, "
        "L2-normalized (output sentence_embedding (batch, hidden))",
    )
    parser.add_argument("--opset", type=int, default=18)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    # onnxruntime's quantizer logs every tensor at INFO on the root logger: keep root quiet.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for name in ("model", __name__):  # __name__ is "__main__" under python -m
        logging.getLogger(name).setLevel(logging.INFO)
    args = _parse(argv)
    try:
        model = load_for_export(args.directory, args.pooling)
    except (FileNotFoundError, ValueError) as e:
        logger.error("%s", e)
        return 2
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    shapes = [(1, 7), (3, 33), (2, min(128, bert_config(model).max_position_embeddings))]
    with tempfile.TemporaryDirectory(dir=output.parent) as tmp:
        fp32 = export_onnx(
            model, Path(tmp, "fp32.onnx") if args.quantize else output, opset=args.opset
        )
        error = max_rel_error(model, fp32, shapes)
        logger.info("fp32 ONNX vs PyTorch: max relative error %.2e over shapes %s", error, shapes)
        if error > FP32_TOLERANCE:
            logger.error(
                "fp32 ONNX outputs differ from PyTorch by %.2e > %g", error, FP32_TOLERANCE
            )
            return 3
        if args.quantize:
            quantize(fp32, output, external_data=_needs_external_data(model))
            error = max_rel_error(model, output, shapes)
            logger.info("INT8 ONNX vs PyTorch fp32: max relative error %.2e", error)
    logger.info("wrote %s (outputs %s)", output, ", ".join(output_names(model)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
