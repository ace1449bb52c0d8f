"""The docs' prose says what is true: what they name exists and what they show runs.

**Prose** (``PROSE_DOCS``: README.md, docs/, deploy/ and FORMAT.md). Every repository path,
relative link and module (``python -m X``, ``pipeline.shards.shard_format``) they name
exists; every command of ours they show (``python -m X``, ``python path.py``, ``bash
path.sh``, ``deepspeed ... trainer/run.py``) answers ``--help``; every flag shown with a
command is one its ``--help`` lists, as spelt there (or Apache Beam's, for ``pipeline
build`` and ``export``; or the deepspeed launcher's, before the script); a flag in inline
code on its own is one of those commands'; an environment setting before a script is one the
script reads; a default the docs state (``STATED_DEFAULT``: "`--cc_rounds` (8)") is the one
a command's ``--help`` gives for that flag; a value shown for a flag that takes choices
(``--precision bf16``, ``--spool auto|yes|no``) is one of them.

**Exit codes** (docs/exit-codes.md): every command its table names has a row, and each
exits with the table's code for a user's mistake, 2, on a misspelt flag, with one line
naming it and no traceback.
(The ```python snippets run in tests/test_docs.py.)

    pytest tests/test_prose.py
"""

from __future__ import annotations

import ast
import contextlib
import importlib.machinery
import json
import re
import shlex
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import REPO
from tests.test_docs import FENCE  # the fenced blocks of a markdown text

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
PIPELINE_COMMANDS = {"corpus", "curate", "build", "stats", "inspect", "validate", "export"}
# The commands that hand Apache Beam every option they do not know.
BEAM_COMMANDS = {
    "python -m pipeline build",
    "python -m pipeline curate",
    "python -m pipeline export",
}
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
        # PathFinder, not importlib.util.find_spec: the latter asks sys.meta_path's finders,
        # and setuptools' distutils finder takes a lookup of "pip" for pip running and turns
        # itself off for the rest of the process; a later `import setuptools` (torch's
        # cpp_extension) then failed in whichever test came next.
        top = importlib.machinery.PathFinder.find_spec(parts[0])
        builtin = parts[0] in sys.builtin_module_names  # sys, time: not on sys.path
        if name in EXTERNAL_MODULES or ((top or builtin) and len(parts) == 1):
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


# How the docs state a flag's default: "`--cc_rounds` (8)", "`--dedup minhash` (the
# default ...", "`--text_field`, default `text`", "`--unpad` is now `auto` by default".
STATED_DEFAULT = [
    re.compile(r"`(--[\w-]+)`,? \(([\w.,-]+)\)"),
    re.compile(r"`(--[\w-]+) ([\w.,-]+)` \(the default"),
    re.compile(r"`(--[\w-]+)`,? default `([^`]+)`"),
    re.compile(r"`(--[\w-]+)` is (?:now )?`([^`]+)` by default"),
]


def help_defaults(help_text: str) -> dict[str, str]:
    """An argparse --help's ``(default: X)`` of each flag: ``{"--cc_rounds": "8", ...}``."""
    defaults = {}
    for entry in re.split(r"\n(?=  -)", help_text):
        names = re.split(r"\s{2,}", entry.split("\n", 1)[0].strip())[0]
        stated = re.search(r"\(default: (.*)\)$", " ".join(entry.split()))
        for name in re.findall(r"(?<![\w-])(--[\w-]+)", names) if stated else []:
            defaults[name] = stated[1]
    return defaults


def default_problems(text: str, helps: dict[str, str]) -> list[str]:
    """The defaults ``text`` states that no command's --help gives for that flag (a flag no
    command shown declares a default for is left to the other checks)."""
    defaults: dict[str, set[str]] = {}
    for help_text in helps.values():
        for flag, value in help_defaults(help_text).items():
            defaults.setdefault(flag, set()).add(value)
    problems = []
    for pattern in STATED_DEFAULT:
        for flag, value in pattern.findall(text):
            if re.fullmatch(r"\d{1,3}(,\d{3})+", value):  # 1,000: a number as prose writes it
                value = value.replace(",", "")
            if flag in defaults and value not in defaults[flag]:
                said = " or ".join(sorted(defaults[flag]))
                problems.append(f"{flag}: the docs say default {value}, --help says {said}")
    return problems


def help_choices(help_text: str) -> dict[str, set[str]]:
    """An argparse --help's choices of each flag: ``{"--precision": {"fp32", "bf16", ...}}``."""
    found = re.findall(r"(?<![\w-])(--[\w-]+)[ =]\{([^}]+)\}", help_text)
    return {flag: set(values.split(",")) for flag, values in found}


