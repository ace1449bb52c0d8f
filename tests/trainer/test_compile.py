"""--compile (trainer/compiling.py): a compiled run trains as the eager one, compiles a bounded
set of graphs, and saves and exports plain state-dict names."""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tests.helpers import args, records
from trainer.compiling import (
    CACHE_NAME,
    cache_dir,
    check_zero,
    compile_step,
    torch_optimizer,
    use_cache,
)
from trainer.config import parse_args
from trainer.run import main

STEPS = 16
# fp32 both ways (dropout 0: inductor draws other dropout masks than eager). The compiled
# kernels sum in another order (LayerNorm and softmax reductions, fused bias and GELU),
# which moves a loss by about 1e-7 relative, and AdamW carries such differences into the
# weights step by step. Measured: at most 1.4e-6 over these 16 steps on 2 cores; the
# tolerance leaves room for another thread count's summation order. A bug (a wrong
# fusion, a gradient lost across a graph break) moves the loss by more than 1e-2 within
# a step or two, and the losses here change by more than that from step to step.
LOSS_TOLERANCE = 1e-4
# Graphs of a run of TINY: the embeddings, each layer's output and the next one's
# projections, the heads and loss (8, measured); a batch without padding runs the same
# graphs (the trainer's set_unpadded(every_batch=True)). A bound with room for a torch
# upgrade's splits; a run that recompiled per batch would pass it within a few steps.
MAX_GRAPHS = 24


def _run(tmp_path_factory, data, name: str, *extra: str, steps: int = STEPS, every=1, **ds):
    """A run of TINY on ``data`` with trainer flags ``extra`` (and DeepSpeed keys ``ds``),
    a record every ``every`` steps; returns its output directory."""
    torch._dynamo.reset()  # graphs of an earlier test in this process do not count
    from torch._dynamo.utils import counters

    counters.clear()
    tmp = tmp_path_factory.mktemp(name)
    flags = ["--max-steps", str(steps), "--log-every", str(every), "--save-every", "0"]
    with pytest.MonkeyPatch.context() as env:  # the cache directory --compile sets
        env.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
        env.delenv("TRITON_CACHE_DIR", raising=False)
        assert main(args(tmp, data, *flags, "--dropout", "0", *extra, **ds)) == 0
    return tmp / "out"


@pytest.fixture(scope="module")
def eager_run(tmp_path_factory, tiny_shards):
    return _run(tmp_path_factory, tiny_shards, "eager")


@pytest.fixture(scope="module")
def compiled_run(tmp_path_factory, tiny_shards):
    return _run(tmp_path_factory, tiny_shards, "compiled", "--compile", "model")


def test_compile_flag_is_checked(tmp_path, tiny_shards):
    assert parse_args(args(tmp_path, tiny_shards, "--compile", "step")).compile == "step"
    assert parse_args(args(tmp_path, tiny_shards)).compile == "off"
    with pytest.raises(SystemExit):
        parse_args(args(tmp_path, tiny_shards, "--compile", "all"))


@pytest.mark.slow  # two runs, one compiled: over a minute on 2 cores
def test_compiled_losses_match(eager_run, compiled_run):
    eager, compiled = records(eager_run), records(compiled_run)
    assert [r["step"] for r in compiled] == list(range(1, STEPS + 1))
    assert all(r["compiled_graphs"] > 0 for r in compiled)  # it did compile
    assert all(r["compiled_graphs"] is None for r in eager)
    diffs = [abs(a["loss"] - b["loss"]) for a, b in zip(eager, compiled, strict=True)]
    assert max(diffs) < LOSS_TOLERANCE, diffs
    # The comparison can fail: the loss moves by far more than the tolerance between steps.
    steps = [abs(a["loss"] - b["loss"]) for a, b in itertools.pairwise(eager)]
    assert max(steps) > 100 * LOSS_TOLERANCE, steps


@pytest.mark.slow  # two runs, one compiled: over a minute on 2 cores
def test_compiled_graphs_are_bounded(compiled_run):
    """Every batch has other shapes (row lengths, predictions); graphs are added at the
    first step and at the first batch without padding (the padded path), at no other:
    a run that recompiled per batch would add graphs at nearly every step."""
    counts = [r["compiled_graphs"] for r in records(compiled_run)]
    assert counts[-1] <= MAX_GRAPHS, counts
    grew = [i for i in range(1, len(counts)) if counts[i] != counts[i - 1]]
    assert len(grew) <= 1, counts


@pytest.mark.slow  # two runs, one compiled: over a minute on 2 cores
def test_compile_cache_is_in_the_run_directory(compiled_run):
    cached = [p for p in (compiled_run / CACHE_NAME).rglob("*") if p.is_file()]
    assert cached  # inductor's FX graph cache and kernels


