"""Prose from the installed packages' docstrings and comments, for the offline corpus
(``pipeline/cli/corpus.py``, ``--packages``): pure readers and the filters that keep prose
and drop templated API text.

    python -m pipeline corpus --output corpus/ --files 10 --packages default

A package's ``.py`` files (from its installed RECORD, sorted; tests and vendored copies
left out) are parsed; each docstring (and each string written as a C function's docstring,
numpy's ``add_newdoc``, torch's ``add_docstr``) keeps its prose paragraphs
(:func:`prose_paragraphs`), and each run of ``#`` lines that reads as prose is kept too
(:func:`line_comment_blocks`). A file's pieces, in source order, make one document
(:func:`_file_pieces`). Parsing runs in worker processes, in order, so the output depends
only on the packages' versions.
"""

from __future__ import annotations

import ast
import inspect
import multiprocessing
import os
import re
import sys
from collections.abc import Iterator, Sequence
from importlib import metadata
from pathlib import Path

from pipeline.core.text import split_sentences

DOCTEST = re.compile(r"^\s*(>>>|\.\.\.)")
_WORD = re.compile(r"^[A-Za-z][a-z]*[,.;:]?$")  # a plain English word, maybe with punctuation
_SKIPPED_DIRS = frozenset(
    {"test", "tests", "testing", "_vendor", "vendor", "vendored", "benchmarks"}
)


def is_prose(words: Sequence[str], min_prose: float) -> bool:
    """Whether at least ``min_prose`` of ``words`` are plain English words (a capital first
    letter allowed, one trailing ``,.;:``): ``["Walk", "the", "tree."]`` is prose, ``["x",
    "=", "f(y)"]`` is not."""
    return bool(words) and sum(bool(_WORD.match(w)) for w in words) / len(words) >= min_prose


# Distributions whose docstrings make the main job's corpus, all installed by the project's
# test extras (scripts/setup.sh). Their prose is English; the rest of .venv adds little.
PACKAGES = (
    "numpy",
    "pandas",
    "pyarrow",
    "apache-beam",
    "torch",
    "deepspeed",
    "transformers",
    "tokenizers",
    "datasets",
    "huggingface-hub",
    "accelerate",
    "sympy",
    "mpmath",
    "networkx",
    "matplotlib",
    "dask",
    "distributed",
    "tornado",
    "pydantic",
    "pytest",
    "setuptools",
    "pip",
    "fonttools",
    "pymongo",
    "dnspython",
    "werkzeug",
    "pygments",
    "jinja2",
    "tensorboard",
    "onnx",
    "onnxscript",
    "protobuf",
    "grpcio",
    "fsspec",
    "h5py",
    "requests",
    "urllib3",
    "click",
    "rich",
    "beartype",
    "python-dateutil",
    "pytz",
    "packaging",
    "filelock",
    "psutil",
)
# Sections of a docstring that list names and types (Google's "Args:", numpy's "Parameters"
# underlined, Sphinx fields): templated text a model predicts from the template, not the
# language, so it would flatter held-out MLM accuracy.
_TEMPLATED = re.compile(
    r"(args|arguments|parameters|params|other parameters|keyword arg(ument)?s|kwargs|returns?|"
    r"return type|yields?|raises|warns|attributes|methods|examples?|see also|references|"
    r"shape|inputs|outputs|types?|todo|usage|example usage|functions|classes)\s*:{0,2}",
    re.IGNORECASE,
)
_LEGAL = re.compile(r"\b(copyright|licen[cs]ed?|SPDX)\b", re.IGNORECASE)  # headers
_PROSE_SECTION = re.compile(r"(notes?|warnings?|description|details)\s*:?", re.IGNORECASE)
_UNDERLINE = re.compile(r"[-=~^*+#]{3,}")
_MARKUP = re.compile(r"^(:\w[^:]*:|\.\. |@\w+|\||\+[-=+]+|[-=]{3,})")  # fields, directives, tables
_ROLE = re.compile(r":[\w:]+:`~?([^`<]*?)(?:\s*<[^>]*>)?`")  # :func:`~a.b` -> a.b
_INLINE = re.compile(r"``([^`]*)``|`([^`]*)`_?")


def _unmark(line: str) -> str:
    """reST inline markup to its text: ``:class:`~torch.Tensor``` -> ``torch.Tensor``."""
    return _INLINE.sub(lambda m: m.group(1) or m.group(2) or "", _ROLE.sub(r"\1", line))


def prose_paragraphs(docstring: str, *, min_words: int = 6, min_prose: float = 0.55) -> list[str]:
    """The prose paragraphs of a (cleaned) docstring, each joined into one line.

    Dropped: templated sections (``Args:``, an underlined ``Parameters``, ``Returns``,
    ``Examples``, ... up to the next prose section such as ``Notes``), indented lines (code,
    parameter lists, literal blocks), reST fields, directives and tables, doctest examples;
    then each paragraph with fewer than ``min_words`` words or less than ``min_prose`` of them
    plain English words. Example: ``"Add two arrays element-wise, broadcasting their shapes
    as numpy does.\\n\\nArgs:\\n    x: the first."`` -> ``["Add two arrays element-wise,
    broadcasting their shapes as numpy does."]``.
    """
    lines = docstring.splitlines()
    kept: list[str] = []
    skipping = in_example = False
    for i, line in enumerate(lines):
        text = line.strip()
        underlined = i + 1 < len(lines) and _UNDERLINE.fullmatch(lines[i + 1].strip() or "x")
        if underlined or (text.endswith(":") and _TEMPLATED.fullmatch(text)):
            skipping = not _PROSE_SECTION.fullmatch(text)
            kept.append("")
            continue
        if _PROSE_SECTION.fullmatch(text):
            skipping = False
            kept.append("")
            continue
        in_example = bool(DOCTEST.match(line)) or (in_example and bool(text))
        # An indented line goes on a kept line (a wrapped list item); else it starts a block.
        block = line[:1].isspace() and not (kept and kept[-1])
        if skipping or in_example or block or _MARKUP.match(text):
            kept.append("")
        else:
            kept.append(_unmark(text))
    paragraphs = " ".join(line if line else "\n\n" for line in kept).split("\n\n")
    out = []
    for paragraph in paragraphs:
        words = paragraph.split()
        if len(words) >= min_words and is_prose(words, min_prose):
            out.append(" ".join(words))
    return out


