"""Trainer options and the DeepSpeed JSON: precedence, validation, batch-size resolution."""

import json

import pytest
import torch

from tests.helpers import REPO
from trainer import dsconfig, prepare
from trainer.config import parse_args, resolve_unpad
from trainer.dsconfig import (
    precision,
    resolve_batch_sizes,
    resolve_ds_config,
    warmup_warning,
    with_precision,
)

REQUIRED = ["--ds-config", "ds.json", "--data", "shards", "--output-dir", "out", "--model", "tiny"]


def test_defaults_json_file_then_flags(tmp_path):
    assert parse_args(REQUIRED).step_limit == 1000
    assert parse_args(REQUIRED).plots  # a run plots unless told not to (tests/helpers.py does)
    assert not parse_args([*REQUIRED, "--plots", "false"]).plots
    assert parse_args([*REQUIRED, "--max-minutes", "2"]).step_limit is None
    config_file = tmp_path / "run.json"
    config_file.write_text(json.dumps({"max_steps": 200, "log_every": 5, "masking": "dynamic"}))
    config = parse_args([*REQUIRED, "--config", str(config_file), "--max-steps", "300"])
    assert (config.max_steps, config.log_every, config.masking) == (300, 5, "dynamic")
    assert parse_args([*REQUIRED, "--local_rank=1", "--skip-corrupt", "true"]).skip_corrupt
    assert parse_args([*REQUIRED, "--skip-corrupt"]).skip_corrupt  # a bare bool flag is true
    assert not parse_args([*REQUIRED, "--unpad", "off"]).unpad
    # Everything, the required options and bools included, can come from the file.
    config_file.write_text(
        json.dumps(
            {
                "ds_config": "ds.json",
                "data": "d",
                "output_dir": "o",
                "unpad": False,
                "max_steps": 7,
                "model": "tiny",
            }
        )
    )
    config = parse_args(["--config", str(config_file), "--data", "shards"])
    assert (config.data, config.output_dir, config.unpad, config.max_steps) == (
        "shards",
        "o",
        False,
        7,
    )


def test_bad_flag_values_exit_2_naming_the_flag(capsys):
    for flag, value in [("--unpad", "maybe"), ("--max-steps", "x"), ("--masking", "random")]:
        with pytest.raises(SystemExit) as exit_:
            parse_args([*REQUIRED, flag, value])
        assert exit_.value.code == 2
        assert f"argument {flag}" in capsys.readouterr().err


def test_unpad_auto_resolves_by_device(tmp_path):
    assert parse_args(REQUIRED).unpad == "auto"  # the default
    assert parse_args([*REQUIRED, "--unpad", "AUTO"]).unpad == "auto"
    assert parse_args([*REQUIRED, "--unpad"]).unpad is True  # a bare flag is true
    assert parse_args([*REQUIRED, "--unpad", "yes"]).unpad is True
    # auto: unpadded on CPU, padded on CUDA (measured on an H200); true/false as given.
    assert resolve_unpad("auto", "cpu") is True
    assert resolve_unpad("auto", "cuda") is False
    assert resolve_unpad(True, "cuda") is True and resolve_unpad(False, "cpu") is False
    config_file = tmp_path / "run.json"
    config_file.write_text(json.dumps({"unpad": "auto"}))
    assert parse_args([*REQUIRED, "--config", str(config_file)]).unpad == "auto"
    config_file.write_text(json.dumps({"unpad": "sometimes"}))
    with pytest.raises(
        ValueError, match=r"run.json: unpad: expected auto, true or false, got 'sometimes'"
    ):
        parse_args([*REQUIRED, "--config", str(config_file)])
    config_file.write_text(json.dumps({"unpad": 3}))
    with pytest.raises(ValueError, match="--unpad must be auto, true or false, got 3"):
        parse_args([*REQUIRED, "--config", str(config_file)])


def test_unknown_key_missing_option_and_bad_value_are_named(tmp_path):
    config_file = tmp_path / "run.json"
    config_file.write_text(json.dumps({"max_stpes": 200}))
    with pytest.raises(
        ValueError,
        match=r"run.json: unknown key\(s\) \['max_stpes'\] "
        r"\(did you mean 'max_steps'\?\)",
    ):
        parse_args([*REQUIRED, "--config", str(config_file)])
    config_file.write_text('{"max_steps": 200,}')
    with pytest.raises(ValueError, match=r"--config .*run.json: not valid JSON"):
        parse_args([*REQUIRED, "--config", str(config_file)])
    with pytest.raises(ValueError, match="--output-dir"):
        parse_args(REQUIRED[:4])
    with pytest.raises(ValueError, match="--log-every must be an int >= 1"):
        parse_args([*REQUIRED, "--log-every", "0"])
    with pytest.raises(SystemExit):
        parse_args([*REQUIRED, "--max-stpes", "3"])


