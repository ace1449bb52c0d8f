"""One way to declare a command's options: dataclass fields -> argparse flags + ``--config FILE``.

A command declares its settings once, as a frozen dataclass whose fields carry their help
(``option(default, "help")``); the flags, their types, the ``--help`` text and the JSON file
format all come from it. Values are layered defaults < ``--config FILE`` < flags:

    @dataclass(frozen=True)
    class RunConfig:
        data: str = option(help="shard directory")            # required: no default
        max_steps: int = option(1000, "optimizer steps")
        unpad: bool = option(True, "encoder on real tokens only")

    parser = argparse.ArgumentParser(prog="run")
    add_options(parser, RunConfig, sep="-")                   # --data --max-steps --unpad
    argv = ["--config", "run.json", "--unpad", "no"]
    config, _ = parse_options(parser, RunConfig, argv, sep="-")  # flags over the file

A ``--config`` file is a JSON object keyed by the field names (``{"max_steps": 200}``);
an unknown key is refused with the closest known name, and every error names the file.

Every command of the project parses with :class:`CommandParser`: a long flag may be
spelled with hyphens or underscores whichever way it was declared (``--vocab-size`` and
``--vocab_size``; the pipeline declares Google's underscores, the trainer hyphens), and a
bad command line is refused in one line, exit 2, with the closest flag:

    trainer/run.py: error: unknown option --mdoel (did you mean --model?)
Only the standard library: ``pipeline/`` runs on Beam workers, and the trainer and
finetune packages import this module too.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

TRUE = ("1", "true", "yes", "y", "on")
FALSE = ("0", "false", "no", "n", "off")
# Field annotations (strings under ``from __future__ import annotations``) -> flag types.
_KINDS = {"int": int, "float": float, "str": str, "bool": bool, "tuple[str, ...]": tuple}


def parse_bool(text: str) -> bool:
    """A flag's true/false, case-insensitive: ``"Yes"`` -> True, ``"off"`` -> False.

    Raises:
        argparse.ArgumentTypeError: anything but 1/true/yes/y/on or 0/false/no/n/off.
    """
    value = text.strip().lower()
    if value in TRUE:
        return True
    if value in FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


def option(
    default: Any = dataclasses.MISSING,
    help: str = "",
    *,
    kw_only: bool | Any = dataclasses.MISSING,
    **argparse_kwargs: Any,
) -> Any:
    """A dataclass field with its ``--help`` line; no default makes it required.

    ``kw_only`` as dataclasses.field's (a subclass's new default for a keyword-only field
    of its base). ``argparse_kwargs`` (``choices``, ``metavar``) go to ``add_argument``.
    """
    metadata = {"help": help, **argparse_kwargs}
    return dataclasses.field(default=default, metadata=metadata, kw_only=kw_only)


def flag(name: str, sep: str) -> str:
    """``flag("max_steps", "-")`` -> ``"--max-steps"``; ``sep="_"`` keeps Google's spelling."""
    return "--" + name.replace("_", sep)


def _kind(f: dataclasses.Field) -> tuple[type, bool]:
    """``(type, optional)`` of a field: ``"int | None"`` -> ``(int, True)``."""
    # A string under ``from __future__ import annotations``, else the type itself.
    name = f.type.__name__ if type(f.type) is type else str(f.type)
    optional = name.endswith(" | None")
    kind = _KINDS.get(name.removesuffix(" | None"))
    if kind is None:
        raise TypeError(f"{f.name}: options cannot have type {name!r}")
    return kind, optional


def _help(f: dataclasses.Field) -> str:
    text = f.metadata.get("help")
    if not text:
        raise TypeError(f"option {f.name} has no help text: declare it with option(..., help)")
    if f.default is dataclasses.MISSING:
        text += " (required)"
    elif f.default is not None:
        shown = str(f.default).lower() if isinstance(f.default, bool) else f.default
        text += f" (default: {shown})"
    return text.replace("%", "%%")  # argparse %-formats help


