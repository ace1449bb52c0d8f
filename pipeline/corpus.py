"""An English corpus that exists offline on every machine: the Python standard
library's docstrings and its language reference (``pydoc_data.topics``), written
in Google's txt convention. About 1.9 MB with Python 3.11.

    python -m pipeline.corpus --output corpus/ --files 4
    python -m pipeline.corpus --output corpus/ --max-mb 5 --repeat   # for benchmarks

Each module, class and function docstring with at least ``min_words`` words, and
each reference topic, is one document; its paragraphs are split into sentences
(``split_sentences``), one per line, with a blank line between documents. Files
are visited in sorted order and documents dealt round-robin into ``--files``
files, so the output depends only on the Python version's standard library.
"""

from __future__ import annotations

import argparse
import ast
import logging
import os
import re
import sysconfig
from collections.abc import Iterator, Sequence
from pathlib import Path

from .text import split_sentences

logger = logging.getLogger(__name__)
_DOCTEST = re.compile(r"^\s*(>>>|\.\.\.)")


def stdlib_docstrings(min_words: int = 8) -> Iterator[str]:
    """Docstrings of the standard library (tests and site-packages excluded), in file order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.rglob("*.py")):
        parts = set(path.relative_to(root).parts)
        if parts & {"site-packages", "test", "tests", "idle_test", "lib2to3"}:
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc.split()) >= min_words:
                    yield doc


def reference_topics() -> Iterator[str]:
    """The language reference's topics, as ``help()`` shows them."""
    try:
        from pydoc_data.topics import topics
    except ImportError:
        return
    for name in sorted(topics):
        yield topics[name]


def document_sentences(docstring: str) -> list[str]:
    """Prose sentences of one docstring: doctest examples (prompts and their output,
    up to the next blank line) dropped, paragraphs joined and split."""
    lines, in_example = [], False
    for line in docstring.splitlines():
        in_example = bool(_DOCTEST.match(line)) or (in_example and bool(line.strip()))
        if not in_example:
            lines.append(line)
    paragraphs = " ".join(line.strip() if line.strip() else "\n\n" for line in lines)
    return [s for s in split_sentences(paragraphs) if s.strip()]


def write_corpus(
    output: str | os.PathLike, *, max_bytes: int | None = None, files: int = 1, repeat: bool = False
) -> list[Path]:
    """Write documents (up to ``max_bytes``) into ``files`` txt files; returns their paths.

    With ``repeat``, documents repeat in the same order until ``max_bytes`` is
    reached (for speed benchmarks; never for held-out evaluation).
    """
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    texts = [*stdlib_docstrings(), *reference_topics()]
    docs = [s for d in texts if len(s := document_sentences(d)) >= 2]
    if not docs:
        raise RuntimeError("no docstrings found in the standard library")
    limit = max_bytes if max_bytes is not None else float("inf")
    chunks: list[list[str]] = [[] for _ in range(files)]
    written, i = 0, 0
    while written < limit and (repeat or i < len(docs)):
        text = "\n".join(docs[i % len(docs)]) + "\n\n"
        chunks[i % files].append(text)
        written += len(text.encode("utf-8"))
        i += 1
    paths = []
    for k, chunk in enumerate(chunks):
        path = output / f"stdlib-docs-{k:03d}.txt"
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(chunk), encoding="utf-8")
        tmp.replace(path)
        paths.append(path)
    logger.info(
        "wrote %d documents, %.2f MB, into %d file(s) in %s", i, written / 1e6, files, output
    )
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--output", required=True, help="directory for the txt files")
    p.add_argument(
        "--max-mb", type=float, default=None, help="cap in MB (default: everything once)"
    )
    p.add_argument("--files", type=int, default=1, help="number of files (default: 1)")
    p.add_argument("--repeat", action="store_true", help="repeat documents up to --max-mb")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    max_bytes = int(args.max_mb * 1e6) if args.max_mb else None
    write_corpus(args.output, max_bytes=max_bytes, files=args.files, repeat=args.repeat)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