def test_batch_sizes_follow_deepspeeds_rule():
    sizes = resolve_batch_sizes(
        {"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4}, 2, where="x"
    )
    assert (sizes.micro, sizes.accumulation, sizes.per_step, sizes.global_micro) == (4, 4, 32, 8)
    sizes = resolve_batch_sizes(
        {"train_batch_size": 32, "gradient_accumulation_steps": 2}, 4, where="x"
    )
    assert (sizes.micro, sizes.accumulation) == (4, 2)
    assert resolve_batch_sizes({"train_micro_batch_size_per_gpu": 3}, 5, where="x").per_step == 15


@pytest.mark.parametrize(
    "ds, world",
    [
        ({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4}, 2),
        (
            {
                "train_batch_size": 8,
                "train_micro_batch_size_per_gpu": 4,
                "gradient_accumulation_steps": 2,
            },
            2,
        ),
        ({"train_batch_size": 4, "train_micro_batch_size_per_gpu": 4}, 2),
    ],
)
def test_batch_sizes_that_do_not_fit_the_world_are_refused(ds, world):
    with pytest.raises(ValueError, match=r"zero2.json: batch sizes .* do not fit 2 rank\(s\)"):
        resolve_batch_sizes(ds, world, where="zero2.json")


def test_warmup_decay_length_defaults_to_max_steps():
    ds = {
        "train_micro_batch_size_per_gpu": 2,
        "bf16": {"enabled": True},
        "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": "auto"}},
    }
    resolved, _ = resolve_ds_config(ds, 1, 77, where="x")
    assert resolved["scheduler"]["params"]["total_num_steps"] == 77
    assert ds["scheduler"]["params"]["total_num_steps"] == "auto"  # the input is not modified
    assert resolved["train_batch_size"] == 2 and resolved["gradient_accumulation_steps"] == 1
    assert precision(resolved) == "bf16" and precision({}) == "fp32"


def test_precision_flag_overrides_the_json(monkeypatch):
    cpu = torch.device("cpu")
    base = {
        "train_micro_batch_size_per_gpu": 2,
        "bf16": {"enabled": False, "immediate_grad_update": True},
    }
    assert with_precision(base, "config", cpu) is base
    bf16 = with_precision(base, "bf16", cpu)
    assert bf16["bf16"] == {"enabled": True, "immediate_grad_update": True} and "fp16" not in bf16
    assert base["bf16"]["enabled"] is False  # the input is not modified
    fp16 = {"train_micro_batch_size_per_gpu": 2, "fp16": {"enabled": True}}
    assert precision(with_precision(fp16, "bf16", cpu)) == "bf16"
    assert with_precision(fp16, "fp32", cpu)["fp16"] == {"enabled": False}
    assert precision(with_precision(bf16, "fp32", cpu)) == "fp32"
    for native, expected in ((True, "bf16"), (False, "fp32")):
        monkeypatch.setattr(dsconfig, "bf16_native", lambda device, native=native: native)
        assert precision(with_precision(base, "auto", cpu)) == expected
    assert parse_args([*REQUIRED, "--precision", "auto"]).precision == "auto"
    with pytest.raises(SystemExit):
        parse_args([*REQUIRED, "--precision", "fp16"])


def test_bf16_native_reads_the_cpu_flags(monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    assert not dsconfig.bf16_native(torch.device("cpu"))
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True, raising=False)
    assert dsconfig.bf16_native(torch.device("cpu"))
    assert not dsconfig.bf16_native(torch.device("meta"))


def test_resume_in_another_precision_is_refused(tmp_path):
    config = parse_args([*REQUIRED, "--precision", "fp32"])
    (tmp_path / "step00000004").mkdir()
    (tmp_path / "step00000004" / "ds_config.json").write_text(
        json.dumps({"bf16": {"enabled": True}})
    )
    with pytest.raises(
        ValueError, match=r"trained in bf16, this run would train in fp32 .*--precision bf16"
    ):
        prepare.check_resumed_precision(config, {}, str(tmp_path), "step00000004")
    prepare.check_resumed_precision(
        config, {"bf16": {"enabled": True}}, str(tmp_path), "step00000004"
    )


@pytest.mark.parametrize(
    "flag, value",
    [("--dropout", "1.0"), ("--dropout", "-0.1"), ("--max-minutes", "0"), ("--max-steps", "0")],
)
def test_out_of_range_run_options_are_refused(flag, value):
    with pytest.raises(ValueError, match=flag):
        parse_args([*REQUIRED, flag, value])


def test_a_warmup_of_half_the_run_or_more_is_warned_about():
    ds = {"scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 100}}}
    assert "the whole run warms up" in warmup_warning(ds, 100)
    assert "50% of it warms up" in warmup_warning(ds, 200)
    assert warmup_warning(ds, 201) is None  # the README's toy run: 100 of 500
    assert warmup_warning(ds, None) is None  # a time budget
    assert warmup_warning({}, 10) is None


def test_the_readme_toy_run_warms_up_for_a_part_of_it_only():
    # The toy run is the first thing a newcomer trains: a warmup as long as the run left it
    # on the unigram plateau (docs/results.md, "The toy run").
    import re
    import shlex

    readme = (REPO / "README.md").read_text()
    toy = readme.split("## A two-minute toy run")[1].split("\n## ")[0]
    (command,) = [c for c in toy.replace("\\\n", " ").splitlines() if "trainer/run.py" in c]
    argv = shlex.split(command)
    flags = dict(zip(argv[2::2], argv[3::2], strict=True))
    assert re.fullmatch(r"\d+", flags["--max-steps"]), command
    ds = json.loads((REPO / flags["--ds-config"]).read_text())
    assert warmup_warning(ds, int(flags["--max-steps"])) is None
    assert "--eval-data" in flags  # its summary checks learning on held-out rows


def test_the_model_size_is_a_choice_the_command_makes():
    without = [flag for flag in REQUIRED if flag not in ("--model", "tiny")]
    with pytest.raises(ValueError, match="--model is required: a preset"):
        parse_args(without)
    assert parse_args([*without, "--init-from-hf", "hf/x"]).model is None  # its config