def add_options(parser: argparse.ArgumentParser, cls: type, *, sep: str) -> None:
    """Add ``--config FILE`` and one flag per field of the dataclass ``cls``.

    Flags default to SUPPRESS, so only those given override the file. A bool takes a value
    (``--unpad false``) or none (``--overwrite`` is true), parsed by ``parse_bool``.

    Raises:
        TypeError: a field without help or of a type flags cannot carry.
    """
    parser.add_argument(
        "--config",
        metavar="FILE",
        default=argparse.SUPPRESS,
        help="JSON object of any of the settings below, keyed by their names with "
        "underscores; flags given too override it",
    )
    # A keyword-only base's fields (build's and curate's shared curation options) come
    # first in dataclasses.fields; --help lists them after the command's own.
    for f in sorted(dataclasses.fields(cls), key=lambda f: f.kw_only is True):
        kind, _ = _kind(f)
        kwargs: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS, "help": _help(f)}
        if kind is bool:
            kwargs.update(type=parse_bool, nargs="?", const=True, metavar="true|false")
        elif kind is tuple:
            kwargs.update(nargs="+")
        else:
            kwargs.update(type=kind)
        extra = {k: v for k, v in f.metadata.items() if k != "help"}
        parser.add_argument(flag(f.name, sep), **{**kwargs, **extra})


def spelling(name: str) -> str:
    """One key for both spellings of a long flag: ``"--vocab_size"`` -> ``"--vocab-size"``."""
    return "--" + name[2:].replace("_", "-") if name.startswith("--") else name


def respell(argv: Sequence[str], names: Iterable[str]) -> list[str]:
    """``argv`` with each long flag spelled as declared in ``names`` (hyphens or underscores).

    ``respell(["--vocab-size=9", "x"], ["--vocab_size"])`` -> ``["--vocab_size=9", "x"]``.
    A flag declared as given, or not declared in any spelling, is left as it is (so it
    reaches the unknown-option check, or Beam); nothing after ``--`` is touched.
    """
    names = set(names)
    declared: dict[str, str] = {}
    for name in sorted(names):  # sorted: the same pick every run if two spellings are declared
        declared.setdefault(spelling(name), name)
    out = list(argv)
    for i, arg in enumerate(out):
        if arg == "--":
            break
        name, eq, value = arg.partition("=")
        if name.startswith("--") and name not in names and spelling(name) in declared:
            out[i] = declared[spelling(name)] + eq + value
    return out


def did_you_mean(name: str, names: Iterable[str]) -> str:
    """``" (did you mean --model?)"`` for the known flag closest to ``name``, else ``""``.

    Compared in one spelling, so ``--max_step`` finds ``--max-steps``; a name never
    suggests itself (``--vocab_size`` for ``--vocab-size``).
    """
    by_key: dict[str, str] = {}
    for known in sorted(names):
        by_key.setdefault(spelling(known), known)
    by_key.pop(spelling(name), None)
    close = difflib.get_close_matches(spelling(name), list(by_key), n=1, cutoff=0.6)
    return f" (did you mean {by_key[close[0]]}?)" if close else ""


