"""The docs' ```python snippets run and do what they say.

**Snippets.** Every ```python block of the docs in ``DOCS`` runs against the installed
packages, in its doc's order and in one namespace per doc, from a directory laid out as the
doc says: ``runs/quickstart/shards`` (built by the pipeline, in-process), ``runs/hdf5`` (its
export) and, for FORMAT.md, ``shards/``. Then what each block claims is checked
(``CLAIMS``): a tokenizer recipe gives the shards' own ids (each row's text, masks undone,
tokenizes to the row's ``input_ids``), for uncased and cased shards. A block that cannot
run here (it needs a GPU, a cluster or the network) is preceded in its doc by
``<!-- not run: REASON -->`` and is only compiled. A tokenizer recipe outside a ```python
block (inline code, say) fails :func:`test_tokenizer_recipes_are_in_python_blocks`: no test
would run it.

FORMAT.md's manifest example has exactly the keys of a real build's manifest. The prose
(paths, modules, commands and flags the docs name) is checked in tests/test_prose.py.

    pytest tests/test_docs.py
"""

from __future__ import annotations

import json
import math
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from pipeline.cli.main import main as pipeline_main
from pipeline.core.vocab import read_vocab
from pipeline.shards import shard_format
from tests.helpers import REPO, build_shards

# Each doc whose ```python blocks run, and the directory (under a test's root) they run from.
DOCS = {
    "docs/exports.md": ".",
    "docs/model.md": ".",
    "pipeline/shards/FORMAT.md": "runs/quickstart",
}
NOT_RUN = re.compile(r"<!--\s*not run:(.*?)-->")
# A fenced block, maybe indented (inside a list item): indent, language, code.
FENCE = re.compile(r"^([ \t]*)```(\w*)[^\n]*\n(.*?)^\1```", flags=re.MULTILINE | re.DOTALL)
# A Hugging Face tokenizer being made: `BertTokenizerFast(`, `AutoTokenizer.from_pretrained(`.
TOKENIZER_CALL = re.compile(r"\b\w*Tokenizer\w*(?:\.from_pretrained)?\(")


@dataclass(frozen=True)
class Snippet:
    """One ```python block of a doc."""

    doc: str  # path relative to the repository, e.g. "README.md"
    line: int  # the line of the block's first line of code, from 1
    code: str  # padded with newlines so that tracebacks give the doc's line numbers
    not_run: str | None  # the reason of a `<!-- not run: REASON -->` before the fence

    @property
    def name(self) -> str:
        return f"{self.doc}:{self.line}"


def python_snippets(text: str, doc: str) -> list[Snippet]:
    """The ```python blocks of a markdown ``text``, in order.

    ``"<!-- not run: needs a GPU -->\\n```python\\nx = 1\\n```"`` -> one Snippet at line 3
    with ``not_run="needs a GPU"``. The marker is the last non-blank line before the fence.

    Raises:
        ValueError: a marker without a reason.
    """
    snippets = []
    for block in FENCE.finditer(text):
        if block[2] != "python":
            continue
        before = text[: block.start()].rstrip().rsplit("\n", 1)[-1]
        marker = NOT_RUN.fullmatch(before.strip())
        line = text.count("\n", 0, block.start(3)) + 1
        if marker and not marker[1].strip():
            raise ValueError(f"{doc}:{line}: say why the block is not run: <!-- not run: WHY -->")
        code = "\n" * (line - 1) + textwrap.dedent(block[3])
        snippets.append(Snippet(doc, line, code, marker[1].strip() if marker else None))
    return snippets


def doc_snippets(doc: str) -> list[Snippet]:
    return python_snippets((REPO / doc).read_text(encoding="utf-8"), doc)


def run_snippets(doc: str, namespace: dict, *, only=lambda snippet: True) -> list[Snippet]:
    """Run the doc's blocks that are not marked ``not run`` (and pass ``only``) in order, in
    ``namespace``, from the current directory. Returns the blocks run."""
    ran = [s for s in doc_snippets(doc) if s.not_run is None and only(s)]
    for snippet in ran:
        exec(compile(snippet.code, str(REPO / doc), "exec"), namespace)
    return ran