def _is_doc_call(node: ast.AST) -> bool:
    """A call that writes a C function's docstring: numpy's ``add_newdoc``, torch's
    ``add_docstr`` (their richest prose is there, not in ``def`` docstrings)."""
    if not isinstance(node, ast.Call):
        return False
    name = getattr(node.func, "id", None) or getattr(node.func, "attr", "")
    return "doc" in name.lower()


def source_docstrings(source: str, *, min_words: int = 8) -> list[tuple[int, str]]:
    """(line, docstring) of one module's source (module, classes, functions) and of the
    string arguments of its documentation calls (:func:`_is_doc_call`), sorted by line,
    with at least ``min_words`` words each; [] for a file that does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    docs = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            line = node.body[0].lineno if node.body else getattr(node, "lineno", 0)
            docs.append((line, ast.get_docstring(node) or ""))
        elif _is_doc_call(node):
            docs += [
                (a.lineno, inspect.cleandoc(a.value))
                for a in node.args
                if isinstance(a, ast.Constant) and isinstance(a.value, str)
            ]
    return sorted((d for d in docs if len(d[1].split()) >= min_words), key=lambda d: d[0])


def package_files(name: str) -> tuple[str, list[Path]]:
    """(version, sorted .py files) of the installed distribution ``name``, tests and vendored
    copies left out.

    Raises:
        FileNotFoundError: ``name`` is not installed here, or lists no files.
    """
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"corpus source {name!r} is missing: no package {name} is installed in "
            f"{sys.prefix} (pip install -e '.[test]' installs the default ones; or leave it out "
            "of --packages)"
        ) from None
    paths = [
        Path(str(dist.locate_file(f)))
        for f in dist.files or ()
        if f.suffix == ".py" and not set(f.parts) & _SKIPPED_DIRS
    ]
    if not paths:
        raise FileNotFoundError(f"corpus source {name!r}: its package lists no .py files")
    return dist.version, sorted(paths)


def _file_pieces(path: Path) -> list[list[str]]:
    """The prose pieces (lists of sentences) of one .py file, in source order: each
    docstring's prose paragraphs (:func:`prose_paragraphs`) and each prose comment block
    (:func:`line_comment_blocks`). The corpus joins a file's pieces into one document, so that
    a document is a module's prose, as an article is on Wikipedia: NSP's true next segment
    then continues its topic (one docstring each made documents of 3.3 sentences on average,
    most too short for a 128-token pair)."""
    try:
        source = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return []
    located = []
    for line, docstring in source_docstrings(source):
        sentences = [s for p in prose_paragraphs(docstring) for s in split_sentences(p)]
        if sentences:
            located.append((line, sentences))
    for line, block in line_comment_blocks(source):
        if sentences := split_sentences(block):
            located.append((line, sentences))
    return [sentences for _, sentences in sorted(located, key=lambda piece: piece[0])]


def line_comment_blocks(
    source: str, *, min_words: int = 12, min_prose: float = 0.7
) -> list[tuple[int, str]]:
    """(first line, text) of the prose comment blocks of ``source``: :func:`comment_blocks`
    read line by line, about 20 times faster than ``tokenize``: runs of lines that start
    with ``#`` (a ``#`` line inside a string literal counts too, which the prose test mostly
    drops). ``"# Walk the tree.\\n# Then return.\\nx = 1"`` with ``min_words=4`` ->
    ``[(1, "Walk the tree. Then return.")]``."""
    blocks, block, start = [], [], 0
    for number, line in enumerate([*source.splitlines(), ""], start=1):
        text = line.strip()
        if text.startswith("#") and not text.startswith("#!"):
            start = start if block else number
            block.append(text.lstrip("#").strip())
            continue
        words = " ".join(block).split()
        text = " ".join(words)
        if len(words) >= min_words and is_prose(words, min_prose) and not _LEGAL.search(text):
            blocks.append((start, text))
        block = []
    return blocks


def package_documents(
    names: Sequence[str], processes: int | None = None
) -> Iterator[tuple[str, str, list[list[str]]]]:
    """Yields (package, version, prose pieces of one file (:func:`_file_pieces`)) for
    ``names`` in order, files sorted.

    Files are parsed by ``processes`` worker processes (default: one per CPU); ``imap``
    keeps the order, so the output does not depend on their number.

    Raises:
        FileNotFoundError: a package is missing (before anything is read).
    """
    found = [(name, *package_files(name)) for name in names]
    jobs = [(name, version, path) for name, version, paths in found for path in paths]
    with multiprocessing.get_context("spawn").Pool(processes or os.cpu_count()) as pool:
        results = pool.imap(_file_pieces, [path for _, _, path in jobs], chunksize=8)
        for (name, version, _), docs in zip(jobs, results, strict=True):
            yield name, version, docs
