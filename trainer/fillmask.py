"""Fill-mask demo: a Hugging Face export guesses one masked word in held-out sentences.

    python -m trainer.fillmask runs/base/hf held_out_shards/ -n 50 --show 5 --seed 0
    python -m trainer.fillmask runs/base/hf notes.txt        # or text: a .txt file or a dir of them

The export must carry its tokenizer (trainer/export.py writes it). Sentences come from a
held-out shard directory (local or gs://, s3://): rows are stored already masked
(pipeline/shards/FORMAT.md), so the original ids are put back from ``masked_lm_ids`` and one segment
(A or B; for MLM rows one document's run of sentences) is decoded with the shards' vocab.txt. Or from text files, split into sentences by
the pipeline's splitter. In each sentence one whole word that the export's tokenizer keeps as
a single token (not a special token, not punctuation) is replaced by ``[MASK]`` and the model
loaded by ``transformers.pipeline("fill-mask", model=EXPORT_DIR)`` guesses it. Its guesses and
the true word's rank (exact, from the logits) count only the tokens that can be such a word:
punctuation and ``##`` pieces, never the answer, are not ranked (a model that puts "," first
would otherwise lose to any baseline that knows better). Rows, segments and words are chosen by
one ``random.Random(seed)``, so a seed always shows the same examples. Offline, CPU, seconds.

Exit codes: 0 printed, 2 a missing or bad export or source, or no maskable sentence in it.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from pipeline.core.text import split_sentences
from pipeline.options import CommandParser
from pipeline.shards import shard_format

from .hf_tokenizer import TOKENIZER_CONFIG_NAME, read_shard_vocab

logger = logging.getLogger(__name__)

ROWS_PER_EXAMPLE = 4  # rows sampled per wanted example: some segments have no maskable word


# ----------------------------------------------------------------------------- sentences


def restore_masked(row: Mapping[str, np.ndarray]) -> np.ndarray:
    """The row's ``input_ids`` before the pipeline masked them.

    Example: input_ids [2, 4, 9, 3], masked_lm_positions [1], masked_lm_ids [7] -> [2, 7, 9, 3].

    Args:
        row: a shard row (pipeline.shards.shard_format.iter_rows): int arrays ``input_ids`` (L,),
            ``masked_lm_positions`` (P,), ``masked_lm_ids`` (P,).
    """
    ids = np.array(row["input_ids"], dtype=np.int64)  # a copy: rows may be read-only views
    if "masked_lm_positions" in row:  # unmasked MLM rows have none
        ids[np.asarray(row["masked_lm_positions"], dtype=np.int64)] = row["masked_lm_ids"]
    return ids


def decode_wordpiece(tokens: Sequence[str]) -> str:
    """WordPiece tokens as text: ``["the", "sch", "##ool", "!"] -> "the school !"``."""
    words: list[str] = []
    for token in tokens:
        if token.startswith("##") and words:
            words[-1] += token[2:]
        else:
            words.append(token)
    return " ".join(words)


def row_segments(row: Mapping[str, np.ndarray], vocab: Sequence[str]) -> list[str]:
    """The row's segments A and B as text (original ids, no [CLS]/[SEP]); empty ones dropped.

    The pipeline truncates long segments at either end, so a segment may start inside a word:
    such leading ``##`` pieces are dropped. (A word cut at the end cannot be told apart.)

    MLM rows (no ``segment_ids``) give the runs of sentences of each document they pack
    (split at their ``[SEP]`` tokens).

    Args:
        row: a shard row (see :func:`restore_masked`) with ``segment_ids`` (L,), or an MLM
            row.
        vocab: the shards' tokens, id = index.
    """
    ids = restore_masked(row)
    if "segment_ids" in row:
        segment_ids = np.asarray(row["segment_ids"])
        parts = [ids[segment_ids == segment] for segment in (0, 1)]
    else:
        parts = np.split(ids, np.flatnonzero(ids == vocab.index("[SEP]")))
    texts = []
    for part in parts:
        tokens = [vocab[i] for i in part.tolist()]
        tokens = [t for t in tokens if t not in ("[CLS]", "[SEP]", "[PAD]")]
        while tokens and tokens[0].startswith("##"):
            tokens.pop(0)
        if tokens:
            texts.append(decode_wordpiece(tokens))
    return texts


def shard_sentences(directory: str, count: int, rng: random.Random) -> list[str]:
    """One segment of each of ``count`` rows of a shard directory, rows and segments by ``rng``.

    Only the shards holding the chosen rows are opened.

    Raises:
        ShardFormatError: no manifest.json, or a bad shard.
        ValueError: vocab.txt does not match the manifest.
        OSError: a file cannot be read.
    """
    vocab = read_shard_vocab(directory).tokens
    manifest = shard_format.read_manifest(directory)
    names = [entry["name"] for entry in manifest["shards"]]
    starts = np.cumsum([0] + [entry["rows"] for entry in manifest["shards"]])  # (shards + 1,)
    picks = rng.sample(range(int(starts[-1])), min(count, int(starts[-1])))
    tables = {}
    sentences = []
    for index in picks:
        shard = int(np.searchsorted(starts, index, side="right")) - 1
        if shard not in tables:
            tables[shard] = shard_format.open_shard(shard_format.join_path(directory, names[shard]))
        row = shard_format.row_to_numpy(tables[shard], index - int(starts[shard]))
        sentences.append(rng.choice(row_segments(row, vocab)))
    return sentences


def text_sentences(path: str | os.PathLike) -> list[str]:
    """The sentences of a .txt file, or of the *.txt files of a directory (sorted by name).

    Raises:
        FileNotFoundError: no such file, or a directory without .txt files.
    """
    path = Path(path)
    files = sorted(path.glob("*.txt")) if path.is_dir() else [path]
    if not files or not files[0].is_file():
        raise FileNotFoundError(f"{path}: not a shard directory, a .txt file or a dir of them")
    sentences = []
    for file in files:
        for line in file.read_text(encoding="utf-8").splitlines():
            sentences.extend(split_sentences(line.strip()) if line.strip() else [])
    return sentences


def mask_one_word(sentence: str, tokenizer, rng: random.Random) -> tuple[str, str] | None:
    """``sentence`` with one single-token word replaced by the mask token, and that token.

    Example: ``"The king built it."`` -> ``("The [MASK] built it.", "king")`` (the word by
    ``rng``; the true word as the tokenizer spells it, e.g. lowercased).

    Args:
        tokenizer: a transformers fast tokenizer (offsets are needed).

    Returns:
        None when no word qualifies: one token, not special, with a letter or digit; or
        the sentence is longer than the tokenizer's model_max_length.
    """
    encoding = tokenizer(sentence, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = encoding["input_ids"], encoding["offset_mapping"]
    if len(ids) + 2 > tokenizer.model_max_length:
        return None
    word_ids = encoding.word_ids()
    tokens_per_word = Counter(word_ids)
    special = set(tokenizer.all_special_ids)
    candidates = []
    for i, word in enumerate(word_ids):
        whole = tokens_per_word[word] == 1 and ids[i] not in special
        if whole and is_word(tokenizer.convert_ids_to_tokens(ids[i])):
            candidates.append(i)
    if not candidates:
        return None
    i = rng.choice(candidates)
    start, end = offsets[i]
    masked = sentence[:start] + tokenizer.mask_token + sentence[end:]
    return masked, tokenizer.convert_ids_to_tokens(ids[i])


def pick_examples(
    sentences: Sequence[str], tokenizer, n: int, rng: random.Random
) -> list[tuple[str, str]]:
    """Up to ``n`` (masked text, true word) pairs from ``sentences`` in an order by ``rng``."""
    examples = []
    for sentence in rng.sample(list(sentences), len(sentences)):
        example = mask_one_word(sentence, tokenizer, rng)
        if example is not None:
            examples.append(example)
            if len(examples) == n:
                break
    return examples


# ----------------------------------------------------------------------------- predictions


def rank_of(logits, true_id: int) -> int:
    """1 + the number of ids scored above ``true_id``: ``rank_of([0.1, 3.0, 2.0], 2) -> 2``.

    Ties count in the true word's favour.

    Args:
        logits: float tensor (V,), one mask position's scores over the vocab.
    """
    return 1 + int((logits > logits[true_id]).sum())


def check_export(export_dir: str | os.PathLike) -> str:
    """``export_dir`` as a string, once it has the files the fill-mask pipeline needs.

    Raises:
        FileNotFoundError: no config.json or no tokenizer files, with the fix.
    """
    for name in ("config.json", TOKENIZER_CONFIG_NAME):
        if not Path(export_dir, name).is_file():
            raise FileNotFoundError(
                f"{export_dir} has no {name}: export it with python -m trainer.export "
                "(add --vocab SHARD_DIR if the training shards have moved)"
            )
    return os.fspath(export_dir)


def load_fill_mask(export_dir: str | os.PathLike, top_k: int = 5):
    """``transformers.pipeline("fill-mask")`` on a local export (CPU).

    Raises:
        FileNotFoundError: see :func:`check_export`.
    """
    import transformers

    return transformers.pipeline(
        "fill-mask", model=check_export(export_dir), top_k=top_k, device="cpu"
    )


def word_tokens(tokenizer):
    """A bool tensor (V,): the ids that can be a masked word's answer, as
    :func:`mask_one_word` chooses words: not special, not a ``##`` continuation, with a letter
    or digit. Punctuation and word pieces are never the answer, so they are not ranked."""
    import torch

    special = set(tokenizer.all_special_ids)
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    return torch.tensor([i not in special and is_word(t) for i, t in enumerate(tokens)])


def is_word(token: str) -> bool:
    """A token that can stand for a whole word: not a ``##`` piece, with a letter or digit.
    ``is_word("king") -> True``; ``is_word(",")``, ``is_word("##s") -> False``."""
    return not token.startswith("##") and any(ch.isalnum() for ch in token)


def fill_mask_examples(
    export_dir: str | os.PathLike, examples: Sequence[tuple[str, str]], top_k: int = 5
) -> list[dict]:
    """The export's guesses for each (text with one mask token, true word), among the
    tokens that can be a word's answer (:func:`word_tokens`).

    Returns:
        One dict per example: ``text``, ``true_word``, ``true_id``, ``predictions`` (the
        top_k word tokens as ``[{"token": str, "id": int, "score": float}]``, best first,
        scores the model's probabilities over the whole vocab), ``rank`` (int in 1..W,
        exact, from the logits) and ``words`` (W, the word tokens ranked).

    Raises:
        FileNotFoundError: see :func:`load_fill_mask`.
        ValueError: a text without exactly one mask token, or a true word that is not a
            word token of the export's vocab.
    """
    import torch

    fill = load_fill_mask(export_dir, top_k)
    tokenizer, model = fill.tokenizer, fill.model
    words = word_tokens(tokenizer)
    results = []
    for text, word in examples:
        inputs = tokenizer(text, return_tensors="pt")
        where = (inputs["input_ids"][0] == tokenizer.mask_token_id).nonzero().flatten()
        if len(where) != 1:
            raise ValueError(f"{text!r} has {len(where)} {tokenizer.mask_token} tokens, not 1")
        true_id = tokenizer.convert_tokens_to_ids(word)
        if true_id is None or tokenizer.convert_ids_to_tokens(true_id) != word:
            raise ValueError(f"{word!r} is not a token of the vocab of {export_dir}")
        if not words[true_id]:
            raise ValueError(f"{word!r} is not a word token (punctuation, special or ##)")
        with torch.no_grad():
            logits = model(**inputs).logits[0, int(where[0])]  # (V,)
        probs = logits.float().softmax(-1)
        answers = torch.zeros(len(logits), dtype=torch.bool)  # the model's vocab may be padded
        answers[: len(words)] = words[: len(logits)]
        ranked = torch.where(answers, logits, float("-inf"))
        best = ranked.topk(min(top_k, int(answers.sum()))).indices.tolist()
        predictions = [
            {"token": tokenizer.convert_ids_to_tokens(i), "id": i, "score": float(probs[i])}
            for i in best
        ]
        results.append(
            {
                "text": text,
                "true_word": word,
                "true_id": true_id,
                "predictions": predictions,
                "rank": rank_of(ranked, true_id),
                "words": int(answers.sum()),
            }
        )
    return results


# ----------------------------------------------------------------------------- report


def shorten(text: str, mask: str = "[MASK]", width: int = 100) -> str:
    """About ``width`` characters of ``text`` around ``mask``, cut ends marked with "...".

    Example: ``shorten("a b [MASK] c d", width=10) -> "...b [MASK] c..."``.
    """
    if len(text) <= width:
        return text
    at = max(text.find(mask), 0)
    start = max(0, min(at - (width - len(mask)) // 2, len(text) - width))
    end = start + width
    return ("..." if start else "") + text[start:end] + ("..." if end < len(text) else "")


def format_example(number: int, result: Mapping, top_k: int) -> str:
    """Three lines: the shortened text, the true word and its rank, the predictions."""
    rank = result["rank"] if result["rank"] <= top_k else f">{top_k}"
    exact = f" (rank {result['rank']} of {result['words']} words)" if result["rank"] > top_k else ""
    predictions = "  ".join(f"{p['token']} {p['score']:.3f}" for p in result["predictions"])
    return (
        f"{number}. {shorten(result['text'])}\n"
        f"   true word: {result['true_word']}   rank: {rank}{exact}\n"
        f"   top {top_k}: {predictions}"
    )


def summary(results: Sequence[Mapping], top_k: int) -> str:
    """How often the true word is the export's first guess and in its top k, beside the
    trivial baseline on the same examples: always guessing the examples' commonest true
    words (the most frequent for top 1, the k most frequent for top k), as the trainer's
    MLM accuracy stands beside its most-frequent-token baseline.

    Example: ranks 1, 3, 9, 1 of true words a, a, b, c -> ``"true word in top 1: 2/4 (50%),
    in top 5: 3/4 (75%); baseline (the commonest true words of these examples): top 1 2/4
    (50%), top 5 4/4 (100%)"``.
    """
    n = len(results)
    top1 = sum(r["rank"] == 1 for r in results)
    topk = sum(r["rank"] <= top_k for r in results)
    counts = sorted(Counter(r["true_word"] for r in results).values(), reverse=True)
    base1, basek = sum(counts[:1]), sum(counts[:top_k])

    def share(hits: int) -> str:
        return f"{hits}/{n} ({hits / n:.0%})"

    return (
        f"true word in top 1: {share(top1)}, in top {top_k}: {share(topk)}; baseline (the "
        f"commonest true words of these examples): top 1 {share(base1)}, top {top_k} "
        f"{share(basek)}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    parser = CommandParser(
        prog="python -m trainer.fillmask",
        description="Mask one word in held-out sentences and show the export's guesses.",
    )
    parser.add_argument("export_dir", help="a Hugging Face export with its tokenizer files")
    parser.add_argument("source", help="held-out shard directory, or a .txt file or dir of them")
    parser.add_argument(
        "-n", type=int, default=50, help="masked words scored (default 50: enough to compare)"
    )
    parser.add_argument("--show", type=int, default=5, help="of them, printed (default 5)")
    parser.add_argument("--seed", type=int, default=0, help="chooses rows, segments and words")
    parser.add_argument("--top-k", type=int, default=5, help="predictions shown (default 5)")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.n < 1 or args.top_k < 1 or args.show < 0:
        parser.error("-n and --top-k must be at least 1, --show at least 0")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local directory; never ask the hub
    try:
        results = _run(args)
    except (OSError, ValueError) as err:  # ShardFormatError is a ValueError
        logger.error("%s", err)
        return 2
    for number, result in enumerate(results[: args.show], 1):
        print(format_example(number, result, args.top_k))
    if len(results) > args.show:
        print(f"... and {len(results) - args.show} more, scored below (--show)")
    print(summary(results, args.top_k))
    return 0


def _run(args: argparse.Namespace) -> list[dict]:
    import transformers

    transformers.logging.set_verbosity_error()  # "some weights not used": the NSP head
    transformers.logging.disable_progress_bar()
    rng = random.Random(args.seed)
    tokenizer = transformers.AutoTokenizer.from_pretrained(check_export(args.export_dir))
    if (
        shard_format.is_remote(args.source)
        or Path(args.source, shard_format.MANIFEST_NAME).is_file()
    ):
        sentences = shard_sentences(args.source, ROWS_PER_EXAMPLE * args.n, rng)
    else:
        sentences = text_sentences(args.source)
    examples = pick_examples(sentences, tokenizer, args.n, rng)
    if not examples:
        raise ValueError(f"{args.source}: no sentence with a word to mask")
    if len(examples) < args.n:
        logger.warning("only %d of %d examples: too few maskable sentences", len(examples), args.n)
    return fill_mask_examples(args.export_dir, examples, args.top_k)


if __name__ == "__main__":
    sys.exit(main())