def flag_values(code: str) -> list[tuple[str, str]]:
    """``"x --to tfrecord --spool=auto|no -n 3 --force"`` -> ``[("--to", "tfrecord"),
    ("--spool", "auto|no")]``: each long flag with the word after it, if that is a value."""
    try:
        words = shlex.split(re.sub(r"(^|\s)#.*", "", code))
    except ValueError:  # an unbalanced quote in prose
        words = code.split()
    pairs = []
    for word, after in zip(words, [*words[1:], ""][: len(words)], strict=True):
        if word.startswith("--") and "=" in word:
            pairs.append(tuple(word.split("=", 1)))
        elif word.startswith("--") and after and not after.startswith("-"):
            pairs.append((word, after))
    return pairs


def choice_problems(text: str, helps: dict[str, str], beam: set[str] = frozenset()) -> list[str]:
    """The values ``text`` shows for a flag that its command's --help limits to choices and
    that are not among them (``a|b``: each); a flag on its own, against every command's
    choices for it, unless a command (or Apache Beam, ``beam``) takes it without choices."""
    choices = {key: help_choices(help_text) for key, help_text in helps.items()}
    anywhere: dict[str, set[str]] = {}
    for by_flag in choices.values():
        for flag, values in by_flag.items():
            anywhere.setdefault(flag, set()).update(values)
    free = set(beam).union(*(help_flags(helps[key]) - set(choices[key]) for key in helps))
    anywhere = {flag: values for flag, values in anywhere.items() if flag not in free}
    problems = []
    lines, spans = code_texts(text)
    for code in lines + spans:
        commands = parse_commands(code)
        if len(commands) == 1:
            allowed = choices.get(commands[0].key, {})
        else:  # several commands on one line are left to the other checks
            allowed = anywhere if code.startswith("--") and not commands else {}
        for flag, value in flag_values(code):
            shown = set(value.split("|"))
            if flag in allowed and not shown <= allowed[flag]:
                wrong = ", ".join(sorted(shown - allowed[flag]))
                takes = ", ".join(sorted(allowed[flag]))
                problems.append(f"{flag} {value}: no choice {wrong} (--help: {takes})")
    return problems


def prose_problems(doc: str, text: str, helps: dict[str, str], beam: set[str]) -> list[str]:
    """What the doc ``doc`` (a path relative to the repository), whose text is ``text``,
    names that is not so."""
    problems = named_problems(doc, text) + command_problems(text, helps, beam)
    return problems + default_problems(text, helps) + choice_problems(text, helps, beam)


# Runs each command's --help with runpy, sharing one process's imports; prints JSON
# {key: [exit code, output]}. A command is [key, "module" or "path", target, argv].
# (A Beam command's console writes to a duplicate of descriptor 2, pipeline/console.py: the
# descriptor is captured too. Loggers lose the handlers an earlier command installed.)
HELP_RUNNER = """
import contextlib, io, json, logging, os, runpy, sys, tempfile
out = {}
for key, kind, target, argv in json.load(sys.stdin):
    sys.argv, text = [target, *argv], io.StringIO()
    for logger in [logging.root, *logging.Logger.manager.loggerDict.values()]:
        if isinstance(logger, logging.Logger):
            logger.handlers.clear()
    with tempfile.TemporaryFile("w+") as fd2:
        saved = os.dup(2)
        os.dup2(fd2.fileno(), 2)
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
        os.dup2(saved, 2)
        os.close(saved)
        fd2.seek(0)
        out[key] = [code, text.getvalue() + fd2.read()]
print(json.dumps(out))
"""


MISSPELT = "--no-such-flag"  # what the exit-code check passes each command


def run_helps(keys: set[str], misspelt: set[str] = frozenset()) -> dict[str, tuple[object, str]]:
    """``key`` -> (exit code, output) of its ``--help``, and deepspeed's and Dask's; and
    ``f"{key} {MISSPELT}"`` -> those of the commands ``misspelt`` given that flag. Two
    processes run in parallel, one for the commands of the base install and one for those
    that import torch (its slow imports, once), and Dask's CLI beside them."""
    light, heavy = [], []
    runs = [(key, "--help") for key in sorted(keys)] + [(key, MISSPELT) for key in misspelt]
    for key, flag in runs:
        name = key if flag == "--help" else f"{key} {flag}"
        if key.startswith("python -m "):
            module, *argv = key.split()[2:]
            command = [name, "module", module, [*argv, flag]]
        else:
            command = [name, "path", str(REPO / key), [flag]]
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
    """Every flag of Apache Beam's pipeline options, the DaskRunner's and ours included.

    Beam lists the options of the PipelineOptions subclasses imported so far, so ours
    (pipeline/beam/dask_compat.py's --dask_shuffle_partitions) are imported here, as the
    commands do (pipeline/beam/runner.py): before, this test passed only after another
    test had imported them in the same process, and failed when run alone."""
    from apache_beam.options.pipeline_options import PipelineOptions

    import pipeline.beam.dask_compat  # noqa: F401  (--dask_shuffle_partitions)

    with contextlib.suppress(ImportError):
        import apache_beam.runners.dask.dask_runner  # noqa: F401  (its --dask_* options)
    names: set[str] = set()

    def collect(parser) -> None:
        names.update(name for action in parser._actions for name in action.option_strings)

    PipelineOptions([]).get_all_options(add_extra_args_fn=collect)
    return names