@pytest.mark.slow  # a third run, its optimizer step compiled too
def test_compiled_step_matches_eager(tmp_path_factory, tiny_shards, eager_run, compiled_run):
    # The model's graphs are compiled_run's: its cache serves them (as a resumed run's own
    # cache does), so only the optimizer step compiles here.
    flags = ("--compile", "step", "--compile-cache", str(compiled_run / CACHE_NAME))
    out = _run(tmp_path_factory, tiny_shards, "step", *flags, steps=4)
    step, eager = records(out), records(eager_run)[:4]
    diffs = [abs(a["loss"] - b["loss"]) for a, b in zip(eager, step, strict=True)]
    assert max(diffs) < LOSS_TOLERANCE, diffs
    grew = [i for i in range(1, 4) if step[i]["compiled_graphs"] != step[i - 1]["compiled_graphs"]]
    assert len(grew) <= 1, [r["compiled_graphs"] for r in step]


def test_compiled_step_at_learning_rate_0_keeps_weights_finite():
    """A warmup from 0 starts at lr 0, where torch's compiled AdamW made NaN of every weight
    whose gradient was 0 (pytorch/pytorch#126514); the next, compiled, step stays finite."""
    torch.manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(8, 4))
    optimizer = torch.optim.AdamW([weight], lr=0.0, eps=1e-6, weight_decay=0.01)
    compile_step(optimizer)
    for lr in (0.0, 1e-3):
        optimizer.param_groups[0]["lr"] = lr
        weight.grad = torch.cat([torch.randn(4, 4), torch.zeros(4, 4)])  # rows 4-7: no gradient
        optimizer.step()
        assert torch.isfinite(weight).all(), lr


def test_the_torch_optimizer_inside_deepspeeds_wrappers_is_found():
    sgd = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    zero = SimpleNamespace(optimizer=SimpleNamespace(optimizer=sgd))  # ZeRO's, bf16's
    assert torch_optimizer(zero) is sgd and torch_optimizer(sgd) is sgd
    with pytest.raises(ValueError, match="--compile step needs a torch optimizer"):
        torch_optimizer(SimpleNamespace())


def test_compiling_with_zero_stage_3_is_refused():
    """Compiled graphs fail on stage 3's partitioned parameters (trainer/compiling.py)."""
    stage = {n: {"zero_optimization": {"stage": n}} for n in (0, 1, 2, 3)}
    with pytest.raises(
        ValueError, match=r"ds\.json: --compile model does not run with ZeRO stage 3"
    ):
        check_zero(stage[3], "model", where="--ds-config ds.json")
    with pytest.raises(ValueError, match='"stage": 2}, or --compile off'):
        check_zero(stage[3], "step", where="--ds-config ds.json")
    for n in (0, 1, 2):
        check_zero(stage[n], "model", where="x")
    check_zero(stage[3], "off", where="x")
    check_zero({}, "model", where="x")  # no zero_optimization: stage 0


def test_cache_directory_is_the_named_one_or_the_runs(tmp_path, monkeypatch):
    assert cache_dir("runs/a", None) == Path("runs/a", CACHE_NAME)
    assert cache_dir("runs/a", "/shared/cache") == Path("/shared/cache")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/elsewhere")
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    use_cache(tmp_path / "c")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "c")
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "c" / "triton")
    assert (tmp_path / "c").is_dir()


@pytest.mark.slow  # two runs, one compiled: over a minute on 2 cores
def test_first_step_time_is_reported(eager_run, compiled_run):
    for out in (eager_run, compiled_run):
        first = [r["first_step_s"] for r in records(out)]
        assert first[0] > 0 and len(set(first)) == 1, first


@pytest.mark.slow  # two runs, one compiled: over a minute on 2 cores
def test_compiled_checkpoint_and_export_have_plain_names(compiled_run, eager_run):
    from safetensors.torch import load_file

    from model import BertForPreTraining

    (state,) = compiled_run.glob("checkpoints/*/mp_rank_00_model_states.pt")
    module = torch.load(state, map_location="cpu", weights_only=False)["module"]
    assert not [k for k in module if "_orig_mod" in k]
    names = set(load_file(compiled_run / "hf" / "model.safetensors"))
    assert names == set(load_file(eager_run / "hf" / "model.safetensors"))
    assert not [k for k in names if "_orig_mod" in k]
    BertForPreTraining.from_hf(compiled_run / "hf")  # strict: every name known


# bf16 both ways: inductor keeps a fused chain's intermediates in fp32 and rounds once at
# its end, where eager rounds to bf16 (8 significant bits, 2^-9 relative) after every op.
# Measured: losses within 2.6e-5 relative over these 8 steps; 1e-3 leaves room for
# other CPUs' kernels. The learning rate is at its peak from the second step, so that the loss
# moves by more than 10x the tolerance in these steps: a micro-batch's gradient lost, or
# a wrong fusion, would move the compiled curve away from the eager one by about as much.
BF16_TOLERANCE = 1e-3
SCHEDULE = {
    "type": "WarmupLR",
    "params": {"warmup_min_lr": 0, "warmup_max_lr": 2e-3, "warmup_num_steps": 1},
}


