"""The docs say what is true: their ```python snippets run, and what they name exists.

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

**Prose** (``PROSE_DOCS``: README.md, docs/, deploy/ and FORMAT.md). Every repository path,
relative link and module (``python -m X``, ``pipeline.shards.shard_format``) they name
exists; every command of ours they show (``python -m X``, ``python path.py``, ``bash
path.sh``, ``deepspeed ... trainer/run.py``) answers ``--help``; every flag shown with a
command is one its ``--help`` lists, as spelt there (or Apache Beam's, for ``pipeline
build`` and ``export``; or the deepspeed launcher's, before the script); a flag in inline
code on its own is one of those commands'; an environment setting before a script is one the
script reads. FORMAT.md's manifest example has exactly the keys of a real build's manifest.

    pytest tests/test_docs.py
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import json
import math
import re
import shlex
import subprocess
import sys
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


# ----------------------------------------------------------------------------- prose

# The docs whose prose is checked (test_prose_holds): what a user reads to run something.
PATTERNS = ("README.md", "docs/*.md", "deploy/*.md", "deploy/beam/*.md")
PROSE_DOCS = [
    *sorted(path.relative_to(REPO).as_posix() for p in PATTERNS for path in REPO.glob(p)),
    "pipeline/shards/FORMAT.md",
]
# Where a repository path starts; a path elsewhere (runs/, shards/) is the user's.
TOP = "pipeline|trainer|model|finetune|report|deploy|bench|scripts|tests|examples|docs"
REPO_PATH = re.compile(rf"(?<![\w./-])((?:{TOP})/[\w./*-]*|(?:README|ARCHITECTURE|CHANGELOG)\.md)")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
# A module of ours named in code (`pipeline.shards.shard_format`); a call or attribute
# (`model.save_hf(`) is a variable's, and `model.onnx` a file.
DOTTED = re.compile(
    r"(?<![\w./])((?:pipeline|trainer|model|finetune|report)(?:\.[A-Za-z_]\w*)+)\b(?![(.])"
)
FILE_SUFFIXES = {"json", "jsonl", "md", "onnx", "py", "safetensors", "txt"}
INLINE = re.compile(r"(`+)(.+?)\1", flags=re.DOTALL)
SHELL = {"bash", "sh", "shell", ""}  # the languages of fenced blocks that hold commands
FLAG = re.compile(r"^(--?[A-Za-z][\w-]*)")
ENV = re.compile(r"^[A-Z_][A-Z0-9_]*=")
PIPELINE_COMMANDS = {"corpus", "build", "stats", "inspect", "validate", "export"}
# The commands that hand Apache Beam every option they do not know.
BEAM_COMMANDS = {"python -m pipeline build", "python -m pipeline export"}
# Other programs whose flags are checked against their own --help.
TOOLS = {"dask scheduler", "dask worker"}
# Other projects' modules and flags that the docs name, with whose they are.
EXTERNAL_MODULES = {"official.nlp.train": "TF Model Garden's (docs/exports.md)"}
EXTERNAL_FLAGS = {"--use_nvidia_dataset": "DeepSpeed bing_bert's (FORMAT.md)"}


@dataclass(frozen=True)
class Command:
    """One command line in a doc: ``python -m pipeline build --input x`` ->
    ``Command("python -m pipeline build", ("--input",))``."""

    key: str  # how it is run, and so how its --help is run
    flags: tuple[str, ...]  # as written, without values: "--direct_num_workers"
    env: tuple[str, ...] = ()  # settings before it: ("CORPUS", "DUPE_FACTOR")
    launcher_flags: tuple[str, ...] = ()  # deepspeed's, before the script


def code_texts(text: str) -> tuple[list[str], list[str]]:
    """A markdown ``text``'s shell code (fenced blocks of sh/bash/no language, a line each,
    continuations joined) and its inline code spans (outside fences; a table's ``\\|`` is
    ``|``)."""
    lines = []
    for block in FENCE.finditer(text):
        if block[2] in SHELL:
            lines += textwrap.dedent(block[3]).replace("\\\n", " ").splitlines()
    spans = [span[2].replace("\\|", "|") for span in INLINE.finditer(FENCE.sub("", text))]
    return lines, spans


def parse_commands(code: str) -> list[Command]:
    """The commands in one line of shell code, each with its flags.

    ``"DS_ACCELERATOR=cpu deepspeed --num_gpus 2 trainer/run.py --data s  # x"`` ->
    ``[Command("trainer/run.py", ("--data",), ("DS_ACCELERATOR",), ("--num_gpus",))]``.
    Other programs (``pip``, another project's ``python run_pretraining.py``) give nothing,
    but another project's module (``python -m official.nlp.train``) is returned without its
    flags, so that its existence is checked."""
    commands = []
    for part in re.split(r"&&|\|\||;|\|", re.sub(r"(^|\s)#.*", "", code)):
        try:
            words = shlex.split(part)
        except ValueError:  # an unbalanced quote in prose
            words = part.split()
        env = []
        while words and ENV.match(words[0]):
            env.append(words.pop(0).split("=", 1)[0])
        launcher: list[str] = []
        launched = words[:1] == ["deepspeed"]
        if launched:
            script = next((i for i, w in enumerate(words) if w.endswith(".py")), len(words))
            launcher, words = flags_of(words[1:script]), words[script:]
        python = words[:1] in (["python"], ["python3"])
        words = words[1:] if python else words
        if python and len(words) >= 2 and words[0] == "-m":
            key, rest = f"python -m {words[1]}", words[2:]
            if words[1] == "pipeline" and rest[:1] and rest[0] in PIPELINE_COMMANDS:
                key, rest = f"{key} {rest[0]}", rest[1:]
            rest = rest if is_ours(key) else []
        elif words[:1] == ["bash"] and len(words) > 1 and (REPO / words[1]).is_file():
            key, rest = words[1], []
        elif words and words[0].endswith(".py") and (python or launched) and is_ours(words[0]):
            key, rest = words[0], words[1:]
        elif " ".join(words[:2]) in TOOLS:
            key, rest = " ".join(words[:2]), words[2:]
        else:
            continue
        commands.append(Command(key, tuple(flags_of(rest)), tuple(env), tuple(launcher)))
    return commands


def flags_of(words: list[str]) -> list[str]:
    """``["--to", "tfrecord", "--output=o", "-n", "3", "-1"]`` -> ``["--to", "--output", "-n"]``."""
    return [m[1] for m in map(FLAG.match, words) if m]


def is_ours(name: str) -> bool:
    """A module (``pipeline.cli.main``), command (``python -m pipeline build``) or path
    (``trainer/run.py``) of this repository."""
    if name.startswith("python -m "):
        name = name.split()[2]
    return (REPO / name).is_file() if "/" in name else (REPO / name.split(".")[0]).is_dir()


def module_exists(name: str) -> bool:
    """``pipeline.shards.shard_format`` -> True: a module of ours, or a name defined in one
    (``pipeline.cli.main.main``); another project's: installed (found without importing
    it: deepspeed's imports are slow) or one of EXTERNAL_MODULES."""
    parts = name.split(".")
    if not is_ours(name):
        top = importlib.util.find_spec(parts[0])
        if name in EXTERNAL_MODULES or (top and len(parts) == 1):
            return True
        if top is None or not top.submodule_search_locations:
            return False
        base = Path(next(iter(top.submodule_search_locations))).joinpath(*parts[1:])
        return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()
    for n in range(len(parts), len(parts) - 2, -1):
        base = REPO.joinpath(*parts[:n])
        for source in (base.with_suffix(".py"), base / "__init__.py"):
            if source.is_file() and n == len(parts):
                return True
            if source.is_file():  # is parts[-1] defined in it?
                defined = rf"^(?:def |class )?{parts[-1]}\b|import .*\b{parts[-1]}\b"
                return re.search(defined, source.read_text(encoding="utf-8"), re.M) is not None
    return False


def doc_commands(text: str) -> list[Command]:
    lines, spans = code_texts(text)
    return [command for code in lines + spans for command in parse_commands(code)]


def shown_commands() -> set[str]:
    """Every command of ours the docs show that has a --help to run (a script does not:
    ``bash scripts/quickstart.sh --help`` would run the job)."""
    docs = [(REPO / doc).read_text(encoding="utf-8") for doc in PROSE_DOCS]
    keys = {command.key for text in docs for command in doc_commands(text)}
    return {key for key in keys if is_ours(key) and not key.endswith(".sh")}


def help_flags(help_text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", help_text))


def table_rows(text: str) -> list[tuple[Command, list[str]]]:
    """Each table row whose first cell is a command, with the flags in inline code in its
    other cells (the README's "most-used flags")."""
    rows = []
    for line in text.splitlines():
        cells = re.split(r"(?<!\\)\|", line.strip())[1:-1] if line.startswith("|") else []
        first = INLINE.search(cells[0]) if cells else None
        commands = parse_commands(first[2]) if first else []
        if commands:
            rest = " ".join(span[2] for cell in cells[1:] for span in INLINE.finditer(cell))
            rows.append((commands[0], [f for f in flags_of(rest.split()) if f.startswith("--")]))
    return rows


def named_problems(doc: str, text: str) -> list[str]:
    """The repository paths, relative links and modules ``text`` (the doc ``doc``) names
    that do not exist."""
    problems = []
    for path in sorted(set(REPO_PATH.findall(text))):
        if not (REPO / path).exists() and not list(REPO.glob(path.rstrip("/"))):
            problems.append(f"no such path: {path}")
    for target in sorted(set(LINK.findall(text))):
        if "://" not in target and not (REPO / doc).parent.joinpath(target).exists():
            problems.append(f"broken link: {target}")
    lines, spans = code_texts(text)
    modules = {m for code in lines + spans for m in DOTTED.findall(code)}
    modules = {m for m in modules if m.rsplit(".", 1)[1] not in FILE_SUFFIXES}
    modules |= {c.key.split()[2] for c in doc_commands(text) if c.key.startswith("python -m")}
    return problems + [f"no such module: {m}" for m in sorted(modules) if not module_exists(m)]


def command_problems(text: str, helps: dict[str, str], beam: set[str]) -> list[str]:
    """The commands of ``text`` whose --help did not run, the flags shown with them that they
    do not take, as spelt in their --help (``helps``: by ``Command.key``, "deepspeed" the
    launcher's; ``beam``: Apache Beam's flags), and the settings a script does not read."""
    problems = []
    launcher = help_flags(helps.get("deepspeed", ""))
    rows = [(c, list(c.flags)) for c in doc_commands(text)] + table_rows(text)
    for command, flags in rows:
        if command.key.endswith(".sh"):
            scripts = (REPO / command.key).parent.glob("*.sh")  # it and those it sources
            said = "\n".join(script.read_text(encoding="utf-8") for script in scripts)
            problems += [
                f"{command.key} reads no {v}"
                for v in command.env
                if not re.search(rf"\b{v}\b", said)
            ]
        elif is_ours(command.key) or command.key in TOOLS:
            if command.key not in helps:
                problems.append(f"{command.key} --help did not run")
                continue
            takes = help_flags(helps[command.key]) | (
                beam if command.key in BEAM_COMMANDS else set()
            )
            problems += [f"{command.key}: no flag {f}" for f in flags if f not in takes]
        problems += [f"deepspeed: no flag {f}" for f in command.launcher_flags if f not in launcher]
    known = set(beam).union(*map(help_flags, helps.values()), EXTERNAL_FLAGS)
    for span in code_texts(text)[1]:
        if span.startswith("--") and not parse_commands(span):  # a flag on its own
            problems += [
                f"no command shown takes {f}" for f in flags_of(span.split()) if f not in known
            ]
    return list(dict.fromkeys(problems))


def prose_problems(doc: str, text: str, helps: dict[str, str], beam: set[str]) -> list[str]:
    """What the doc ``doc`` (a path relative to the repository), whose text is ``text``,
    names that is not so."""
    return named_problems(doc, text) + command_problems(text, helps, beam)


# Runs each command's --help with runpy, sharing one process's imports; prints JSON
# {key: [exit code, output]}. A command is [key, "module" or "path", target, argv].
HELP_RUNNER = """
import contextlib, io, json, runpy, sys
out = {}
for key, kind, target, argv in json.load(sys.stdin):
    sys.argv, text = [target, *argv], io.StringIO()
    with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
        try:
            if kind == "module":
                runpy.run_module(target, run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(target, run_name="__main__")
            code = 0
        except SystemExit as stop:
            code = stop.code or 0
        except BaseException as err:
            code = repr(err)
    out[key] = [code, text.getvalue()]
print(json.dumps(out))
"""


def run_helps(keys: set[str]) -> dict[str, tuple[object, str]]:
    """``key`` -> (exit code, output) of its ``--help``, and deepspeed's and Dask's. Two
    processes run in parallel, one for the commands of the base install and one for those
    that import torch (its slow imports, once), and Dask's CLI beside them."""
    light, heavy = [], []
    for key in sorted(keys):
        if key.startswith("python -m "):
            module, *argv = key.split()[2:]
            command = [key, "module", module, [*argv, "--help"]]
        else:
            command = [key, "path", str(REPO / key), ["--help"]]
        is_light = key.startswith(("python -m pipeline", "python -m report"))
        (light if is_light else heavy).append(command)
    heavy.append(["deepspeed", "module", "deepspeed.launcher.runner", ["--help"]])
    pipes = {"text": True, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    python = [sys.executable, "-c", HELP_RUNNER]
    jobs = [subprocess.Popen(python, cwd=REPO, stdin=subprocess.PIPE, **pipes) for _ in "ab"]
    dask = Path(sys.executable).with_name("dask")
    clis = {
        tool: subprocess.Popen([str(dask), tool.split()[1], "--help"], **pipes) for tool in TOOLS
    }
    helps = {}
    for job, commands in zip(jobs, (light, heavy), strict=True):
        stdout, stderr = job.communicate(json.dumps(commands), timeout=300)
        assert job.returncode == 0, stderr[-3000:]
        helps.update(json.loads(stdout.strip().splitlines()[-1]))
    for tool, cli in clis.items():
        helps[tool] = [cli.wait(120), cli.communicate()[0]]
    return helps


def beam_flags() -> set[str]:
    """Every flag of Apache Beam's pipeline options, the DaskRunner's included."""
    from apache_beam.options.pipeline_options import PipelineOptions

    with contextlib.suppress(ImportError):
        import apache_beam.runners.dask.dask_runner  # noqa: F401  (its --dask_* options)
    names: set[str] = set()

    def collect(parser) -> None:
        names.update(name for action in parser._actions for name in action.option_strings)

    PipelineOptions([]).get_all_options(add_extra_args_fn=collect)
    return names


@pytest.fixture(scope="module")
def helps_run() -> dict[str, tuple[object, str]]:
    return run_helps(shown_commands())


@pytest.fixture(scope="module")
def helps(helps_run) -> dict[str, str]:
    """The --help output of every command the docs show that answered it."""
    return {key: out for key, (code, out) in helps_run.items() if code == 0}


def test_every_command_the_docs_show_answers_help(helps_run):
    failed = {key: out[-500:] for key, (code, out) in helps_run.items() if code != 0}
    assert not failed, failed
    assert {"python -m pipeline build", "trainer/run.py", "deepspeed", *TOOLS} <= set(helps_run)
    assert "--num_gpus" in helps_run["deepspeed"][1]


@pytest.mark.parametrize("doc", PROSE_DOCS)
def test_prose_holds(doc, helps):
    problems = prose_problems(doc, (REPO / doc).read_text(encoding="utf-8"), helps, beam_flags())
    assert not problems, f"{doc} names what is not so:\n" + "\n".join(problems)


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


def test_parse_commands_and_flags():
    line = "DS_ACCELERATOR=cpu deepspeed --num_gpus 2 trainer/run.py --data s --max-steps=3  # x"
    (run,) = parse_commands(line)
    assert run == Command(
        "trainer/run.py", ("--data", "--max-steps"), ("DS_ACCELERATOR",), ("--num_gpus",)
    )
    build, stats = parse_commands(
        "python -m pipeline build -n 1 --to a|b && python -m pipeline stats s"
    )
    assert (build.key, build.flags) == ("python -m pipeline build", ("-n", "--to"))
    assert stats == Command("python -m pipeline stats", ())
    assert parse_commands("pip install -e . ; python run_pretraining.py --input_dir x") == []
    assert parse_commands("python -m official.nlp.train --mode train")[0].flags == ()
    assert parse_commands('-m "not slow"') == []  # pytest's, not python's, -m


def test_prose_problems_name_each_stale_reference():
    problems = prose_problems(
        "README.md",
        "`python -m pipeline.corpus` and `bash scripts/quickstart.sh`; `pipeline.shard_format`,"
        " deploy/hostfile, [x](docs/nowhere.md), `python -m pipeline build --vocab-size 9`,"
        " `NO_SUCH=1 bash scripts/quickstart.sh`, `--no-such-flag`, `model.save_hf(d)`",
        {"python -m pipeline build": "--vocab_size"},
        set(),
    )
    assert problems == [
        "no such path: deploy/hostfile",
        "no such path: docs/nowhere.md",
        "broken link: docs/nowhere.md",
        "no such module: pipeline.corpus",
        "no such module: pipeline.shard_format",
        "python -m pipeline.corpus --help did not run",
        "python -m pipeline build: no flag --vocab-size",
        "scripts/quickstart.sh reads no NO_SUCH",
        "no command shown takes --no-such-flag",
    ], problems


def test_module_docstrings_run_modules_that_exist():
    """A module's docstring gives the command that runs it (``python -m finetune ...``)."""
    missing = []
    for top in TOP.split("|"):
        for path in sorted((REPO / top).rglob("*.py")):
            docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
            for module in re.findall(r"python -m ([\w.]+)", docstring):
                if not module.isupper() and not module_exists(module):  # not a placeholder, X
                    missing.append(f"{path.relative_to(REPO)}: python -m {module}")
    assert not missing, "\n".join(missing)
