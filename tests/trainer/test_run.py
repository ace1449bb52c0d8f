"""trainer/run.py in this process (a one-rank world): metrics, checkpoints, export, refusals."""

import errno
import io
import json
import logging
import os
import shutil
import stat
import subprocess
import sys

import pytest
import torch

from model import BertConfig, BertForPreTraining
from tests.helpers import REPO, TINY, args, build_shards, ds_json, model_json, records
from trainer import export
from trainer import run as run_module
from trainer.data import PretrainingStream, StreamSpec
from trainer.loop import SCHEDULER_START_WARNING
from trainer.run import main
from trainer.shards import ShardSet


@pytest.fixture(scope="module")
def finished_run(tiny_shards, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("run")
    extra = [
        "--max-steps",
        "6",
        "--log-every",
        "3",
        "--save-every",
        "3",
        "--eval-data",
        str(tiny_shards),
        "--eval-every",
        "3",
        "--plots",
        "true",
    ]
    old_umask = os.umask(0o022)  # so that files written as usual are 0644
    try:
        assert main(args(tmp, tiny_shards, *extra)) == 0
    finally:
        os.umask(old_umask)
    return tmp / "out"


def test_metrics_are_logged_to_jsonl_and_tensorboard(finished_run, tiny_shards):
    train = records(finished_run)
    assert [r["step"] for r in train] == [3, 6]
    keys = {
        "loss",
        "mlm_loss",
        "mlm_accuracy",
        "nsp_loss",
        "nsp_accuracy",
        "lr",
        "grad_norm",
        "sequences_per_s",
        "tokens_per_s",
        "tflops_per_s",
        "mfu",
        "epoch",
        "samples",
        "mlm_baseline_accuracy",
        "nsp_baseline_accuracy",
    }
    assert keys <= set(train[0])
    for r in train:  # the same rows' trivial baselines: a share, never all the targets here
        assert 0 < r["mlm_baseline_accuracy"] < 1 and 0.5 <= r["nsp_baseline_accuracy"] <= 1
    assert train[1]["samples"] == 6 * 8 and train[0]["mfu"] is None  # no peak known on CPU
    assert abs(train[0]["loss"] - train[0]["mlm_loss"] - train[0]["nsp_loss"]) < 1e-4
    assert 0 < train[0]["tokens_per_s"] < 48 * train[0]["sequences_per_s"]
    assert train[0]["grad_norm"] > 0 and 0 < train[0]["lr"] <= 1e-3
    manifest = ShardSet(str(tiny_shards)).manifest  # static masks: the rate they were made at
    assert train[0]["mask_rate"] == manifest["params"]["masked_lm_prob"]
    evals = records(finished_run, "eval")
    assert [r["step"] for r in evals] == [3, 6]
    assert evals[0]["rows"] == ShardSet(str(tiny_shards)).num_rows  # every held-out row once
    assert 0 <= evals[1]["mlm_accuracy"] <= 1
    assert list((finished_run / "tensorboard").glob("events.out.tfevents.*"))


def test_console_shows_our_lines_and_the_log_file_everything(
    tiny_shards, tmp_path, capfd, monkeypatch
):
    monkeypatch.delenv("BERT_VERBOSE", raising=False)
    argv = args(
        tmp_path,
        tiny_shards / "manifest.json",
        "--max-steps",
        "2",
        "--log-every",
        "1",
        "--export-hf",
        "false",
        "--save-every",
        "0",
    )
    assert main(argv) == 0
    console = capfd.readouterr()
    log = (tmp_path / "out" / "logs" / "train-rank0.log").read_text()
    assert f"is a manifest: reading its shard directory {tiny_shards}\n" in console.err
    # What the start-up check of the shards did, and did not (their sha256 costs a read).
    assert "(sizes and row counts checked, sha256 not checked: --verify-shards)" in console.err
    assert SCHEDULER_START_WARNING not in log + console.err  # DeepSpeed's, at every start
    assert "step 2/2  loss " in console.err and "ETA" in console.err
    assert f"full log: {tmp_path / 'out' / 'logs' / 'train-rank0.log'}" in console.err
    # DeepSpeed's records and prints, and our config dumps, are in the file only.
    for line in ("INFO DeepSpeed: ", "built successfully", "trainer config: {"):
        assert line in log and line not in console.err + console.out, line
    assert "step 2/2  loss " in log
    shutil.rmtree(tmp_path / "out")
    assert main([*argv, "--verbose"]) == 0  # everything on the console too
    assert "trainer config: {" in capfd.readouterr().err


def test_checkpoints_hold_the_data_position_and_configs(finished_run):
    ckpt = finished_run / "checkpoints"
    assert (ckpt / "latest").read_text() == "step00000006"
    assert (ckpt / "step00000003").is_dir()
    state = json.loads((ckpt / "step00000006" / "trainer_state.json").read_text())
    assert (state["step"], state["position"], state["rank_positions"]) == (6, 48, [48])
    train_config = json.loads((ckpt / "step00000006" / "train_config.json").read_text())
    assert train_config["max_steps"] == 6
    ds = json.loads((ckpt / "step00000006" / "ds_config.json").read_text())
    assert ds["scheduler"]["params"]["total_num_steps"] == 6  # "auto" resolved
    assert BertConfig.from_json(ckpt / "step00000006" / "config.json") == BertConfig(**TINY)
    # Readable by others as written (umask 022), not tempfile.mkstemp's 0600.
    assert (finished_run / "plots" / "loss.png").is_file()  # --plots true
    for directory in (ckpt, ckpt / "step00000006", finished_run / "hf", finished_run / "plots"):
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in directory.iterdir() if p.is_file()}
        assert {name for name, mode in modes.items() if mode != 0o644} == set(), directory


