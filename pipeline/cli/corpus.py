"""An English corpus that exists offline on every machine: the Python standard
library's docstrings, its language reference (``pydoc_data.topics``), its tests'
docstrings and its prose comments, written in Google's txt convention. 2.7 MB with
Python 3.11; the docstrings and reference alone (``--sources docstrings reference``,
the main job's corpus): 1.9 MB.

    python -m pipeline.cli.corpus --output corpus/ --files 4
    python -m pipeline.cli.corpus --output corpus/ --max-mb 5 --repeat   # for benchmarks

Each module, class and function docstring with at least ``min_words`` words, each
block of consecutive comment lines that reads as prose (:func:`stdlib_comments`),
and each reference topic, is one document; its paragraphs are split into sentences
(``split_sentences``), one per line, with a blank line between documents. Files
are visited in sorted order and documents dealt round-robin into ``--files``
files, so the output depends only on the Python version's standard library.
"""

from __future__ import annotations

import argparse
import ast
import io
import itertools
import logging
import os
import re
import sysconfig
import tokenize
from collections.abc import Iterator, Sequence
from pathlib import Path

from pipeline.core.text import split_sentences
from pipeline.options import CommandParser

logger = logging.getLogger(__name__)
_DOCTEST = re.compile(r"^\s*(>>>|\.\.\.)")
_WORD = re.compile(r"^[A-Za-z][a-z]*[,.;:]?$")  # a plain English word, maybe with punctuation
SOURCES = ("docstrings", "reference", "test-docstrings", "comments")
_TEST_DIRS = frozenset({"test", "tests", "idle_test", "lib2to3"})
_LAYOUT = frozenset({tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT})


def stdlib_files(tests: bool | None = None) -> Iterator[tuple[Path, str]]:
    """(path, source) of the standard library's .py files (site-packages excluded), sorted.

    ``tests``: None for all files, True for the library's tests only, False for the rest.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.rglob("*.py")):
        parts = set(path.relative_to(root).parts)
        if "site-packages" in parts:
            continue
        if tests is not None and bool(parts & _TEST_DIRS) != tests:
            continue
        try:
            yield path, path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue


def stdlib_docstrings(min_words: int = 8, *, tests: bool = False) -> Iterator[str]:
    """Docstrings of the standard library (``tests``: of its tests instead), in file order."""
    for _, source in stdlib_files(tests):
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc.split()) >= min_words:
                    yield doc


def stdlib_comments(min_words: int = 20, min_prose: float = 0.7) -> Iterator[str]:
    """Prose comment blocks (:func:`comment_blocks`) of the standard library, in file
    order; a block whose text was seen before (licence headers repeat) is skipped."""
    seen: set[str] = set()
    for _, source in stdlib_files():
        for text in comment_blocks(source, min_words=min_words, min_prose=min_prose):
            if text not in seen:
                seen.add(text)
                yield text


def comment_blocks(source: str, *, min_words: int = 20, min_prose: float = 0.7) -> list[str]:
    """Blocks of ``#`` comments on consecutive lines of ``source`` that read as prose.

    A block is kept when it has at least ``min_words`` words, at least ``min_prose`` of
    them plain English words (commented-out code and tables fail this). Its lines join
    into one paragraph. Example (``min_words=4``): ``"# Walk the tree once.\\n# Then
    return.\\nx = 1\\n# y = f(x) + 2"`` -> ``["Walk the tree once. Then return."]``.
    """
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError):
        return []
    blocks, block, last_row = [], [], -2
    for tok in [*tokens, None]:
        if tok is not None and tok.type in _LAYOUT:
            continue
        if tok is not None and tok.type == tokenize.COMMENT and tok.start[0] == last_row + 1:
            block.append(tok.string.lstrip("#").strip())
            last_row = tok.start[0]
            continue
        words = " ".join(block).split()
        if len(words) >= min_words:
            prose = sum(bool(_WORD.match(w)) for w in words) / len(words)
            if prose >= min_prose:
                blocks.append(" ".join(words))
        block = []
        if tok is not None and tok.type == tokenize.COMMENT:
            block, last_row = [tok.string.lstrip("#").strip()], tok.start[0]
    return blocks


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
    output: str | os.PathLike,
    *,
    max_bytes: int | None = None,
    files: int = 1,
    repeat: bool = False,
    sources: Sequence[str] = SOURCES,
) -> list[Path]:
    """Write documents (up to ``max_bytes``) into ``files`` txt files; returns their paths.

    With ``repeat``, documents repeat in the same order until ``max_bytes`` is
    reached (for speed benchmarks; never for held-out evaluation). ``sources``: any of
    :data:`SOURCES`, in that order in the output.

    Raises:
        ValueError: an unknown source.
    """
    unknown = sorted(set(sources) - set(SOURCES))
    if unknown:
        raise ValueError(f"unknown corpus source(s) {unknown}; choose from {SOURCES}")
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    readers = {"docstrings": stdlib_docstrings, "reference": reference_topics,
               "test-docstrings": lambda: stdlib_docstrings(tests=True),
               "comments": stdlib_comments}  # fmt: skip
    texts = (text for name in SOURCES if name in sources for text in readers[name]())
    # Lazy: a capped corpus reads only as much of the library as it writes.
    docs = (sentences for d in texts if len(sentences := document_sentences(d)) >= 2)
    if repeat:
        docs = itertools.cycle(list(docs))
    limit = max_bytes if max_bytes is not None else float("inf")
    chunks: list[list[str]] = [[] for _ in range(files)]
    written, i = 0, 0
    for sentences in docs:
        if written >= limit:
            break
        text = "\n".join(sentences) + "\n\n"
        chunks[i % files].append(text)
        written += len(text.encode("utf-8"))
        i += 1
    if not i:
        raise RuntimeError("no documents found in the standard library")
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
    p = CommandParser(
        prog="python -m pipeline.cli.corpus",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--output", required=True, help="directory for the txt files")
    p.add_argument(
        "--max-mb", type=float, default=None, help="cap in MB (default: everything once)"
    )
    p.add_argument("--files", type=int, default=1, help="number of files (default: 1)")
    p.add_argument("--repeat", action="store_true", help="repeat documents up to --max-mb")
    p.add_argument(
        "--sources",
        nargs="+",
        choices=SOURCES,
        default=list(SOURCES),
        help="what to write (default: all)",
    )
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    max_bytes = int(args.max_mb * 1e6) if args.max_mb else None
    write_corpus(
        args.output, max_bytes=max_bytes, files=args.files, repeat=args.repeat, sources=args.sources
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