def exit_code_rows() -> dict[str, dict[str, str]]:
    """docs/exit-codes.md's table: each command -> its cells by code ("0", "1", "2",
    "other"). A cell "`python -m pipeline stats` / `inspect`" names two commands."""
    text = (REPO / "docs/exit-codes.md").read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    header = [cell.strip() for cell in re.split(r"(?<!\\)\|", lines[0])[2:-1]]
    rows = {}
    for line in lines[1:]:
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
        keys: list[str] = []
        for part in cells[0].split(" / "):
            span = INLINE.match(part)
            commands = parse_commands(span[2]) if span else []
            if commands:
                keys.append(commands[0].key)
            elif span and keys:  # `inspect` after `python -m pipeline stats`: its last word
                keys.append(keys[-1].rsplit(" ", 1)[0] + " " + span[2])
        rows.update({key: dict(zip(header, cells[1:], strict=True)) for key in keys})
    return rows


@pytest.fixture(scope="module")
def runs() -> dict[str, tuple[object, str]]:
    return run_helps(shown_commands(), set(exit_code_rows()))


@pytest.fixture(scope="module")
def helps_run(runs) -> dict[str, tuple[object, str]]:
    return {key: run for key, run in runs.items() if not key.endswith(MISSPELT)}


@pytest.fixture(scope="module")
def helps(helps_run) -> dict[str, str]:
    """The --help output of every command the docs show that answered it."""
    return {key: out for key, (code, out) in helps_run.items() if code == 0}


def test_every_command_the_docs_show_answers_help(helps_run):
    failed = {key: out[-500:] for key, (code, out) in helps_run.items() if code != 0}
    assert not failed, failed
    assert {"python -m pipeline build", "trainer/run.py", "deepspeed", *TOOLS} <= set(helps_run)
    assert "--num_gpus" in helps_run["deepspeed"][1]


def test_every_command_exits_as_its_exit_code_row_says_on_a_misspelt_flag(runs):
    """A misspelt flag is a user's mistake: the table's code for one, 2, one line naming the
    flag, no traceback; and every pipeline command has its row."""
    rows = exit_code_rows()
    assert {f"python -m pipeline {name}" for name in PIPELINE_COMMANDS} <= set(rows)
    assert "trainer/run.py" in rows
    wrong = {}
    for key, cells in rows.items():
        code, out = runs[f"{key} {MISSPELT}"]
        # The misspelt flag, or the first error found before it: required ones missing.
        said = re.search(rf"{MISSPELT}|arguments are required|missing required option", out)
        if cells["2"] == "" or code != 2 or not said or "Traceback" in out:
            wrong[key] = (code, out[-300:])
    assert not wrong, wrong


@pytest.mark.parametrize("doc", PROSE_DOCS)
def test_prose_holds(doc, helps):
    problems = prose_problems(doc, (REPO / doc).read_text(encoding="utf-8"), helps, beam_flags())
    assert not problems, f"{doc} names what is not so:\n" + "\n".join(problems)


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


def test_a_stale_default_is_named():
    helps = {
        "python -m pipeline curate": "options:\n  --cc_rounds CC_ROUNDS\n"
        "                        rounds (default:\n                        8)\n"
        "  -n N, --num N         a count (default: 2)\n",
    }
    text = (
        "`--cc_rounds` (6); `--num`, default `2`; `--bucket_size` (1,000); `--num 3` (the default)"
    )
    assert default_problems(text, helps) == [
        "--cc_rounds: the docs say default 6, --help says 8",
        "--num: the docs say default 3, --help says 2",
    ]


def test_a_value_that_is_no_choice_is_named():
    helps = {
        "trainer/run.py": "  --precision {fp32,bf16,auto}\n  --data DATA\n",
        "python -m pipeline build": "  --spool {auto,yes,no}  where rows wait (default: auto)\n",
    }
    text = (
        "`python trainer/run.py --precision fp16 --data x`, `--spool auto|maybe`, "
        "`python -m pipeline build --spool=yes`, `--precision bf16`, `pip install --spool x`"
    )
    assert choice_problems(text, helps) == [
        "--precision fp16: no choice fp16 (--help: auto, bf16, fp32)",
        "--spool auto|maybe: no choice maybe (--help: auto, no, yes)",
    ]
    assert flag_values("x --to tf --spool=a|b -n 3 --force --y") == [
        ("--to", "tf"),
        ("--spool", "a|b"),
    ]


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


def test_looking_up_a_module_leaves_setuptools_importable():
    # importlib.util.find_spec("pip") turned setuptools' distutils finder off for the process,
    # and the next test to import setuptools (through torch's cpp_extension) failed.
    code = "from tests.test_prose import module_exists; module_exists('pip'); import setuptools"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