def test_hf_export_gives_transformers_the_same_mlm_logits(finished_run, tiny_shards, tmp_path):
    transformers = pytest.importorskip("transformers")
    ours = export.load_model(finished_run).eval()
    assert (
        export.main([str(finished_run / "checkpoints" / "step00000006"), str(tmp_path / "hf")]) == 0
    )
    for hf_dir in (finished_run / "hf", tmp_path / "hf"):
        theirs = transformers.BertForPreTraining.from_pretrained(str(hf_dir)).eval()
        batch = PretrainingStream(
            ShardSet(str(tiny_shards)), StreamSpec(micro=16, world_size=1, rank=0, seed=0)
        ).batch(0)
        with torch.no_grad():
            out = ours(
                batch["input_ids"],
                batch["segment_ids"],
                batch["attention_mask"],
                batch["masked_lm_positions"],
            )
            ref = theirs(
                input_ids=batch["input_ids"],
                token_type_ids=batch["segment_ids"],
                attention_mask=batch["attention_mask"],
            )
        index = batch["masked_lm_positions"][..., None].expand(-1, -1, 200)
        expected = ref.prediction_logits.gather(1, index)
        real = batch["masked_lm_positions"] != 0  # the head runs on real predictions only
        assert (out.mlm_logits[real] - expected[real]).abs().max().item() < 1e-5
        assert (out.nsp_logits - ref.seq_relationship_logits).abs().max().item() < 1e-5
    trained = export.load_model(finished_run)
    untrained = BertForPreTraining(BertConfig(**TINY))
    assert not torch.equal(trained.bert.pooler.dense.weight, untrained.bert.pooler.dense.weight)
    assert export.main([str(tmp_path / "nothing"), str(tmp_path / "hf2")]) == 2


