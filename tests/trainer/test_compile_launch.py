"""--compile on two ZeRO-2 CPU ranks (``deepspeed --num_gpus 2``, gloo), as test_resume.py
launches them: a compiled run ends as the eager one, and a compiled run whose rank 1 is
SIGKILLed after a checkpoint and resumed with ``--resume auto`` ends with the weights of the
uninterrupted compiled run.

Dropout is 0 in every run: inductor draws other dropout masks than eager. The compiled runs
share one ``--compile-cache``, so the later ones load the kernels the first one built (the
cache that a resumed run does not pay again).
"""

from __future__ import annotations

import pytest

from tests.helpers import launch, max_weight_difference, records
from trainer.checkpoint import tag_for

# Four launches of two ranks, three of them compiled: 22 min at load 10-15 on 2 cores.
pytestmark = [pytest.mark.slow, pytest.mark.long]

STEPS, SAVE_EVERY, KILL_AFTER = 8, 4, 6  # resumes at step 4, repeats steps 5 and 6
# Two ranks compiling at once: over 300 s (launch's default) on the loaded 2-core machine.
RUN = {"steps": STEPS, "save_every": SAVE_EVERY, "timeout": 1200}
# Eager against compiled, fp32 on the same rows: the compiled kernels sum in another order
# (tests/trainer/test_compile.py's LOSS_TOLERANCE). Measured on two ranks: losses within
# 3.6e-7 over 8 steps, weights within 3.7e-9. AdamW divides each update by the gradient's
# running size, so a weight whose gradient is near 0 can move by up to the learning rate (at
# most 1.6e-4 in these warmup steps) on summation noise: the weights are compared at that
# scale. Before the trainer ran every batch on one path (model/bert.py, set_unpadded's
# every_batch), a rank whose micro-batch had no padding ran the padded graph, whose backward
# hands the gradients to ZeRO-2 in another order, and the ranks summed one parameter's
# gradient with another's: losses 1.1e-4 apart by step 6, weights 6.8e-4.
LOSS_TOLERANCE = 1e-4
WEIGHT_TOLERANCE = 2e-4
# Compiled against compiled: the same kernels (loaded from the shared cache) on the same
# rows, so the resumed run is exact as the eager resume of test_resume.py is (measured:
# bitwise equal weights).
RESUME_TOLERANCE = 1e-6


@pytest.fixture(scope="module")
def runs(zero2_files, small_shards):
    files = zero2_files
    cache = str(files / "compile-cache")
    compiled = ("--dropout", "0", "--compile", "model", "--compile-cache", cache)
    out = {}
    for name, extra, fault in (
        ("eager", ("--dropout", "0"), None),
        ("compiled", compiled, None),
        ("killed", compiled, f"sigkill@{KILL_AFTER}:1"),
    ):
        out[name] = files / f"compile-{name}"
        done = launch(files, small_shards, out[name], *extra, fault=fault, **RUN)
        assert (done.returncode == 0) == (fault is None), done.stderr[-3000:]
    assert (out["killed"] / "checkpoints" / "latest").read_text() == tag_for(SAVE_EVERY)
    resumed = launch(files, small_shards, out["killed"], *compiled, "--resume", "auto", **RUN)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return out


def test_two_zero2_ranks_compiled_train_as_eager(runs):
    eager, compiled = records(runs["eager"]), records(runs["compiled"])
    assert [r["step"] for r in compiled] == [r["step"] for r in eager]
    assert all(r["compiled_graphs"] for r in compiled)
    diffs = [abs(a["loss"] - b["loss"]) for a, b in zip(eager, compiled, strict=True)]
    assert max(diffs) < LOSS_TOLERANCE, diffs
    weights = max_weight_difference(runs["eager"], runs["compiled"], tag_for(STEPS))
    assert weights < WEIGHT_TOLERANCE


def test_compiled_run_killed_and_resumed_ends_with_the_same_weights(runs):
    weights = max_weight_difference(runs["compiled"], runs["killed"], tag_for(STEPS))
    assert weights <= RESUME_TOLERANCE