@pytest.mark.slow  # two runs, one compiled, in bf16: minutes on 2 cores
@pytest.mark.long
def test_compiled_bf16_with_accumulation_matches_eager(tmp_path_factory, tiny_shards):
    """Gradient accumulation (2 micro-batches a step) and bf16 together, compiled as eager,
    and the row buckets of bf16 on CPU (model/unpad.py) cost no recompiles."""
    flags, ds = ("--precision", "bf16"), {"gradient_accumulation_steps": 2, "scheduler": SCHEDULE}
    eager = records(_run(tmp_path_factory, tiny_shards, "bf16-eager", *flags, steps=8, **ds))
    compiled = _run(
        tmp_path_factory, tiny_shards, "bf16", *flags, "--compile", "model", steps=8, **ds
    )
    compiled = records(compiled)
    diffs = [abs(a["loss"] - b["loss"]) / a["loss"] for a, b in zip(eager, compiled, strict=True)]
    assert max(diffs) < BF16_TOLERANCE, diffs
    assert abs(eager[-1]["loss"] - eager[0]["loss"]) / eager[0]["loss"] > 10 * BF16_TOLERANCE
    counts = [r["compiled_graphs"] for r in compiled]
    # As in fp32 (test_compiled_graphs_are_bounded), and one more at the second step: a
    # row bucket's n rounded on the host each batch recompiled every step.
    grew = [i for i in range(1, len(counts)) if counts[i] != counts[i - 1]]
    assert counts[0] > 0 and len(grew) <= 2, counts


@pytest.mark.slow  # two runs, one compiled: over a minute on 2 cores
def test_export_of_a_compiled_run_gives_the_eager_logits_in_transformers(compiled_run):
    """transformers' BertForPreTraining on the export against our eager model on the run's
    last checkpoint: the trained weights, under the names transformers reads."""
    transformers = pytest.importorskip("transformers")
    from trainer.export import load_model

    ours = load_model(compiled_run / "checkpoints")  # the latest: the run's last step
    theirs = transformers.BertForPreTraining.from_pretrained(str(compiled_run / "hf")).eval()
    ids = torch.tensor([[2, 40, 41, 42, 3, 50, 51, 3]])  # [CLS] a b c [SEP] d e [SEP]
    segments = torch.tensor([[0, 0, 0, 0, 0, 1, 1, 1]])
    with torch.no_grad():
        out = ours.eval()(ids, segments, torch.ones_like(ids), labels=ids)
        ref = theirs(input_ids=ids, token_type_ids=segments)
    # fp32 both, other kernels (transformers' SDPA on the padded batch): as test_run's export
    # checks, 1e-4 of logits of size ~10.
    assert (out.prediction_logits - ref.prediction_logits.flatten(0, 1)).abs().max() < 1e-4
    assert (out.nsp_logits - ref.seq_relationship_logits).abs().max() < 1e-4


CURVE_STEPS, WINDOW = 200, 10
# Largest |compiled - eager| of a window's mean loss (10 steps), relative to eager's, over
# 200 steps of the tiny preset in fp32. The per-step differences are summation order (see
# LOSS_TOLERANCE); measured: at most 3.6e-8 over the first 14 windows (6.00 -> 4.98), with
# no growth from window to window. 1e-4 is 3,000x that, room for another CPU's or thread
# count's kernels and for AdamW's slow amplification; a compiled run that learned otherwise
# (a lost gradient, a wrong fusion) differs by more than the 1e-2 the windows move by.
CURVE_TOLERANCE = 1e-4


@pytest.mark.slow  # 400 steps in process, one run compiled: 40 min at load 14 on 2 cores
@pytest.mark.long
def test_200_step_loss_curves_of_compiled_and_eager_agree(tmp_path_factory, tiny_shards):
    curves = {}
    for name, extra in (("curve-eager", ()), ("curve-compiled", ("--compile", "model"))):
        out = _run(
            tmp_path_factory,
            tiny_shards,
            name,
            "--model",
            "tiny",
            *extra,
            steps=CURVE_STEPS,
            every=WINDOW,
        )
        curves[name] = [r["loss"] for r in records(out)]
    eager, compiled = curves["curve-eager"], curves["curve-compiled"]
    assert len(eager) == len(compiled) == CURVE_STEPS // WINDOW
    diffs = [abs(c - e) / e for e, c in zip(eager, compiled, strict=True)]
    assert max(diffs) <= CURVE_TOLERANCE, list(zip(eager, compiled, strict=True))
    assert eager[-1] < eager[0] - 0.8  # it learned: a curve, not a plateau
