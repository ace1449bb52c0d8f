"""An English corpus that exists offline on every machine: the Python standard
library's docstrings, its language reference (``pydoc_data.topics``), its tests'
docstrings and its prose comments, written in Google's txt convention. 2.7 MB with
Python 3.11; the docstrings and reference alone (``--sources docstrings reference``,
the main job's corpus): 1.9 MB.

    python -m pipeline corpus --output corpus/ --files 4
    python -m pipeline corpus --output corpus/ --max_mb 5 --repeat   # for benchmarks

Each module, class and function docstring with at least ``min_words`` words, each
block of consecutive comment lines that reads as prose (:func:`stdlib_comments`),
and each reference topic, is one document; its paragraphs are split into sentences
(``split_sentences``), one per line, with a blank line between documents. Files
are visited in sorted order and documents dealt round-robin into ``--files``
files, so the output depends only on the Python version's standard library.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import io
import itertools
import json
import logging
import os
import platform
import sysconfig
import time
import tokenize
from collections.abc import Iterator, Sequence
from pathlib import Path

from pipeline.cli.package_docs import DOCTEST, PACKAGES, is_prose, package_documents
from pipeline.core.text import split_sentences
from pipeline.options import CommandParser
from pipeline.shards.shard_writer import atomic_write_bytes

logger = logging.getLogger(__name__)
SOURCES = ("docstrings", "reference", "test-docstrings", "comments")
_TEST_DIRS = frozenset({"test", "tests", "idle_test", "lib2to3"})
_SKIPPED_DIRS = frozenset(
    {"test", "tests", "testing", "_vendor", "vendor", "vendored", "benchmarks"}
)
MANIFEST_NAME = "corpus.json"  # beside the txt files: what they hold and their sha256
MANIFEST_VERSION = 1
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
        if len(words) >= min_words and is_prose(words, min_prose):
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
        raise FileNotFoundError(
            "corpus source 'reference' is missing: this Python has no pydoc_data.topics "
            "(leave it out of --sources)"
        ) from None
    for name in sorted(topics):
        yield topics[name]


def document_sentences(docstring: str) -> list[str]:
    """Prose sentences of one docstring: doctest examples (prompts and their output,
    up to the next blank line) dropped, paragraphs joined and split."""
    lines, in_example = [], False
    for line in docstring.splitlines():
        in_example = bool(DOCTEST.match(line)) or (in_example and bool(line.strip()))
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
    readers = {
        "docstrings": stdlib_docstrings,
        "reference": reference_topics,
        "test-docstrings": lambda: stdlib_docstrings(tests=True),
        "comments": stdlib_comments,
    }
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


def write_package_corpus(
    output: str | os.PathLike,
    packages: Sequence[str],
    *,
    files: int = 1,
    heldout_permille: int = 0,
    processes: int | None = None,
    max_bytes: int | None = None,
) -> tuple[list[Path], list[dict]]:
    """Write the prose of ``packages``' docstrings and comments into ``files`` txt files
    (``packages-000.txt``, ...) plus ``packages-heldout.txt``; returns (paths, sources).

    A document is one .py file's prose pieces (:func:`~pipeline.cli.package_docs._file_pieces`:
    docstrings and comment blocks, in source order); a piece seen before (a copied docstring)
    is left out of it, and a document of fewer than two sentences is skipped. Documents whose
    text's sha256 falls in the first ``heldout_permille`` of 1000 go to the held-out file, so
    the split depends on a document's text only, not on the other packages. ``sources`` holds
    one dict per package: name, version, documents, bytes written. With ``max_bytes``, the
    documents stop before the one that would take the files (held-out one included) past it.

    Raises:
        FileNotFoundError: a package is not installed (named), before anything is written.
        ValueError: ``heldout_permille`` outside [0, 1000).
    """
    if not 0 <= heldout_permille < 1000:
        raise ValueError(f"heldout_permille must be in [0, 1000), got {heldout_permille!r}")
    chunks: list[list[bytes]] = [[] for _ in range(files + 1)]  # the last: held out
    sources: dict[str, dict] = {}
    seen: set[bytes] = set()
    i = documents = written = 0
    limit = max_bytes if max_bytes is not None else float("inf")
    # closing: a stop at max_bytes ends the worker pool at once, not when collected.
    with contextlib.closing(package_documents(packages, processes)) as found:
        for name, version, pieces in found:
            source = sources.setdefault(
                name, {"name": name, "version": version, "documents": 0, "bytes": 0}
            )
            text = new_prose(pieces, seen)
            if text is None:
                continue
            if written + len(text) > limit:
                break
            written += len(text)
            digest = hashlib.sha256(text).digest()
            held_out = int.from_bytes(digest[:8], "big") % 1000 < heldout_permille
            chunks[files if held_out else i % files].append(text)
            i += 0 if held_out else 1
            documents += 1
            source["documents"] += 1
            source["bytes"] += len(text)
    paths = write_chunks(output, chunks)
    logger.info(
        "wrote %d documents of %d packages, %.2f MB, in %s",
        documents,
        len(sources),
        sum(s["bytes"] for s in sources.values()) / 1e6,
        output,
    )
    return paths, list(sources.values())


def write_chunks(output: str | os.PathLike, chunks: list[list[bytes]]) -> list[Path]:
    """``packages-000.txt``, ... one per chunk but the last, ``packages-heldout.txt``, each
    file written atomically; their paths."""
    names = [f"packages-{k:03d}.txt" for k in range(len(chunks) - 1)] + ["packages-heldout.txt"]
    paths = [Path(output, name) for name in names]
    for path, chunk in zip(paths, chunks, strict=True):
        atomic_write_bytes(path, chunk)
    return paths


def new_prose(pieces: Sequence[list[str]], seen: set[bytes]) -> bytes | None:
    """A file's prose pieces (each a list of sentences) as one txt document, the pieces
    already in ``seen`` (by sha256) left out and the others added to it; None for a
    document of fewer than two sentences."""
    sentences = []
    for piece in pieces:
        digest = hashlib.sha256("\n".join(piece).encode("utf-8")).digest()
        if digest not in seen:
            seen.add(digest)
            sentences += piece
    if len(sentences) < 2:
        return None
    return ("\n".join(sentences) + "\n\n").encode("utf-8")


def write_manifest(output: str | os.PathLike, paths: Sequence[Path], sources: list[dict]) -> dict:
    """Write ``corpus.json`` beside the corpus: each source with its version, each file with
    its size and sha256, and the corpus's sha256 (of the files' bytes concatenated in name
    order: ``cat $(ls *.txt | sort) | sha256sum`` when only they are there). Returns it."""
    whole = hashlib.sha256()
    listed = []
    for path in sorted(paths, key=lambda p: p.name):
        data = path.read_bytes()
        whole.update(data)
        listed.append(
            {"name": path.name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        )
    manifest = {
        "format_version": MANIFEST_VERSION,
        "sources": sources,
        "files": listed,
        "bytes": sum(f["bytes"] for f in listed),
        "sha256": whole.hexdigest(),
    }
    text = json.dumps(manifest, indent=1, sort_keys=True) + "\n"
    atomic_write_bytes(Path(output, MANIFEST_NAME), text.encode("utf-8"))
    return manifest


def corpus_parser() -> CommandParser:
    p = CommandParser.of_doc("python -m pipeline corpus", __doc__)
    p.add_argument("--output", required=True, help="directory for the txt files")
    p.add_argument(
        "--max_mb",
        type=float,
        default=None,
        help="cap on the whole corpus in MB, packages' files included (default: everything once)",
    )
    p.add_argument("--files", type=int, default=1, help="number of files (default: 1)")
    p.add_argument("--repeat", action="store_true", help="repeat documents up to --max_mb")
    p.add_argument(
        "--sources",
        nargs="+",
        choices=SOURCES,
        default=list(SOURCES),
        help="what to write (default: all)",
    )
    p.add_argument(
        "--packages",
        nargs="*",
        default=[],
        metavar="NAME",
        help="installed packages whose docstrings and prose comments to add, or "
        "'default' for PACKAGES (default: none)",
    )
    p.add_argument(
        "--heldout_permille",
        type=int,
        default=10,
        help="share of the packages' documents held out, per 1000 (default: 10)",
    )
    p.add_argument(
        "--processes",
        type=int,
        default=None,
        help="processes reading the packages (default: one per CPU)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = corpus_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    max_bytes = int(args.max_mb * 1e6) if args.max_mb else None
    packages = [n for name in args.packages for n in (PACKAGES if name == "default" else [name])]
    start = time.perf_counter()
    try:
        paths = write_corpus(
            args.output,
            max_bytes=max_bytes,
            files=args.files,
            repeat=args.repeat,
            sources=args.sources,
        )
        left = None if max_bytes is None else max_bytes - sum(p.stat().st_size for p in paths)
        python = platform.python_version()
        sources = [{"name": f"python-{name}", "version": python} for name in args.sources]
        if packages:
            more, package_sources = write_package_corpus(
                args.output,
                packages,
                files=args.files,
                heldout_permille=args.heldout_permille,
                processes=args.processes,
                max_bytes=left,
            )
            paths, sources = paths + more, sources + package_sources
        manifest = write_manifest(args.output, paths, sources)
    except (FileNotFoundError, ValueError) as err:
        logger.error("%s", err)
        return 2
    logger.info(
        "corpus: %.1f MB in %.0f s, sha256 %s (%s)",
        manifest["bytes"] / 1e6,
        time.perf_counter() - start,
        manifest["sha256"],
        Path(args.output, MANIFEST_NAME),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