@pytest.mark.slow  # 60 training steps: the longest in-process run of the fast tier
def test_loss_falls_on_a_small_repeated_dataset(small_shards, tmp_path):
    model = model_json(tmp_path, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    ds = ds_json(
        tmp_path,
        optimizer={"type": "AdamW", "params": {"lr": 3e-3, "torch_adam": True}},
        scheduler={
            "type": "WarmupLR",
            "params": {"warmup_num_steps": 5, "warmup_max_lr": 3e-3, "warmup_type": "linear"},
        },
    )
    argv = [
        "--ds-config",
        ds,
        "--data",
        str(small_shards),
        "--model",
        model,
        "--num-workers",
        "0",
        "--output-dir",
        str(tmp_path / "out"),
        "--max-steps",
        "60",
        "--log-every",
        "10",
        "--export-hf",
        "false",
        "--plots",
        "false",
        "--save-every",
        "0",
    ]
    assert main(argv) == 0
    assert not (tmp_path / "out" / "plots").exists()  # finished_run's has them
    train = records(tmp_path / "out")
    assert train[-1]["epoch"] > 2.5  # 161 rows seen three times
    assert train[-1]["mlm_loss"] < train[0]["mlm_loss"] - 0.5
    assert train[-1]["mlm_accuracy"] > 2 * train[0]["mlm_accuracy"]


def test_vocab_mismatch_is_refused_naming_both_sizes(tiny_shards, tmp_path, caplog):
    argv = args(tmp_path, tiny_shards, "--max-steps", "1")
    argv[argv.index("--model") + 1] = model_json(tmp_path, vocab_size=300)
    assert main(argv) == 2
    assert "vocab_size 300" in caplog.text and "vocabulary of 200" in caplog.text
    argv[argv.index("--model") + 1] = model_json(tmp_path, pad_token_id=1)
    assert main(argv) == 2
    assert "[PAD]" in caplog.text
    assert not (tmp_path / "out" / "checkpoints").exists()


def test_held_out_shards_of_another_vocab_or_casing_are_refused(
    tiny_shards, small_shards, tmp_path, caplog
):
    """Both sets have 200 tokens, learned from other corpora: same size, other vocab."""
    argv = args(tmp_path, tiny_shards, "--max-steps", "1", "--eval-data", str(small_shards))
    assert main(argv) == 2
    refusal = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR][-1]
    assert f"--eval-data {small_shards} was tokenized otherwise than --data {tiny_shards}" in (
        refusal
    )
    assert f"{small_shards}/manifest.json against {tiny_shards}/manifest.json" in refusal
    assert f"--vocab_file {tiny_shards}/vocab.txt --do_lower_case true" in refusal
    assert not (tmp_path / "out" / "checkpoints").exists()
    # The training shards' vocab, cased: the same ids for other text.
    cased = build_shards(
        tmp_path / "cased",
        n_docs=20,
        dupe_factor=1,
        vocab_file=tiny_shards / "vocab.txt",
        do_lower_case="false",
    )
    caplog.clear()
    assert main([*argv[:-1], str(cased)]) == 2
    assert "casing (do_lower_case): False in --eval-data, True in --data" in caplog.text


