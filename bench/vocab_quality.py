"""Vocab quality: our count-based WordPiece learner vs tokenizers' BertWordPieceTokenizer.

Builds an English corpus offline and deterministically from docstrings: the
Python standard library's, then those of the installed packages (files in
sorted order, one document per module, 8 MB by default), holds out every 10th
document, then for each vocab size:

* ours: count words of the training documents with ``basic_tokenize``
  (a ``Counter``, as the Beam combiner does), ``learn_wordpiece_vocab``;
* reference: ``tokenizers.BertWordPieceTokenizer`` trained on the raw training
  text (same normalization, same defaults: min_frequency 2, limit_alphabet 1000);

and prints WordPiece tokens per word on the held-out documents for both (both
vocabs go through the same ``build_tokenizer``), the ratio, the [UNK] rate,
the share of tokens the two vocabs have in common, and the learning times.
The requirement: ratio within 2% (``|ours / reference - 1| <= 0.02``).

Run (from the repository root)::

    python bench/vocab_quality.py                       # uncased, 8000 and 30522
    python bench/vocab_quality.py --cased --vocab_sizes 8000 16000 --max_mb 2
"""

from __future__ import annotations

import argparse
import ast
import logging
import os
import sys
import sysconfig
import time
from collections import Counter

from tokenizers import BertWordPieceTokenizer

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pipeline.core.text import basic_tokenize
from pipeline.core.vocab import build_tokenizer, learn_wordpiece_vocab

_DOCSTRING_NODES = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def _python_files(root: str) -> list[str]:
    """The ``.py`` files under ``root``, sorted (nested site-packages excluded)."""
    paths = []
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = [d for d in subdirs if d != "site-packages"]
        paths += [os.path.join(directory, f) for f in files if f.endswith(".py")]
    return sorted(paths)


def _docstrings(path: str) -> str:
    """A module's docstrings (module, classes, functions), blank-line separated;
    ``""`` for a file that does not parse."""
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return ""
    docstrings = [ast.get_docstring(n) for n in ast.walk(tree) if isinstance(n, _DOCSTRING_NODES)]
    return "\n\n".join(d for d in docstrings if d)


def docstring_documents(max_bytes: int) -> list[str]:
    """One document per Python module: the standard library's, then this
    environment's site-packages (``purelib``), in sorted path order, until
    ``max_bytes`` of UTF-8 text. The same Python build and installed packages
    give the same corpus on every run; no network.
    """
    roots = [sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"]]
    documents, size = [], 0
    for path in _python_files(roots[0]) + _python_files(roots[1]):
        document = _docstrings(path)
        if document:
            documents.append(document)
            size += len(document.encode("utf-8"))
        if size >= max_bytes:
            break
    return documents


def tokens_per_word(tokens: list[str], documents: list[str], do_lower_case: bool) -> tuple:
    """(WordPiece tokens per basic word, [UNK] share of tokens) on ``documents``."""
    tokenizer = build_tokenizer(tokens, do_lower_case)
    encodings = tokenizer.encode_batch(documents, add_special_tokens=False)
    num_tokens = sum(len(e.ids) for e in encodings)
    num_unk = sum(e.ids.count(tokens.index("[UNK]")) for e in encodings)
    num_words = sum(len(basic_tokenize(d, do_lower_case)) for d in documents)
    return num_tokens / num_words, num_unk / num_tokens


def reference_vocab(train: list[str], vocab_size: int, do_lower_case: bool) -> list[str]:
    """tokenizers' BertWordPieceTokenizer trained on raw text, as an id-ordered list."""
    reference = BertWordPieceTokenizer(lowercase=do_lower_case)
    reference.train_from_iterator(train, vocab_size=vocab_size, show_progress=False)
    vocab = reference.get_vocab()
    return sorted(vocab, key=vocab.__getitem__)


def compare(train, held_out, counts, vocab_size, do_lower_case) -> float:
    """Learns both vocabs at ``vocab_size``, prints one report line, returns the ratio."""
    started = time.perf_counter()
    ours = learn_wordpiece_vocab(counts, vocab_size)
    ours_s = time.perf_counter() - started
    started = time.perf_counter()
    theirs = reference_vocab(train, vocab_size, do_lower_case)
    theirs_s = time.perf_counter() - started
    ours_tpw, ours_unk = tokens_per_word(ours, held_out, do_lower_case)
    theirs_tpw, theirs_unk = tokens_per_word(theirs, held_out, do_lower_case)
    shared = len(set(ours) & set(theirs)) / len(theirs)
    ratio = ours_tpw / theirs_tpw
    print(
        f"vocab {vocab_size:>6} (got {len(ours)}/{len(theirs)}): tokens/word ours "
        f"{ours_tpw:.4f} ref {theirs_tpw:.4f} ratio {ratio:.4f} ({(ratio - 1) * 100:+.2f}%)  "
        f"[UNK] {ours_unk:.4%}/{theirs_unk:.4%}  shared tokens {shared:.1%}  "
        f"learn {ours_s:.1f}s / ref {theirs_s:.1f}s"
    )
    return ratio


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab_sizes", type=int, nargs="+", default=[8000, 30522])
    parser.add_argument("--max_mb", type=float, default=8.0, help="corpus size in MB")
    parser.add_argument("--cased", action="store_true", help="cased (default: uncased)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    do_lower_case = not args.cased
    documents = docstring_documents(int(args.max_mb * 1e6))
    train = [d for i, d in enumerate(documents) if i % 10 != 9]
    held_out = [d for i, d in enumerate(documents) if i % 10 == 9]
    started = time.perf_counter()
    counts = Counter()
    for document in train:
        counts.update(basic_tokenize(document, do_lower_case))
    print(
        f"corpus: {len(documents)} documents, {sum(map(len, documents)) / 1e6:.2f} M chars; "
        f"held out {len(held_out)}; {'uncased' if do_lower_case else 'cased'}; "
        f"{sum(counts.values())} training words, {len(counts)} distinct "
        f"(counted in {time.perf_counter() - started:.1f}s)"
    )
    ratios = [compare(train, held_out, counts, v, do_lower_case) for v in args.vocab_sizes]
    worst = max(abs(r - 1) for r in ratios)
    print(f"worst |ratio - 1| = {worst:.2%} ({'within' if worst <= 0.02 else 'OUTSIDE'} 2%)")
    return 0 if worst <= 0.02 else 1


if __name__ == "__main__":
    sys.exit(main())