# ----------------------------------------------------------------------------- fixtures


def make_runs(root: Path, *, do_lower_case: bool) -> Path:
    """``root/runs/quickstart/shards`` built by the pipeline and ``root/runs/hdf5`` exported
    from it, as the README's commands make them. Returns ``root``."""
    shards = build_shards(
        root / "runs" / "quickstart",
        n_docs=60,
        dupe_factor=1,
        do_lower_case=str(do_lower_case).lower(),
    )
    export = ["export", str(shards), "--to", "nvidia-hdf5", "--output", str(root / "runs/hdf5")]
    assert pipeline_main(export) == 0
    return root


@pytest.fixture(scope="module")
def uncased_runs(tmp_path_factory) -> Path:
    return make_runs(tmp_path_factory.mktemp("uncased"), do_lower_case=True)


@pytest.fixture(scope="module")
def cased_runs(tmp_path_factory) -> Path:
    return make_runs(tmp_path_factory.mktemp("cased"), do_lower_case=False)


def shard_rows(shards: Path) -> list[dict]:
    manifest = shard_format.read_manifest(shards)
    rows = []
    for entry in manifest["shards"]:
        rows += shard_format.open_shard(str(shards / entry["name"])).to_pylist()
    return rows


# ----------------------------------------------------------------------------- claims


def unmasked_ids(row: dict) -> list[int]:
    """A row's ``input_ids`` with each masked position given back its ``masked_lm_ids``."""
    ids = list(row["input_ids"])
    for position, original in zip(row["masked_lm_positions"], row["masked_lm_ids"], strict=True):
        ids[position] = original
    return ids


def row_texts(row: dict, tokens: list[str]) -> tuple[str, str]:
    """A row's two segments as text, masks undone and word pieces joined.
    ``[CLS] the river [SEP] ban ##ks [SEP]`` -> ``("the river", "banks")``."""
    ids = unmasked_ids(row)
    length_a = row["segment_ids"].count(0)  # [CLS] A [SEP]
    segments = (ids[1 : length_a - 1], ids[length_a:-1])
    texts = []
    for segment in segments:
        words: list[str] = []
        for token in (tokens[i] for i in segment):
            if token.startswith("##"):
                words[-1] += token[2:]
            else:
                words.append(token)
        texts.append(" ".join(words))
    return texts[0], texts[1]


def assert_tokenizer_gives_shard_ids(tokenizer, shards: Path) -> None:
    """``tokenizer`` (transformers) gives each row's ids and segment ids for the row's text.

    Only rows shorter than ``max_seq_length`` are compared: the pipeline truncates longer
    pairs token by token (Google's ``truncate_seq_pair``), which can cut a word."""
    tokens = read_vocab(shards / "vocab.txt")
    manifest = shard_format.read_manifest(shards)
    assert len(tokenizer) == len(tokens), "the tokenizer has another vocab than the shards"
    longest = manifest["params"]["max_seq_length"]
    whole = [row for row in shard_rows(shards) if len(row["input_ids"]) < longest]
    assert len(whole) >= 20
    for row in whole:
        text_a, text_b = row_texts(row, tokens)
        encoding = tokenizer(text_a, text_b, return_token_type_ids=True)
        assert encoding["input_ids"] == unmasked_ids(row), (text_a, text_b)
        assert encoding["token_type_ids"] == row["segment_ids"]


def model_inputs(shards: Path, n: int = 4) -> dict[str, torch.Tensor]:
    """The README model block's inputs: ``n`` real rows, padded (positions 0 and ids -100)."""
    rows = shard_rows(shards)[:n]

    def pad(key, value):
        width = max(len(row[key]) for row in rows)
        return torch.tensor([row[key] + [value] * (width - len(row[key])) for row in rows])

    return {
        "input_ids": pad("input_ids", 0),
        "segment_ids": pad("segment_ids", 0),
        "attention_mask": pad("input_ids", -1).ne(-1).long(),
        "masked_lm_positions": pad("masked_lm_positions", 0),
        "masked_lm_ids": pad("masked_lm_ids", -100),
        "next_sentence_label": torch.tensor([row["next_sentence_label"] for row in rows]),
    }