def test_a_log_file_that_cannot_be_written_at_start_stops_with_one_line(tiny_shards, tmp_path):
    """The log file on a full disk (/dev/full): one error line naming it, exit 1, not one
    '--- Logging error ---' traceback per record."""
    logs = tmp_path / "out" / "logs"
    logs.mkdir(parents=True)
    (logs / "train-rank0.log").symlink_to("/dev/full")
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "PYTHONPATH": str(REPO)}
    argv = args(tmp_path, tiny_shards, "--max-steps", "2", "--save-every", "0")
    done = subprocess.run(
        [sys.executable, "trainer/run.py", *argv],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Logging error" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if "ERROR" in line]
    assert len(errors) == 1, done.stderr[-3000:]
    assert f"cannot write the log file {logs}/train-rank0.log: No space left" in errors[0]


class _FillingDisk(io.StringIO):
    """A log file's stream whose disk fills after ``room`` writes."""

    def __init__(self, room: int):
        super().__init__()
        self.room = room

    def write(self, text: str) -> int:
        self.room -= 1
        if self.room < 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super().write(text)


def test_a_log_file_that_fills_mid_run_stops_it_with_one_line(
    tiny_shards, tmp_path, capfd, monkeypatch
):
    setup = run_module._setup_logging

    def filling(rank, output_dir=None, **kwargs):
        handlers = setup(rank, output_dir, **kwargs)
        for handler in handlers:
            if isinstance(handler, logging.FileHandler):
                handler.stream = _FillingDisk(room=12)  # past start-up, before the end
        return handlers

    monkeypatch.setattr(run_module, "_setup_logging", filling)
    argv = args(tmp_path, tiny_shards, "--max-steps", "40", "--log-every", "1")
    assert main([*argv, "--save-every", "0"]) == 1
    err = capfd.readouterr().err
    assert "Logging error" not in err and "Traceback" not in err, err
    errors = [line for line in err.splitlines() if "ERROR" in line]
    assert len(errors) == 1 and "cannot write the log file" in errors[0], err[-3000:]
    assert "train-rank0.log: No space left on device" in errors[0]


def test_bad_batch_sizes_and_missing_data_fail_before_training(tiny_shards, tmp_path, caplog):
    argv = args(tmp_path, tiny_shards, "--max-steps", "1", train_batch_size=7)
    assert main(argv) == 2
    assert "batch sizes" in caplog.text and "do not fit 1 rank(s)" in caplog.text
    assert not (tmp_path / "out").exists()  # a refused run leaves no folder behind
    (tmp_path / "out").mkdir()
    assert main(args(tmp_path, tmp_path / "no-such-dir", "--max-steps", "1")) == 2
    assert (tmp_path / "out" / "logs").is_dir()  # not ours to remove: the folder was there
    assert "--data" in caplog.text and "no-such-dir" in caplog.text
    assert main(["--data", str(tiny_shards)]) == 2
    assert not (tmp_path / "out" / "checkpoints").exists()


def test_resume_with_another_schedule_length_says_so(finished_run, tiny_shards, tmp_path, caplog):
    shutil.copytree(finished_run, tmp_path / "out")  # a checkpoint of --max-steps 6 at step 6

    def resume(steps: int) -> str:
        caplog.clear()
        argv = args(
            tmp_path,
            tiny_shards,
            "--max-steps",
            str(steps),
            "--resume",
            "auto",
            "--save-every",
            "0",
            "--export-hf",
            "false",
        )
        assert main(argv) == 0
        return caplog.text

    said = "decayed its learning rate over {} steps (--max-steps {}); this run decays it over {}"
    assert said.format(6, 6, "7 steps (--max-steps 7)") in resume(7)
    assert said.format(7, 7, "8 steps (--max-steps 8)") in resume(8)  # step 7's own config
    assert "decays it over" not in resume(8)  # the same length: nothing to say


def test_resume_on_other_data_is_refused(finished_run, small_shards, tmp_path, caplog):
    argv = args(tmp_path, small_shards, "--max-steps", "8", "--resume", str(finished_run))
    assert main(argv) == 2
    assert "trained on other data" in caplog.text


def test_resume_into_another_model_size_is_refused_naming_the_fields(
    finished_run, tiny_shards, tmp_path, caplog
):
    argv = args(tmp_path, tiny_shards, "--max-steps", "8", "--resume", str(finished_run))
    argv[argv.index("--model") + 1] = model_json(tmp_path, hidden_size=64, intermediate_size=128)
    assert main(argv) == 2  # was: a RuntimeError (state_dict size mismatch) out of DeepSpeed
    assert (
        f"--resume {finished_run}: the checkpoint {finished_run}/checkpoints/step00000006 is a "
        "model with hidden_size=32, intermediate_size=64; this run builds hidden_size=64, "
        f"intermediate_size=128 (--model {tmp_path / 'model.json'}). Resume with --model "
        f"{finished_run}/checkpoints/step00000006/config.json, or leave out --resume"
    ) in caplog.text
    assert not (tmp_path / "out" / "checkpoints").exists()


def poison_loss(monkeypatch, at_call: int) -> dict:
    """The model's loss is NaN on its ``at_call``-th forward; returns the call counter."""
    calls = {"n": 0}
    forward = BertForPreTraining.forward

    def poisoned(self, *a, **k):
        out = forward(self, *a, **k)
        calls["n"] += 1
        if calls["n"] == at_call:
            out.loss = out.loss * float("nan")
        return out

    monkeypatch.setattr(BertForPreTraining, "forward", poisoned)
    return calls


def test_non_finite_loss_stops_before_the_update_and_saves_nothing(
    tiny_shards, tmp_path, monkeypatch, caplog
):
    poison_loss(monkeypatch, at_call=3)
    argv = args(tmp_path, tiny_shards, "--max-steps", "5", "--save-every", "1")
    assert main(argv) == 3
    assert "non-finite loss at step 3" in caplog.text
    ckpt = tmp_path / "out" / "checkpoints"
    assert (ckpt / "latest").read_text() == "step00000002"
    assert not (ckpt / "step00000003").exists()


@pytest.mark.parametrize(
    ("save_every", "found", "latest"),
    [
        # The flag stays on the device on steps that read nothing back (3); a save step (4)
        # reads it before its update.
        (2, "found before the update of step 4", "step00000002"),
        # A step that only logs (4) reads it in the log's one read, after its update; the
        # torch engine (this config's) skipped step 3's on the device.
        (6, "found at the log of step 4 (stream position 32); step 3's update skipped", None),
    ],
)
def test_non_finite_loss_between_reads_is_named_and_no_checkpoint_holds_it(
    tiny_shards, tmp_path, monkeypatch, caplog, save_every, found, latest
):
    calls = poison_loss(monkeypatch, at_call=3)
    extra = ("--max-steps", "8", "--save-every", str(save_every), "--log-every", "4")
    assert main(args(tmp_path, tiny_shards, *extra)) == 3
    assert "engine: torch" in caplog.text
    assert f"non-finite loss at step 3; {found}" in caplog.text
    assert calls["n"] == 4  # stopped at step 4
    ckpt = tmp_path / "out" / "checkpoints"
    saved = (ckpt / "latest").read_text() if (ckpt / "latest").exists() else None
    assert saved == latest
    assert not (ckpt / "step00000004").exists()
    assert records(tmp_path / "out") == []  # step 4's record is not written


def test_entry_point_runs_as_a_module_and_as_a_file():
    for cmd in (["-m", "trainer.run", "--help"], [str(REPO / "trainer" / "run.py"), "--help"]):
        done = subprocess.run(
            [sys.executable, *cmd], capture_output=True, text=True, cwd="/", timeout=120
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert "--ds-config" in done.stdout and "--resume" in done.stdout


def test_export_loads_in_automodel_and_masked_lm(finished_run):
    transformers = pytest.importorskip("transformers")
    hf = finished_run / "hf"
    ours = BertForPreTraining.from_hf(hf).eval()
    ids = torch.tensor([[2, 17, 4, 33, 3, 50, 61, 3]])
    seg = torch.tensor([[0, 0, 0, 0, 0, 1, 1, 1]])
    mask = torch.ones_like(ids)
    out = ours(ids, seg, mask, masked_lm_positions=torch.tensor([[2]]))
    encoder = transformers.AutoModel.from_pretrained(hf).eval()
    assert type(encoder).__name__ == "BertModel"
    hidden = encoder(input_ids=ids, token_type_ids=seg, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(hidden, out.sequence_output, atol=1e-5, rtol=1e-5)
    mlm, info = transformers.BertForMaskedLM.from_pretrained(hf, output_loading_info=True)
    assert not info["missing_keys"], info
    logits = mlm.eval()(input_ids=ids, token_type_ids=seg, attention_mask=mask).logits
    torch.testing.assert_close(logits[:, 2], out.mlm_logits[:, 0], atol=1e-4, rtol=1e-5)


def test_continued_pretraining_from_an_hf_directory(finished_run, tiny_shards, tmp_path):
    # A recognisable starting point: an MLM bias that predicts token 7 everywhere, so
    # the first step's MLM loss is ~20 instead of a fresh model's log(200) ~ 5.3.
    start = BertForPreTraining.from_hf(finished_run / "hf")
    with torch.no_grad():
        start.cls.predictions.bias.zero_()
        start.cls.predictions.bias[7] = 20.0
    start.save_hf(tmp_path / "init")
    extra = [
        "--max-steps",
        "3",
        "--log-every",
        "1",
        "--save-every",
        "0",
        "--init-from-hf",
        str(tmp_path / "init"),
    ]
    run = args(tmp_path, tiny_shards, *extra)
    run[run.index("--model") + 1] = str(tmp_path / "init" / "config.json")
    assert main(run) == 0
    assert records(tmp_path / "out")[0]["mlm_loss"] > 10
    continued = BertForPreTraining.from_hf(tmp_path / "out" / "hf")
    assert 19.0 < continued.cls.predictions.bias[7].item() <= 20.0
