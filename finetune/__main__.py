"""Fine-tune a BERT directory on sentence classification, token classification, QA or
sentence-pair similarity.

    python -m finetune --task classification --init hf/base \\
        --train sst2/train.jsonl --eval sst2/dev.jsonl --output-dir runs/sst2
    python -m finetune --task token --init hf/base --train ner/train.jsonl \\
        --eval ner/dev.jsonl --epochs 3 --lr 5e-5
    python -m finetune --task qa --init hf/base --train squad/train.jsonl \\
        --eval squad/dev.jsonl --batch-size 12 --doc-stride 128 --epochs 2
    python -m finetune --task similarity --init hf/base --train stsb/train.jsonl \\
        --eval stsb/dev.jsonl --output-dir runs/stsb

(``bert-finetune`` once installed. More in docs/finetune.md.)

--init is a Hugging Face directory (``save_hf`` or transformers') with a tokenizer:
``tokenizer.json``, or ``vocab.txt`` (lower-cased unless its ``tokenizer_config.json``
says ``"do_lower_case": false``). A DeepSpeed checkpoint of trainer/run.py is turned
into one by ``python -m trainer.export CKPT HF_DIR``. The head is the one saved in
--init if it is there, else a new one (model/heads.py).

Files are JSONL (``.jsonl``/``.json``, one object per line) or CSV (``.csv``, header):
- classification: ``text``, optional ``text_pair``, ``label`` (str or int);
- similarity (STS-B style): ``text``, ``text_pair``, ``score`` (a float, e.g. 0..5); the
  model regresses it from the pair's pooled [CLS] (one output, MSE loss);
- token: ``tokens`` and ``tags``, lists of equal length (CSV: space-separated);
- qa (SQuAD v1.1 or 2.0 style): ``question``, ``context``,
  ``answers`` = ``{"text": [...], "answer_start": [...]}`` or a list of such
  objects (CSV: JSON in the cell); ``context[answer_start:]`` must begin with the text.
  An unanswerable question (2.0) has empty ``answers`` or ``"is_impossible": true``.

The loop is plain PyTorch: AdamW (weight decay 0.01, none on biases and LayerNorm),
linear warmup (--warmup-ratio of all steps, or --warmup-steps) then linear decay to 0 at
the last step, gradient clipping at 1.0, dynamic padding, one evaluation per epoch and
one at --max-steps. Defaults are BERT's fine-tuning recipe (lr 3e-5 in 2e-5..5e-5,
3 epochs, batch 32, warmup 10%). An optimizer step takes --grad-accum micro batches of
--batch-size examples. What trains, and how fast (finetune/params.py; L encoder layers,
l = 0 the lowest): --freeze-layers N keeps the embeddings and layers 0..N-1 fixed;
--gradual-unfreeze trains in epoch e the head and the top e-1 layers (epoch L+2: the
embeddings too); --layer-lr-decay D gives layer l lr * D^(L-l), the embeddings
lr * D^(L+1), the head (and pooler) lr. Sequences are truncated to --max-seq-length
(default 128; QA 384).

QA follows Google's run_squad.py (finetune/qa.py, finetune/squad.py): the question is cut
to --max-query-length tokens and the context split into windows that start --doc-stride
tokens apart, each a feature [CLS] question [SEP] window [SEP]; a window without the
whole answer is trained to point at [CLS]. An example's answer is the best span over its
windows (top --n-best-size starts and ends, at most --max-answer-length tokens, starting
where the token has its most context), cut from the context by offsets. When the training
file has unanswerable questions the answer is "" where the null score ([CLS] start + end
logit, the smallest over windows) exceeds the best span's by more than
--null-score-diff-threshold.

Metrics: classification accuracy; similarity Pearson and Spearman (ties ranked by their
average, as scipy) correlation and MSE; token accuracy and micro F1 over
words whose tag is not ``O`` (a per-word F1, not seqeval's per-entity one; words
cut by truncation are not scored); QA exact match and token F1 (SQuAD's v2 script: ""
is right for a question without answers), with unanswerable questions in --eval also
by HasAns/NoAns and the best null threshold for this set (``best_f1_thresh``; reported,
not applied).

Sentence embeddings for search, from any directory this writes (or --init):
``finetune.embed.SentenceEncoder.from_hf(DIR, pooling="mean" | "cls").encode(texts)``, and
as ONNX ``python -m model.export_onnx DIR OUT --pooling mean``.

Writes to --output-dir: the model (``save_hf``), the tokenizer files of --init,
``finetune_config.json`` and ``eval_results.json``. Exit codes: 0 done, 2 a bad
file, directory or setting (the message names it).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from finetune.config import parse_config
from finetune.train import run

logger = logging.getLogger("finetune")


def main(argv: Sequence[str] | None = None) -> int:
    """The command: 0 done, 2 a bad file, directory or setting (logged, no traceback)."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        run(parse_config(argv, __doc__))
    except (ValueError, FileNotFoundError) as e:  # DataError is a ValueError
        logger.error("%s", e)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