class CommandParser(argparse.ArgumentParser):
    """argparse's parser, as every command of the project uses it: either spelling of a long
    flag (:func:`respell`), and errors in one line with exit 2, no usage dump:
    ``prog: error: unknown option --mdoel (did you mean --model?)``. ``--help`` is argparse's.
    """

    @classmethod
    def of_doc(cls, prog: str, doc: str | None, **kwargs) -> CommandParser:
        """The parser of the command ``prog`` whose --help shows ``doc`` (its module's
        docstring) as written, line breaks kept."""
        return cls(
            prog=prog,
            description=doc,
            formatter_class=argparse.RawDescriptionHelpFormatter,
            **kwargs,
        )

    def option_names(self) -> list[str]:
        """Every long flag this parser declares, as declared."""
        return [
            name
            for action in self._actions
            for name in action.option_strings
            if name.startswith("--")
        ]

    def parse_known_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else args
        return super().parse_known_args(respell(args, self.option_names()), namespace)

    def parse_args(self, args=None, namespace=None):
        parsed, rest = self.parse_known_args(args, namespace)
        if rest:
            self.error(self.unknown_message(rest))
        return parsed

    def unknown_message(self, rest: Sequence[str]) -> str:
        """``"unknown option --mdoel (did you mean --model?)"`` for what parsing left over."""
        options = [arg.partition("=")[0] for arg in rest if arg.startswith("-") and arg != "-"]
        if not options:
            return f"unexpected argument(s) {' '.join(rest)}"
        names = self.option_names()
        problems = [name + did_you_mean(name, names) for name in options]
        return f"unknown option{'s' if len(problems) > 1 else ''} {', '.join(problems)}"

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def read_config_file(path: str, cls: type) -> dict[str, Any]:
    """The settings of a ``--config`` JSON file, checked against the fields of ``cls``.

    Raises:
        ValueError: unreadable, not JSON, not an object, an unknown key (with the closest
            known one) or a value of the wrong type; every message starts ``--config PATH:``.
    """
    where = f"--config {path}"
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise ValueError(f"{where}: cannot read: {err.strerror or err}") from None
    try:
        values = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{where}: not valid JSON: {err}") from None
    if not isinstance(values, dict):
        raise ValueError(
            f"{where}: expected a JSON object of settings, got {type(values).__name__}"
        )
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        close = {key: difflib.get_close_matches(key, list(fields), n=1) for key in unknown}
        hints = [
            repr(m[0]) + (f" for {k!r}" if len(unknown) > 1 else "") for k, m in close.items() if m
        ]
        hint = f" (did you mean {', '.join(hints)}?)" if hints else f"; known: {', '.join(fields)}"
        raise ValueError(f"{where}: unknown key(s) {unknown}{hint}")
    return {key: _file_value(fields[key], value, where) for key, value in values.items()}


def _file_value(f: dataclasses.Field, value: Any, where: str) -> Any:
    """A JSON value as the field's type (a list as a tuple, an int as a float where one is due)."""
    kind, optional = _kind(f)
    if value is None and optional:
        return None
    parse = f.metadata.get("type")
    if parse is not None:  # a field with its own parser (--unpad): JSON strings go through it
        try:
            return parse(value) if isinstance(value, str) else value
        except argparse.ArgumentTypeError as e:
            raise ValueError(f"{where}: {f.name}: {e}") from None
    ok = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, (int, float)) and not isinstance(value, bool),
        str: isinstance(value, str),
        tuple: isinstance(value, str)
        or (isinstance(value, list) and all(isinstance(v, str) for v in value)),
    }[kind]
    choices = f.metadata.get("choices")
    if not ok or (choices and value not in choices):
        want = f"one of {list(choices)}" if choices else f"a JSON {kind.__name__}"
        if kind is tuple:
            want = "a string or a list of strings"
        raise ValueError(f"{where}: {f.name} must be {want}, got {value!r}")
    if kind is tuple:
        return (value,) if isinstance(value, str) else tuple(value)
    return float(value) if kind is float else value


def parse_options(
    parser: argparse.ArgumentParser,
    cls: type,
    argv: Sequence[str],
    *,
    sep: str,
    known: bool = False,
) -> tuple[Any, list[str]]:
    """Defaults < ``--config FILE`` < flags -> ``(cls(...), unparsed args)``.

    ``known``: leave unknown arguments to the caller (Beam's, for ``pipeline build``)
    instead of exiting 2. Parser destinations that are not fields (``local_rank``) are dropped.

    Raises:
        ValueError: a bad ``--config`` file, a missing required option (named as a flag),
            or what ``cls`` itself refuses.
        SystemExit: from argparse: ``--help``, a bad flag value (exit 2, naming the flag).
    """
    if known:
        args, rest = parser.parse_known_args(list(argv))
    else:
        args, rest = parser.parse_args(list(argv)), []
    given = vars(args)
    path = given.pop("config", None)
    values = read_config_file(path, cls) if path else {}
    fields = dataclasses.fields(cls)
    values.update({f.name: given[f.name] for f in fields if f.name in given})
    for f in fields:
        if f.name in values and _kind(f)[0] is tuple:
            values[f.name] = tuple(values[f.name])
    missing = [
        flag(f.name, sep)
        for f in fields
        if f.default is dataclasses.MISSING and f.name not in values
    ]
    if missing:
        raise ValueError(
            f"missing required option(s) {' '.join(missing)} (as flags or in --config FILE)"
        )
    return cls(**values), rest