def check_model_md(namespace: dict, root: Path) -> None:
    import transformers

    from model import BertConfig, BertForPreTraining

    loss = namespace["out"].loss
    assert loss.ndim == 0 and math.isfinite(loss.item()) and loss.requires_grad
    model = namespace["model"]
    assert isinstance(model, BertForPreTraining)
    assert model.config == BertConfig.preset("base")
    theirs, info = transformers.BertForPreTraining.from_pretrained(
        root / "export", output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert torch.equal(
        theirs.bert.embeddings.word_embeddings.weight, model.bert.embeddings.word_embeddings.weight
    )


def check_tokenizer_recipe(namespace: dict, root: Path) -> None:
    """The export's tokenizer (docs/exports.md, "Other BERT trainers"), and its saved copy
    as a trainer loads it (``--tokenizer_name TOKENIZER_DIR``)."""
    import transformers

    shards = root / "runs/quickstart/shards"
    if "tokenizer" not in namespace:
        pytest.fail("docs/exports.md: no ```python block makes the export's `tokenizer`")
    assert_tokenizer_gives_shard_ids(namespace["tokenizer"], shards)
    saved = transformers.AutoTokenizer.from_pretrained(root / namespace["tokenizer_dir"])
    assert_tokenizer_gives_shard_ids(saved, shards)


def check_format_md(namespace: dict, root: Path) -> None:
    shards = root / "runs/quickstart/shards"
    manifest = shard_format.read_manifest(shards)
    first = shard_format.open_shard(str(shards / manifest["shards"][0]["name"]))
    assert namespace["row"] == first.slice(0, 1).to_pylist()[0]
    assert namespace["train"].num_rows == namespace["mapped"].num_rows == manifest["num_rows"]
    assert namespace["example"]["input_ids"].dtype == torch.int64
    batch = namespace["batch"]
    assert batch["input_ids"].shape == (8, int(batch["attention_mask"].sum(1).max()))
    for i in range(8):  # the MLM labels hold masked_lm_ids exactly at masked_lm_positions
        weights = batch["masked_lm_weights"][i].bool()
        positions = batch["masked_lm_positions"][i][weights]
        assert torch.equal(batch["labels"][i][positions], batch["masked_lm_ids"][i][weights])
        assert int((batch["labels"][i] != -100).sum()) == int(weights.sum())


# What each doc's blocks claim, checked after they ran: every doc with ```python blocks has
# one (test_every_doc_with_python_blocks_is_checked).
CLAIMS = {
    "docs/exports.md": check_tokenizer_recipe,
    "docs/model.md": check_model_md,
    "pipeline/shards/FORMAT.md": check_format_md,
}


# ----------------------------------------------------------------------------- tests


@pytest.mark.parametrize("doc", sorted(DOCS))
def test_doc_snippets_run_and_hold(doc, uncased_runs, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", uncased_runs / "hf-cache")
    monkeypatch.chdir(uncased_runs / DOCS[doc])
    namespace = model_inputs(uncased_runs / "runs/quickstart/shards")
    run_snippets(doc, namespace)
    CLAIMS[doc](namespace, uncased_runs)


def test_tokenizer_recipe_on_cased_shards(cased_runs, monkeypatch):
    """Cased shards: a recipe that lowercases by default gives other ids."""
    monkeypatch.chdir(cased_runs)
    namespace: dict = {}
    ran = run_snippets("docs/exports.md", namespace, only=lambda s: TOKENIZER_CALL.search(s.code))
    assert ran, "docs/exports.md has no ```python block that makes a tokenizer"
    check_tokenizer_recipe(namespace, cased_runs)


def test_every_doc_with_python_blocks_is_checked():
    """A doc's ```python blocks run here, and a claim checks what they made; a block marked
    ``<!-- not run: REASON -->`` must still compile."""
    docs = [path.relative_to(REPO).as_posix() for path in repo_docs()]
    with_blocks = {doc for doc in docs if doc_snippets(doc)}
    assert with_blocks == set(DOCS) == set(CLAIMS), (with_blocks, set(DOCS), set(CLAIMS))
    for doc in DOCS:
        for snippet in doc_snippets(doc):
            compile(snippet.code, f"{doc}:{snippet.line}", "exec")


def repo_docs() -> list[Path]:
    """The repository's markdown files, but CHANGELOG.md (a history) and tests/."""
    folders = [p for p in REPO.iterdir() if p.is_dir() and p.name[0] != "." and p.name != "tests"]
    docs = [*REPO.glob("*.md"), *(path for folder in folders for path in folder.rglob("*.md"))]
    return sorted(path for path in docs if path.name != "CHANGELOG.md")


def test_tokenizer_recipes_are_in_python_blocks():
    outside = []
    for path in repo_docs():
        text = path.read_text(encoding="utf-8")
        # ```python blocks blanked (their lines kept, so line numbers stay the file's).
        rest = FENCE.sub(lambda b: "\n" * b[0].count("\n") if b[2] == "python" else b[0], text)
        for call in TOKENIZER_CALL.finditer(rest):
            line = rest.count("\n", 0, call.start()) + 1
            outside.append(f"{path.relative_to(REPO)}:{line}: {rest.splitlines()[line - 1]}")
    assert not outside, "tokenizer recipes no test runs (put them in ```python blocks):\n" + (
        "\n".join(outside)
    )


def test_python_snippets_parse_markers_and_line_numbers():
    text = (
        "Intro\n\n```bash\necho hi\n```\n\n<!-- not run: needs a GPU -->\n\n"
        "```python\nimport torch\n```\n\n```python\nx = 1\ny = 2\n```\n"
        "- a list item:\n\n  ```python\n  if x:\n      y = 3\n  ```\n"
    )
    gpu, plain, indented = python_snippets(text, "DOC.md")
    assert (gpu.line, gpu.not_run, gpu.code.strip()) == (10, "needs a GPU", "import torch")
    assert (plain.line, plain.not_run, plain.name) == (14, None, "DOC.md:14")
    assert plain.code.split("\n")[13:15] == ["x = 1", "y = 2"]
    assert indented.line == 20 and indented.code.lstrip("\n") == "if x:\n    y = 3\n"
    with pytest.raises(ValueError, match=r"DOC\.md:3: say why"):
        python_snippets("<!-- not run: -->\n```python\nx = 1\n```\n", "DOC.md")


def manifest_keys(value, path: str = ""):
    """The key structure of a manifest: a dict by its keys, a list by its elements', a value
    as ``"value"``; ``skipped`` and ``stats.input`` are ``{what: count}`` maps whose keys
    depend on the input, so only that shape is kept."""
    if isinstance(value, dict) and path in ("skipped", "stats.input"):
        assert all(isinstance(count, int) for count in value.values()), (path, value)
        return "{what: count}"
    if isinstance(value, dict):
        return {key: manifest_keys(v, f"{path}.{key}".lstrip(".")) for key, v in value.items()}
    if isinstance(value, list):
        shapes = [manifest_keys(v, path) for v in value]
        assert all(shape == shapes[0] for shape in shapes), (path, shapes)
        return shapes[:1]
    return "value"


def format_manifest_example(text: str) -> dict:
    """The first ```json block under FORMAT.md's "## manifest.json"."""
    section = text.split("\n## manifest.json", 1)[1]
    return json.loads(next(block[3] for block in FENCE.finditer(section) if block[2] == "json"))


def test_format_md_manifest_example_is_a_real_builds(uncased_runs):
    example = format_manifest_example((REPO / "pipeline/shards/FORMAT.md").read_text("utf-8"))
    real = shard_format.read_manifest(uncased_runs / "runs/quickstart/shards")
    assert manifest_keys(example) == manifest_keys(real)
    assert example["format_version"] == shard_format.FORMAT_VERSION
    assert example["algorithm_version"] == shard_format.ALGORITHM_VERSION
