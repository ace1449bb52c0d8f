"""pipeline/options.py: the one bool parser, flags from dataclass fields, ``--config FILE``."""

import argparse
import dataclasses
import importlib
import json
from dataclasses import dataclass

import pytest

from pipeline.options import (
    add_options,
    did_you_mean,
    option,
    parse_bool,
    parse_options,
    respell,
)


@pytest.mark.parametrize(
    "text, value",
    [
        ("1", True),
        ("true", True),
        ("True", True),
        ("YES", True),
        ("y", True),
        ("on", True),
        (" true ", True),
        ("0", False),
        ("false", False),
        ("False", False),
        ("no", False),
        ("N", False),
        ("off", False),
    ],
)
def test_parse_bool_truth_table(text, value):
    assert parse_bool(text) is value


@pytest.mark.parametrize("text", ["", "2", "tru", "nope", "enabled", "none"])
def test_parse_bool_refuses_the_rest(text):
    with pytest.raises(argparse.ArgumentTypeError, match="expected true/false"):
        parse_bool(text)


@pytest.mark.parametrize(
    "path",
    [
        "pipeline.beam.config.BuildConfig",
        "trainer.config.TrainConfig",
        "finetune.config.FinetuneConfig",
    ],
)
def test_every_option_has_help(path):
    module, name = path.rsplit(".", 1)
    if not module.startswith("pipeline."):  # trainer/ and finetune/ refuse to load without torch
        pytest.importorskip("torch", reason=f"{module} needs the [train] extra (torch)")
    cls = getattr(importlib.import_module(module), name)
    for f in dataclasses.fields(cls):
        assert f.metadata.get("help", "").strip(), f"{cls.__name__}.{f.name} has no help"


@dataclass(frozen=True)
class Toy:
    data_dir: str = option(help="where")
    steps: int = option(10, "how many")
    rate: float | None = option(None, "how fast")
    fast: bool = option(False, "hurry")
    names: tuple[str, ...] = option(("a",), "some names")
    mode: str = option("x", "which", choices=("x", "y"))


def parse(argv, sep="-"):
    parser = argparse.ArgumentParser(prog="toy")
    add_options(parser, Toy, sep=sep)
    return parse_options(parser, Toy, argv, sep=sep)[0]


def test_flags_types_and_bools_with_or_without_a_value():
    assert parse(["--data-dir", "d"]) == Toy(data_dir="d")
    toy = parse(["--data-dir", "d", "--steps", "3", "--rate", "0.5", "--fast", "--names", "p", "q"])
    assert toy == Toy(data_dir="d", steps=3, rate=0.5, fast=True, names=("p", "q"))
    assert parse(["--data-dir", "d", "--fast", "no"]).fast is False
    assert parse(["--data_dir=d", "--fast=on"], sep="_").fast is True


def test_a_field_without_help_is_refused_when_flags_are_made():
    @dataclass
    class Bare:
        x: int = 1

    with pytest.raises(TypeError, match="x has no help"):
        add_options(argparse.ArgumentParser(), Bare, sep="-")


def test_config_file_then_flags(tmp_path):
    path = tmp_path / "toy.json"
    path.write_text(json.dumps({"data_dir": "d", "steps": 4, "rate": 1, "names": "solo"}))
    toy = parse(["--config", str(path), "--steps", "5"])
    assert (toy.data_dir, toy.steps, toy.rate, toy.names) == ("d", 5, 1.0, ("solo",))
    assert isinstance(toy.rate, float)


@pytest.mark.parametrize(
    "content, says",
    [
        ('{"setps": 3}', r"toy.json: unknown key\(s\) \['setps'\] \(did you mean 'steps'\?\)"),
        ('{"zzz": 3}', r"toy.json: unknown key\(s\) \['zzz'\]; known: data_dir, steps"),
        ('{"steps": 3,}', r"toy.json: not valid JSON"),
        ("[1, 2]", r"toy.json: expected a JSON object of settings, got list"),
        ('{"steps": "3"}', r"toy.json: steps must be a JSON int, got '3'"),
        ('{"fast": "yes"}', r"toy.json: fast must be a JSON bool, got 'yes'"),
        ('{"steps": true}', r"toy.json: steps must be a JSON int"),
        ('{"mode": "z"}', r"toy.json: mode must be one of \['x', 'y'\], got 'z'"),
    ],
)
def test_bad_config_files_are_named(tmp_path, content, says):
    path = tmp_path / "toy.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=says):
        parse(["--data-dir", "d", "--config", str(path)])


def test_missing_file_and_missing_required_option_are_named(tmp_path):
    with pytest.raises(ValueError, match=r"--config .*nope.json: cannot read"):
        parse(["--data-dir", "d", "--config", str(tmp_path / "nope.json")])
    with pytest.raises(ValueError, match=r"missing required option\(s\) --data-dir \("):
        parse([])
    with pytest.raises(ValueError, match=r"missing required option\(s\) --data_dir \("):
        parse([], sep="_")


def test_respell_takes_either_spelling_up_to_a_double_dash():
    declared = ["--vocab_size", "--max-steps", "--local_rank", "--local-rank", "--a_b"]
    argv = [
        "--vocab-size=9",
        "x",
        "--max_steps",
        "3",
        "--local_rank=1",
        "--other-one",
        "--",
        "--a-b",
    ]
    assert respell(argv, declared) == [
        "--vocab_size=9",
        "x",
        "--max-steps",
        "3",
        "--local_rank=1",
        "--other-one",
        "--",
        "--a-b",
    ]


def test_did_you_mean_compares_in_one_spelling_and_never_suggests_the_name():
    names = ["--model", "--max-steps", "--vocab_size"]
    assert did_you_mean("--mdoel", names) == " (did you mean --model?)"
    assert did_you_mean("--max_step", names) == " (did you mean --max-steps?)"
    assert did_you_mean("--vocab-size", names) == ""  # a spelling of it, not a typo
    assert did_you_mean("--zzz", names) == ""
