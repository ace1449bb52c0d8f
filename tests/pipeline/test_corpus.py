import hashlib
import json
from importlib import metadata

import pytest

from pipeline.cli.corpus import comment_blocks, document_sentences, write_corpus
from pipeline.core.text import iter_txt_documents


def test_corpus_is_deterministic_and_in_googles_format(tmp_path):
    a = write_corpus(tmp_path / "a", max_bytes=200_000, files=2)
    b = write_corpus(tmp_path / "b", max_bytes=200_000, files=2)
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]
    lines = a[0].read_text(encoding="utf-8").splitlines()
    docs = list(iter_txt_documents(lines))
    assert len(docs) > 20 and all(len(d) >= 2 for d in docs)
    assert sum(p.stat().st_size for p in a) >= 200_000


def test_document_sentences_drops_doctests():
    doc = "Add two numbers. Returns their sum.\n\n>>> add(1, 2)\n3\n\nWorks on floats too."
    assert document_sentences(doc) == [
        "Add two numbers.",
        "Returns their sum.",
        "Works on floats too.",
    ]


def test_comment_blocks_keep_prose_and_drop_code():
    source = (
        "# Walk the tree once.\n# Then return.\nx = 1\n"
        "# y = f(x) + 2 if z else g(w)\n"
        "def f():\n    # Each node is visited\n    # before its children.\n    pass\n"
    )
    blocks = comment_blocks(source, min_words=4)
    assert blocks == [
        "Walk the tree once. Then return.",
        "Each node is visited before its children.",
    ]
    assert comment_blocks(source, min_words=8) == []  # both blocks are shorter


def test_corpus_sources_are_chosen_and_checked(tmp_path):
    only_reference = write_corpus(tmp_path / "r", files=1, sources=["reference"])
    text = only_reference[0].read_text(encoding="utf-8")
    everything = write_corpus(tmp_path / "all", max_bytes=len(text) * 2, files=1)
    assert everything[0].read_text(encoding="utf-8") != text
    with pytest.raises(ValueError, match="unknown corpus source"):
        write_corpus(tmp_path / "x", sources=["tweets"])


def test_package_corpus_is_deterministic_with_its_manifest(tmp_path):
    """Same packages and versions -> the same bytes and sha256, twice; each source is named
    with its version; held-out documents are split off by their text."""
    from pipeline.cli.corpus import write_manifest, write_package_corpus

    manifests = []
    for name in ("a", "b"):
        paths, sources = write_package_corpus(
            tmp_path / name, ["packaging", "filelock"], files=2, heldout_permille=200, processes=1
        )
        manifests.append(write_manifest(tmp_path / name, paths, sources))
        assert [p.name for p in paths] == [
            "packages-000.txt",
            "packages-001.txt",
            "packages-heldout.txt",
        ]
    a, b = manifests
    assert a == b and a["bytes"] > 10_000
    assert json.loads((tmp_path / "a" / "corpus.json").read_text()) == a
    assert [s["name"] for s in a["sources"]] == ["packaging", "filelock"]
    assert a["sources"][0]["version"] == metadata.version("packaging")
    whole = b"".join((tmp_path / "a" / f["name"]).read_bytes() for f in a["files"])
    assert hashlib.sha256(whole).hexdigest() == a["sha256"]
    held_out = (tmp_path / "a" / "packages-heldout.txt").read_text(encoding="utf-8")
    train = (tmp_path / "a" / "packages-000.txt").read_text(encoding="utf-8")
    assert held_out and not set(held_out.split("\n\n")) - {""} & set(train.split("\n\n"))


def test_a_missing_source_is_named(tmp_path, caplog):
    from pipeline.cli.corpus import main, write_package_corpus

    with pytest.raises(FileNotFoundError, match="corpus source 'no-such-package' is missing"):
        write_package_corpus(tmp_path, ["packaging", "no-such-package"])
    assert not list(tmp_path.iterdir())  # nothing written
    assert (
        main(
            [
                "--output",
                str(tmp_path / "c"),
                "--sources",
                "reference",
                "--packages",
                "no-such-package",
            ]
        )
        == 2
    )
    assert "no-such-package" in caplog.text


def test_templated_api_text_is_dropped_and_prose_kept():
    from pipeline.cli.package_docs import prose_paragraphs

    doc = (
        "Add two arrays element-wise, broadcasting their shapes as numpy does.\n\n"
        "Args:\n    x: the first array of the two.\n    y: the second array of the two.\n\n"
        "Returns:\n    The sum of the two arrays, with the broadcast shape.\n\n"
        "Parameters\n----------\nx : ndarray\n    The first one, given as an array.\n\n"
        "Notes\n-----\nThe :func:`add` ufunc is used, so a scalar works as well as an array.\n"
        ":param z: unused here, kept for the old callers of this function.\n"
    )
    assert prose_paragraphs(doc) == [
        "Add two arrays element-wise, broadcasting their shapes as numpy does.",
        "The add ufunc is used, so a scalar works as well as an array.",
    ]


def test_a_files_prose_is_one_document_in_source_order(tmp_path):
    """Docstrings and comment blocks of one file come out in the order they are written
    (ast.walk would give the nested function's docstring after the class's), so one
    document reads as the module does."""
    from pipeline.cli.package_docs import _file_pieces

    source = tmp_path / "m.py"
    source.write_text(
        '"""Tools for walking a tree of nodes. Each node is visited once."""\n'
        "# The walk is iterative, so that deep trees do not hit the recursion limit of\n"
        "# the interpreter when they are walked.\n"
        "def walk(tree):\n"
        '    """Yield every node of the tree, parents before their children, in order."""\n'
        "    def inner(node):\n"
        '        """Push the children of one node onto the stack, last child first."""\n'
        "class Tree:\n"
        '    """A tree of nodes, each with a list of children that may be empty."""\n',
        encoding="utf-8",
    )
    assert _file_pieces(source) == [
        ["Tools for walking a tree of nodes.", "Each node is visited once."],
        [
            "The walk is iterative, so that deep trees do not hit the recursion limit of the "
            "interpreter when they are walked."
        ],
        ["Yield every node of the tree, parents before their children, in order."],
        ["Push the children of one node onto the stack, last child first."],
        ["A tree of nodes, each with a list of children that may be empty."],
    ]


def test_max_mb_caps_the_whole_corpus_packages_included(tmp_path):
    from pipeline.cli.corpus import main, write_corpus

    reference = sum(p.stat().st_size for p in write_corpus(tmp_path / "r", sources=["reference"]))
    cap = reference + 30_000  # room for a few of the package's documents, not all
    argv = ["--output", str(tmp_path / "c"), "--sources", "reference", "--processes", "1"]
    assert main([*argv, "--packages", "packaging", "--max_mb", str(cap / 1e6)]) == 0
    manifest = json.loads((tmp_path / "c" / "corpus.json").read_text())
    assert reference < manifest["bytes"] <= cap
    assert main([*argv[:1], str(tmp_path / "all"), *argv[2:], "--packages", "packaging"]) == 0
    assert json.loads((tmp_path / "all" / "corpus.json").read_text())["bytes"] > cap
