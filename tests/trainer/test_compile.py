"""--compile (trainer/compiling.py): a compiled run trains as the eager one, compiles a bounded
set of graphs, and saves and exports plain state-dict names."""

from __future__ import annotations

import itertools

import pytest
import torch

from tests.helpers import args, records
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
# projections, the heads and loss (8, measured), and 2 more for the padded path, compiled
# at the first batch without padding. A bound with room for a torch upgrade's splits; a
# run that recompiled per batch would pass it within a few steps.
MAX_GRAPHS = 24


def _run(tmp_path_factory, tiny_shards, name: str, *extra: str):
    torch._dynamo.reset()  # graphs of an earlier test in this process do not count
    from torch._dynamo.utils import counters

    counters.clear()
    tmp = tmp_path_factory.mktemp(name)
    flags = ["--max-steps", str(STEPS), "--log-every", "1", "--save-every", "0", "--dropout", "0"]
    assert main(args(tmp, tiny_shards, *flags, *extra)) == 0
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
